from harness.util import log_to

log_to(snakemake.log[0])

import sys

from harness.report.compare import compare

compare(snakemake.params.machines, snakemake.output[0])
print(f"compared {', '.join(snakemake.params.machines)}", file=sys.stderr)
