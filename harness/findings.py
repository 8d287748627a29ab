"""The study's findings, one unit each: its claim in the study's words, the runs it needs, the
tables it rests on, its rule and its verdict. Nothing here renders; harness.report prints the
outcomes. Every verdict passes through `decide`, which applies the rules RESULTS.md states: fewer
than MIN_REPEATS ok repeats, or a spread over WIDE_SPREAD, on any side makes it inconclusive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from harness import analysis
from harness.analysis import FAILS, HOLDS, INCONCLUSIVE, MIN_REPEATS, WIDE_SPREAD
from harness.contract import Status

STUDY_ROUTING = {"experts_for_80pct_median": 25.0, "distinct_per_layer_64_tokens": "44-59",
                 "shared_distance_1": 0.357, "shared_distance_8": 0.208}
IO_BOUND_SHARE = 0.5  # a configuration is I/O-bound when disk reads take at least half its token time
FAR_BELOW = 5.0  # "far below the compute ceiling": the best configuration at least 5x slower
FAULT_FLOOR = 5.0  # fewer major faults per token than this on either side: fault ratios say nothing


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str


def spread(s: pd.Series) -> float:
    s = s.dropna()
    if len(s) == 0 or s.median() == 0:
        return float("nan")
    return float((s.max() - s.min()) / s.median())


def decide(raw: str, reason: str, *samples: pd.Series) -> Verdict:
    """The one gate of every verdict: each sample is the ok repeats of one configuration."""
    for s in samples:
        s = s.dropna()
        if len(s) < MIN_REPEATS:
            return Verdict(INCONCLUSIVE, f"{len(s)} ok repeat(s) where {MIN_REPEATS} are needed")
        if spread(s) > WIDE_SPREAD:
            return Verdict(INCONCLUSIVE, f"spread {spread(s):.0%} of the median exceeds "
                                         f"{WIDE_SPREAD:.0%}")
    return Verdict(raw, reason)


def combine(verdicts: list[Verdict], reason: str) -> Verdict:
    """All parts hold: holds; any part fails: does not hold; otherwise inconclusive."""
    vs = [v.verdict for v in verdicts]
    if vs and all(v == HOLDS for v in vs):
        return Verdict(HOLDS, reason)
    which = FAILS if FAILS in vs else INCONCLUSIVE
    why = dict.fromkeys(v.reason for v in verdicts if v.verdict == which)  # once each, in order
    return Verdict(which, reason + ": " + "; ".join(why) if why else reason)


def compare_ranges(a: pd.Series, b: pd.Series) -> str:
    """'above' if every repeat of a beats every repeat of b, 'below' if the reverse, else 'overlap'."""
    a, b = a.dropna(), b.dropna()
    if len(a) and len(b) and a.min() > b.max():
        return "above"
    if len(a) and len(b) and a.max() < b.min():
        return "below"
    return "overlap"


def range_vs(values: pd.Series, threshold: float) -> str:
    values = values.dropna()
    if len(values) and values.min() > threshold:
        return "above"
    if len(values) and values.max() <= threshold:
        return "below"
    return "overlap"


def paired_ratios(a: pd.DataFrame, b: pd.DataFrame, col: str) -> pd.Series:
    """b[col] / a[col] repeat by repeat (repeat k of each ran in the same interleaved round)."""
    m = a[["repeat", col]].merge(b[["repeat", col]], on="repeat", suffixes=("_a", "_b"))
    return (m[f"{col}_b"] / m[f"{col}_a"]).replace([np.inf, -np.inf], np.nan)


def _rng(s: pd.Series) -> str:
    s = s.dropna()
    return f"{s.min():.3g}-{s.max():.3g}" if len(s) else "-"


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
    n_expert: int = 0

    def ok(self, **eq) -> pd.DataFrame:
        r = self.runs[self.runs.status == Status.OK.value]
        for k, v in eq.items():
            r = r[r[k] == v]
        return r

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


@dataclass
class Outcome:
    verdict: Verdict
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Finding:
    number: str
    title: str
    claim: str
    needs: str
    rule: str

    def evaluate(self, study: Study) -> Outcome:
        raise NotImplementedError


MIN_BUDGETS = 3  # a trend against the budget needs three points
TREND = 0.5  # |Spearman| at least this: tok/s falls (or rises) with the budget


class LruFinding(Finding):
    def evaluate(self, st):
        lru = st.runs[st.runs.mechanism == "lru-odirect"]
        pm = st.surviving_design(st.q4)
        if lru.empty or pm.empty:
            return Outcome(Verdict(INCONCLUSIVE, "no lru-odirect or pread+madvise runs"))
        rows, parts, dead, once = [], [], [], []
        for budget, g in lru.groupby("lru_budget_mb"):
            ok = g[g.status == Status.OK.value]
            if ok.empty and g.status.str.startswith("killed").all():
                # a budget that never finishes beat nothing (the study's 1200 MB died): it is shown
                # with its memory trail and judged by the budgets that did finish
                dead.append(budget)
                v = Verdict(INCONCLUSIVE, f"budget {budget} MB: {', '.join(sorted(set(g.status)))}")
                cmp = "killed"
            elif len(ok) < MIN_REPEATS and len(g) < MIN_REPEATS:
                # run once by design (the config's probe of a budget the study's box died at):
                # shown, not judged, as it would otherwise make every verdict inconclusive
                once.append(budget)
                cmp = compare_ranges(ok.tok_per_s, pm.tok_per_s)
                v = Verdict(INCONCLUSIVE, f"budget {budget} MB: {len(g)} repeat(s), not judged")
            else:
                cmp = compare_ranges(ok.tok_per_s, pm.tok_per_s)
                raw = {"below": HOLDS, "above": FAILS}.get(cmp, INCONCLUSIVE)
                v = decide(raw, f"budget {budget} MB {cmp} pread+madvise", ok.tok_per_s, pm.tok_per_s)
                parts.append(v)
            rows.append({"lru_budget_mb": budget, "n_ok": len(ok),
                         "tok_per_s_median": ok.tok_per_s.median(), "tok_per_s_range": _rng(ok.tok_per_s),
                         "statuses": ",".join(sorted(set(g.status))),
                         "peak_rss_bytes": g.peak_rss_bytes.max(),
                         "peak_cgroup_bytes": g.peak_cgroup_bytes.max() if "peak_cgroup_bytes" in g
                         else None, "vs_pread_madvise": cmp, "verdict": v.verdict})
        t = pd.DataFrame(rows)
        med = t[~t.lru_budget_mb.isin(once)].dropna(subset=["tok_per_s_median"])
        # Spearman's rank correlation (Pearson on ranks; scipy is not a dependency)
        trend = (float(med.lru_budget_mb.rank().corr(med.tok_per_s_median.rank()))
                 if len(med) >= 3 else float("nan"))
        n_finished = len(parts)
        if n_finished >= MIN_BUDGETS and not math.isnan(trend):
            # the study: "tok/s got worse as the cache budget (and hit rate) went up"
            parts.append(Verdict(HOLDS, f"tok/s falls as the budget grows (Spearman {trend:.2f})")
                         if trend <= -TREND else
                         Verdict(FAILS, f"tok/s rises as the budget grows (Spearman {trend:.2f})")
                         if trend >= TREND else
                         Verdict(INCONCLUSIVE, f"no trend against the budget (Spearman {trend:.2f})"))
        v = combine(parts, f"LRU against pread+madvise ({_rng(pm.tok_per_s)} tok/s) at every budget, "
                           "and its trend against the budget")
        if v.verdict == HOLDS and n_finished < MIN_BUDGETS:
            v = Verdict(INCONCLUSIVE, f"{n_finished} budget(s) finished; the rule needs {MIN_BUDGETS}")
        if dead:
            v = Verdict(v.verdict, v.reason + f" (killed, not judged: {', '.join(map(str, dead))} MB)")
        if once:
            v = Verdict(v.verdict, v.reason + f" (run once, not judged: {', '.join(map(str, once))} MB)")
        notes = [f"Trend of the median tok/s against the budget (Spearman): {trend:.2f} "
                 f"({'falls' if trend < 0 else 'rises' if trend > 0 else 'flat'} as the budget grows)"
                 if not math.isnan(trend) else "Fewer than three budgets with ok runs: no trend."]
        return Outcome(v, {"finding1_lru": t}, notes)


class SkewFinding(Finding):
    def evaluate(self, st):
        if st.trace is None:
            return Outcome(Verdict(INCONCLUSIVE, "no run logged its expert activations"))
        sk = analysis.skew(st.trace)
        frac = float(sk.experts_for_80pct.median()) / max(st.n_expert, 1)
        if st.trace_synthetic:
            v = Verdict(INCONCLUSIVE, "routing of a synthetic model is not the original's")
        else:
            v = Verdict(HOLDS if frac >= 0.25 else FAILS,
                        f"the median layer needs {frac:.0%} of its experts for 80%")
        return Outcome(v, {"finding2_skew": sk})


class LocalityFinding(Finding):
    def evaluate(self, st):
        if st.trace is None:
            return Outcome(Verdict(INCONCLUSIVE, "no run logged its expert activations"))
        loc = analysis.locality(st.trace)
        by_d = loc.set_index("distance").shared_fraction if len(loc) else pd.Series(dtype=float)
        d1 = float(by_d.get(1, float("nan")))
        if st.trace_synthetic:
            v = Verdict(INCONCLUSIVE, "routing of a synthetic model is not the original's")
        elif math.isnan(d1):
            v = Verdict(INCONCLUSIVE, "trace too short")
        else:
            v = Verdict(HOLDS if d1 < 0.5 else FAILS, f"adjacent tokens share {d1:.1%}")
        sk = analysis.skew(st.trace)
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
        return Outcome(v, {"finding3_locality": loc, "routing_vs_study": stats})


class ScalingFinding(Finding):
    def evaluate(self, st):
        br = st.bytes_ratio()
        rows, verdict = [], Verdict(INCONCLUSIVE, "no Q4_K_M/Q2_K pread+madvise pair")
        for mech, a, b in st.quant_pairs():  # the study's design first; demand paging beside it
            ratios = paired_ratios(a, b, "tok_per_s")  # Q2 / Q4
            cmp = range_vs(ratios, br)
            rows.append({"mechanism": mech, "bytes_ratio_q4_over_q2": br,
                         "speedup_q2_over_q4_median": ratios.median(),
                         "speedup_min": ratios.min(), "speedup_max": ratios.max(),
                         "pairs": len(ratios), "vs_bytes_ratio": cmp})
            if mech == "pread+madvise":
                raw = {"above": HOLDS, "below": FAILS}.get(cmp, INCONCLUSIVE)
                verdict = decide(raw, f"per-repeat Q2/Q4 speed-up {_rng(ratios)} vs bytes ratio "
                                      f"{br:.3g}", a.tok_per_s, b.tok_per_s, ratios)
        return Outcome(verdict, {"finding4_scaling": pd.DataFrame(rows)} if rows else {})


class FaultsFinding(Finding):
    def evaluate(self, st):
        br = st.bytes_ratio()
        rows, verdict = [], Verdict(INCONCLUSIVE, "no Q4_K_M/Q2_K pread+madvise pair")
        for mech, a, b in st.quant_pairs():
            faults = paired_ratios(b, a, "majflt_per_token")  # Q4 / Q2
            disk = paired_ratios(b, a, "cgroup_read_bytes_per_token")
            few = min(a.majflt_per_token.median(), b.majflt_per_token.median()) < FAULT_FLOOR
            row = {"mechanism": mech, "bytes_ratio_q4_over_q2": br,
                   "majflt_q4": a.majflt_per_token.median(), "majflt_q2": b.majflt_per_token.median(),
                   "fault_ratio_range": _rng(faults), "disk_read_ratio_median": disk.median(),
                   "disk_read_ratio_range": _rng(disk), "faults_too_few": few}
            rows.append(row)
            if mech == "pread+madvise":
                parts = [decide({"above": HOLDS, "below": FAILS}.get(range_vs(disk, br), INCONCLUSIVE),
                                f"disk-read ratio {_rng(disk)} vs bytes ratio {br:.3g}", disk,
                                a.cgroup_read_bytes_per_token, b.cgroup_read_bytes_per_token)]
                if not few:
                    parts.append(decide({"above": HOLDS, "below": FAILS}.get(range_vs(faults, br),
                                                                             INCONCLUSIVE),
                                        f"fault ratio {_rng(faults)}", faults))
                verdict = combine(parts, "Q4 reads disproportionately more than its bytes ratio"
                                  + (" (fault counts under 5/token: disk bytes only)" if few else ""))
        return Outcome(verdict, {"finding5_faults": pd.DataFrame(rows)} if rows else {})


class GapFinding(Finding):
    def evaluate(self, st):
        ok = st.runs[st.runs.status == Status.OK.value]
        if ok.empty or not st.dense_ceiling:
            return Outcome(Verdict(INCONCLUSIVE, "no ok runs or no dense compute ceiling"))
        med = ok.groupby("run_id").tok_per_s.median()
        best_id = med.idxmax()
        best = ok[ok.run_id == best_id].tok_per_s
        gap = st.dense_ceiling / best.max()
        gap_raw = HOLDS if gap >= FAR_BELOW else FAILS if gap < 2 else INCONCLUSIVE
        parts = [decide(gap_raw, f"dense ceiling / best ({best_id}) = {gap:.3g}", best)]
        rows = []
        for model in (st.q4, st.q2):
            pm = st.surviving_design(model)
            if pm.empty:
                continue
            io_s = pm.cgroup_read_bytes_per_token / (st.io_mb_s * 1e6)
            share = io_s * pm.tok_per_s  # I/O time over the measured time per token
            cmp = range_vs(share, IO_BOUND_SHARE)
            raw = {"above": HOLDS, "below": FAILS}.get(cmp, INCONCLUSIVE)
            parts.append(decide(raw, f"{model}: disk reads {_rng(share)} of the token time", share))
            rows.append({"model": model, "tok_per_s_median": pm.tok_per_s.median(),
                         "io_share_of_token_min": share.min(), "io_share_of_token_max": share.max(),
                         "io_bound": cmp == "above"})
        t = pd.DataFrame([{"best_run_id": best_id, "best_tok_per_s_max": best.max(),
                           "dense_compute_ceiling": st.dense_ceiling,
                           "moe_compute_ceiling": st.moe_ceiling, "gap_x": gap}])
        return Outcome(combine(parts, f"at least {FAR_BELOW:g}x below the dense ceiling and I/O-bound "
                                      "(reads at least half the token time) at every quant"),
                       {"finding6_gap": t, "finding6_io_bound": pd.DataFrame(rows)})


class SwitchesFinding(Finding):
    def evaluate(self, st):
        base = st.surviving_design(st.q4)
        mlock = st.ok(mechanism="pread+madvise", model=st.q4, mlock_non_expert=True)
        mlock = mlock[mlock.log_experts.astype(bool)]
        rows, parts = [], []
        for label, sel, claim in (("mlock", mlock, "above"),
                                  ("write-in-place", st.ok(mechanism="write-in-place", model=st.q4),
                                   "below"),
                                  ("threadpool", st.ok(mechanism="threadpool", model=st.q4), "below")):
            if sel.empty or base.empty:
                continue
            cmp = compare_ranges(sel.tok_per_s, base.tok_per_s)
            raw = HOLDS if cmp == claim else FAILS if cmp != "overlap" else INCONCLUSIVE
            note = ""
            if label == "write-in-place":
                shared, note = analysis.writes_share_the_disk(sel)
                if not shared:  # the claim's cause (writes competing with reads) cannot happen here
                    raw = INCONCLUSIVE
            v = decide(raw, f"{label} {cmp} pread+madvise" + (f" ({note})" if note else ""),
                       sel.tok_per_s, base.tok_per_s)
            if label == "write-in-place" and raw == INCONCLUSIVE and note:
                v = Verdict(INCONCLUSIVE, note)
            parts.append(v)
            rows.append({"change": label, "claim": "faster" if claim == "above" else "slower",
                         "tok_per_s_median": sel.tok_per_s.median(), "tok_per_s_range": _rng(sel.tok_per_s),
                         "baseline_pread_madvise_median": base.tok_per_s.median(),
                         "baseline_range": _rng(base.tok_per_s),
                         "majflt_per_token": sel.majflt_per_token.median(),
                         "baseline_majflt_per_token": base.majflt_per_token.median(),
                         "verdict": v.verdict, "why": v.reason})
        if not rows:
            return Outcome(Verdict(INCONCLUSIVE, "no mlock/write-in-place/threadpool runs"))
        return Outcome(combine(parts, "mlock faster, the other two slower"),
                       {"finding7_switches": pd.DataFrame(rows)})


class MechanismsFinding(Finding):
    def evaluate(self, st):
        base = st.surviving_design(st.q4)
        if base.empty:
            return Outcome(Verdict(INCONCLUSIVE, "no pread+madvise runs"))
        rows, parts = [], []
        # every Q4_K_M configuration but the LRU budgets (finding 1 judges those)
        q4 = st.runs[(st.runs.model == st.q4) & (st.runs.run_id != base.run_id.iloc[0])
                     & (st.runs.mechanism != "lru-odirect")]
        for run_id, g in q4.groupby("run_id", sort=False):
            ok = g[g.status == Status.OK.value]
            cmp = compare_ranges(ok.tok_per_s, base.tok_per_s)
            # the claim: nothing beats the study's design; a faster configuration refutes it
            raw = {"below": HOLDS, "above": FAILS}.get(cmp, INCONCLUSIVE)
            v = decide(raw, f"{run_id} {cmp} pread+madvise", ok.tok_per_s, base.tok_per_s)
            parts.append(v)
            rows.append({"run_id": run_id, "mechanism": g.mechanism.iloc[0],
                         "mlock_non_expert": bool(g.mlock_non_expert.iloc[0]), "n_ok": len(ok),
                         "tok_per_s_median": ok.tok_per_s.median(), "tok_per_s_range": _rng(ok.tok_per_s),
                         "vs_pread_madvise": {"above": "faster", "below": "slower"}.get(cmp, "overlap"),
                         "verdict": v.verdict, "why": v.reason})
        t = pd.DataFrame(rows)
        v = combine(parts, f"every other Q4_K_M configuration against pread+madvise "
                           f"({_rng(base.tok_per_s)} tok/s)")
        return Outcome(v, {"finding8_mechanisms": t})


STUDY_MECHANISMS = ("none", "pread+madvise", "write-in-place", "threadpool", "lru-odirect")


class LookaheadFinding(Finding):
    def evaluate(self, st):
        rows, parts = [], []
        ok = st.runs[st.runs.status == Status.OK.value]
        for model, g in ok.groupby("model"):
            la = g[g.mechanism == "lookahead"]
            if la.empty:
                continue
            best = {}
            for label, sel in (("lookahead", la),
                               ("study's best", g[g.mechanism.isin(STUDY_MECHANISMS)]),
                               ("ours best", g[~g.mechanism.isin(STUDY_MECHANISMS + ("lookahead",))])):
                if len(sel):
                    rid = sel.groupby("run_id").tok_per_s.median().idxmax()
                    best[label] = (rid, sel[sel.run_id == rid].tok_per_s)
            la_id, la_tok = best["lookahead"]
            for label in ("study's best", "ours best"):
                if label not in best:
                    continue
                rid, tok = best[label]
                cmp = compare_ranges(la_tok, tok)
                raw = {"above": HOLDS, "below": FAILS}.get(cmp, INCONCLUSIVE)
                v = decide(raw, f"{model}: {la_id} {cmp} {rid}", la_tok, tok)
                parts.append(v)
                rows.append({"model": model, "lookahead": la_id, "lookahead_range": _rng(la_tok),
                             "against": label, "run_id": rid, "range": _rng(tok),
                             "verdict": v.verdict})
        if not rows:
            return Outcome(Verdict(INCONCLUSIVE, "no lookahead runs"))
        la = ok[ok.mechanism == "lookahead"]
        quality = la.groupby("run_id").agg(
            n=("tok_per_s", "count"), tok_per_s_median=("tok_per_s", "median"),
            precision=("lookahead_precision", "median"), recall=("lookahead_recall", "median"),
            wasted_bytes_per_token=("lookahead_wasted_bytes_per_token", "median"),
            read_ahead_resident_share=("lookahead_resident_share", "median"),
            hook_s_per_token=("hook_s_per_token", "median")).reset_index() \
            if "lookahead_precision" in la else pd.DataFrame()
        return Outcome(combine(parts, "the best lookahead configuration against the best of the "
                                      "study's mechanisms and the best of ours, per model"),
                       {"finding9_lookahead": pd.DataFrame(rows), "lookahead_predictions": quality})


FINDINGS: list[Finding] = [
    LruFinding("1", "a userspace LRU cache never beat the kernel's page cache",
               "a userspace LRU over O_DIRECT never beat the kernel page cache; tok/s got worse as the "
               "budget went up; 1200 MB died (RSS growth)",
               "lru-odirect at each budget (each its own configuration) and pread+madvise, Q4_K_M",
               "at every budget the LRU's repeats are all slower than pread+madvise's; any budget "
               "faster refutes it; the trend against the budget and the memory trail are shown"),
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
                   "every per-repeat Q2/Q4 speed-up of pread+madvise lies above the bytes ratio"),
    FaultsFinding("5", "the extra penalty is disk-driven page-fault pressure",
                  "Q4_K_M takes 9.3x the major faults per token of Q2_K for 1.67x the bytes",
                  "pread+madvise on Q4_K_M and Q2_K (demand paging shown beside it)",
                  "per-repeat Q4/Q2 ratios of disk bytes read (and of major faults, where both "
                  "sides fault at least 5 times per token) all lie above the bytes ratio"),
    GapFinding("6", "even the fastest configuration is far below the compute ceiling",
               "the best quant (Q2_K, 0.175-0.201 tok/s) is ~10x below the ~2.0 tok/s compute "
               "ceiling; the workload is I/O-bound at every quant",
               "every configuration, the dense compute ceiling, pread+madvise per quant",
               f"the best configuration's fastest repeat is at least {FAR_BELOW:g}x below the dense "
               f"ceiling, and at every quant pread+madvise's disk reads (at the measured I/O "
               f"ceiling) take at least {IO_BOUND_SHARE:.0%} of its token time in every repeat"),
    SwitchesFinding("7", "mlock wins; write-in-place and a background pread thread do not",
                    "mlock of the non-expert tensors +26% tok/s; write-in-place >2x slower (write "
                    "traffic contending with reads); a background pread thread slower (majflt x7.4)",
                    "pread+madvise with and without mlock, write-in-place, threadpool, Q4_K_M",
                    "mlock's repeats all faster than plain pread+madvise and the other two all "
                    "slower; write-in-place is judged only where its writeback was throttled like "
                    "its reads"),
    MechanismsFinding("8", "which mechanism does the work",
                      "the surviving design is pread() + madvise(WILLNEED): the one that works",
                      "every Q4_K_M configuration beside pread+madvise, 3 repeats each",
                      "a configuration whose repeats are all faster than pread+madvise's refutes "
                      "it; it holds when every other configuration is conclusively slower"),
    LookaheadFinding("9", "lookahead prefetch beats every other mechanism (not the study's claim)",
                     "(not in the study) predicting the next layer's experts with its router and "
                     "reading them ahead beats the best of the study's mechanisms and of ours",
                     "lookahead, and every other configuration, on the same model and profile",
                     "on every model with lookahead runs, the best lookahead configuration's "
                     "repeats are all faster than those of the study's best and of our best "
                     "mechanism; any of them faster refutes it"),
]
