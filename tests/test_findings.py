"""Every finding's rule driven to holds, does not hold and inconclusive on hand-made tables."""

import pandas as pd
import pytest

from harness.analysis import findings
from harness.analysis.stats import FAILS, HOLDS, INCONCLUSIVE, NOT_RUN

Q4, Q2 = "q4", "q2"
LAYOUTS = {Q4: {"bytes_per_token": 167, "n_layer": 2, "n_expert": 8},
           Q2: {"bytes_per_token": 100, "n_layer": 2, "n_expert": 8}}


def rows(run_id, tok, model=Q4, mechanism="pread+madvise", mlock=False, log=True, status="ok",
         **cols):
    out = []
    for k, t in enumerate(tok, start=1):
        r = {"run_id": run_id, "repeat": k, "model": model, "mechanism": mechanism,
             "mlock_non_expert": mlock, "log_experts": log, "status": status, "tok_per_s": t,
             "lru_budget_mb": 0, "peak_rss_bytes": 1, "peak_cgroup_bytes": 1,
             "majflt_per_token": 100.0, "cgroup_read_bytes_per_token": 100e6,
             "dirtied_bytes_per_token": 0.0, "cgroup_write_bytes_per_token": 0.0}
        for c, v in cols.items():
            r[c] = v[k - 1] if isinstance(v, list) else v
        out.append(r)
    return out


def study(*groups, trace=None, synthetic=True, dense=2.0, min_effect=0.10):
    runs = pd.DataFrame([r for g in groups for r in g])
    return findings.Study(runs=runs, layouts=LAYOUTS, q4=Q4, q2=Q2, io_mb_s=150.0, dense_ceiling=dense,
                   moe_ceiling=1.0, trace=trace, trace_synthetic=synthetic, n_expert=8,
                   min_effect=min_effect)


def verdict(number, st):
    return next(f for f in findings.FINDINGS if f.number == number).evaluate(st).verdict.verdict


PM = rows("pm", [1.0, 1.05, 1.1])


def lru(budget, tok):
    return rows(f"lru-{budget}", tok, mechanism="lru-odirect", lru_budget_mb=budget)


def test_finding1a_lru_slower_at_every_budget_each_way():
    slow3 = (lru(0, [0.5, 0.52]), lru(256, [0.4, 0.41]), lru(512, [0.3, 0.3]))
    assert verdict("1a", study(PM, *slow3)) == HOLDS
    assert verdict("1a", study(PM, lru(0, [0.5, 0.52]), lru(256, [1.5, 1.55]))) == FAILS
    # as fast as pread+madvise, within noise: neither 10% slower nor excluded from it
    assert verdict("1a", study(PM, lru(0, [0.85, 1.15]))) == INCONCLUSIVE
    # a budget killed at every repeat is shown, not judged
    killed = rows("lru-1200", [None], mechanism="lru-odirect", lru_budget_mb=1200,
                  status="killed: memory")
    out = F("1a").evaluate(study(PM, *slow3, killed))
    assert out.verdict.verdict == HOLDS and "killed, not judged: 1200" in out.verdict.reason
    t = out.tables["finding1_lru"].set_index("lru_budget_mb")
    assert t.loc[0, "ci90_low"] > 1.0 and t.loc[1200, "verdict"] == INCONCLUSIVE


def test_finding1b_lru_trend_each_way():
    falling = (lru(0, [0.5, 0.52]), lru(256, [0.4, 0.41]), lru(512, [0.3, 0.31]),
               lru(800, [0.25, 0.26]))
    assert verdict("1b", study(PM, *falling)) == HOLDS
    rising = (lru(0, [0.25, 0.26]), lru(256, [0.3, 0.31]), lru(512, [0.4, 0.41]),
              lru(800, [0.5, 0.52]))
    assert verdict("1b", study(PM, *rising)) == FAILS
    assert verdict("1b", study(PM, *falling[:3])) == INCONCLUSIVE  # three budgets: no trend rule
    noisy = (lru(0, [0.3, 0.5]), lru(256, [0.5, 0.3]), lru(512, [0.45, 0.3]), lru(800, [0.3, 0.45]))
    out = F("1b").evaluate(study(PM, *noisy))
    assert out.verdict.verdict == INCONCLUSIVE
    assert "no trend" in out.notes[0]  # equivalence is reported, and here cannot be shown either


