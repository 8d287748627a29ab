from harness.util import log_to

log_to(snakemake.log[0])

import logging

from harness.analysis.run_table import disturbed_repeats
from harness.util import atomic_write_json

flagged = disturbed_repeats(snakemake.input.records)
atomic_write_json(snakemake.output[0], {"disturbed": flagged,
                                        "rerun": flagged if snakemake.params.rerun else []})
logging.info(f"{len(flagged)} disturbed repeat(s)"
             + ("; each is measured once more" if snakemake.params.rerun and flagged else ""))
