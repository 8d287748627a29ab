from harness.util import log_to

log_to(snakemake.log[0])

import json
from pathlib import Path

from harness.models.synthetic import SHAPES, write_f16

manifest = json.loads(Path(snakemake.input.manifest).read_text())
shape = SHAPES[snakemake.wildcards.shape]
write_f16(shape, int(snakemake.wildcards.seed), Path(manifest["source_tree"]) / shape.vocab_file,
          Path(snakemake.output[0]))