def F(number):
    return next(f for f in findings.FINDINGS if f.number == number)


def trace_rows(shared):
    """2 layers, 8 experts, 4 routed per token; `shared` experts repeat from one token to the next."""
    out = []
    for t in range(16):
        for layer in range(2):
            ex = [(t * (4 - shared) + i) % 8 for i in range(4)]
            out += [(t, layer, r, e) for r, e in enumerate(ex)]
    return pd.DataFrame(out, columns=["token", "layer", "rank", "expert"])


def test_findings2_and_3_routing_each_way():
    low, high = trace_rows(1), trace_rows(3)
    assert verdict("3", study(PM, trace=low, synthetic=False)) == HOLDS  # 25% shared
    assert verdict("3", study(PM, trace=high, synthetic=False)) == FAILS  # 75% shared
    assert verdict("3", study(PM, trace=low, synthetic=True)) == INCONCLUSIVE
    assert verdict("2", study(PM, trace=low, synthetic=False)) == HOLDS  # uniform over 8
    hot = pd.DataFrame([(t, 0, r, r) for t in range(16) for r in range(4)],
                       columns=["token", "layer", "rank", "expert"])  # the same 4 of 8 always
    st = study(PM, trace=hot, synthetic=False)
    st.n_expert = 64  # 4 of 64 cover everything: a small hot set
    assert verdict("2", st) == FAILS
    assert verdict("2", study(PM, trace=low, synthetic=True)) == INCONCLUSIVE


def pair(q4_tok, q2_tok, q4_read=167e6, q2_read=100e6, q4_flt=200.0, q2_flt=100.0):
    return (rows("pm-q4", q4_tok, cgroup_read_bytes_per_token=q4_read, majflt_per_token=q4_flt),
            rows("pm-q2", q2_tok, model=Q2, cgroup_read_bytes_per_token=q2_read,
                 majflt_per_token=q2_flt))


def test_finding4_scaling_each_way():
    assert verdict("4", study(*pair([1.0, 1.0, 1.0], [2.0, 2.1, 2.05]))) == HOLDS  # 2x > 1.67
    assert verdict("4", study(*pair([1.0, 1.0, 1.0], [1.2, 1.25, 1.3]))) == FAILS
    assert verdict("4", study(*pair([1.0, 1.0, 1.0], [1.5, 1.7, 1.8]))) == INCONCLUSIVE
    # judged on pread+madvise: a demand-paging pair alone gives no verdict
    none = [dict(r, mechanism="none") for r in pair([1.0, 1.0], [2.0, 2.0])[0] + pair(
        [1.0, 1.0], [2.0, 2.0])[1]]
    assert verdict("4", study(none)) == INCONCLUSIVE


def test_finding5_disk_reads_and_faults_each_way():
    assert verdict("5", study(*pair([1, 1], [2, 2], q4_read=500e6, q4_flt=900.0))) == HOLDS
    assert verdict("5", study(*pair([1, 1], [2, 2], q4_read=150e6, q4_flt=150.0))) == FAILS
    assert verdict("5", study(*pair([1], [2], q4_read=500e6, q4_flt=900.0))) == INCONCLUSIVE
    # too few faults to count: judged on disk bytes alone
    st = study(*pair([1, 1], [2, 2], q4_read=500e6, q4_flt=2.0, q2_flt=1.0))
    assert verdict("5", st) == HOLDS


