"""The study's findings, one unit each: its claim in the study's words, the runs it needs, the
tables it rests on, its rule and its verdict. Nothing here renders; harness.report.results prints the
outcomes. Every comparison is a ratio of steady tok/s with a 90% confidence interval from the
runs, against the regime's minimum effect (a profile's `min_effect`, 10% unless set:
harness.analysis.stats.MIN_EFFECT); a finding made of several comparisons holds
only when every part holds and is refuted after Holm's correction across its parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from harness.analysis import configurations, stats, traces
from harness.analysis.stats import FAILS, HOLDS, INCONCLUSIVE, NOT_RUN
from harness.contract import Status
from harness.analysis.stats import Verdict
from harness.analysis.outcome import Figure, Outcome

STUDY_ROUTING = {"experts_for_80pct_median": 25.0, "distinct_per_layer_64_tokens": "44-59",
                 "shared_distance_1": 0.357, "shared_distance_8": 0.208}
IO_BOUND_SHARE = 0.5  # a configuration is I/O-bound when I/O wait is at least half its token time
FAR_BELOW = 5.0  # "far below the compute ceiling": the best configuration at least 5x slower
FAULT_FLOOR = 5.0  # fewer major faults per token than this on either side: fault ratios say nothing
WRITE_IN_PLACE_SLOWER = 2.0  # the study: write-in-place "over 2x slower"
DISK_GATED = 0.5  # pread time is disk-gated when the thread waits on I/O for most of it
DESIGNED_SPEEDUP = 1.5  # the mechanism designed from the attribution must beat the study's best by it
WAIT_SPEEDUP = 1.10  # finding 12: passive waiting must be worth at least the minimum effect
# finding 13: the expert cache over demand paging, and over the best of every other mechanism
CACHE_OVER_PAGING, CACHE_OVER_BEST = 1.5, 1.2
# finding 12's baseline: libgomp's own wait policy, which every run had before it was a parameter
LIBGOMP_WAIT = "libgomp"
MIN_BUDGETS = 4  # a trend against the LRU budget needs four budgets


def _rng(s: pd.Series) -> str:
    s = s.dropna()
    return f"{s.min():.3g}-{s.max():.3g}" if len(s) else "-"


def _interval_columns(iv: stats.Interval | None, name: str = "ratio") -> dict:
    """A comparison's table columns: its ratio under `name`, and the 90% interval's ends."""
    est_low_high = iv.ratio if iv is not None else (None, None, None)
    return {name: est_low_high[0], "ci90_low": est_low_high[1], "ci90_high": est_low_high[2]}


# a token's parts (harness.run.attribution), and what they cost the quota and the disk
ATTRIBUTION_COLUMNS = ["user_share", "kernel_share", "throttled_share", "runqueue_share",
                       "sync_share", "io_wait_share", "cg_sys_s_per_token",
                       "cgroup_read_bytes_per_token"]


def _attribution_side_by_side(runs: list[pd.DataFrame], by: list[str],
                              extra: list[str]) -> pd.DataFrame:
    """Configurations compared by a finding, one row each (`by`), with the median over their
    repeats of their attribution and `extra` columns: which part of the token a faster one
    shrank. Columns older records lack are left out."""
    both = pd.concat(runs)
    cols = [c for c in by + ATTRIBUTION_COLUMNS + extra if c in both]
    # a configuration is named by the first of its run ids: the table says run_id
    return both[cols].groupby(by).median().reset_index().rename(columns={CONFIG: "run_id"})


def _one(sel: pd.DataFrame) -> str:
    """The configuration a selection of runs is (runs of one resolved spec under several run ids
    are one: configurations.configuration_ids), the most frequent if several."""
    return sel[CONFIG].mode().iloc[0]


CONFIG = "configuration"  # the runs table's column the comparisons group by


@dataclass
class Study:
    """What the findings read: the runs of the default length, the longest routing trace, the
    layouts and ceilings."""

    runs: pd.DataFrame
    layouts: dict
    q4: str
    q2: str
    io_mb_s: float
    dense_ceiling: float
    moe_ceiling: float
    trace: pd.DataFrame | None = None
    trace_synthetic: bool = True
    trace_of: str = ""  # which run the trace is: "run `<id>` repeat <k>"
    n_expert: int = 0
    # the smallest difference a directional verdict claims here: the profile's `min_effect`,
    # raised where the regime's noise cannot resolve 10% with the runs the budget buys
    min_effect: float = stats.MIN_EFFECT
    _pools: dict = field(default_factory=dict, repr=False)  # value -> stats.Pool, made once

    def __post_init__(self):
        if CONFIG not in self.runs:  # a table from before the column: each run id its own
            self.runs = self.runs.assign(**{CONFIG: configurations.configuration_ids(self.runs)})

    @classmethod
    def of(cls, runs: pd.DataFrame, all_runs: pd.DataFrame, layouts: dict, q4: str, q2: str,
           io_mb_s: float, dense_ceiling: float, moe_ceiling: float,
           min_effect: float | None = None) -> Study:
        """The study of one regime: `runs` the judged runs, the routing trace the longest
        logged one of `all_runs`."""
        tr = traces.trace_run(all_runs, q4)
        return cls(runs=runs, layouts=layouts, q4=q4, q2=q2, io_mb_s=io_mb_s,
                   dense_ceiling=dense_ceiling, moe_ceiling=moe_ceiling,
                   trace=traces.read_trace(tr) if tr is not None else None,
                   trace_synthetic=bool(tr.synthetic) if tr is not None else True,
                   trace_of=f"run `{tr.run_id}` repeat {tr['repeat']}" if tr is not None else "",
                   n_expert=layouts.get(q4, {}).get("n_expert", 0),
                   min_effect=stats.MIN_EFFECT if min_effect is None else float(min_effect))

    @property
    def value(self) -> str:
        """The run's figure: steady tok/s (its measured window) where recorded, else tok/s."""
        r = self.runs
        return ("steady_tok_per_s" if "steady_tok_per_s" in r and r.steady_tok_per_s.notna().any()
                else "tok_per_s")

    def pool(self, value: str | None = None) -> stats.Pool:
        """The variance the ok runs of every configuration share, of `value` (default: the
        run's figure)."""
        key = value or self.value
        if key not in self._pools:
            ok = self.ok(any_wait_policy=True)
            self._pools[key] = stats.Pool.of(ok[ok[key] > 0], key, by=CONFIG)
        return self._pools[key]

    def compare(self, a: pd.DataFrame, b: pd.DataFrame, value: str | None = None) -> stats.Interval:
        return stats.compare(self.pool(value), _one(a), _one(b))

    def faster(self, iv: stats.Interval, what: str) -> Verdict:
        """'a is faster than b' by at least this regime's minimum effect."""
        return stats.faster(iv, self.min_effect, what)

    @property
    def effect(self) -> str:
        """The minimum effect as the verdicts' texts say it."""
        return f"{self.min_effect:.0%}"

    def ok(self, any_wait_policy: bool = False, **eq) -> pd.DataFrame:
        """The ok runs with these column values; of the study's OpenMP wait policy unless asked
        (a configuration that only changes how threads wait is finding 12's, no other's)."""
        r = self.runs[self.runs.status == Status.OK.value]
        if not any_wait_policy and "omp_wait_policy" not in eq:
            r = self.study_wait(r)
        for k, v in eq.items():
            r = r[r[k] == v]
        return r

    @property
    def wait_policy(self) -> str | None:
        """The study's OpenMP wait policy: the one most of its runs had (what `auto` chose for the
        regime; a reference run from before the parameter existed has `libgomp`)."""
        if "omp_wait_policy" not in self.runs or self.runs.omp_wait_policy.dropna().empty:
            return None
        return self.runs.omp_wait_policy.mode().iloc[0]

    def study_wait(self, r: pd.DataFrame) -> pd.DataFrame:
        """The runs with the study's OpenMP wait policy (records from before it was a parameter
        all had one: libgomp's)."""
        policy = self.wait_policy
        return r[r.omp_wait_policy == policy] if policy is not None else r

    def surviving_design(self, model: str) -> pd.DataFrame:
        """The study's pread+madvise: no mlock, logging on, the default run length."""
        r = self.ok(mechanism="pread+madvise", model=model, mlock_non_expert=False)
        return r[r.log_experts.astype(bool)]

    def quant_pairs(self):
        """(mechanism, Q4_K_M runs, Q2_K runs) for pread+madvise, then demand paging, where both
        quants have ok runs and both layouts are known."""
        if math.isnan(self.bytes_ratio()):
            return
        for mech in ("pread+madvise", "none"):
            if mech == "pread+madvise":
                a, b = self.surviving_design(self.q4), self.surviving_design(self.q2)
            else:
                a = self.ok(model=self.q4, mechanism=mech, mlock_non_expert=False)
                b = self.ok(model=self.q2, mechanism=mech, mlock_non_expert=False)
            if len(a) and len(b):
                yield mech, a, b

    def bytes_ratio(self) -> float:
        if self.q4 not in self.layouts or self.q2 not in self.layouts:
            return float("nan")
        return self.layouts[self.q4]["bytes_per_token"] / self.layouts[self.q2]["bytes_per_token"]


