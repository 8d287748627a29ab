from harness.util import log_to

log_to(snakemake.log[0])

from harness.report.results import write_findings

write_findings(snakemake.input, snakemake.output, snakemake.params.config)
