"""How far a figure moves between two jobs: a study's configurations against the same ones of an
earlier study (identical resolved specs), each a ratio of geometric-mean steady tok/s with a 90%
interval from both jobs' repeats, and the finding tables' ratios side by side. The intervals a
single job reports describe repeats run back to back; this says what the next job does.

    python -m harness.analysis.reproducibility NEW_REFERENCE OLD_REFERENCE [--out CSV_DIR]

Each reference is a committed copy (`reference/<machine>-<date>`: its results/final/runs.csv and
tables). A configuration is matched by run id and profile, and only where every measured run
parameter both tables carry is the same (a parameter an older table lacks is taken at its
declared default, as the record reader does); the rest are listed as not comparable.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from harness import parameters
from harness.analysis import flags, stats
from harness.contract import Status

VALUE = "steady_tok_per_s"
# a finding table's column that holds a ratio (what its verdict judged)
RATIO_COLUMN = re.compile(r"^ratio$|_over_|speedup|^gap_x$")
TEXT_COLUMNS = ("verdict", "why", "statuses", "claim")


def _judged(runs: pd.DataFrame) -> pd.DataFrame:
    """The ok repeats a study judged: not disturbed (a re-run replaces a disturbed repeat)."""
    ok = runs[(runs.status == Status.OK.value) & (runs[VALUE] > 0)]
    disturbed = (ok["disturbed"].astype(str).str.lower() == "true" if "disturbed" in ok
                 else flags.disturbed(ok))
    return ok[~disturbed]


def _canonical(name: str, v) -> str:
    """A parameter's value as one string whichever table it was read from (2 and 2.0 alike)."""
    v = parameters.current_value(name, v)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _spec(runs: pd.DataFrame) -> pd.DataFrame:
    """Per run id and profile, its measured parameters as strings; a parameter the table lacks
    at its declared default (none declared: not compared)."""
    out = runs.drop_duplicates(["run_id", "profile"]).set_index(["run_id", "profile"])
    cols = {}
    for p in parameters.PARAMETERS:
        if not p.measured:
            continue
        if p.name in out:
            cols[p.name] = out[p.name].map(lambda v, n=p.name: _canonical(n, v))
        elif p.default is not None:
            cols[p.name] = _canonical(p.name, p.default)
    return pd.DataFrame(cols, index=out.index)


def configurations(new_runs: pd.DataFrame, old_runs: pd.DataFrame) -> pd.DataFrame:
    """Every configuration of the new study beside the same one of the old: the ratio new/old of
    geometric-mean steady tok/s and its 90% Welch interval from each side's own repeats;
    `comparable` false (and why) where the old study has no such run id or its spec differs."""
    new, old = _judged(new_runs), _judged(old_runs)
    spec_new, spec_old = _spec(new_runs), _spec(old_runs)
    rows = []
    for (rid, profile), g in new.groupby(["run_id", "profile"], sort=True):
        row = {"run_id": rid, "profile": profile, "n_new": len(g),
               "new_median": float(g[VALUE].median()), "cpu_quota_new": _quota(g)}
        o = old[(old.run_id == rid) & (old.profile == profile)]
        if (rid, profile) not in spec_old.index or o.empty:
            rows.append({**row, "comparable": False, "why": "not in the old study"})
            continue
        a, b = spec_new.loc[(rid, profile)], spec_old.loc[(rid, profile)]
        differ = [k for k in a.index if k in b.index and a[k] != b[k]]
        if differ:
            rows.append({**row, "comparable": False,
                         "why": "spec differs: " + ", ".join(f"{k} {b[k]} -> {a[k]}"
                                                              for k in differ)})
            continue
        iv = _ratio(np.log(g[VALUE].to_numpy(float)), np.log(o[VALUE].to_numpy(float)))
        ratio, low, high = iv.ratio
        rows.append({**row, "n_old": len(o), "old_median": float(o[VALUE].median()),
                     "cpu_quota_old": _quota(o),
                     "ratio": ratio, "ratio_ci90_low": low, "ratio_ci90_high": high,
                     "moved": bool(low > 1 or high < 1), "comparable": True, "why": ""})
    return pd.DataFrame(rows)


def _quota(runs: pd.DataFrame) -> float:
    """The CPU quota the runs were held to (each job calibrates its own: on another machine the
    same target is another quota); nan for none."""
    if "cpu_quota" not in runs:
        return float("nan")
    q = pd.to_numeric(runs["cpu_quota"], errors="coerce")
    return float(q.median()) if q.notna().any() else float("nan")


