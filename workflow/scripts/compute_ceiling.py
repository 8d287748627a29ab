from harness.util import log_to

log_to(snakemake.log[0])

import sys

import json
from pathlib import Path

from harness.box import pagecache
from harness.stages.ceilings import llama_bench
from harness.profiles import cpu_quota_of, profile_limits
from harness.models.staging import staged_model
from harness.util import resolve_wait_policy
from harness.util import atomic_write_json

cfg = snakemake.params.config
manifest = json.loads(Path(snakemake.input.manifest).read_text())
threads = cfg["profiles"][cfg["profile"]]["threads"]
quota = cpu_quota_of(snakemake.input.quota)
dense = staged_model(snakemake.input.dense, snakemake.config)
moe = staged_model(snakemake.input.moe, snakemake.config)


def bench(model, limits, extra=(), **kw):
    return llama_bench(manifest["llama_bench"], model, threads, snakemake.params.tokens, "mmap",
                       limits, manifest["lib_dir"], sys.stderr, extra, **kw)


AUTO = resolve_wait_policy("auto", quota)


def moe_ceilings(name: str, path: str) -> dict:
    """The MoE model fully cached under the quota with --repack 0 and llama-bench's warm-up,
    `repetitions` times, once per OpenMP wait policy the profile's runs use ({policy: record},
    `auto`'s first): the floor takes the fastest, since a policy decides how fast a decode can
    compute (spinning threads are much faster on the tiny models, passive ones under seed-box)."""
    limits = profile_limits(cfg, path, ram=False, cpu_quota=quota)
    pagecache.warm(path)
    wanted = [AUTO] + sorted({resolve_wait_policy(p, quota)
                              for p in snakemake.params.wait_policies} - {AUTO})
    return {p: bench(path, limits, ("--repack", "0"), warmup=True,
                     repetitions=snakemake.params.repetitions, wait_policy=p) for p in wanted}


limits = profile_limits(cfg, dense, cpu_quota=quota)
# dense model: cold (evicted), then warm straight after, as the study did
pagecache.cold_start(dense)
dense_cold = bench(dense, limits)
# repeated: finding 6 compares the best configuration with it, its own noise included
dense_warm = bench(dense, limits, repetitions=snakemake.params.repetitions)
# the MoE model's own compute ceiling: no RAM budget, fully cached. --repack 0 is the harness's
# own kernels (it loads with use_extra_bufts off); the default repack beside it, and the floor
# takes the faster of the two (a mechanism could use the repacked kernels). With
# llama-bench's warm-up: the ceiling is the floor's compute term, and the runs' steady rate
# leaves their first token out too (on a tiny model the first token's start-up work is most of
# an 8-token measurement).
by_policy = {snakemake.params.moe_model: moe_ceilings(snakemake.params.moe_model, moe)}
# repeated like the others: the floor's compute term takes the fastest kernels the build has
moe_warm_repack = bench(moe, profile_limits(cfg, moe, ram=False, cpu_quota=quota), warmup=True,
                        repetitions=snakemake.params.repetitions)
# every other MoE quant the runs use, the same way: its own fully cached decode under the quota
for name, path in zip(snakemake.params.other_moe_models, snakemake.input.other_moe, strict=True):
    path = staged_model(path, snakemake.config)
    by_policy[name] = moe_ceilings(name, path)
    pagecache.evict(path)
atomic_write_json(snakemake.output[0], {
    "dense_model": snakemake.params.dense_model, "moe_model": snakemake.params.moe_model,
    "cpu_quota": quota,
    "dense_cold": dense_cold, "dense_warm": dense_warm,
    # under the wait policy `auto` chose; the others the runs use in moe_warm_policies
    "moe_warm": by_policy[snakemake.params.moe_model][AUTO],
    "moe_warm_default_repack": moe_warm_repack,
    "moe_warm_other": {name: recs[AUTO] for name, recs in by_policy.items()
                       if name != snakemake.params.moe_model},
    "moe_warm_policies": {name: {p: r for p, r in recs.items() if p != AUTO}
                          for name, recs in by_policy.items()},
    "build": {k: manifest[k] for k in ("commit", "patch_sha256", "key")},
})
