from harness.util import log_to

log_to(snakemake.log[0])

from harness.config import check
from harness.models.make import make_model
from harness.catalog import BY_NAME as MECHANISMS

# read from the config, not given as params: adding a run must not make the model again
name = snakemake.wildcards.model
prefetched_by = tuple(r.mechanism for r in check(snakemake.config)
                      if r.model == name and MECHANISMS[r.mechanism].prefetches)
make_model(name, snakemake.params.spec, snakemake.input.manifest,
           snakemake.input.f16 or None, snakemake.output.gguf, snakemake.output.info,
           snakemake.threads, prefetched_by)
