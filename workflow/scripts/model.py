from harness.util import log_to

log_to(snakemake.log[0])

from harness.models.make import make_model

make_model(snakemake.wildcards.model, snakemake.params.spec, snakemake.input.manifest,
           snakemake.input.f16 or None, snakemake.output.gguf, snakemake.output.info,
           snakemake.threads)
