from harness.util import log_to

log_to(snakemake.log[0])

import logging

from harness.models.checks import verify_models
from harness.util import atomic_write_json

checked = verify_models(snakemake.input.infos)
atomic_write_json(snakemake.output[0], checked)
logging.info(f"{len(checked)} model(s) unchanged since they were made")
