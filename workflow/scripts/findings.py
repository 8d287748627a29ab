from harness.util import log_to

log_to(snakemake.log[0])

from harness.report.results import ReportInputs, write_findings

write_findings(ReportInputs.of(snakemake.input), dict(snakemake.output.items()),
               snakemake.params.config)
