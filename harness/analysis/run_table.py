"""The runs table: one row per run record (runs.csv), with the measured window's figures, the
box's counters and the flags that keep a disturbed repeat out of the verdicts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.analysis import attribution
from harness.contract import Status
from harness import parameters, profile_keys
from harness.record import RUN_FIELDS, RunRecord, measured_window, read_run
from harness.analysis.configurations import configuration_ids


def run_row(record_path: Path) -> dict:
    """runs.csv's row of one run record: exactly the columns harness.record.RUN_COLUMNS declares
    but the last three (runs_table adds them), in that order."""
    rec = read_run(record_path)
    spec = rec.spec
    tok = pd.read_csv(Path(record_path).parent / "tokens.csv")
    gen = tok[tok.phase == "gen"]
    n = len(gen)
    decode_s = float(gen.wall_s.sum()) if n else float("nan")

    def per(col):
        return float(gen[col].sum()) / n if n else float("nan")

    row = {
        "run_id": rec.run_id, "repeat": spec.repeat, "entry": spec.entry,
        # a disturbed repeat measured once more at the end of the study (rule harness_rerun)
        "rerun": spec.rerun, "profile": spec.profile,
        "quant": rec.model.quant, "synthetic": rec.model.synthetic,
        # every run parameter, as the record holds it (`auto` resolved)
        **{p.name: getattr(spec, p.name) for p in parameters.PARAMETERS},
        "status": rec.status, "tokens_completed": rec.tokens_completed,
        "tok_per_s": n / decode_s if n and decode_s > 0 else float("nan"),
        # the run's figure: its measured window, after the warm-up (the first token among it)
        "steady_tok_per_s": steady_rate(gen, spec.warmup_tokens),
        "mean_median_gap": mean_median_gap(gen, spec.warmup_tokens), "run_wall_s": rec.wall_s,
        "prompt_tok_per_s": prompt_rate(tok),
        "majflt_per_token": per("majflt"),
        "bytes_prefetched_per_token": per("bytes_prefetched"),
        "bytes_routed_per_token": per("bytes_routed"),
        "disk_read_bytes_per_token": per("disk_read_bytes"),
        "pread_s_per_token": per("pread_s"), "madvise_s_per_token": per("madvise_s"),
        "other_prefetch_s_per_token": per("other_prefetch_s"), "wall_s_per_token": per("wall_s"),
        "peak_rss_bytes": int(tok.rss_bytes.max()) if len(tok) else None,
        "peak_cgroup_bytes": rec.peak_cgroup_bytes,
        "byte_accounting_ok": rec.summary.byte_accounting_ok,
        "residency_at_start": rec.residency_at_start,
        "machine_cpus": rec.machine_cpus,
        **box_columns(rec, gen, per),
        # from the first decode on (the prompt's and every generated token's reads), per
        # generated token: what the floor of the distance-to-the-limit table bounds
        "decode_read_bytes_per_token": (float(tok.cgroup_read_bytes.sum()) / n
                                        if "cgroup_read_bytes" in tok and n
                                        and (tok.cgroup_read_bytes >= 0).all() else float("nan")),
        # the measured window's reads per window token: what the window's floor bounds
        "window_read_bytes_per_token": window_read(gen, spec.warmup_tokens),
        "prompt_tokens": int(tok[tok.phase == "prompt"].n_tokens.sum()),
        "harness_s_per_token": per("harness_s") if "harness_s" in gen else float("nan"),
        **attribution.run_attribution(gen, spec.warmup_tokens),
        **window_columns(gen, spec.warmup_tokens),
        **prediction_columns(Path(record_path).parent / "mechanism.csv"),
        "start_utc": rec.start_utc, "end_utc": rec.end_utc,
        "record": str(record_path),
    }
    declared = RUN_FIELDS[:-3]
    if set(row) != set(declared):
        raise ValueError(f"run_row: columns not declared in harness.record.RUN_COLUMNS: "
                         f"{sorted(set(row) - set(declared))}; declared but not written: "
                         f"{sorted(set(declared) - set(row))}")
    return {k: row[k] for k in declared}


def window_mean(gen: pd.DataFrame, col: str, warmup: int) -> float:
    """A tokens.csv column's mean over the measured window (nan where it is not recorded)."""
    w = measured_window(gen, warmup)
    return float(w[col].mean()) if col in w and len(w) else float("nan")


def steady_rate(gen: pd.DataFrame, warmup: int) -> float:
    """Generated tokens per second over the measured window: without the warm-up tokens, the
    first of which carries start-up work whose size depends on the mechanism (1.35x the steady
    mean in the second reference run), and during which caches fill (docs/benchmarks.md)."""
    steady = gen.iloc[warmup:]
    total = float(steady.wall_s.sum())
    return len(steady) / total if len(steady) and total > 0 else float("nan")