def test_finding6_gap_and_io_bound_each_way():
    # 0.3 tok/s reading 450 MB/token at 150 MB/s: 3 s of 3.3 s in I/O, 6.7x below 2.0
    q4, q2 = pair([0.3, 0.3], [0.3, 0.31], q4_read=450e6, q2_read=450e6)
    assert verdict("6", study(q4, q2)) == HOLDS
    # compute-bound: 1.5 tok/s reading 15 MB/token
    q4, q2 = pair([1.5, 1.5], [1.5, 1.52], q4_read=15e6, q2_read=15e6)
    assert verdict("6", study(q4, q2)) == FAILS
    q4, q2 = pair([0.3], [0.3], q4_read=450e6, q2_read=450e6)
    assert verdict("6", study(q4, q2)) == INCONCLUSIVE


def test_finding6_compares_with_the_ceilings_repetitions_not_one_of_them():
    q4, q2 = pair([0.3, 0.3], [0.3, 0.31], q4_read=450e6, q2_read=450e6)
    # one repetition of 2.0 tok/s is taken as exact: 6.7x, surely above 5x
    exact = study(q4, q2)
    assert verdict("6", exact) == HOLDS
    # three repetitions averaging about 2.0 but spread 1.2-3.3: the ceiling's own noise makes
    # 5x uncertain
    noisy = study(q4, q2)
    noisy.dense_ceiling_samples = (1.2, 2.0, 3.3)
    out = F("6").evaluate(noisy)
    assert out.verdict.verdict == INCONCLUSIVE
    assert out.tables["finding6_gap"].ceiling_repetitions.iloc[0] == 3
    # three tight repetitions: it holds again, with the ceiling's noise in the interval
    tight = study(q4, q2)
    tight.dense_ceiling_samples = (1.98, 2.0, 2.02)
    assert verdict("6", tight) == HOLDS


def test_finding7_switches_each_way():
    mlock_fast = rows("mlock", [1.5, 1.6], mlock=True)
    slow_tp = rows("tp", [0.3, 0.31], mechanism="threadpool")
    assert verdict("7", study(PM, mlock_fast, slow_tp)) == HOLDS
    fast_tp = rows("tp", [2.0, 2.1], mechanism="threadpool")
    assert verdict("7", study(PM, mlock_fast, fast_tp)) == FAILS
    assert verdict("7", study(PM, rows("mlock", [1.0, 1.1], mlock=True))) == INCONCLUSIVE


def test_finding7_write_in_place_needs_throttled_writeback():
    slow = dict(mechanism="write-in-place", dirtied_bytes_per_token=400e6)
    unthrottled = rows("wip", [0.3, 0.3], cgroup_write_bytes_per_token=0.0, **slow)
    out = F("7").evaluate(study(PM, unthrottled))
    assert out.verdict.verdict == INCONCLUSIVE and "writeback not throttled" in out.verdict.reason
    throttled = rows("wip", [0.3, 0.3], cgroup_write_bytes_per_token=390e6, **slow)
    assert verdict("7", study(PM, throttled)) == HOLDS
    fast = rows("wip", [2.0, 2.1], cgroup_write_bytes_per_token=390e6, **slow)
    assert verdict("7", study(PM, fast)) == FAILS



def test_finding7_judges_the_studys_write_in_place_and_shows_the_sync_variant_beside():
    slow = dict(mechanism="write-in-place", dirtied_bytes_per_token=400e6)
    kernel = rows("wip", [0.3, 0.3], cgroup_write_bytes_per_token=0.0, writeback="kernel", **slow)
    sync_fast = rows("wip-sync", [2.0, 2.1], cgroup_write_bytes_per_token=390e6,
                     writeback="sync", **slow)
    out = F("7").evaluate(study(PM, kernel, sync_fast))
    # the sync variant is refuted beside, but the study's own is not judged: not refuted
    t = out.tables["finding7_switches"].set_index("change")
    assert t.loc["write-in-place (writeback: sync, beside)", "verdict"] == FAILS
    assert not t.loc["write-in-place (writeback: sync, beside)", "in_verdict"]
    assert out.verdict.verdict == INCONCLUSIVE and "writeback not throttled" in out.verdict.reason
    # the study's own, throttled and fast, refutes it whatever the sync variant did
    kernel_fast = rows("wip", [2.0, 2.1], cgroup_write_bytes_per_token=390e6, writeback="kernel",
                       **slow)
    sync_slow = rows("wip-sync", [0.3, 0.3], cgroup_write_bytes_per_token=390e6,
                     writeback="sync", **slow)
    assert verdict("7", study(PM, kernel_fast, sync_slow)) == FAILS
    # nothing of the finding ran: not run, not inconclusive; only the sync variant: inconclusive
    assert verdict("7", study(PM)) == NOT_RUN
    assert verdict("7", study(PM, sync_slow)) == INCONCLUSIVE


