"""Where a study's time goes: per run, the model's load, the prompt, the first generated token,
the warm-up, the measured window and the rest of the measured process; and, given the whole
job's elapsed time, what ran outside the runs (building, models, ceilings, checks, analysis).
The README's cost table is `python -m harness.analysis.cost RESULTS_DIR [main_job.json]`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from harness.record import measured_window, read_run

PHASES = ("load", "prompt", "first token", "warm-up", "measured window", "past the window",
          "rest of the run")


def run_phases(record_path: Path) -> dict:
    """Seconds of one run in each phase (PHASES)."""
    rec = read_run(record_path)
    tok = pd.read_csv(Path(record_path).parent / "tokens.csv")
    gen = tok[tok.phase == "gen"]
    warmup = rec.spec.warmup_tokens
    window = float(measured_window(gen, warmup).wall_s.sum()) if len(gen) > warmup else 0.0
    first = float(gen.wall_s.iloc[0]) if len(gen) else 0.0
    warm = float(gen.wall_s.iloc[1:warmup].sum()) if len(gen) > warmup else \
        float(gen.wall_s.iloc[1:].sum())
    load = rec.summary.load_s or 0.0
    prompt = float(tok[tok.phase == "prompt"].wall_s.sum())
    total = rec.wall_s or 0.0
    past = float(tok[tok.phase == "later"].wall_s.sum())  # the first repeat's later_tokens
    parts = {"load": load, "prompt": prompt, "first token": first, "warm-up": warm,
             "measured window": window, "past the window": past}
    parts["rest of the run"] = max(0.0, total - sum(parts.values()))
    return parts


def study_cost(results: Path, elapsed_s: float | None = None) -> pd.DataFrame:
    """Seconds and share of the study per phase, over every run record under results/runs
    (re-runs included); with the job's elapsed time, a last row for what ran outside the runs,
    and shares of the whole job."""
    rows = [run_phases(p) for p in sorted(Path(results).glob("runs/*/re*/run.json"))]
    sums = pd.DataFrame(rows, columns=list(PHASES)).sum()
    out = pd.DataFrame({"phase": list(PHASES), "seconds": [float(sums[p]) for p in PHASES]})
    if elapsed_s is not None:
        out.loc[len(out)] = ["outside the runs", max(0.0, elapsed_s - out.seconds.sum())]
    out["share"] = out.seconds / out.seconds.sum()
    out.attrs["runs"] = len(rows)
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    elapsed = (json.loads(Path(argv[1]).read_text())["elapsed_s"] if len(argv) > 1 else None)
    t = study_cost(Path(argv[0]), elapsed)
    print(f"{t.attrs['runs']} runs" + (f", job {elapsed / 60:.0f} min" if elapsed else ""))
    print(t.assign(seconds=t.seconds.round(0), share=(100 * t.share).round(1)).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
