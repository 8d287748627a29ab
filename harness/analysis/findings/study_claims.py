"""The study's own claims, findings 1a to 8 and 10: each a Finding with its rule, judged on the
Study of one regime."""

from __future__ import annotations

import math

import pandas as pd

from harness.analysis import configurations, stats, traces
from harness.analysis.findings.study import (CONFIG, Finding, interval_columns, one_config,
                                             value_range)
from harness.analysis.outcome import Figure, Outcome
from harness.analysis.stats import FAILS, HOLDS, INCONCLUSIVE, NOT_RUN, Verdict
from harness.contract import Status

STUDY_ROUTING = {"experts_for_80pct_median": 25.0, "distinct_per_layer_64_tokens": "44-59",
                 "shared_distance_1": 0.357, "shared_distance_8": 0.208}
IO_BOUND_SHARE = 0.5  # a configuration is I/O-bound when I/O wait is at least half its token time
FAR_BELOW = 5.0  # "far below the compute ceiling": the best configuration at least 5x slower
FAULT_FLOOR = 5.0  # fewer major faults per token than this on either side: fault ratios say nothing
WRITE_IN_PLACE_SLOWER = 2.0  # the study: write-in-place "over 2x slower"
DISK_GATED = 0.5  # pread time is disk-gated when the thread waits on I/O for most of it
MIN_BUDGETS = 4  # a trend against the LRU budget needs four budgets


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
                         "tok_per_s_median": ok[st.value].median(), "tok_per_s_range": value_range(ok[st.value]),
                         "statuses": ",".join(sorted(set(g.status))),
                         "peak_rss_bytes": g.peak_rss_bytes.max(),
                         "peak_cgroup_bytes": g.peak_cgroup_bytes.max() if "peak_cgroup_bytes" in g
                         else None,
                         **interval_columns(iv, "pread_madvise_over_lru"),
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
            row = {**interval_columns(iv, "change_across_sweep"), "runs": iv.n_a}
        else:
            # the line is not the data: each budget against the smallest instead, a family
            parts, rows = [], []
            small = lru[lru.lru_budget_mb == budgets[0]]
            for b in budgets[1:]:
                pv = st.faster(st.compare(small, lru[lru.lru_budget_mb == b]),
                                  what=f"{budgets[0]} MB over {b} MB")
                parts.append(pv)
                rows.append({"lru_budget_mb": b, "against_mb": budgets[0],
                             **interval_columns(pv.interval), "verdict": pv.verdict})
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
                         **interval_columns(iv, "speedup_q2_over_q4"), "verdict": v.verdict,
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
        # the ceiling's own repetitions where it has several; one is taken as exact
        iv = stats.against_measured(st.pool(), best_id,
                                    st.dense_ceiling_samples or (st.dense_ceiling,))
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
                           "ceiling_repetitions": max(1, len(st.dense_ceiling_samples)),
                           "moe_compute_ceiling": st.moe_ceiling, "gap_x": iv.ratio[0],
                           "gap_ci90_low": iv.ratio[1], "gap_ci90_high": iv.ratio[2]}])
        return Outcome(stats.family(parts, f"at least {FAR_BELOW:g}x below the dense ceiling and "
                                           "I/O-bound (I/O wait at least half the token) at every "
                                           "quant"),
                       {"finding6_gap": t, "finding6_io_bound": pd.DataFrame(rows)})