def test_finding8_every_mechanism_against_pread_madvise():
    slower = [rows("none", [0.1, 0.1], mechanism="none"),
              rows("madvise", [0.5, 0.55], mechanism="madvise")]
    assert verdict("8", study(PM, *slower)) == HOLDS
    faster = rows("madvise", [1.5, 1.55], mechanism="madvise")
    out = F("8").evaluate(study(PM, slower[0], faster))
    assert out.verdict.verdict == FAILS and "Holm" in out.verdict.reason
    t = out.tables["finding8_mechanisms"].set_index("run_id")
    assert t.loc["madvise", "pread_madvise_over_it"] < 1 and t.loc["none", "verdict"] == HOLDS
    assert verdict("8", study(PM, rows("madvise", [1.0, 1.1], mechanism="madvise"))) == INCONCLUSIVE


def test_a_regimes_minimum_effect_decides_what_a_difference_must_reach():
    # madvise ~15% slower than pread+madvise, tightly: a 10% claim holds, a 20% one is refuted
    # (its interval excludes 20%), and the verdict's text names the effect it was judged at
    tight_pm = rows("pm", [1.0, 1.01, 1.0])
    slower = rows("madvise", [0.87, 0.87, 0.875], mechanism="madvise")
    assert verdict("8", study(tight_pm, slower)) == HOLDS
    out = F("8").evaluate(study(tight_pm, slower, min_effect=0.20))
    assert out.verdict.verdict == FAILS and "minimum effect 20%" in \
        out.tables["finding8_mechanisms"].why.iloc[0]
    assert "at least 20% slower" in out.verdict.reason


@pytest.mark.parametrize("finding", findings.FINDINGS, ids=lambda f: f.number)
def test_every_finding_states_its_claim_runs_and_rule(finding):
    assert finding.claim and finding.needs and finding.rule
    assert verdict(finding.number, study(PM)) in (HOLDS, FAILS, INCONCLUSIVE, NOT_RUN)


def test_finding9_lookahead_each_way():
    study_best = rows("pm", [1.0, 1.05])
    ours = rows("madvise", [1.2, 1.25], mechanism="madvise")
    fast = rows("la", [1.6, 1.7], mechanism="lookahead")
    assert verdict("9", study(study_best, ours, fast)) == HOLDS
    slow = rows("la", [0.8, 0.85], mechanism="lookahead")
    assert verdict("9", study(study_best, ours, slow)) == FAILS
    between = rows("la", [1.1, 1.15], mechanism="lookahead")  # beats the study's, not ours
    out = F("9").evaluate(study(study_best, ours, between))
    assert out.verdict.verdict == FAILS
    t = out.tables["finding9_lookahead"].set_index("against")
    assert t.loc["ours best", "verdict"] == FAILS
    assert verdict("9", study(study_best, ours, rows("la", [1.3], mechanism="lookahead"))) \
        == INCONCLUSIVE
    assert verdict("9", study(study_best, ours)) == NOT_RUN  # no lookahead runs



