from harness.util import log_to

log_to(snakemake.log[0])

import json

from harness.build.llama import ensure_build
from harness.util import atomic_write_json

manifest = ensure_build({**json.loads(snakemake.params.identity),
                         "cache_dir": snakemake.params.cache_dir}, snakemake.threads)
atomic_write_json(snakemake.output.manifest, manifest)