def window_read(gen: pd.DataFrame, warmup: int) -> float:
    """The run cgroup's disk reads per token of the measured window (nan where not counted)."""
    w = gen.iloc[warmup:]
    if "cgroup_read_bytes" not in w or w.empty or (w.cgroup_read_bytes < 0).any():
        return float("nan")
    return float(w.cgroup_read_bytes.sum()) / len(w)


def window_columns(gen: pd.DataFrame, warmup: int) -> dict:
    """The warm-up's rate (the generated tokens before the window, the first left out) and the
    window's drift (harness.analysis.steady.drift): whether the run's figure was steady."""
    from harness.analysis import steady

    w = gen.wall_s.iloc[1:warmup]
    win = measured_window(gen, warmup)
    d = steady.drift(win.wall_s.to_numpy(float),
                     read_bytes=win.cgroup_read_bytes if "cgroup_read_bytes" in win else None)
    return {"warmup_tok_per_s": len(w) / float(w.sum()) if len(w) and w.sum() > 0 else float("nan"),
            "window_drift": d.change, "window_drift_low": d.low, "window_drift_high": d.high,
            "window_steady": d.steady}


def mean_median_gap(gen: pd.DataFrame, warmup: int) -> float:
    """|mean / median - 1| of the window's tokens' times: large when a few tokens stalled."""
    steady = gen.wall_s.iloc[warmup:]
    med = float(steady.median()) if len(steady) else float("nan")
    return abs(float(steady.mean()) / med - 1) if med and med == med else float("nan")


def prompt_rate(tok: pd.DataFrame) -> float:
    """Prompt processing in tokens per second (the prompt's one batched decode)."""
    p = tok[tok.phase == "prompt"]
    return float(p.n_tokens.sum() / p.wall_s.sum()) if len(p) and p.wall_s.sum() > 0 else float("nan")


DISTURBED_READ_BYTES = 50e6  # foreign reads above this, and above 1% of the run's own: disturbed


def foreign_read(device_read_bytes, cgroup_read_bytes) -> float:
    """Bytes the whole disk read during the run beyond what the run's cgroup read (nan unknown)."""
    dev, own = device_read_bytes, cgroup_read_bytes
    return float(dev - own) if dev is not None and own is not None and own >= 0 else float("nan")


MEAN_MEDIAN_GAP = 0.10  # a run whose mean and median steady token differ by more is flagged


STEAL_BOUND = 0.05  # CPU steal over this share of the machine's CPU time (CPUs x wall) flags it


def disturbed(runs: pd.DataFrame) -> pd.Series:
    """Repeats the machine disturbed, by recorded counters (not guessed): something else read the
    run's disk, the host stole more than STEAL_BOUND of its CPUs, or its mean and median steady
    token disagree by more than MEAN_MEDIAN_GAP (a stall inside the run). They are left out of
    the verdicts, never out of the tables; `flag_reason` in runs.csv says which."""
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


def prediction_columns(path: Path) -> dict:
    """A lookahead run's prediction quality over its generated tokens (mechanism.csv)."""
    nan = float("nan")
    cols = {"lookahead_precision": nan, "lookahead_recall": nan,
            "lookahead_wasted_bytes_per_token": nan, "lookahead_resident_share": nan}
    if not path.exists():
        return cols
    m = pd.read_csv(path)
    gen = m[m.token >= 0]
    if gen.empty:
        return cols
    n_tok = gen.token.nunique()
    return {"lookahead_precision": float(gen.hits.sum() / gen.n_predicted.sum()),
            "lookahead_recall": float(gen.hits.sum() / gen.n_routed.sum()),
            "lookahead_wasted_bytes_per_token": float(gen.wasted_bytes.sum() / n_tok),
            # of the bytes read ahead, the share already resident when their layer ran
            "lookahead_resident_share": float(gen.predicted_resident_bytes.sum()
                                              / gen.predicted_bytes.sum())}


