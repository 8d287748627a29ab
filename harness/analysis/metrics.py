"""Analyses of the run records: importable functions over pandas tables, each tested on small
hand-made tables with known answers (tests/test_analysis.py)."""

from __future__ import annotations

from collections import Counter, OrderedDict
from pathlib import Path

import numpy as np
import pandas as pd

from harness.analysis import attribution
from harness.contract import Status
from harness import parameters
from harness.record import RUN_FIELDS, RunRecord, measured_window, read_run

WIDE_SPREAD = 0.25  # (max-min)/median above this: flagged `wide_spread` in the summary table


# --- the runs table ---------------------------------------------------------------------------


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


def window_mean(gen: pd.DataFrame, col: str, warmup: int = 1) -> float:
    """A tokens.csv column's mean over the measured window (nan where it is not recorded)."""
    w = measured_window(gen, warmup)
    return float(w[col].mean()) if col in w and len(w) else float("nan")


def steady_rate(gen: pd.DataFrame, warmup: int = 1) -> float:
    """Generated tokens per second over the measured window: without the warm-up tokens, the
    first of which carries start-up work whose size depends on the mechanism (1.35x the steady
    mean in the second reference run), and during which caches fill (docs/benchmarks.md)."""
    steady = gen.iloc[warmup:]
    total = float(steady.wall_s.sum())
    return len(steady) / total if len(steady) and total > 0 else float("nan")


def window_read(gen: pd.DataFrame, warmup: int = 1) -> float:
    """The run cgroup's disk reads per token of the measured window (nan where not counted)."""
    w = gen.iloc[warmup:]
    if "cgroup_read_bytes" not in w or w.empty or (w.cgroup_read_bytes < 0).any():
        return float("nan")
    return float(w.cgroup_read_bytes.sum()) / len(w)


def window_columns(gen: pd.DataFrame, warmup: int = 1) -> dict:
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


def mean_median_gap(gen: pd.DataFrame, warmup: int = 1) -> float:
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
        "read_ahead_kb": rec.limit("read_ahead_kb"),
        "fadvise": ",".join(rec.file_advice) or None,
        "cpu_quota": rec.limit("cpu_quota"), "write_bps_limit": rec.limit("write_bps"),
        # odirect-cache: what its warm start copied in from the page cache before the first token
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


# what does not change what a run measures: how often, and how long it may take
NOT_MEASURED = ("repeats", "time_limit_s")


def _spec_key(runs: pd.DataFrame, leave_out: tuple = ()) -> pd.Series:
    """Per run, its resolved spec as one string (profile, model and every run parameter the table
    carries, `auto` resolved as the record holds it), less NOT_MEASURED and `leave_out`. A table
    without every parameter (an older runs.csv, a hand-made one) cannot say which run ids share a
    spec: each run id is its own."""
    keys = [c for c in ("profile", "model", *parameters.RUN_KEYS)
            if c not in (*NOT_MEASURED, *leave_out)]
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


# --- conditions of a verdict (harness.analysis.findings holds the rules) ---------------------------


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


# --- routing ----------------------------------------------------------------------------------


def skew(experts: pd.DataFrame, coverage: float = 0.8) -> pd.DataFrame:
    """Per layer: how many experts cover `coverage` of the activations, and how many distinct."""
    rows = []
    for layer, g in experts.groupby("layer"):
        counts = g.expert.value_counts().sort_values(ascending=False).to_numpy()
        cum = np.cumsum(counts) / counts.sum()
        rows.append({"layer": int(layer), "experts_for_80pct": int(np.searchsorted(cum, coverage - 1e-12)
                                                                    + 1),
                     "distinct_experts": int(len(counts)), "activations": int(counts.sum())})
    return pd.DataFrame(rows)


def token_sets(experts: pd.DataFrame) -> dict[int, list[set]]:
    """layer -> per-token sets of routed experts, in token order."""
    out = {}
    for layer, g in experts.groupby("layer"):
        out[int(layer)] = [set(x) for _, x in g.sort_values("token").groupby("token").expert]
    return out


def locality(experts: pd.DataFrame, max_distance: int = 16) -> pd.DataFrame:
    """Mean share of token t's routed experts also routed at token t+d, over layers and t."""
    sets = token_sets(experts)
    rows = []
    for d in range(1, max_distance + 1):
        shares = [len(s[t] & s[t + d]) / len(s[t]) for s in sets.values() for t in range(len(s) - d)
                  if s[t]]
        if shares:
            rows.append({"distance": d, "shared_fraction": float(np.mean(shares)), "pairs": len(shares)})
    return pd.DataFrame(rows)


