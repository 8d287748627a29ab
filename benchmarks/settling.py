"""How per-token time and bytes read settle over a long decode, per regime: the data the steady
window (warm-up tokens, measured tokens) is chosen from (docs/benchmarks.md, "Settling").

    .venv/bin/python benchmarks/settling.py OUT [--tokens 96] [--repeats 2]

Runs, with the pipeline's own supervisor and worker, each configuration named in CONFIGS under
each regime of config/experiments.yaml, cold, in a fresh cgroup with the profile's limits and
the CPU quota the pipeline calibrated (results/ceilings/<profile>/cpu_quota.json), for `--tokens`
generated tokens. Every repeat round runs all configurations of both regimes before the next
round starts, so a session cut short still has one repeat of each. A finished run (its run.json)
is not measured again: the script resumes where it stopped. Each run keeps run.json, tokens.csv,
experts.csv (the routing trace a window's floor is computed from) and worker.log under
OUT/<run_id>/rep<k>/.

Needs what `snakemake --cores 2 results/ceilings/<profile>/cpu_quota.json` makes for every
profile (the build, the models and their layouts, the calibrated quotas); measure on a quiet box.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml

from harness.config import cpu_quota_of, expand, profile_limits
from harness.run import supervise

# run ids of config/experiments.yaml (before `@<profile>`): the study's best (pread+madvise with
# the non-expert tensors mlocked), demand paging, odirect-cache and the LRU at its largest swept
# budget; and per regime its own best of the reference run where that is another one
CONFIGS = {"seed-box": ["pread-madvise-mlock", "baseline", "odirect-cache", "lru--lru-budget-mb-900"],
           "disk-box": ["pread-madvise-mlock", "baseline", "odirect-cache", "lru--lru-budget-mb-900",
                        "madvise"]}


def specs(config: dict, tokens: int) -> list:
    """(profile, RunSpec) of every configuration measured, in run order within a round."""
    by_id = {r.run_id: r for r in expand(config)}
    out = []
    for profile, ids in CONFIGS.items():
        for rid in ids:
            r = by_id[f"{rid}@{profile}"]
            # long runs: the reference's 1800 s limit would stop the slowest
            out.append((profile, dataclasses.replace(r, tokens=tokens, time_limit_s=3 * 3600)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--config", type=Path, default=ROOT / "config/experiments.yaml")
    a = ap.parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s")
    config = yaml.safe_load(a.config.read_text())
    manifest = json.loads((ROOT / "results/build/llama.json").read_text())
    plan = specs(config, a.tokens)
    total, done = a.repeats * len(plan), 0
    t_start = time.monotonic()
    for k in range(1, a.repeats + 1):
        for profile, r in plan:
            out = a.out / r.run_id / f"rep{k}"
            done += 1
            if (out / "run.json").exists():
                continue
            model = ROOT / "results/models" / f"{r.model}.gguf"
            info = json.loads(model.with_suffix(".json").read_text())
            quota = cpu_quota_of(str(ROOT / f"results/ceilings/{profile}/cpu_quota.json"))
            limits = profile_limits(config, info["path"], cpu_quota=quota, profile=profile)
            spec = {**r.as_dict(), "repeat": k}
            logging.info(f"settling: run {done} of {total}: {r.run_id} rep {k} "
                         f"({a.tokens} tokens, quota {quota}), {time.monotonic() - t_start:.0f} s in")
            supervise.run(spec, out, lib_dir=manifest["lib_dir"], build=manifest, model_info=info,
                          layout_path=str(model.with_name(model.stem + ".layout.json")),
                          limits=limits, time_limit_s=spec["time_limit_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
