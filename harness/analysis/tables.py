"""The tables RESULTS.md shows beside the findings, computed from the runs, ceilings and
records: what the report prints, with every median, ratio and share worked out here, so that
harness.report.results only renders."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness import profile_keys
from harness.analysis import configurations, flags, floors, stats
from harness.contract import Status

# the MoE compute ceiling's measurement, as compute_ceiling names its rows
MOE_ROW = "MoE fully cached, no RAM budget, --repack 0 (the harness's kernels)"
REPACK_ROW = "MoE fully cached, no RAM budget, default repack"
WITHIN_TARGET = 0.2  # a dense ceiling within 20% of the calibration's target reached it


@dataclass(frozen=True)
class CeilingTables:
    """One regime's ceilings: the I/O samples (sequential, random), each read path's fastest
    rate, the compute ceilings' table and each MoE model's fastest fully cached rate."""

    io_sequential: pd.DataFrame
    io_random: pd.DataFrame
    io_mb_s_median: float
    io_by_path: dict[str, float]
    compute: pd.DataFrame
    moe_ceiling: dict[str, float]
    dense_warm_tok_s: float
    # the dense warm ceiling's repetitions (tok/s each): finding 6's ceiling with its own noise
    dense_warm_samples: tuple = ()

    def compute_row(self, measurement: str) -> float:
        rows = self.compute[self.compute.measurement == measurement].tok_per_s
        return float(rows.iloc[0]) if len(rows) else float("nan")


def _ceiling_row(measurement: str, model: str, rec: dict | None, quota) -> dict:
    # a record from before these switches: one repetition, --no-warmup, the `auto` policy
    rec = rec or {}
    return {"measurement": measurement, "model": model, "tok_per_s": rec.get("tok_per_s"),
            "fastest_tok_per_s": rec.get("fastest_tok_per_s", rec.get("tok_per_s")),
            "repetitions": rec.get("repetitions", 1), "warmup": bool(rec.get("warmup", False)),
            "omp_wait_policy": rec.get("omp_wait_policy"), "cpu_quota": quota}


def ceilings(io_csv: str, compute_json: str, read_bps) -> CeilingTables:
    io = pd.read_csv(io_csv)
    compute = json.loads(Path(compute_json).read_text())
    sequential, random = floors.io_patterns(io)
    seq = sequential[[c for c in ("sample", "offset_bytes", "bytes", "mb_per_s", "cpu_ms_per_mb",
                                  "read_bps_limit") if c in sequential]]
    rnd = (random[["sample", "access", "queue_depth", "block_bytes", "bytes", "mb_per_s",
                   "cpu_ms_per_mb", "read_bps_limit", "cpu_quota"]] if len(random) else random)
    quota = compute.get("cpu_quota")
    comp = pd.DataFrame([
        _ceiling_row("dense cold", compute["dense_model"], compute["dense_cold"], quota),
        _ceiling_row("dense warm", compute["dense_model"], compute["dense_warm"], quota),
        _ceiling_row(MOE_ROW, compute["moe_model"], compute["moe_warm"], quota),
        *(_ceiling_row(MOE_ROW, name, rec, quota)
          for name, rec in (compute.get("moe_warm_other") or {}).items()),
        *(_ceiling_row(MOE_ROW, name, rec, quota)
          for name, recs in (compute.get("moe_warm_policies") or {}).items()
          for rec in recs.values()),
        _ceiling_row(REPACK_ROW, compute["moe_model"],
                     compute.get("moe_warm_default_repack"), quota)])
    # read by name, never by row position; the fastest kernels (repacked or the harness's),
    # policy and repetition of each quant: the floor's compute term no mechanism can beat
    moe = comp[comp.measurement.isin([MOE_ROW, REPACK_ROW])].groupby("model").fastest_tok_per_s.max()
    dense = comp[comp.measurement == "dense warm"].tok_per_s
    return CeilingTables(
        io_sequential=seq, io_random=rnd,
        io_mb_s_median=float(pd.to_numeric(seq.mb_per_s, errors="coerce").median()),
        io_by_path=floors.read_path_io_ceilings(io, read_bps), compute=comp,
        moe_ceiling={str(k): float(v) for k, v in moe.items() if v == v},
        dense_warm_tok_s=float(dense.iloc[0]) if len(dense) and dense.iloc[0] is not None
        else float("nan"),
        dense_warm_samples=tuple((compute.get("dense_warm") or {}).get("samples_ts") or ()))


@dataclass(frozen=True)
class Quota:
    """The CPU quota the rule cpu_quota chose, and how close its target it came."""

    record: dict
    dense_tok_s: float  # the dense model's warm ceiling under the quota
    dense_off_target: float | None  # dense ceiling over the target, minus 1
    within_target: bool | None
    steps: pd.DataFrame


def quota(quota_json: str | None, dense_warm_tok_s: float) -> Quota | None:
    if not quota_json:
        return None
    q = json.loads(Path(quota_json).read_text())
    target = q.get("target_tok_s")
    off = dense_warm_tok_s / target - 1 if target else None
    return Quota(q, dense_warm_tok_s, off, abs(off) <= WITHIN_TARGET if off is not None else None,
                 pd.DataFrame(q.get("steps") or []))


SUMMARY_MEDIANS = ("majflt_per_token", "read_amplification", "residency_decode_start",
                   "first_token_s", "kernel_read_vs_missing", "hook_s_per_token",
                   "mechanism_s_per_token")


def configuration_summary(all_runs: pd.DataFrame) -> pd.DataFrame:
    """Every configuration: the median of repeats with min-max (configurations.summarize), the median
    of each column of SUMMARY_MEDIANS, whether its limits were enforced, and the hook's time
    as a share of its median token."""
    summ = configurations.summarize(all_runs)
    for col in SUMMARY_MEDIANS:
        summ = summ.merge(configurations.summarize(all_runs, col)[["run_id", "median"]].rename(
            columns={"median": col}), on="run_id", how="left")
    summ["synthetic"] = summ["synthetic"].astype(bool)
    enforced = (all_runs.groupby("run_id").limits_enforced.all() if "limits_enforced" in all_runs
                else pd.Series(True, index=summ.run_id))
    summ["limits_enforced"] = summ.run_id.map(enforced).fillna(True).astype(bool)
    # how much of a token the hook is: its time per token at the configuration's median rate
    summ["hook_share"] = summ["hook_s_per_token"] * summ["median"]
    return summ


def summary_table(summ: pd.DataFrame) -> pd.DataFrame:
    """RESULTS.md's table of every configuration."""
    return summ[["run_id", "synthetic", "quant", "mechanism", "mlock_non_expert", "log_experts",
                 "tokens", "n", "median", "min", "max", "wide_spread", "majflt_per_token",
                 "read_amplification", "kernel_read_vs_missing", "hook_s_per_token", "hook_share",
                 "mechanism_s_per_token", "statuses", "limits_enforced"]].rename(
        columns={"median": "tok_per_s_median", "min": "tok_per_s_min", "max": "tok_per_s_max"})