def test_finding10_pread_is_disk_gated_each_way():
    def mlock(io_share, kernel_share, n=3):
        # 1 tok/s, 0.6 s of pread a token; io_wait_share of the token waits on I/O
        return rows("mlock", [1.0] * n, mlock=True, pread_s_per_token=0.6,
                    io_wait_share=io_share, kernel_share=kernel_share, throttled_share=0.0,
                    regime="disk-bound", steady_tok_per_s=[1.0, 1.02, 0.98][:n])
    assert verdict("10", study(PM, mlock([0.55, 0.5, 0.52], 0.05))) == HOLDS  # ~0.9 of pread
    assert verdict("10", study(PM, mlock([0.05, 0.08, 0.06], 0.5))) == FAILS  # pread is CPU
    assert verdict("10", study(PM, mlock([0.05, 0.55, 0.3], 0.2))) == INCONCLUSIVE
    assert verdict("10", study(PM)) == INCONCLUSIVE  # no such runs


def test_finding11_the_designed_mechanism_against_the_studys_best_each_way():
    best = rows("pm-mlock", [1.0, 1.02, 0.98], mlock=True)
    odc = "odirect-cache"
    assert verdict("11", study(PM, best, rows("odc", [2.0, 2.05, 1.95], mechanism=odc))) == HOLDS
    assert verdict("11", study(PM, best, rows("odc", [1.1, 1.12, 1.08], mechanism=odc))) == FAILS
    # about 1.5x, within noise: neither above nor below the threshold
    assert verdict("11", study(PM, best, rows("odc", [1.3, 1.7, 1.5], mechanism=odc))) == \
        INCONCLUSIVE
    assert verdict("11", study(PM, best)) == INCONCLUSIVE  # no odirect-cache runs
    out = F("11").evaluate(study(PM, best, rows("odc", [2.0, 2.05, 1.95], mechanism=odc)))
    assert set(out.tables["finding11_attribution"].run_id) == {"odc", "pm-mlock"}
    assert out.tables["finding11_designed"].threshold.iloc[0] == 1.5


def test_finding12_passive_waiting_against_the_default_each_way():
    def mlock(run_id, tok, policy):
        return rows(run_id, tok, mlock=True, omp_wait_policy=policy)

    base = mlock("pm-mlock", [1.0, 1.02, 0.98], "libgomp")
    pm = rows("pm", [1.0, 1.05, 1.1], omp_wait_policy="libgomp")
    assert verdict("12", study(pm, base, mlock("passive", [1.3, 1.32, 1.28], "passive"))) == HOLDS
    assert verdict("12", study(pm, base, mlock("passive", [0.9, 0.92, 0.88], "passive"))) == FAILS
    assert verdict("12", study(pm, base, mlock("passive", [0.9, 1.3, 1.1], "passive"))) == \
        INCONCLUSIVE
    assert verdict("12", study(pm, base)) == INCONCLUSIVE  # no other policy
    # spinning alone is shown, not judged: the claim is passive waiting's
    out = F("12").evaluate(study(pm, base, mlock("spin", [0.5, 0.52, 0.48], "active")))
    assert out.verdict.verdict == INCONCLUSIVE
    assert list(out.tables["finding12_wait_policy"].verdict) == [FAILS]
    # no other finding sees a configuration that only changes the wait policy: taken for the
    # study's best, these passive runs would make finding 11 fail
    odc = rows("odc", [2.0, 2.05, 1.95], mechanism="odirect-cache", omp_wait_policy="libgomp")
    fast = mlock("passive", [3.0, 3.1, 2.9], "passive")
    assert verdict("11", study(pm, base, odc, fast)) == HOLDS


def test_the_other_findings_judge_the_wait_policy_most_runs_had():
    """A study run with passive waiting as its default has a libgomp configuration for finding
    12 alone; one from before (the reference's) has libgomp everywhere and a passive one."""
    def mlock(run_id, tok, policy):
        return rows(run_id, tok, mlock=True, omp_wait_policy=policy)

    odc = "odirect-cache"
    # passive everywhere but finding 12's libgomp configuration, which is 3x slower: taken for
    # the study's best, it would make finding 11 hold
    slow = mlock("libgomp", [0.5, 0.52, 0.48], "libgomp")
    best = mlock("pm-mlock", [1.5, 1.52, 1.48], "passive")
    pm = rows("pm", [1.0, 1.05, 1.1], omp_wait_policy="passive")
    new = rows("odc", [1.6, 1.62, 1.58], mechanism=odc, omp_wait_policy="passive")
    st = study(pm, best, new, slow)
    assert st.wait_policy == "passive"
    assert verdict("11", st) == FAILS
    assert verdict("12", st) == HOLDS  # passive over libgomp: 3x



