"""Progress a person can plan by: which run of how many this is, and the time the study has left,
from the expected cost of a run, corrected by the runs already finished."""

from __future__ import annotations

import statistics
from pathlib import Path

from harness.record import read_run

# a run's wall time before any has finished here (the second reference run: ~3.4 min at 16
# tokens under seed-box, about half at 6 tokens); replaced by the finished runs' own times
EXPECTED_RUN_S = 120.0


def finished_walls(run_dirs: list[str], root: Path = Path(".")) -> list[float]:
    walls = []
    for d in run_dirs:
        rec = root / d / "run.json"
        if rec.exists():
            try:
                wall = read_run(rec).wall_s
            except (OSError, ValueError):
                continue
            if wall is not None:
                walls.append(float(wall))
    return walls


def line(run_dirs: list[str], this_dir: str, root: Path = Path(".")) -> str:
    """'run 12 of 60 (...), ~1 h 40 min left': this run counted as not yet finished."""
    walls = finished_walls([d for d in run_dirs if d != this_dir], root)
    total, done = len(run_dirs), len(walls)
    per_run = statistics.median(walls) if walls else EXPECTED_RUN_S
    left_s = (total - done) * per_run
    basis = (f"median of {done} finished run(s) {per_run:.0f} s" if walls
             else f"expected {per_run:.0f} s a run")
    return (f"run {done + 1} of {total} ({this_dir}): about {_hm(left_s)} of runs left, this one "
            f"included ({basis})")


def _hm(seconds: float) -> str:
    m = int(round(seconds / 60))
    return f"{m // 60} h {m % 60} min" if m >= 60 else f"{m} min"
