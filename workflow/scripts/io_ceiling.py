from harness.util import log_to

log_to(snakemake.log[0])

import json
from pathlib import Path

import pandas as pd

from harness.stages.ceilings import expert_slab_bytes, io_ceiling
from harness.profiles import cpu_quota_of, profile_limits
from harness.models.staging import local_dir
from harness.util import atomic_path

# the disk the models are measured from: the node-local one on a cluster (cluster.local_dir)
models_dir = Path(local_dir(snakemake.config) or Path(snakemake.input.models[0]).parent)
limits = profile_limits(snakemake.params.config, str(models_dir),
                        cpu_quota=cpu_quota_of(snakemake.input.quota))
slab = expert_slab_bytes(json.loads(Path(snakemake.input.moe_layout).read_text()))
rows = io_ceiling(models_dir, snakemake.params.samples, limits, slab_bytes=slab,
                  random_mib=snakemake.params.random_mib,
                  queue_depths=snakemake.params.queue_depths)
with atomic_path(snakemake.output[0]) as tmp:
    pd.DataFrame(rows).to_csv(tmp, index=False)
