import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

import logging

logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s")

from harness.report.results import write_findings

write_findings(snakemake.input, snakemake.output, snakemake.params.config)
