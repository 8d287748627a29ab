from harness.util import log_to

log_to(snakemake.log[0])

import sys

from harness.analysis.run_table import runs_table
from harness.util import atomic_path

table = runs_table(snakemake.input.records)
with atomic_path(snakemake.output[0]) as tmp:
    table.to_csv(tmp, index=False)
print(f"{len(table)} runs", file=sys.stderr)