@dataclass(frozen=True)
class Finding:
    number: str
    title: str
    claim: str
    needs: str
    rule: str

    def evaluate(self, study: Study) -> Outcome:
        raise NotImplementedError


class LruSlowerFinding(Finding):
    def evaluate(self, st):
        lru = st.runs[st.runs.mechanism == "lru-odirect"]
        pm = st.surviving_design(st.q4)
        if lru.empty:
            return Outcome(Verdict(NOT_RUN, "no lru-odirect runs in this regime"))
        if pm.empty:
            return Outcome(Verdict(NOT_RUN, "no pread+madvise runs of the Q4_K_M model in this "
                                            "regime"))
        rows, parts, dead = [], [], []
        for budget, g in lru.groupby("lru_budget_mb"):
            ok = g[g.status == Status.OK.value]
            if ok.empty:
                # a budget that never finishes beat nothing (the study's 1200 MB died): it is shown
                # with its memory trail and judged by the budgets that did finish
                dead.append(budget)
                v = Verdict(INCONCLUSIVE, f"budget {budget} MB: {', '.join(sorted(set(g.status)))}")
            else:
                v = st.faster(st.compare(pm, ok), what=f"pread+madvise over LRU {budget} MB")
                parts.append(v)
            iv = v.interval
            rows.append({"lru_budget_mb": budget, "n_ok": len(ok),
                         "tok_per_s_median": ok[st.value].median(), "tok_per_s_range": _rng(ok[st.value]),
                         "statuses": ",".join(sorted(set(g.status))),
                         "peak_rss_bytes": g.peak_rss_bytes.max(),
                         "peak_cgroup_bytes": g.peak_cgroup_bytes.max() if "peak_cgroup_bytes" in g
                         else None,
                         **_interval_columns(iv, "pread_madvise_over_lru"),
                         "verdict": v.verdict})
        v = stats.family(parts, f"LRU slower than pread+madvise by at least {st.effect} at every budget "
                                "that finished")
        if dead:
            v = Verdict(v.verdict, v.reason + f" (killed, not judged: {', '.join(map(str, dead))} MB)")
        return Outcome(v, {"finding1_lru": pd.DataFrame(rows)})


