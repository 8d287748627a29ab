"""Repeats the machine disturbed, by recorded counters (not guessed): they are left out of the
verdicts, never out of the tables, and measured once more at the end of the study (rule
harness_rerun); runs.csv's `flag_reason` says why."""

from __future__ import annotations

import pandas as pd

DISTURBED_READ_BYTES = 50e6  # foreign reads above this, and above 1% of the run's own: disturbed
MEAN_MEDIAN_GAP = 0.10  # a run whose mean and median steady token differ by more is flagged
STEAL_BOUND = 0.05  # CPU steal over this share of the machine's CPU time (CPUs x wall) flags it


def foreign_read(device_read_bytes, cgroup_read_bytes) -> float:
    """Bytes the whole disk read during the run beyond what the run's cgroup read (nan unknown)."""
    dev, own = device_read_bytes, cgroup_read_bytes
    return float(dev - own) if dev is not None and own is not None and own >= 0 else float("nan")


def disturbed(runs: pd.DataFrame) -> pd.Series:
    """Something else read the run's disk, the host stole more than STEAL_BOUND of its CPUs, its
    mean and median steady token disagree by more than MEAN_MEDIAN_GAP (a stall inside the run),
    or its window drifted (harness.analysis.steady)."""
    return flag_reason(runs) != ""


def flag_reason(runs: pd.DataFrame) -> pd.Series:
    out = pd.Series("", index=runs.index)

    def add(mask, why):
        nonlocal out
        mask = mask.fillna(False).astype(bool)
        out = out.where(~mask, out.where(out == "", out + "; ") + why)

    if "foreign_read_bytes" in runs:
        own = runs.get("cgroup_read_bytes_per_token", 0) * runs.get("tokens_completed", 0)
        f = runs.foreign_read_bytes
        add((f > DISTURBED_READ_BYTES) & (f > 0.01 * own.fillna(0)), "foreign disk reads")
    if "cpu_steal_s" in runs and "run_wall_s" in runs:
        # steal is counted over every CPU of the machine; a table from before machine_cpus was a
        # column was measured on 2
        cpus = runs["machine_cpus"].fillna(2) if "machine_cpus" in runs else 2
        add(runs.cpu_steal_s / (cpus * runs.run_wall_s) > STEAL_BOUND, "CPU steal")
    if "mean_median_gap" in runs:
        add(runs.mean_median_gap > MEAN_MEDIAN_GAP, "mean and median token disagree")
    if "window_steady" in runs:
        steady_ = runs.window_steady.map(lambda v: v if isinstance(v, bool) else
                                         str(v).lower() != "false")
        add(~steady_, "window not steady (its per-token time drifts)")
    return out
