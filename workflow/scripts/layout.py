import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

import logging

logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s")

from harness.models.layout import read_layout
from harness.util import atomic_write_json

atomic_write_json(snakemake.output[0], read_layout(snakemake.input.gguf))