class LruTrendFinding(Finding):
    def evaluate(self, st):
        lru = st.ok(mechanism="lru-odirect")
        if st.runs[st.runs.mechanism == "lru-odirect"].empty:
            return Outcome(Verdict(NOT_RUN, "no lru-odirect runs in this regime"))
        budgets = sorted(lru.lru_budget_mb.unique())
        if len(budgets) < MIN_BUDGETS:
            return Outcome(Verdict(INCONCLUSIVE, f"{len(budgets)} budget(s) with ok runs; the trend "
                                                 f"needs {MIN_BUDGETS}"))
        fit = stats.lack_of_fit(lru, "lru_budget_mb", st.value)
        tables = {}
        if fit.fits:
            iv = stats.sweep_change(lru, "lru_budget_mb", st.value, pool=st.pool())
            falls = stats.Interval(-iv.estimate, iv.se, iv.df, iv.n_a, iv.n_b, iv.method)
            v = st.faster(falls, what=f"tok/s at {budgets[0]} MB over {budgets[-1]} MB "
                                         "(fitted line)")
            notes = [stats.equivalent(iv, st.min_effect, what="no trend against the budget "
                                     f"(equivalence, +-{st.effect})").reason]
            row = {**_interval_columns(iv, "change_across_sweep"), "runs": iv.n_a}
        else:
            # the line is not the data: each budget against the smallest instead, a family
            parts, rows = [], []
            small = lru[lru.lru_budget_mb == budgets[0]]
            for b in budgets[1:]:
                pv = st.faster(st.compare(small, lru[lru.lru_budget_mb == b]),
                                  what=f"{budgets[0]} MB over {b} MB")
                parts.append(pv)
                rows.append({"lru_budget_mb": b, "against_mb": budgets[0],
                             **_interval_columns(pv.interval), "verdict": pv.verdict})
            v = stats.family(parts, f"tok/s at the smallest budget at least {st.effect} above every "
                                    "larger one (per budget: a line does not fit)")
            tables["finding1b_per_budget"] = pd.DataFrame(rows)
            notes = []
            row = {"runs": len(lru)}
        notes.append(f"Lack of fit of a line through the budgets' mean log tok/s: F {fit.f:.3g} "
                     f"on {fit.df_lof} and {fit.df_pe} df, p {fit.p:.3g} "
                     f"({'the line fits' if fit.fits else 'a line is not the data'}); the means "
                     f"are {fit.monotone} in the budget.")
        tables = {"finding1b_lru_trend": pd.DataFrame([{
            "budgets_mb": " ".join(map(str, budgets)), **row, "lack_of_fit_p": fit.p,
            "monotone": fit.monotone, "verdict": v.verdict}]), **tables}
        return Outcome(v, tables, notes)


class SkewFinding(Finding):
    def evaluate(self, st):
        if st.trace is None:
            return Outcome(Verdict(INCONCLUSIVE, "no run logged its expert activations"))
        sk = traces.skew(st.trace)
        frac = float(sk.experts_for_80pct.median()) / max(st.n_expert, 1)
        if st.trace_synthetic:
            v = Verdict(INCONCLUSIVE, "routing of a synthetic model is not the original's")
        else:
            v = Verdict(HOLDS if frac >= 0.25 else FAILS,
                        f"the median layer needs {frac:.0%} of its experts for 80%")
        lay = st.layouts.get(st.q4, {})
        heat = traces.routing_heatmap(st.trace, lay.get("n_layer", 0), lay.get("n_expert", 0))
        note = (f"Routing trace: {st.trace_of} ({int(st.trace.token.nunique())} tokens incl. the "
                f"prompt, {st.n_expert} experts).")
        return Outcome(v, {"finding2_skew": sk}, [note],
                       figures=[Figure("routing_heatmap", "routing_heatmap", heat)])


