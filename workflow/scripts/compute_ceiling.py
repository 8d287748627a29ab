import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

import logging

logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s")

import json
from pathlib import Path

from harness.box import pagecache
from harness.box.ceilings import llama_bench
from harness.config import cpu_quota_of, profile_limits
from harness.models.staging import staged_model
from harness.util import atomic_write_json

cfg = snakemake.params.config
manifest = json.loads(Path(snakemake.input.manifest).read_text())
threads = cfg["profiles"][cfg["profile"]]["threads"]
quota = cpu_quota_of(snakemake.input.quota)
dense = staged_model(snakemake.input.dense, snakemake.config)
moe = staged_model(snakemake.input.moe, snakemake.config)


def bench(model, limits, extra=()):
    return llama_bench(manifest["llama_bench"], model, threads, snakemake.params.tokens, "mmap",
                       limits, manifest["lib_dir"], sys.stderr, extra)


limits = profile_limits(cfg, dense, cpu_quota=quota)
# dense model: cold (evicted), then warm straight after, as the study did
pagecache.cold_start(dense)
dense_cold = bench(dense, limits)
dense_warm = bench(dense, limits)
# the MoE model's own compute ceiling: no RAM budget, fully cached. --repack 0 is the harness's
# own kernels (it loads with use_extra_bufts off); the default repack is shown beside it.
moe_limits = profile_limits(cfg, moe, ram=False, cpu_quota=quota)
pagecache.warm(moe)
moe_warm = bench(moe, moe_limits, ("--repack", "0"))
moe_warm_repack = bench(moe, moe_limits)
# every other MoE quant the runs use, the same way: its own fully cached decode under the quota
other = {}
for name, path in zip(snakemake.params.other_moe_models, snakemake.input.other_moe, strict=True):
    path = staged_model(path, snakemake.config)
    pagecache.warm(path)
    other[name] = bench(path, profile_limits(cfg, path, ram=False, cpu_quota=quota), ("--repack", "0"))
    pagecache.evict(path)
atomic_write_json(snakemake.output[0], {
    "dense_model": snakemake.params.dense_model, "moe_model": snakemake.params.moe_model,
    "cpu_quota": quota,
    "dense_cold": dense_cold, "dense_warm": dense_warm, "moe_warm": moe_warm,
    "moe_warm_default_repack": moe_warm_repack, "moe_warm_other": other,
    "build": {k: manifest[k] for k in ("commit", "patch_sha256", "key")},
})
