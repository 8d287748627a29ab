import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from harness.build import ensure_build  # noqa: E402
from harness.util import atomic_write_json  # noqa: E402

manifest = ensure_build(snakemake.params.build, snakemake.threads,
                        log=lambda s: print(s, file=sys.stderr))
atomic_write_json(snakemake.output.manifest, manifest)