def box_columns(rec: RunRecord, gen: pd.DataFrame, per) -> dict:
    """The conditions the run was measured under and what the kernel did beside it."""
    decode_start = rec.summary.moment("before_first_decode")
    before_load, after_load = rec.summary.moment("before_load"), rec.summary.moment("after_load")
    damon = rec.damon_applied
    cg_read = per("cgroup_read_bytes") if "cgroup_read_bytes" in gen else float("nan")
    routed = per("bytes_routed")
    nan = float("nan")
    return {
        # False: the profile's limits could not be applied and the run went on without them
        # (profile.allow_unenforced); every table and verdict that uses it says so
        "limits_enforced": rec.limits_enforced,
        **{k.column: rec.limit(k.limit) for k in profile_keys.LIMITS if k.column},
        "fadvise": ",".join(rec.file_advice) or None,
        # odirect-cache: what its warm start copied in from the page cache before the first token
        "cache_capacity_bytes": rec.summary.cache_capacity_bytes,
        "bytes_warm_start": rec.summary.bytes_warm_start,
        "residency_decode_start": decode_start.residency if decode_start else None,
        "load_read_bytes": (after_load.cgroup_read_bytes - before_load.cgroup_read_bytes
                            if before_load and after_load else None),
        "first_token_s": float(gen.wall_s.iloc[0]) if len(gen) else nan,
        "cgroup_read_bytes_per_token": cg_read if cg_read >= 0 else nan,
        # the bytes the disk really delivered for each byte of routed expert weights
        "read_amplification": cg_read / routed if cg_read >= 0 and routed > 0 else nan,
        "dirtied_bytes_per_token": per("dirtied_bytes") if "dirtied_bytes" in gen else nan,
        # the check under the byte accounting: what the kernel read against what mincore said was
        # missing from the routed slabs just before each layer's prefetch (1.0 = nothing more),
        # over the tokens residency was measured on (the warm-up: none runs in the window)
        **missing_columns(gen),
        # over the measured window, like the figure they are a share of: the warm-up's hook also
        # runs the residency checks, which no window token pays
        "hook_s_per_token": window_mean(gen, "hook_s", rec.spec.warmup_tokens),
        "mechanism_s_per_token": window_mean(gen, "mechanism_s", rec.spec.warmup_tokens),
        "cgroup_write_bytes_per_token": (per("cgroup_write_bytes") if "cgroup_write_bytes" in gen
                                         else nan),
        "device_read_bytes": rec.device_read_bytes, "device_write_bytes": rec.device_write_bytes,
        # what the rest of the machine read from the same disk while the run was measured
        "foreign_read_bytes": foreign_read(rec.device_read_bytes, rec.cgroup_read_bytes),
        "cpu_steal_s": rec.cpu_steal_s,
        "damon_pageout_bytes": (damon.get("pageout") or {}).get("sz_applied"),
        "damon_applied_bytes": sum(v.get("sz_applied", 0) for v in damon.values()) if damon else None,
    }


def missing_columns(gen: pd.DataFrame) -> dict:
    """Routed bytes not resident before each layer's prefetch, per token, and what the cgroup
    read over them, on the generated tokens whose residency was measured (bytes_missing >= 0)."""
    nan = float("nan")
    if "bytes_missing" not in gen:
        return {"bytes_missing_per_token": nan, "kernel_read_vs_missing": nan}
    m = gen[gen.bytes_missing >= 0]
    missing = float(m.bytes_missing.mean()) if len(m) else nan
    read = (float(m.cgroup_read_bytes.mean()) if len(m) and "cgroup_read_bytes" in m
            and (m.cgroup_read_bytes >= 0).all() else nan)
    return {"bytes_missing_per_token": missing,
            "kernel_read_vs_missing": read / missing if missing > 0 and read == read else nan}


def disturbed_repeats(record_paths: list) -> list[dict]:
    """The repeats the machine disturbed (flag_reason), first measurements only: a re-run is
    never re-run."""
    table = runs_table(record_paths)
    if table.empty:
        return []
    bad = table[table.disturbed & ~table.rerun]
    return [{"run_id": r.run_id, "repeat": int(r.repeat), "flag_reason": r.flag_reason}
            for r in bad.itertuples()]


def runs_table(record_paths: list) -> pd.DataFrame:
    """One row per run record, with `flag_reason` and `disturbed` (left out of the verdicts)."""
    table = pd.DataFrame([run_row(Path(p)) for p in record_paths], columns=RUN_FIELDS[:-3])
    table["configuration"] = configuration_ids(table)
    table["flag_reason"] = flag_reason(table)
    table["disturbed"] = table.flag_reason != ""
    return table


def time_breakdown(runs: pd.DataFrame, run_id: str) -> dict:
    ok = runs[(runs.run_id == run_id) & (runs.status == Status.OK.value)]
    wall = ok.wall_s_per_token.median()
    pread = ok.pread_s_per_token.median()
    madv = ok.madvise_s_per_token.median()
    other = ok.other_prefetch_s_per_token.median()
    compute = max(0.0, wall - pread - madv - other)
    return {"run_id": run_id, "wall_s": wall, "pread_s": pread, "madvise_s": madv,
            "other_prefetch_s": other, "compute_s": compute,
            "pread_share": pread / wall if wall else float("nan"),
            "compute_share": compute / wall if wall else float("nan"),
            "madvise_other_share": (madv + other) / wall if wall else float("nan")}