class LocalityFinding(Finding):
    def evaluate(self, st):
        if st.trace is None:
            return Outcome(Verdict(INCONCLUSIVE, "no run logged its expert activations"))
        loc = traces.locality(st.trace)
        by_d = loc.set_index("distance").shared_fraction if len(loc) else pd.Series(dtype=float)
        d1 = float(by_d.get(1, float("nan")))
        if st.trace_synthetic:
            v = Verdict(INCONCLUSIVE, "routing of a synthetic model is not the original's")
        elif math.isnan(d1):
            v = Verdict(INCONCLUSIVE, "trace too short")
        else:
            v = Verdict(HOLDS if d1 < 0.5 else FAILS, f"adjacent tokens share {d1:.1%}")
        sk = traces.skew(st.trace)
        stats = pd.DataFrame([
            {"statistic": "experts for 80% of a layer's activations (median)",
             "this_run": float(sk.experts_for_80pct.median()),
             "study": STUDY_ROUTING["experts_for_80pct_median"]},
            {"statistic": "distinct experts per layer (min-max)",
             "this_run": f"{sk.distinct_experts.min()}-{sk.distinct_experts.max()}",
             "study": STUDY_ROUTING["distinct_per_layer_64_tokens"]},
            {"statistic": "shared at distance 1", "this_run": d1,
             "study": STUDY_ROUTING["shared_distance_1"]},
            {"statistic": "shared at distance 8", "this_run": float(by_d.get(8, float("nan"))),
             "study": STUDY_ROUTING["shared_distance_8"]}])
        stats["this_run"] = stats["this_run"].astype(str)
        # what any expert cache could do on this trace: LRU, LFU and Belady's optimum
        sizes = sorted({max(1, st.n_expert * k // 8) for k in range(1, 9)})
        cs = traces.cache_simulation(st.trace, sizes=sizes)
        return Outcome(v, {"finding3_locality": loc, "routing_vs_study": stats,
                           "cache_simulation": cs},
                       figures=[Figure("locality", "locality", loc),
                                Figure("cache_simulation", "cache_simulation", cs)])


class ScalingFinding(Finding):
    def evaluate(self, st):
        br = st.bytes_ratio()
        rows, notes, verdict = [], [], Verdict(INCONCLUSIVE, "no Q4_K_M/Q2_K pread+madvise pair")
        for mech, a, b in st.quant_pairs():  # the study's design first; demand paging beside it
            iv = st.compare(b, a)  # Q2 over Q4
            v = stats.above(iv, br, f"{mech}: Q2_K over Q4_K_M")
            # beside the nominal ratio (the claim's): the bytes the runs' cgroups really read
            read = (a.cgroup_read_bytes_per_token.median() / b.cgroup_read_bytes_per_token.median()
                    if "cgroup_read_bytes_per_token" in a else float("nan"))
            ratio, low, high = iv.ratio
            scales = bool(low <= read <= high) if read == read else None
            rows.append({"mechanism": mech, "bytes_ratio_q4_over_q2": br,
                         "read_ratio_q4_over_q2": read,
                         **_interval_columns(iv, "speedup_q2_over_q4"), "verdict": v.verdict,
                         "scales_with_bytes_read": scales})
            if scales is not None:
                notes.append(f"{mech}: the bytes read differ {read:.3g}x; the rates "
                             f"{ratio:.3g}x ({low:.3g}-{high:.3g}): tok/s "
                             + ("scales with the bytes actually read" if scales else
                                "does not scale with the bytes actually read either"))
            if mech == "pread+madvise":
                verdict = v
        return Outcome(verdict, {"finding4_scaling": pd.DataFrame(rows)} if rows else {}, notes)


class FaultsFinding(Finding):
    def evaluate(self, st):
        br = st.bytes_ratio()
        rows, verdict = [], Verdict(INCONCLUSIVE, "no Q4_K_M/Q2_K pread+madvise pair")
        for mech, a, b in st.quant_pairs():
            few = min(a.majflt_per_token.median(), b.majflt_per_token.median()) < FAULT_FLOOR
            disk = stats.above(st.compare(a, b, "cgroup_read_bytes_per_token"), br,
                               f"{mech}: disk bytes read, Q4_K_M over Q2_K")
            parts = [disk]
            row = {"mechanism": mech, "bytes_ratio_q4_over_q2": br,
                   "majflt_q4": a.majflt_per_token.median(), "majflt_q2": b.majflt_per_token.median(),
                   "disk_read_ratio": disk.interval.ratio[0],
                   "disk_ci90": f"{disk.interval.ratio[1]:.3g}-{disk.interval.ratio[2]:.3g}",
                   "faults_too_few": few}
            if not few:
                faults = stats.above(st.compare(a, b, "majflt_per_token"), br,
                                     f"{mech}: major faults, Q4_K_M over Q2_K")
                parts.append(faults)
                row["fault_ratio"] = faults.interval.ratio[0]
            rows.append(row)
            if mech == "pread+madvise":
                verdict = stats.family(parts, "Q4 reads disproportionately more than its bytes ratio"
                                       + (" (fault counts under 5/token: disk bytes only)" if few
                                          else ""))
        return Outcome(verdict, {"finding5_faults": pd.DataFrame(rows)} if rows else {})


class GapFinding(Finding):
    def evaluate(self, st):
        ok = st.ok()
        if ok.empty or not st.dense_ceiling:
            return Outcome(Verdict(INCONCLUSIVE, "no ok runs or no dense compute ceiling"))
        best_id = ok.groupby(CONFIG)[st.value].median().idxmax()
        iv = stats.against_constant(st.pool(), best_id, st.dense_ceiling)
        parts = [stats.above(iv, FAR_BELOW, f"dense ceiling over the best ({best_id})")]
        rows = []
        for model in (st.q4, st.q2):
            pm = st.surviving_design(model)
            if pm.empty:
                continue
            if "io_wait_share" in pm and pm.io_wait_share.notna().any():
                share, how = pm.io_wait_share, "measured I/O wait"
            else:  # records without the attribution: the bytes at the I/O ceiling, an estimate
                share = pm.cgroup_read_bytes_per_token / (st.io_mb_s * 1e6) * pm[st.value]
                how = "disk bytes at the I/O ceiling (estimated)"
            parts.append(stats.mean_above(share, IO_BOUND_SHARE, f"{model}: {how}, share of a token"))
            rows.append({"model": model, "tok_per_s_median": pm[st.value].median(),
                         "io_share_of_token_min": share.min(), "io_share_of_token_max": share.max(),
                         "io_share_source": how, "verdict": parts[-1].verdict})
        t = pd.DataFrame([{"best_run_id": best_id, "best_tok_per_s_median":
                           ok[ok[CONFIG] == best_id][st.value].median(),
                           "dense_compute_ceiling": st.dense_ceiling,
                           "moe_compute_ceiling": st.moe_ceiling, "gap_x": iv.ratio[0],
                           "gap_ci90_low": iv.ratio[1], "gap_ci90_high": iv.ratio[2]}])
        return Outcome(stats.family(parts, f"at least {FAR_BELOW:g}x below the dense ceiling and "
                                           "I/O-bound (I/O wait at least half the token) at every "
                                           "quant"),
                       {"finding6_gap": t, "finding6_io_bound": pd.DataFrame(rows)})


class SwitchesFinding(Finding):
    def evaluate(self, st):
        base = st.surviving_design(st.q4)
        mlock = st.ok(mechanism="pread+madvise", model=st.q4, mlock_non_expert=True)
        mlock = mlock[mlock.log_experts.astype(bool)]
        rows, parts = [], []
        for label, sel in (("mlock", mlock),
                           ("write-in-place", st.ok(mechanism="write-in-place", model=st.q4)),
                           ("threadpool", st.ok(mechanism="threadpool", model=st.q4))):
            if sel.empty or base.empty:
                continue
            note = ""
            if label == "mlock":
                v = st.faster(st.compare(sel, base), what="mlock over pread+madvise")
            elif label == "write-in-place":
                v = stats.above(st.compare(base, sel), WRITE_IN_PLACE_SLOWER,
                                "pread+madvise over write-in-place")
                shared, note = configurations.writes_share_the_disk(sel)
                if not shared:  # the claim's cause (writes competing with reads) cannot happen here
                    v = Verdict(INCONCLUSIVE, f"{v.reason}; not judged: {note}", v.interval)
            else:
                v = st.faster(st.compare(base, sel), what="pread+madvise over threadpool")
            parts.append(v)
            rows.append({"change": label, "claim": "faster" if label == "mlock" else "slower",
                         "tok_per_s_median": sel[st.value].median(),
                         "baseline_pread_madvise_median": base[st.value].median(),
                         "ratio": v.interval.ratio[0] if v.interval else None,
                         "majflt_per_token": sel.majflt_per_token.median(),
                         "baseline_majflt_per_token": base.majflt_per_token.median(),
                         "verdict": v.verdict, "why": v.reason})
        if not rows:
            return Outcome(Verdict(INCONCLUSIVE, "no mlock/write-in-place/threadpool runs"))
        return Outcome(stats.family(parts, "mlock faster, the other two slower"),
                       {"finding7_switches": pd.DataFrame(rows)})


class MechanismsFinding(Finding):
    def evaluate(self, st):
        base = st.surviving_design(st.q4)
        if base.empty:
            return Outcome(Verdict(INCONCLUSIVE, "no pread+madvise runs"))
        rows, parts = [], []
        # every Q4_K_M configuration but the LRU budgets (finding 1 judges those)
        runs = st.study_wait(st.runs)
        q4 = runs[(runs.model == st.q4) & (runs[CONFIG] != _one(base))
                  & (runs.mechanism != "lru-odirect")]
        for run_id, g in q4.groupby(CONFIG, sort=False):
            ok = g[g.status == Status.OK.value]
            if ok.empty:
                v = Verdict(INCONCLUSIVE, f"{run_id}: no ok run ({', '.join(sorted(set(g.status)))})")
            else:
                # the claim: nothing beats the study's design; each part: faster by the effect
                v = st.faster(st.compare(base, ok), what=f"pread+madvise over {run_id}")
            parts.append(v)
            rows.append({"run_id": run_id, "mechanism": g.mechanism.iloc[0],
                         "mlock_non_expert": bool(g.mlock_non_expert.iloc[0]), "n_ok": len(ok),
                         "tok_per_s_median": ok[st.value].median(),
                         "pread_madvise_over_it": v.interval.ratio[0] if v.interval else None,
                         "verdict": v.verdict, "why": v.reason})
        v = stats.family(parts, f"every other Q4_K_M configuration at least {st.effect} slower than "
                                "pread+madvise")
        return Outcome(v, {"finding8_mechanisms": pd.DataFrame(rows)})


class BreakdownFinding(Finding):
    def evaluate(self, st):
        best = st.ok(mechanism="pread+madvise", model=st.q4, mlock_non_expert=True)
        if best.empty or "io_wait_share" not in best or best.io_wait_share.isna().all():
            return Outcome(Verdict(INCONCLUSIVE, "no pread+madvise+mlock runs with the per-token "
                                                 "attribution"))
        token_s = 1.0 / best[st.value]
        pread_share = best.pread_s_per_token / token_s
        # of the time the decoding thread spent inside pread, the share it waited on I/O
        gated = best.io_wait_share * token_s / best.pread_s_per_token
        v = stats.mean_above(gated, DISK_GATED, "I/O wait over pread time, per run")
        t = pd.DataFrame([{
            "runs": len(best), "pread_share_of_token": pread_share.median(), "study_pread_share": 0.58,
            "io_wait_share_of_token": best.io_wait_share.median(),
            "kernel_share_of_token": best.kernel_share.median(),
            "throttled_share_of_token": best.throttled_share.median(),
            "io_wait_over_pread": gated.median(), "regime": best.regime.mode().iloc[0],
            "verdict": v.verdict}])
        return Outcome(v, {"finding10_breakdown": t})


STUDY_MECHANISMS = ("none", "pread+madvise", "write-in-place", "threadpool", "lru-odirect")


class LookaheadFinding(Finding):
    def evaluate(self, st):
        rows, parts = [], []
        ok = st.ok()
        for model, g in ok.groupby("model"):
            la = g[g.mechanism == "lookahead"]
            if la.empty:
                continue
            best = {}
            for label, sel in (("lookahead", la),
                               ("study's best", g[g.mechanism.isin(STUDY_MECHANISMS)]),
                               ("ours best", g[~g.mechanism.isin(STUDY_MECHANISMS + ("lookahead",))])):
                if len(sel):
                    rid = sel.groupby(CONFIG)[st.value].median().idxmax()
                    best[label] = (rid, sel[sel[CONFIG] == rid])
            la_id, la_tok = best["lookahead"]
            for label in ("study's best", "ours best"):
                if label not in best:
                    continue
                rid, other = best[label]
                v = st.faster(st.compare(la_tok, other), what=f"{model}: {la_id} over {rid}")
                parts.append(v)
                rows.append({"model": model, "lookahead": la_id, "against": label, "run_id": rid,
                             **_interval_columns(v.interval), "verdict": v.verdict})
        if not rows:
            if ok[ok.mechanism == "lookahead"].empty:
                return Outcome(Verdict(NOT_RUN, "no lookahead runs in this regime"))
            return Outcome(Verdict(INCONCLUSIVE, "no other configuration of a lookahead's model "
                                                 "to compare it with"))
        la = ok[ok.mechanism == "lookahead"]
        quality = la.groupby("run_id").agg(
            n=("tok_per_s", "count"), tok_per_s_median=("tok_per_s", "median"),
            precision=("lookahead_precision", "median"), recall=("lookahead_recall", "median"),
            wasted_bytes_per_token=("lookahead_wasted_bytes_per_token", "median"),
            read_ahead_resident_share=("lookahead_resident_share", "median"),
            hook_s_per_token=("hook_s_per_token", "median")).reset_index() \
            if "lookahead_precision" in la else pd.DataFrame()
        return Outcome(stats.family(parts, f"the best lookahead configuration at least {st.effect} faster "
                                           "than the best of the study's mechanisms and of ours, "
                                           "per model"),
                       {"finding9_lookahead": pd.DataFrame(rows), "lookahead_predictions": quality})


class DesignedMechanismFinding(Finding):
    def evaluate(self, st):
        new = st.ok(mechanism="odirect-cache", model=st.q4)
        best = st.ok(mechanism="pread+madvise", model=st.q4, mlock_non_expert=True)
        if new.empty or best.empty:
            return Outcome(Verdict(INCONCLUSIVE, "no odirect-cache or pread+madvise+mlock runs"))
        # the best odirect-cache configuration (its budgets, depths, predictions may be swept)
        rid = new.groupby(CONFIG)[st.value].median().idxmax()
        v = stats.above(st.compare(new[new[CONFIG] == rid], best), DESIGNED_SPEEDUP,
                        f"{rid} over pread+madvise+mlock")
        # which part of the token it shrank: the attribution of both, side by side
        shares = _attribution_side_by_side([new[new[CONFIG] == rid], best], [CONFIG],
                                           ["mechanism_s_per_token", "bytes_warm_start"])
        t = pd.DataFrame([{"odirect_cache": rid, "against": _one(best),
                           **_interval_columns(v.interval), "threshold": DESIGNED_SPEEDUP, "verdict": v.verdict}])
        return Outcome(v, {"finding11_designed": t, "finding11_attribution": shares})


class ExpertCacheFinding(Finding):
    """The expert cache (odirect-cache filling the memory limit, LFU) against demand paging and
    against the fastest configuration of every other mechanism, each a threshold claim; the
    cache's bytes per window token beside its own policy's replay (harness.analysis.policies)."""

    def evaluate(self, st):
        if "cache_fill" not in st.runs:
            return Outcome(Verdict(NOT_RUN, "these runs predate the expert cache (no cache_fill)"))
        cache = st.ok(mechanism="odirect-cache", model=st.q4, cache_fill=True, cache_policy="lfu")
        paging = st.ok(mechanism="none", model=st.q4)
        if cache.empty or paging.empty:
            return Outcome(Verdict(NOT_RUN, "no runs of the expert cache (odirect-cache, "
                                            "cache_fill, lfu) or of demand paging in this regime"))
        others = st.ok(model=st.q4)
        others = others[~others[CONFIG].isin(set(cache[CONFIG])) & (others.mechanism != "none")]
        parts = [stats.above(st.compare(cache, paging), CACHE_OVER_PAGING,
                             f"{_one(cache)} over demand paging")]
        rows = [{"against": _one(paging), **_interval_columns(parts[0].interval),
                 "threshold": CACHE_OVER_PAGING, "verdict": parts[0].verdict}]
        if len(others):
            best_id = others.groupby(CONFIG)[st.value].median().idxmax()
            best = others[others[CONFIG] == best_id]
            parts.append(stats.above(st.compare(cache, best), CACHE_OVER_BEST,
                                     f"{_one(cache)} over {best_id}, the fastest of the others"))
            rows.append({"against": best_id, **_interval_columns(parts[1].interval),
                         "threshold": CACHE_OVER_BEST, "verdict": parts[1].verdict})
        shares = _attribution_side_by_side([cache, paging], [CONFIG],
                                            ["cache_capacity_bytes", "window_read_bytes_per_token"])
        return Outcome(stats.family(parts, "the expert cache over demand paging and over the "
                                           "fastest other configuration"),
                       {"finding13_expert_cache": pd.DataFrame(rows).assign(cache=_one(cache)),
                        "finding13_attribution": shares,
                        "finding13_bytes_vs_replay": _bytes_against_replay(cache, st.layouts)})


def _bytes_against_replay(runs: pd.DataFrame, layouts: dict) -> pd.DataFrame:
    """Per cache run: the disk bytes its cgroup read per window token beside what its own policy
    reads at its own capacity on its own routing (harness.analysis.policies): a gap is a
    difference between the design and the code."""
    from harness.analysis import policies

    rows = []
    for _, r in runs.iterrows():
        lay = layouts.get(r.model, {})
        if not lay.get("slab_bytes_per_layer") or not isinstance(r.get("record"), str) \
                or pd.isna(r.get("cache_capacity_bytes")):
            continue
        replayed = policies.replay_of_run(r, lay, r.cache_policy, r.cache_capacity_bytes)
        rows.append({"run_id": r.run_id, "repeat": int(r["repeat"]),
                     "capacity_mb": r.cache_capacity_bytes / 1e6,
                     "read_mb_per_window_token": r.window_read_bytes_per_token / 1e6,
                     "replay_mb_per_window_token": replayed / 1e6,
                     "read_over_replay": r.window_read_bytes_per_token / replayed
                     if replayed > 0 else float("nan")})
    return pd.DataFrame(rows)


class WaitPolicyFinding(Finding):
    def evaluate(self, st):
        if "omp_wait_policy" not in st.runs:
            return Outcome(Verdict(INCONCLUSIVE, "no run records its OpenMP wait policy"))
        base = st.ok(mechanism="pread+madvise", model=st.q4, mlock_non_expert=True,
                     omp_wait_policy=LIBGOMP_WAIT)
        if base.empty:
            return Outcome(Verdict(INCONCLUSIVE, "no runs of pread+madvise+mlock with libgomp's "
                                                 "own wait policy"))
        rows, verdicts, parts = [], [], [base]
        for policy in ("passive", "active"):
            other = st.ok(mechanism="pread+madvise", model=st.q4, mlock_non_expert=True,
                          omp_wait_policy=policy)
            if other.empty:
                continue
            v = stats.above(st.compare(other, base), WAIT_SPEEDUP,
                            f"{policy} over libgomp's own wait")
            verdicts.append(v)
            parts.append(other)
            rows.append({"omp_wait_policy": policy, "run_id": _one(other), "against": _one(base),
                         **_interval_columns(v.interval), "threshold": WAIT_SPEEDUP, "verdict": v.verdict})
        if not verdicts:
            return Outcome(Verdict(INCONCLUSIVE, "no pread+madvise+mlock runs with another wait "
                                                 "policy"))
        # which part of the token the policy moved: spinning shows as user CPU and throttling
        shares = _attribution_side_by_side(parts, [CONFIG, "omp_wait_policy"],
                                           ["cg_user_s_per_token"])
        # the claim is passive waiting's; active spinning is shown beside it
        v = next((v for v, r in zip(verdicts, rows) if r["omp_wait_policy"] == "passive"),
                 Verdict(INCONCLUSIVE, "no pread+madvise+mlock runs with passive waiting"))
        return Outcome(v, {"finding12_wait_policy": pd.DataFrame(rows),
                           "finding12_attribution": shares})


FINDINGS: list[Finding] = [
    LruSlowerFinding("1a", "a userspace LRU cache never beat the kernel's page cache",
                     "a userspace LRU over O_DIRECT never beat the kernel page cache; 1200 MB died "
                     "(RSS growth)",
                     "lru-odirect at each budget (each its own configuration) and pread+madvise, "
                     "Q4_K_M",
                     "at every budget that finished, pread+madvise is faster by at least the "
                     "regime's minimum effect (90% interval above 1, estimate at least 1 + the "
                     "effect); a budget where the interval excludes the effect refutes it after Holm's correction over the budgets; killed "
                     "budgets are shown with their memory trail"),
    LruTrendFinding("1b", "tok/s got worse as the LRU budget grew",
                    "tok/s got worse as the cache budget (and hit rate) went up",
                    f"lru-odirect at {MIN_BUDGETS} or more budgets, Q4_K_M",
                    "the fitted change of log tok/s from the smallest to the largest budget is a "
                    "fall of at least the regime's minimum effect with its 90% interval below no "
                    "change; 'no trend' is reported only by equivalence within +- the effect; "
                    "where a line does not fit the budgets' means (lack of fit), each budget "
                    "against the smallest instead"),
    SkewFinding("2", "expert routing has no small hot set",
                "covering 80% of a layer's activations takes 20-33 of 64 experts (median ~25); 44-59 "
                "distinct experts per layer in 64 tokens",
                "the longest logged routing trace",
                "the median layer needs at least a quarter of its experts for 80% of activations; "
                "synthetic routing is inconclusive"),
    LocalityFinding("3", "token-to-token expert locality is low",
                    "adjacent tokens share 35.7% of their routed experts; 20.8% at distance 8",
                    "the longest logged routing trace",
                    "adjacent tokens share under half their experts; synthetic routing is "
                    "inconclusive"),
    ScalingFinding("4", "tok/s does not scale linearly with bytes per token",
                   "Q2_K is 1.92x faster than Q4_K_M for 1.67x fewer bytes per token "
                   "(pread+madvise design)",
                   "pread+madvise on Q4_K_M and Q2_K (demand paging shown beside it)",
                   "the 90% interval of pread+madvise's Q2/Q4 tok/s ratio lies above the bytes "
                   "ratio (below it: does not hold)"),
    FaultsFinding("5", "the extra penalty is disk-driven page-fault pressure",
                  "Q4_K_M takes 9.3x the major faults per token of Q2_K for 1.67x the bytes",
                  "pread+madvise on Q4_K_M and Q2_K (demand paging shown beside it)",
                  "the 90% intervals of the Q4/Q2 ratios of disk bytes read (and of major faults, "
                  "where both sides fault at least 5 times per token) lie above the bytes ratio"),
    GapFinding("6", "even the fastest configuration is far below the compute ceiling",
               "the best quant (Q2_K, 0.175-0.201 tok/s) is ~10x below the ~2.0 tok/s compute "
               "ceiling; the workload is I/O-bound at every quant",
               "every configuration, the dense compute ceiling, pread+madvise per quant",
               f"the dense ceiling over the best configuration is above {FAR_BELOW:g}x (90% "
               f"interval), and at every quant pread+madvise's measured I/O wait is above "
               f"{IO_BOUND_SHARE:.0%} of its token time (90% interval over its runs)"),
    SwitchesFinding("7", "mlock wins; write-in-place and a background pread thread do not",
                    "mlock of the non-expert tensors +26% tok/s; write-in-place >2x slower (write "
                    "traffic contending with reads); a background pread thread slower (majflt x7.4)",
                    "pread+madvise with and without mlock, write-in-place, threadpool, Q4_K_M",
                    "mlock faster than plain pread+madvise and threadpool slower, each by at "
                    "least the regime's minimum effect, and write-in-place more than 2x slower, "
                    "each by its 90% interval; write-in-place is judged only where its writeback was throttled like its "
                    "reads"),
    MechanismsFinding("8", "which mechanism does the work",
                      "the surviving design is pread() + madvise(WILLNEED): the one that works",
                      "every Q4_K_M configuration beside pread+madvise",
                      "pread+madvise faster than every other configuration by at least the regime's "
                      "minimum effect (each by its 90% interval); refuted when one part's "
                      "interval excludes the effect after Holm's correction over the parts"),
    LookaheadFinding("9", "lookahead prefetch beats every other mechanism (not the study's claim)",
                     "(not in the study) predicting the next layer's experts with its router and "
                     "reading them ahead beats the best of the study's mechanisms and of ours",
                     "lookahead, and every other configuration, on the same model and profile",
                     "on every model with lookahead runs, the best lookahead configuration is "
                     "faster by at least the regime's minimum effect than the study's best and "
                     "than our best mechanism, each by its 90% interval"),
    BreakdownFinding("10", "pread time is gated by disk throughput",
                     "at the best configuration (mlock + pread + madvise, Q4_K_M) pread is 58% of a "
                     "token, and pread, gated by real disk throughput, is the floor",
                     "pread+madvise with mlock, Q4_K_M, with the per-token attribution",
                     f"the decoding thread's I/O wait covers more than {DISK_GATED:.0%} of its "
                     "time inside pread (90% interval of the mean over runs); below it, pread "
                     "time is CPU (kernel copies, the quota's throttling), not the disk"),
    DesignedMechanismFinding("11", "a mechanism designed from the attribution beats the study's "
                             "best by half (not the study's claim)",
                             "(not in the study) an expert cache in its own anonymous memory, "
                             "filled by O_DIRECT reads at a queue depth and ahead of need from "
                             "the next layer's router, is 1.5x the study's best",
                             "odirect-cache and pread+madvise with mlock, Q4_K_M",
                             f"the 90% interval of odirect-cache's tok/s over pread+madvise+mlock's "
                             f"lies above {DESIGNED_SPEEDUP:g} (below it: does not hold); the "
                             "attribution of both shows which part of the token changed"),
    WaitPolicyFinding("12", "threads that sleep at barriers beat spinning ones by 10% (not the "
                      "study's claim)",
                      "(not in the study) llama.cpp's OpenMP threads told to wait passively "
                      "(`OMP_WAIT_POLICY=passive`) decode at least 10% faster than with libgomp's "
                      "default spin-then-sleep, because a spinning thread spends CPU the kernel's "
                      "reads need",
                      "pread+madvise with mlock, Q4_K_M, with each OpenMP wait policy",
                      f"the 90% interval of the passive policy's tok/s over libgomp's lies "
                      f"above {WAIT_SPEEDUP:g} (below it: does not hold); `active` (always spin) "
                      "is shown beside it, and the attribution of each says which part moved"),
    ExpertCacheFinding("13", "an expert cache with the best online policy beats demand paging "
                       "by half (not the study's claim)",
                       "(not in the study) an expert cache in anonymous memory that holds what "
                       "the memory limit leaves, keeps the slabs routed most often (LFU) and "
                       "reads its misses with O_DIRECT at a queue depth decodes at least "
                       f"{CACHE_OVER_PAGING:g}x demand paging and {CACHE_OVER_BEST:g}x the "
                       "fastest other configuration",
                       "odirect-cache with cache_fill and cache_policy lfu, demand paging, "
                       "and every other Q4_K_M configuration",
                       f"both 90% intervals lie above their thresholds ({CACHE_OVER_PAGING:g}, "
                       f"{CACHE_OVER_BEST:g}); either below its threshold after Holm's correction: "
                       "does not hold; the attribution of the cache and of demand paging, and "
                       "the cache's bytes beside its policy's replay, say why"),
]
