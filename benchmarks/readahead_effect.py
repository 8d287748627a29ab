"""Benchmark (not a test): what the device's read-ahead does to demand paging and to pread+madvise.

Runs `none` and `pread+madvise` on a model at read_ahead_kb 128 (the kernel's default, seed-box)
and at the device's own value, under the same RAM budget, read/write throttle and CPU quota as the
profile in force, interleaved (every configuration once per round), and prints one JSON line per
run and a table of medians: tok/s, major faults and disk bytes per generated token.

    python benchmarks/readahead_effect.py results/models/olmoe-q4.gguf [rounds] [tokens]

The CPU quota is the pipeline's calibrated one for the config's first profile
(results/ceilings/<profile>/cpu_quota.json) when present.
"""

import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd
import yaml

from harness.box import conditions
from harness.run import supervise
from harness.config import adhoc_spec, study_profiles
from harness.profiles import cpu_quota_of, profile_limits
from harness.box.limits import block_device_of


def main():
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
    model = Path(sys.argv[1]).resolve()
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    cfg = yaml.safe_load((ROOT / "config/experiments.yaml").read_text())
    manifest = json.loads((ROOT / "results/build/llama.json").read_text())
    info = json.loads(model.with_suffix(".json").read_text())
    layout = str(model.with_name(model.stem + ".layout.json"))
    profile = study_profiles(cfg)[0]
    quota_file = ROOT / f"results/ceilings/{profile}/cpu_quota.json"
    quota = cpu_quota_of(str(quota_file)) if quota_file.exists() else None
    device_kb = conditions.DeviceReadahead(block_device_of(model), None).current_kb()
    configs = [(m, ra) for m in ("none", "pread+madvise") for ra in sorted({128, device_kb})]
    rows = []
    for k in range(1, rounds + 1):
        for mech, ra in configs:
            limits = profile_limits(cfg, str(model), cpu_quota=quota)
            limits.read_ahead_kb = ra
            spec = adhoc_spec(f"ra{ra}-{mech}", info["name"], mech, entry="bench", tokens=tokens,
                              log_experts=False, repeat=k)
            with tempfile.TemporaryDirectory(dir=model.parent) as d:
                rec = supervise.run(spec, Path(d) / "run", lib_dir=manifest["lib_dir"], build=manifest,
                                    model_info=info, layout_path=layout, limits=limits,
                                    time_limit_s=3600)
                tok = pd.read_csv(Path(d) / "run" / "tokens.csv")
            gen = tok[tok.phase == "gen"]
            row = {"round": k, "mechanism": mech, "read_ahead_kb": rec.limits_in_force["read_ahead_kb"],
                   "status": rec.status, "tok_per_s": len(gen) / gen.wall_s.sum(),
                   "majflt_per_token": gen.majflt.mean(),
                   "disk_bytes_per_token": gen.cgroup_read_bytes.mean(),
                   "routed_bytes_per_token": gen.bytes_routed.mean()}
            rows.append(row)
            print(json.dumps(row), flush=True)
    df = pd.DataFrame(rows)
    summary = df.groupby(["mechanism", "read_ahead_kb"]).agg(
        tok_per_s=("tok_per_s", statistics.median), tok_per_s_min=("tok_per_s", "min"),
        tok_per_s_max=("tok_per_s", "max"), majflt_per_token=("majflt_per_token", statistics.median),
        disk_bytes_per_token=("disk_bytes_per_token", statistics.median)).reset_index()
    summary["read_amplification"] = summary.disk_bytes_per_token / df.routed_bytes_per_token.iloc[0]
    print(summary.to_string(index=False))
    print(json.dumps({"profile": profile, "cpu_quota": quota, "tokens": tokens,
                      "rounds": rounds, "device_read_ahead_kb": device_kb}))


if __name__ == "__main__":
    main()
