import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

import logging

logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s")

from harness.build.llama import ensure_build
from harness.util import atomic_write_json

manifest = ensure_build(snakemake.params.build, snakemake.threads)
atomic_write_json(snakemake.output.manifest, manifest)