def belady_hits(requests: list[set], size: int) -> list[tuple[int, object, bool]]:
    """Belady's optimal cache of `size` entries over steps of requested keys: (step, key, hit) for
    every request in order. On a miss with a full cache the key used farthest ahead is not kept:
    a cached one (evicted), or the requested one itself (read, and not cached)."""
    flat = [(t, e) for t, s in enumerate(requests) for e in sorted(s)]
    next_use = {}
    nxt = [0] * len(flat)
    for i in range(len(flat) - 1, -1, -1):
        t, e = flat[i]
        nxt[i] = next_use.get(e, float("inf"))
        next_use[e] = i  # the request's place in the whole sequence, not only its step
    cache: dict = {}
    out = []
    for i, (t, e) in enumerate(flat):
        hit = e in cache
        if not hit and size <= 0:
            out.append((t, e, False))
            continue
        if not hit and len(cache) >= size:
            victim = max(cache, key=cache.get)
            if nxt[i] >= cache[victim]:  # the new key is needed last of all: keep the others
                out.append((t, e, False))
                continue
            del cache[victim]
        cache[e] = nxt[i]
        out.append((t, e, hit))
    return out


def _simulate(requests: list[set], size: int, policy: str) -> tuple[int, int]:
    hits = total = 0
    if policy == "belady":
        res = belady_hits(requests, size)
        return sum(h for _, _, h in res), len(res)
    lru: OrderedDict[int, None] = OrderedDict()
    freq: Counter = Counter()
    for s in requests:
        for e in sorted(s):
            total += 1
            freq[e] += 1
            if e in lru:
                hits += 1
                lru.move_to_end(e)
                continue
            if len(lru) >= size:
                if policy == "lru":
                    lru.popitem(last=False)
                else:  # lfu: evict the least frequently used so far (ties: least recent)
                    victim = min(lru, key=lambda x: freq[x])
                    del lru[victim]
            lru[e] = None
    return hits, total


def cache_simulation(experts: pd.DataFrame, sizes=(8, 16, 24, 32, 40, 48, 56, 64)) -> pd.DataFrame:
    """Hit rate of LRU, LFU and Belady's optimal policy for per-layer expert caches of each size:
    the best any expert cache could do on the recorded routing trace."""
    sets = token_sets(experts)
    rows = []
    for size in sizes:
        for policy in ("lru", "lfu", "belady"):
            h = t = 0
            for reqs in sets.values():
                hh, tt = _simulate(reqs, size, policy)
                h, t = h + hh, t + tt
            rows.append({"cache_experts_per_layer": size, "policy": policy,
                         "hit_rate": h / t if t else float("nan")})
    return pd.DataFrame(rows)


def read_path_of(run) -> str:
    """The read path of a runs-table row's configuration (harness.catalog.read_path), through
    the base mechanism a lookahead wraps (its `lookahead_base` column; the parameter's default
    where a table has none)."""
    from harness import catalog, parameters

    base = run.get("lookahead_base")
    if not isinstance(base, str):
        base = parameters.BY_NAME["lookahead_base"].default
    return catalog.read_path(run["mechanism"], {"lookahead_base": base})


def belady_misses_best_start(requests: list[set], size: int) -> int:
    """The fewest misses any cache of `size` entries can have on these steps of requested keys,
    its contents at the start chosen as well as possible: Belady's rule from a cache holding the
    `size` keys first requested earliest (which is where Belady would be had it seen them
    before). tests/test_analysis.py checks it against every policy and start on tiny traces."""
    if size <= 0:
        return sum(len(s) for s in requests)
    first_use: dict = {}
    for t, s in enumerate(requests):
        for e in sorted(s):
            first_use.setdefault(e, t)
    start = sorted(first_use, key=first_use.get)[:size]
    # the start state as requests Belady has already served (its misses there are free)
    warm = [set(start)]
    res = belady_hits(warm + list(requests), size)
    return sum(1 for t, _, hit in res if t >= 1 and not hit)


