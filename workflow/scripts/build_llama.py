from harness.util import log_to

log_to(snakemake.log[0])

from harness.build.llama import ensure_build
from harness.util import atomic_write_json

manifest = ensure_build(snakemake.params.build, snakemake.threads)
atomic_write_json(snakemake.output.manifest, manifest)