class SwitchesFinding(Finding):
    """The study's write-in-place is the one whose writeback the kernel's flusher threads issue
    (`writeback: kernel`); it alone is judged. `writeback: sync` (ours: the run writes back each
    layer itself, so its writes share the run's throttled disk) is shown beside it, judged by
    the same rule but outside the finding's verdict."""

    def evaluate(self, st):
        base = st.surviving_design(st.q4)
        mlock = st.ok(mechanism="pread+madvise", model=st.q4, mlock_non_expert=True)
        mlock = mlock[mlock.log_experts.astype(bool)]
        wip = st.ok(mechanism="write-in-place", model=st.q4)
        sync = wip.writeback == "sync" if "writeback" in wip else pd.Series(False, index=wip.index)
        rows, parts = [], []
        for label, sel in (("mlock", mlock), ("write-in-place", wip[~sync]),
                           ("write-in-place (writeback: sync, beside)", wip[sync]),
                           ("threadpool", st.ok(mechanism="threadpool", model=st.q4))):
            if sel.empty or base.empty:
                continue
            if label == "mlock":
                v = st.faster(st.compare(sel, base), what="mlock over pread+madvise")
            elif label.startswith("write-in-place"):
                v = stats.above(st.compare(base, sel), WRITE_IN_PLACE_SLOWER,
                                f"pread+madvise over {label}")
                shared, note = configurations.writes_share_the_disk(sel)
                if not shared:  # the claim's cause (writes competing with reads) cannot happen here
                    v = Verdict(INCONCLUSIVE, f"{v.reason}; not judged: {note}", v.interval)
            else:
                v = st.faster(st.compare(base, sel), what="pread+madvise over threadpool")
            if not label.endswith("beside)"):
                parts.append(v)
            rows.append({"change": label, "claim": "faster" if label == "mlock" else "slower",
                         "tok_per_s_median": sel[st.value].median(),
                         "baseline_pread_madvise_median": base[st.value].median(),
                         "ratio": v.interval.ratio[0] if v.interval else None,
                         "majflt_per_token": sel.majflt_per_token.median(),
                         "baseline_majflt_per_token": base.majflt_per_token.median(),
                         "in_verdict": not label.endswith("beside)"),
                         "verdict": v.verdict, "why": v.reason})
        if not rows:  # nothing of this finding ran in this regime
            return Outcome(Verdict(NOT_RUN, "no pread+madvise runs, or none of mlock, the "
                                            "study's write-in-place and threadpool, here"))
        if not parts:  # only our sync variant ran: shown, not judged
            return Outcome(Verdict(INCONCLUSIVE, "only write-in-place with `writeback: sync` "
                                                 "ran; the study's switches did not"),
                           {"finding7_switches": pd.DataFrame(rows)})
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
        q4 = runs[(runs.model == st.q4) & (runs[CONFIG] != one_config(base))
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


FINDINGS: list[Finding] = [
    LruSlowerFinding("1a", "a userspace LRU cache never beat the kernel's page cache",
                     "a userspace LRU over O_DIRECT never beat the kernel page cache; 1200 MB died "
                     "(RSS growth)",
                     "lru-odirect at each budget (each its own configuration) and pread+madvise, "
                     "Q4_K_M",
                     "at every budget that finished, pread+madvise is faster by at least the "
                     "regime's minimum effect (90% interval above 1 and reaching 1 + the "
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
                    "each by its 90% interval; write-in-place is the study's (`writeback: kernel`), "
                    "judged only where its writeback was throttled like its reads; ours "
                    "(`writeback: sync`) is shown beside it, outside the verdict"),
    MechanismsFinding("8", "which mechanism does the work",
                      "the surviving design is pread() + madvise(WILLNEED): the one that works",
                      "every Q4_K_M configuration beside pread+madvise",
                      "pread+madvise faster than every other configuration by at least the regime's "
                      "minimum effect (each by its 90% interval); refuted when one part's "
                      "interval excludes the effect after Holm's correction over the parts"),
    BreakdownFinding("10", "pread time is gated by disk throughput",
                     "at the best configuration (mlock + pread + madvise, Q4_K_M) pread is 58% of a "
                     "token, and pread, gated by real disk throughput, is the floor",
                     "pread+madvise with mlock, Q4_K_M, with the per-token attribution",
                     f"the decoding thread's I/O wait covers more than {DISK_GATED:.0%} of its "
                     "time inside pread (90% interval of the mean over runs); below it, pread "
                     "time is CPU (kernel copies, the quota's throttling), not the disk"),
]
