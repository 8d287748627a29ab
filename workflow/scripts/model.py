import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

import logging

logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s")

from harness.models.make import make_model

make_model(snakemake.wildcards.model, snakemake.params.spec, snakemake.input.manifest,
           snakemake.input.f16 or None, snakemake.output.gguf, snakemake.output.info,
           snakemake.threads)
