import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from harness.report import write_findings

write_findings(snakemake.input, snakemake.output, snakemake.params.config,
               log=lambda s: print(s, file=sys.stderr))
