"""The expert cache beside demand paging and madvise, from runs benchmarks/settling.py made:
per run the measured window's rate (tokens 5-36) and the 16 tokens after it, the window's bytes
read (the cgroup's and the mechanism's), the token's parts, and for a cache its own policy's
replay at its own capacity on its own routing (and LRU's, at the same capacity).

    .venv/bin/python benchmarks/settling.py OUT --tokens 52 --warmup 4 --config CONFIG \\
        --only baseline@disk-box,madvise@disk-box,expert-cache@disk-box,baseline@seed-box,expert-cache@seed-box
    .venv/bin/python benchmarks/expert_cache.py OUT results/models/olmoe-q4.layout.json

Writes OUT/summary.csv (per run) and OUT/ratios.csv (each ratio with its 90% Welch interval on
log tok/s) and prints both.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np
import pandas as pd
from scipy import stats

from harness.analysis import policies, window
from harness.analysis.attribution import run_attribution
from harness.record import read_run

WARMUP, WINDOW = 4, 32


def row(rec_path: Path, slab: dict) -> dict:
    rec = read_run(rec_path)
    tok = pd.read_csv(rec_path.parent / "tokens.csv")
    gen = tok[tok.phase == "gen"].reset_index(drop=True)
    win, later = gen.iloc[WARMUP:WARMUP + WINDOW], gen.iloc[WARMUP + WINDOW:]
    rate = window.steady_rate(gen.iloc[:WARMUP + WINDOW], WARMUP)  # as runs.csv figures it
    parts = run_attribution(gen.iloc[:WARMUP + WINDOW], WARMUP)
    out = {"run_id": rec.run_id, "repeat": rec.spec.repeat, "status": rec.status,
           "window_tok_s": rate,
           "later_tok_s": len(later) / later.wall_s.sum() if len(later) else float("nan"),
           "window_cgroup_read_bytes": win.cgroup_read_bytes.mean(),
           "window_mechanism_read_bytes": win.bytes_read.mean(),
           **{f"{k}_s": parts[f"{k}_share"] / rate for k in ("user", "kernel", "throttled",
                                                             "io_wait")},
           "cache_capacity_bytes": rec.summary.cache_capacity_bytes or 0}
    if rec.spec.mechanism == "odirect-cache" and rec.summary.cache_capacity_bytes:
        steps = policies.decode_steps(pd.read_csv(rec_path.parent / "experts.csv"),
                                      len(rec.summary.prompt_tokens))
        for label, policy in (("replay_own_policy_bytes", rec.spec.cache_policy),
                              ("replay_lru_bytes", "lru")):
            read = policies.replay(steps, slab, rec.summary.cache_capacity_bytes, policy)
            out[label] = policies.window_bytes(read, WARMUP, WARMUP + WINDOW)
    return out


def ratio(t: pd.DataFrame, a: str, b: str) -> tuple[float, float, float]:
    """a's tok/s over b's: the ratio of geometric means and its 90% Welch interval."""
    x, y = (np.log(t[t.run_id == r].window_tok_s) for r in (a, b))
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    df = (va + vb) ** 2 / (va ** 2 / (len(x) - 1) + vb ** 2 / (len(y) - 1))
    d, h = x.mean() - y.mean(), stats.t.ppf(0.95, df) * np.sqrt(va + vb)
    return float(np.exp(d)), float(np.exp(d - h)), float(np.exp(d + h))


def main(argv: list[str]) -> int:
    out, layout = Path(argv[0]), json.loads(Path(argv[1]).read_text())
    slab = {int(k): v for k, v in layout["slab_bytes_per_layer"].items()}
    t = pd.DataFrame([row(p, slab) for p in sorted(out.glob("*/rep*/run.json"))])
    t.to_csv(out / "summary.csv", index=False)
    print(t.round(3).to_string(index=False))
    rows = []
    for a, b in (("expert-cache@disk-box", "baseline@disk-box"),
                 ("expert-cache@disk-box", "madvise@disk-box"),
                 ("expert-cache@seed-box", "baseline@seed-box")):
        if {a, b} <= set(t.run_id):
            r, lo, hi = ratio(t, a, b)
            rows.append({"comparison": f"{a} over {b}", "ratio": r, "ratio_ci90_low": lo,
                         "ratio_ci90_high": hi})
    ratios = pd.DataFrame(rows)
    ratios.to_csv(out / "ratios.csv", index=False)
    print(ratios.round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