def first_token(summ: pd.DataFrame) -> pd.DataFrame:
    """Residency at the first decode and the first token's time beside the median token's."""
    first = summ[["run_id", "residency_decode_start", "first_token_s", "median"]].copy()
    first["median_token_s"] = 1.0 / first.pop("median")
    return first


def disturbed_repeats(all_runs: pd.DataFrame) -> pd.DataFrame:
    dist = all_runs[all_runs.disturbed.astype(bool)]
    return dist.assign(flag_reason=flags.flag_reason(dist))[
        ["run_id", "repeat", "rerun", "start_utc", "flag_reason", "foreign_read_bytes",
         "tok_per_s"]]


def stock_baselines(baseline_jsons: list[str], infos: dict) -> pd.DataFrame:
    rows = []
    for p in baseline_jsons:
        b = json.loads(Path(p).read_text())
        for r in b["runs"]:
            rows.append({"model": b["model"], "synthetic": infos[b["model"]].get("synthetic"),
                         "load_mode": r["load_mode"], "tok_per_s": r.get("tok_per_s"),
                         "status": r.get("status", Status.OK.value if r["exit_code"] == 0
                                         else Status.FAILED.value)})
    return pd.DataFrame(rows)


BOX_COLUMNS = ("read_ahead_kb", "fadvise", "cpu_quota", "damon_pageout_bytes", "device_read_bytes",
               "device_write_bytes", "dirtied_bytes_per_token", "cgroup_write_bytes_per_token")


