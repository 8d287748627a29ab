import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from harness.build import ensure_build
from harness.util import atomic_write_json

manifest = ensure_build(snakemake.params.build, snakemake.threads,
                        log=lambda s: print(s, file=sys.stderr))
atomic_write_json(snakemake.output.manifest, manifest)