def test_finding13_the_expert_cache_against_demand_paging_and_the_fastest_other_each_way():
    def cache(tok):
        return rows("cache", tok, mechanism="odirect-cache", cache_fill=True, cache_policy="lfu")

    paging = rows("none", [1.0, 1.02, 0.98], mechanism="none", cache_fill=False, cache_policy="lru")
    madvise = rows("madvise", [1.2, 1.22, 1.18], mechanism="madvise", cache_fill=False,
                   cache_policy="lru")
    base = [r | {"cache_fill": False, "cache_policy": "lru"} for r in PM]
    assert verdict("13", study(base, paging, madvise, cache([2.0, 2.05, 1.95]))) == HOLDS
    # 1.3x paging and 1.08x madvise: both below their thresholds
    assert verdict("13", study(base, paging, madvise, cache([1.3, 1.32, 1.28]))) == FAILS
    assert verdict("13", study(base, paging, madvise, cache([1.2, 2.2, 1.7]))) == INCONCLUSIVE
    # no cache runs in this regime: not run, not inconclusive
    assert verdict("13", study(base, paging, madvise)) == NOT_RUN
    assert verdict("13", study(PM)) == NOT_RUN  # a runs table from before the expert cache
    out = F("13").evaluate(study(base, paging, madvise, cache([2.0, 2.05, 1.95])))
    t = out.tables["finding13_expert_cache"]
    assert list(t.against) == ["none", "madvise"] and list(t.threshold) == [1.5, 1.2]


def test_a_finding_whose_configurations_did_not_run_says_so():
    assert verdict("1a", study(PM)) == NOT_RUN  # no LRU runs
    assert verdict("1b", study(PM)) == NOT_RUN
    assert verdict("9", study(PM)) == NOT_RUN  # no lookahead runs
    # ... where they ran but cannot be judged, inconclusive
    assert verdict("1b", study(PM, lru(0, [0.5, 0.52]))) == INCONCLUSIVE


def test_same_in_every_regime_counts_only_the_regimes_that_ran():
    from harness.analysis.tables import verdicts_side_by_side

    v = {"a": [{"finding": "9", "claim": "c", "verdict": NOT_RUN, "why": "x"}],
         "b": [{"finding": "9", "claim": "c", "verdict": HOLDS, "why": "y"}]}
    assert bool(verdicts_side_by_side(v, 0).same_in_every_regime.iloc[0])
    v["a"][0]["verdict"] = FAILS
    assert not bool(verdicts_side_by_side(v, 0).same_in_every_regime.iloc[0])


def test_finding4_says_whether_tok_s_scales_with_the_bytes_actually_read():
    # 2x the rate for 2x fewer bytes read (nominal 1.67x): holds, and scales with bytes read
    out = F("4").evaluate(study(*pair([1.0, 1.02, 0.98], [2.0, 2.05, 1.95], q4_read=200e6,
                                      q2_read=100e6)))
    t = out.tables["finding4_scaling"].set_index("mechanism")
    assert out.verdict.verdict == HOLDS and t.loc["pread+madvise", "read_ratio_q4_over_q2"] == 2.0
    assert bool(t.loc["pread+madvise", "scales_with_bytes_read"])
    assert "scales with the bytes actually read" in out.notes[0]
    # the same rates for bytes read 1.67x apart: it does not scale with them
    out = F("4").evaluate(study(*pair([1.0, 1.02, 0.98], [2.0, 2.05, 1.95])))
    assert not bool(out.tables["finding4_scaling"].scales_with_bytes_read.iloc[0])