def box_conditions(runs: pd.DataFrame) -> pd.DataFrame | None:
    """Per configuration, the kernel's conditions (median over repeats, or the first value)."""
    have = [c for c in BOX_COLUMNS if c in runs]
    if not have:
        return None
    g = runs.groupby("run_id")
    return pd.concat([g[c].median() if pd.api.types.is_numeric_dtype(runs[c]) else g[c].first()
                      for c in have], axis=1).reset_index()


def damon_schemes(records: list) -> tuple[dict, pd.DataFrame] | None:
    """Transparent huge pages and the host's DAMON schemes, from the first record that has them."""
    rec = next((r for r in records if r.box), None)
    if rec is None:
        return None
    rows = [{"kdamond": k["kdamond"], "state": k["state"], "operations": c.get("operations"),
             "action": sc.get("action"),
             "min_age_aggregations": (sc.get("access_pattern", {}).get("age", {}) or {}).get("min"),
             "aggr_us": c.get("intervals_us", {}).get("aggr_us")}
            for k in rec.damon_state for c in k["contexts"] for sc in c["schemes"]]
    return rec.thp, pd.DataFrame(rows)


def verdicts_side_by_side(verdicts_by: dict[str, list[dict]], unenforced: int) -> pd.DataFrame:
    """Each finding's verdict in each regime; with several, `same_in_every_regime`."""
    if unenforced:
        verdicts_by = {k: [dict(v, why=v["why"] + " [limits not enforced in some runs]")
                           for v in vs] for k, vs in verdicts_by.items()}
    if len(verdicts_by) == 1:
        return pd.DataFrame(next(iter(verdicts_by.values())))
    rows: dict[str, dict] = {}
    for name, verdicts in verdicts_by.items():
        for v in verdicts:
            row = rows.setdefault(v["finding"], {"finding": v["finding"], "claim": v["claim"]})
            row[name] = v["verdict"]
            row[f"why ({name})"] = v["why"]
    t = pd.DataFrame(list(rows.values()))
    # over the regimes where the finding was judged: one it was not run in differs from none
    ran = t[list(verdicts_by)].where(t[list(verdicts_by)] != stats.NOT_RUN)
    t["same_in_every_regime"] = ran.nunique(axis=1) <= 1
    return t


def unenforced_runs(all_runs: pd.DataFrame) -> set[str]:
    """Run ids measured without the profile's limits (allow_unenforced)."""
    if "limits_enforced" not in all_runs:
        return set()
    return set(all_runs.run_id[~all_runs.limits_enforced.astype(bool)])


def unenforced_count(all_runs: pd.DataFrame) -> int:
    """Runs (repeats) measured without the profile's limits."""
    return int((~all_runs.limits_enforced.astype(bool)).sum()) if "limits_enforced" in all_runs \
        else 0


def identity_ok_median(attribution_table: pd.DataFrame) -> float:
    """The median over configurations of the share of tokens whose parts explain their time."""
    return float(attribution_table.identity_ok_share.median())


# the machine table's limit columns: (column, the record's limit), every limit the registry
# gives a runs.csv column (the read-ahead is a box condition, in its own table)
MACHINE_LIMITS = (*((k.column, k.limit) for k in profile_keys.LIMITS
                    if k.column and k.limit != "read_ahead_kb"), ("cgroup", "cgroup"))


def machine_limits(records: list, profiles: list[str]) -> pd.DataFrame:
    """Each machine the records name, once per profile, with that profile's own limits as the
    kernel held its first run to them (every run of a profile has its limits). In a study of
    one profile, records written without a profile count as its."""
    rows = []
    for name in profiles:
        mine = [r for r in records if r.spec.profile == name
                or (len(profiles) == 1 and not r.spec.profile)]
        if not mine:
            continue
        machines = pd.DataFrame([r.machine for r in mine]).drop_duplicates()
        limits = {col: mine[0].limit(key) for col, key in MACHINE_LIMITS}
        rows.append(machines.assign(profile=name, **limits))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