def _ratio(new_logs: np.ndarray, old_logs: np.ndarray) -> stats.Interval:
    """Welch's interval of the difference of mean logs; a side of one run borrows the other's
    variance (one run has none of its own)."""
    na, nb = len(new_logs), len(old_logs)
    va = new_logs.var(ddof=1) if na > 1 else float("nan")
    vb = old_logs.var(ddof=1) if nb > 1 else float("nan")
    va, vb = (vb if va != va else va), (va if vb != vb else vb)
    est = float(new_logs.mean() - old_logs.mean())
    if not (va == va and vb == vb):
        return stats.Interval(est, float("nan"), 0, na, nb, "one run a side")
    sa, sb = va / na, vb / nb
    se = math.sqrt(sa + sb)
    da, db = max(na - 1, 1), max(nb - 1, 1)
    return stats.Interval(est, se, stats.welch_df(sa, sb, da, db), na, nb,
                          "Welch, each job's own repeats")


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per profile and over all: how many configurations compared, the median and largest move
    (|ratio - 1|), and how many moved beyond their interval (the interval excludes 1)."""
    c = table[table.comparable.astype(bool)] if len(table) else table
    if c.empty:
        return pd.DataFrame(columns=["profile", "configurations", "median_move_fraction",
                                     "largest_move_fraction", "largest_move_run_id",
                                     "moved_configurations"])
    rows = []
    for profile, g in [*c.groupby("profile"), ("all", c)]:
        move = (g.ratio - 1).abs()
        rows.append({"profile": profile, "configurations": len(g),
                     "cpu_quota_old": float(g.cpu_quota_old.median()),
                     "cpu_quota_new": float(g.cpu_quota_new.median()),
                     "median_move_fraction": float(move.median()),
                     "largest_move_fraction": float(move.max()),
                     "largest_move_run_id": g.loc[move.idxmax(), "run_id"],
                     # moved beyond its interval: the repeats of one job do not explain it
                     "moved_configurations": int(g.moved.sum())})
    return pd.DataFrame(rows)


def finding_ratios(new_tables: Path, old_tables: Path) -> pd.DataFrame:
    """Each ratio a finding table holds (finding*.csv under each regime's tables), new beside
    old, rows matched by the table's text columns (its run ids and labels); verdicts beside."""
    rows = []
    for path in sorted(new_tables.glob("*/finding*.csv")):
        old_path = old_tables / path.parent.name / path.name
        if not old_path.exists():
            continue
        new, old = pd.read_csv(path), pd.read_csv(old_path)
        ratios = [c for c in new.columns if RATIO_COLUMN.search(c) and c in old
                  and pd.api.types.is_numeric_dtype(new[c])]
        keys = [c for c in new.columns if c in old and c not in TEXT_COLUMNS
                and (pd.api.types.is_string_dtype(new[c]) or new[c].dtype == object)]
        if not ratios or not keys:
            continue
        merged = new.merge(old, on=keys, suffixes=("_new", "_old"))
        for _, r in merged.iterrows():
            for c in ratios:
                rows.append({"regime": path.parent.name, "table": path.stem,
                             "row": "; ".join(f"{k}={r[k]}" for k in keys), "column": c,
                             "old": r[f"{c}_old"], "new": r[f"{c}_new"],
                             "new_over_old": r[f"{c}_new"] / r[f"{c}_old"]
                             if r[f"{c}_old"] else float("nan"),
                             "verdict_old": r.get("verdict_old"), "verdict_new": r.get("verdict_new")})
    return pd.DataFrame(rows)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("new", help="the new reference (reference/<machine>-<date>)")
    ap.add_argument("old", help="the earlier reference")
    ap.add_argument("--out", help="write reproducibility.csv, reproducibility_summary.csv and "
                    "reproducibility_findings.csv here (default: into the new reference)")
    a = ap.parse_args(argv)
    new, old = Path(a.new), Path(a.old)
    table = configurations(pd.read_csv(new / "results/final/runs.csv"),
                           pd.read_csv(old / "results/final/runs.csv"))
    out = Path(a.out) if a.out else new
    out.mkdir(parents=True, exist_ok=True)
    table.round(4).to_csv(out / "reproducibility.csv", index=False)
    summ = summary(table)
    summ.round(4).to_csv(out / "reproducibility_summary.csv", index=False)
    fr = finding_ratios(new / "results/final/tables", old / "results/final/tables")
    fr.round(4).to_csv(out / "reproducibility_findings.csv", index=False)
    print(summ.to_markdown(index=False, floatfmt=".3f"))
    print(f"\n{int((~table.comparable.astype(bool)).sum())} configurations not comparable; "
          f"{len(fr)} finding ratios side by side; written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
