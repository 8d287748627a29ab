import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

import logging

logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s")

from harness.analysis.metrics import runs_table
from harness.util import atomic_path

table = runs_table(snakemake.input.records)
with atomic_path(snakemake.output[0]) as tmp:
    table.to_csv(tmp, index=False)
print(f"{len(table)} runs", file=sys.stderr)