def window_floor_bytes(experts: pd.DataFrame, slab_bytes: dict[int, int], cache_bytes: float,
                       positions) -> float:
    """Bytes that any run must read over the routing of the decodes at `positions` (the measured
    window's tokens, by sequence position), with a cache of `cache_bytes` (the RAM budget less
    the non-expert tensors) started with the best possible contents: a floor that needs no
    credit for what was resident. Slabs of unequal size (some layers carry other quant types)
    are bounded by the smallest: a cache of C bytes holds at most C / smallest slabs, so no
    policy misses fewer slabs than Belady with that many, and each miss reads at least the
    smallest slab."""
    if experts.empty or not slab_bytes:
        return float("nan")
    sel = experts[experts.token.isin(set(positions))]
    smallest = min(slab_bytes.values())
    steps = [{(int(layer), int(e)) for e in g.expert}
             for (_, layer), g in sel.groupby(["token", "layer"], sort=True)]
    return float(belady_misses_best_start(steps, int(max(0, cache_bytes) // smallest)) * smallest)


def kernel_cpu_per_byte(runs: pd.DataFrame) -> pd.Series:
    """Per read path (harness.catalog.read_path), the least kernel CPU seconds any ok run of it
    spent per byte its cgroup read: the decoding thread's kernel time per steady token over the
    bytes per token. The least, because a floor may not charge more than the cheapest run paid
    (kernel time also holds work other than reading)."""
    need = {"kernel_share", "steady_tok_per_s", "cgroup_read_bytes_per_token", "mechanism"}
    if not need <= set(runs) or runs.empty:
        return pd.Series(dtype=float)
    ok = runs[(runs.status == Status.OK.value) & (runs.steady_tok_per_s > 0)
              & (runs.cgroup_read_bytes_per_token > 1e6)]
    cost = ok.kernel_share / ok.steady_tok_per_s / ok.cgroup_read_bytes_per_token
    return cost.groupby(ok.apply(read_path_of, axis=1) if len(ok) else ok.mechanism).min()


def io_patterns(io: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The I/O ceiling's sequential and random-read samples (harness.stages.ceilings); a table from
    before the random reads were measured holds sequential ones only."""
    if "pattern" not in io:
        return io, io.iloc[0:0]
    return io[io.pattern == "sequential"], io[io.pattern == "random"]


def read_path_io_ceilings(io: pd.DataFrame, read_bps: float | None = None) -> dict[str, float]:
    """Per read path (harness.catalog.read_path), bytes/s: the fastest any I/O ceiling sample
    of the path's kind ran. O_DIRECT: its sequential and random samples; buffered reads: the
    random buffered ones; faults (the page cache's read-ahead, neither kind): every sample. The
    fastest, because a floor may not assume a read slower than one measured. A kind with no
    samples gets the profile's read throttle, else the fastest sample of any kind."""
    sequential, random = io_patterns(io)
    rates = pd.to_numeric(io.mb_per_s, errors="coerce") * 1e6
    fastest = float(rates.max()) if rates.notna().any() else float("nan")
    fallback = float(read_bps) if read_bps else fastest

    def best(rows):
        r = pd.to_numeric(rows.mb_per_s, errors="coerce") * 1e6 if len(rows) else rows
        return float(r.max()) if len(rows) and r.notna().any() else fallback

    direct = pd.concat([sequential, random[random.access == "O_DIRECT"]] if len(random)
                       else [sequential])
    return {"O_DIRECT": best(direct),
            "buffered read": best(random[random.access == "buffered read"] if len(random)
                                  else random),
            "fault": fastest if fastest == fastest else fallback}


def floor_bound(floor_bytes: float, io_bytes_per_s: float, compute_s: float,
                kernel_s_per_byte: float, cpus: float) -> dict:
    """The fastest a token can be: the floor's bytes at the I/O ceiling, and the compute ceiling's
    time plus the kernel CPU those bytes cost at the cheapest measured rate, spread over the CPUs
    the run may use (its quota, or its threads); with perfect overlap (the larger) and none."""
    io_s = floor_bytes / io_bytes_per_s if io_bytes_per_s > 0 else float("nan")
    kernel = floor_bytes * (kernel_s_per_byte if kernel_s_per_byte == kernel_s_per_byte else 0.0)
    cpu_s = compute_s + kernel / cpus
    return {"floor_io_s": io_s, "floor_cpu_s": cpu_s,
            "floor_perfect_overlap_tok_per_s": 1.0 / max(io_s, cpu_s) if max(io_s, cpu_s) > 0
            else float("nan"),
            "floor_no_overlap_tok_per_s": 1.0 / (io_s + cpu_s) if io_s + cpu_s > 0 else float("nan")}


# the parts of a token grouped by what would have to shrink for it to approach its floor
IN_THE_WAY = {
    "io_wait": "waiting on the disk",
    "kernel": "kernel CPU (the page cache's copies, faults and read calls)",
    "user": "user CPU (the matmuls, the routing hook, the mechanism's own work)",
    "cpu_wait": "waiting for a CPU (the quota's throttling, a barrier, other processes)",
}


def in_the_way(runs: pd.DataFrame) -> dict:
    """What stands between a configuration and its floor, from its attribution: its mean steady
    token's parts (median over its repeats) in four groups, the largest named `part`. `runs`: the
    configuration's ok repeats (runs-table rows). Empty when they carry no attribution."""
    med = {k: float(runs[f"{k}_share"].median()) if f"{k}_share" in runs else 0.0
           for k in ("io_wait", "kernel", "user", "hook", "throttled", "runqueue", "sync")}
    if runs.empty or med["io_wait"] != med["io_wait"]:
        return {}
    groups = {"io_wait": med["io_wait"], "kernel": med["kernel"],
              "user": med["user"] + med["hook"],
              "cpu_wait": med["throttled"] + med["runqueue"] + med["sync"]}
    groups = {k: (v if v == v else 0.0) for k, v in groups.items()}
    part = max(groups, key=groups.get)
    return {"part": part, "what": IN_THE_WAY[part],
            **{f"{k}_share": v for k, v in groups.items()}}


def bound_errors(table: pd.DataFrame) -> pd.Series:
    """Runs that beat their floor: faster than its perfect-overlap tok/s, or reading fewer bytes
    in the measured window than it says must be read. Either means the bound is wrong. A
    repeat flagged as disturbed (column `disturbed`) is not judged: its figure is not trusted
    (the verdicts leave it out too)."""
    num = {c: pd.to_numeric(table[c], errors="coerce") for c in (
        "steady_tok_per_s", "floor_perfect_overlap_tok_per_s", "window_read_bytes_per_token",
        "floor_bytes_per_token")}
    faster = num["steady_tok_per_s"] > num["floor_perfect_overlap_tok_per_s"]
    fewer = num["window_read_bytes_per_token"] < num["floor_bytes_per_token"] * (1 - 1e-9)
    judged = ~table["disturbed"].fillna(False).astype(bool) if "disturbed" in table else True
    return ((faster.fillna(False) | fewer.fillna(False)) & judged).astype(bool)


def trace_run(runs: pd.DataFrame, model: str):
    """The runs-table row of the longest logged routing trace of `model` (the study's used 64
    tokens), None when no ok run logged one. Every mechanism routes identically
    (tests/test_harness.py), so the mechanism only breaks ties: `none` first."""
    cand = runs[(runs.status == Status.OK.value) & (runs.log_experts.astype(bool))]
    if len(cand[cand.model == model]):
        cand = cand[cand.model == model]
    if cand.empty:
        return None
    cand = cand.assign(_not_none=cand.mechanism != "none")
    return cand.sort_values(["tokens_completed", "_not_none", "repeat"],
                            ascending=[False, True, True]).iloc[0]


def read_trace(run) -> pd.DataFrame:
    """A run's routing trace (experts.csv beside its record)."""
    return pd.read_csv(Path(run["record"]).parent / "experts.csv")


def configuration_trace(runs: pd.DataFrame, config) -> pd.DataFrame | None:
    """The routing trace (every decode: the prompt's and each generated token's) of a logged run
    of this configuration's model and length (`config`: a summary row), its own runs first."""
    cand = runs[(runs.model == config.model) & (runs.tokens == config.tokens)
                & (runs.status == Status.OK.value)]
    cand = pd.concat([cand[cand.run_id == config.run_id], cand[cand.log_experts.astype(bool)]])
    for rec in cand.record:
        ex = pd.read_csv(Path(rec).parent / "experts.csv")
        if len(ex):
            return ex
    return None


def routing_heatmap(experts: pd.DataFrame, n_layer: int, n_expert: int) -> np.ndarray:
    m = np.zeros((n_layer, n_expert))
    for (layer, e), c in experts.groupby(["layer", "expert"]).size().items():
        m[int(layer), int(e)] = c
    return m


# --- throughput ---------------------------------------------------------------------------------


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
