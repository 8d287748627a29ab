from harness.util import log_to

log_to(snakemake.log[0])

from harness.models.layout import read_layout
from harness.util import atomic_write_json

atomic_write_json(snakemake.output[0], read_layout(snakemake.input.gguf))
