"""Which runs are one configuration, at which length the findings judge them, and the summary
of each run id's repeats."""

from __future__ import annotations


import pandas as pd

from harness.contract import Status
from harness import parameters



WIDE_SPREAD = 0.25  # (max-min)/median above this: flagged `wide_spread` in the summary table


def _spec_key(runs: pd.DataFrame, leave_out: tuple = ()) -> pd.Series:
    """Per run, its resolved spec as one string (profile, model and every run parameter the table
    carries, `auto` resolved as the record holds it), less the parameters that are not measured
    (parameters.NOT_MEASURED) and `leave_out`. A table
    without every parameter (an older runs.csv, a hand-made one) cannot say which run ids share a
    spec: each run id is its own."""
    keys = [c for c in ("profile", "model", *parameters.RUN_KEYS)
            if c not in (*parameters.NOT_MEASURED, *leave_out)]
    if not set(keys) <= set(runs):
        return runs.run_id
    return runs[keys].astype(str).agg("\x1f".join, axis=1)


def at_study_length(runs: pd.DataFrame) -> pd.Series:
    """Per run, whether the speed findings judge it at its length. Each profile's runs are
    compared at that profile's most common length (its profile's `run_defaults` may set one of
    its own); a configuration measured only at another length (the LRU's shorter window) is judged
    at its own; a run of another length beside runs of its configuration at the common length (a
    longer routing trace) is not."""
    if runs.empty:
        return pd.Series(dtype=bool)
    # the longest of equally common lengths: a longer window is the steadier figure
    common = runs.groupby("profile").tokens.agg(lambda t: t.mode().iloc[-1])
    at_common = runs.tokens == runs.profile.map(common)
    has_common = at_common.groupby(_spec_key(runs, leave_out=("tokens",))).transform("any")
    return (at_common | ~has_common).rename("at_study_length")


def configuration_ids(runs: pd.DataFrame) -> pd.Series:
    """Per run, the configuration it measures: runs whose resolved spec is the same (profile,
    model and every run parameter the table carries, `auto` resolved as the record holds it,
    repeats and time limit aside) are one configuration, named by the first of their run ids
    in sorted order, whatever ids they were measured under."""
    if runs.empty:
        return pd.Series(dtype=str)
    key = _spec_key(runs)
    first = runs.assign(_key=key).groupby("_key").run_id.min()
    return key.map(first).rename("configuration")


def merged_configurations(runs: pd.DataFrame) -> pd.DataFrame:
    """The configurations measured under more than one run id, and those ids."""
    conf = runs["configuration"] if "configuration" in runs else configuration_ids(runs)
    ids = runs.assign(configuration=conf).groupby("configuration").run_id.unique()
    rows = [{"configuration": c, "run_ids": ", ".join(sorted(v)), "runs": int((conf == c).sum())}
            for c, v in ids.items() if len(v) > 1]
    return pd.DataFrame(rows, columns=["configuration", "run_ids", "runs"])


def summarize(runs: pd.DataFrame, value: str = "tok_per_s") -> pd.DataFrame:
    """Median and min-max of `value` over the ok repeats of each run id; flags wide spread."""
    ok = runs[runs.status == Status.OK.value]
    g = ok.groupby("run_id")[value]
    out = pd.DataFrame({"median": g.median(), "min": g.min(), "max": g.max(), "n": g.count()})
    out["spread"] = (out["max"] - out["min"]) / out["median"].where(out["median"] != 0)
    out["wide_spread"] = out["spread"] > WIDE_SPREAD
    # every run id, also those with no ok repeat (all killed): their statuses are the result
    statuses = runs.groupby("run_id")["status"].agg(lambda s: ",".join(sorted(set(s))))
    out = out.reindex(statuses.index)
    out["n"] = out["n"].fillna(0).astype(int)
    first = runs.drop_duplicates("run_id").set_index("run_id")
    for col in ("profile", "quant", "synthetic", *parameters.RUN_KEYS):
        if col in first:  # hand-made tables and older runs tables may carry only some of them
            out[col] = first[col]
    out["statuses"] = statuses
    return out.reset_index()


def writes_share_the_disk(runs: pd.DataFrame, share: float = 0.5) -> tuple[bool, str]:
    """Did the runs' own cgroup write (and so get throttled for) the pages they dirtied? On cgroup
    v1 buffered writeback is issued from the root cgroup, so the run's cgroup sees almost none."""
    dirtied = runs.get("dirtied_bytes_per_token", pd.Series(dtype=float)).median()
    written = runs.get("cgroup_write_bytes_per_token", pd.Series(dtype=float)).median()
    if pd.isna(dirtied) or pd.isna(written):
        return False, "write counters not recorded"
    if dirtied <= 0:
        return False, "the runs dirtied no pages"
    frac = written / dirtied
    if frac >= share:
        return True, f"the run's cgroup wrote {frac:.0%} of the bytes it dirtied"
    return False, (f"writeback not throttled: the run's cgroup wrote {frac:.1%} of the "
                   f"{dirtied / 1e6:.0f} MB/token it dirtied (cgroup v1 flushers write from root)")
