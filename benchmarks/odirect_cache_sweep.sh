#!/bin/bash
# Benchmark (not a test): odirect-cache's budget, prediction and warm start by hand, one cold run
# each, beside the study's best (pread+madvise+mlock), under a profile's limits.
#
#   benchmarks/odirect_cache_sweep.sh MODEL MANIFEST OUT [CPU_QUOTA]
#
# MODEL: results/models/olmoe-q4.gguf; MANIFEST: results/build/llama.json; CPU_QUOTA: none for
# disk-box, results/ceilings/seed-box/cpu_quota.json's value for seed-box. The limits are
# seed-box's and disk-box's own (config/experiments.yaml). Prints a table per run; the records
# are in OUT/<label>/. Run on a quiet box: nothing else measuring, no test suite.
set -euo pipefail
model=$1 manifest=$2 out=$3 quota=${4:-}
cd "$(dirname "$0")/.."
mkdir -p "$out"
limits=(--ram-budget 1.7GiB --read-bps 150MB --write-bps 150MB --read-ahead-kb 128 -t 2)
[ -n "$quota" ] && limits+=(--cpu-quota "$quota")
run() {
  local label=$1; shift
  echo "== $label $(date -u +%T)" >&2
  .venv/bin/python -m harness -m "$model" -n 6 -q "${limits[@]}" --manifest "$manifest" \
    -o "$out/$label" "$@" > "$out/$label.json" 2> "$out/$label.err"
}
run pm-mlock --mechanism pread+madvise --mlock-non-expert
run odc900-p8-warm --mechanism odirect-cache --cache-budget-mb 900 --predict-experts 8
for p in 8 4 0; do
  run "odc1200-p$p-warm-mlock" --mechanism odirect-cache --cache-budget-mb 1200 \
    --predict-experts "$p" --mlock-non-expert
done
.venv/bin/python - "$out" <<'PY'
import sys
from pathlib import Path
import pandas as pd
rows = []
for d in sorted(p for p in Path(sys.argv[1]).iterdir() if p.is_dir()):
    g = pd.read_csv(d / "tokens.csv").query("phase == 'gen'").iloc[1:]  # steady tokens
    wall = g.wall_s.sum()
    rows.append({"run": d.name, "steady_tok_s": len(g) / wall,
                 "disk_MB_per_token": g.cgroup_read_bytes.mean() / 1e6,
                 "io_wait_share": g.io_wait_s.sum() / wall,
                 "cg_user_cpu_s_per_token": g.cg_user_s.mean(),
                 "cg_sys_cpu_s_per_token": g.cg_sys_s.mean(),
                 "peak_rss_MiB": g.rss_bytes.max() / 2**20})
print(pd.DataFrame(rows).round(3).to_string(index=False))
PY
