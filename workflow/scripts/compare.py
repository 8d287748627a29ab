import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from harness.report.compare import compare

compare(snakemake.params.machines, snakemake.output[0])
print(f"compared {', '.join(snakemake.params.machines)}", file=sys.stderr)
