"""Each rule of harness.analysis.stats comes out each way on constructed run tables, and a simulation
shows the procedure's false-verdict rate for two equal configurations."""

import math

import numpy as np
import pandas as pd
import pytest

from harness.analysis import stats
from harness.analysis.stats import FAILS, HOLDS, INCONCLUSIVE, Pool


def table(**configs) -> pd.DataFrame:
    return pd.DataFrame([{"run_id": c, "steady_tok_per_s": v} for c, vals in configs.items()
                         for v in vals])


def spread(center, rel=0.03, n=4):
    """n runs around `center`, symmetric, with relative spread `rel` (a known SD of log)."""
    offs = np.linspace(-1, 1, n)
    return [center * math.exp(rel * o) for o in offs]


def test_a_directional_claim_holds_fails_or_is_inconclusive():
    pool = Pool.of(table(a=spread(1.3), b=spread(1.0), c=spread(1.02), d=spread(1.0, 0.2, 2)))
    assert stats.faster(stats.compare(pool, "a", "b")).verdict == HOLDS  # +30%, tight
    assert stats.faster(stats.compare(pool, "c", "b")).verdict == FAILS  # +2%: excludes +10%
    # +10% with a 20%-wide configuration on one side: the interval spans both
    wide = Pool.of(table(a=[1.0, 1.3], b=[1.0, 1.05], e=[0.9, 1.25]))
    v = stats.faster(stats.compare(wide, "a", "b"))
    assert v.verdict == INCONCLUSIVE and "90% CI" in v.reason


def test_an_estimate_below_the_minimum_effect_never_holds_even_when_it_is_certain():
    pool = Pool.of(table(a=spread(1.05, 0.001, 6), b=spread(1.0, 0.001, 6)))
    iv = stats.compare(pool, "a", "b")
    assert iv.low > 0  # certainly faster ...
    assert stats.faster(iv).verdict == FAILS  # ... but by 5%, and the claim is 10%


def test_a_clearly_noisier_configuration_gets_its_own_variance():
    cfgs = {f"q{i}": spread(1.0 + i / 10, 0.01) for i in range(6)}
    pool = Pool.of(table(noisy=[0.6, 1.4, 0.8, 1.2], **cfgs))
    assert pool.noisy == {"noisy"}
    iv = stats.compare(pool, "noisy", "q0")
    assert iv.method == "Welch"
    assert stats.compare(pool, "q1", "q0").method.startswith("pooled")
    # the noisy side's own variance makes its interval far wider than a pooled one would be
    assert iv.se > 5 * stats.compare(pool, "q1", "q0").se


def test_a_threshold_claim_is_tested_against_its_threshold():
    pool = Pool.of(table(q2=spread(1.95), q4=spread(1.0)))
    iv = stats.compare(pool, "q2", "q4")
    assert stats.above(iv, 1.67, "Q2_K over Q4_K_M").verdict == HOLDS
    assert stats.above(iv, 2.5, "more than 2.5x").verdict == FAILS
    assert stats.above(iv, 1.95, "exactly at it").verdict == INCONCLUSIVE


def test_holm_refutes_a_family_only_when_a_part_survives_the_correction():
    assert stats.holm([0.04, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]) == [False] * 8
    assert stats.holm([0.001, 0.04, 0.5]) == [True, False, False]
    assert stats.holm([0.001, 0.02, 0.03]) == [True, True, True]
    # a family of 8 comparisons: one part barely refuted on its own (p 0.04) is not a refutation
    # of the family after Holm; a part refuted strongly is
    base = Pool.of(table(base=spread(1.0, 0.05), **{f"m{i}": spread(1.3, 0.05) for i in range(7)},
                         weak=spread(1.0, 0.05), strong=spread(0.8, 0.05)))
    parts = [stats.faster(stats.compare(base, f"m{i}", "base")) for i in range(7)]
    assert all(p.verdict == HOLDS for p in parts)
    assert stats.family(parts, "all faster").verdict == HOLDS
    weak = stats.faster(stats.compare(base, "weak", "base"))
    weak = stats.Verdict(weak.verdict, weak.reason, weak.interval, weak.p_holds, 0.04)
    assert stats.family(parts + [weak], "all faster").verdict == INCONCLUSIVE
    strong = stats.faster(stats.compare(base, "strong", "base"))
    assert strong.p_fails < 0.001
    assert stats.family(parts + [strong], "all faster").verdict == FAILS


def sweep(values_by_budget: dict, rel=0.03) -> pd.DataFrame:
    return pd.DataFrame([{"budget": b, "run_id": f"lru-{b}", "steady_tok_per_s": v}
                         for b, c in values_by_budget.items() for v in spread(c, rel, 3)])


def test_a_trend_over_a_sweep_is_its_change_with_an_interval_and_no_trend_needs_equivalence():
    falling = sweep({0: 1.0, 256: 0.9, 512: 0.8, 1200: 0.6})
    iv = stats.sweep_change(falling, "budget", pool=Pool.of(falling))
    assert iv.ratio[0] == pytest.approx(0.6, rel=0.08) and iv.high < 0
    assert stats.faster(stats.Interval(-iv.estimate, iv.se, iv.df, iv.n_a, iv.n_b, iv.method)
                        ).verdict == HOLDS  # tok/s falls by at least 10% across the sweep
    flat = sweep({0: 1.0, 256: 1.01, 512: 0.99, 1200: 1.0}, rel=0.01)
    eq = stats.equivalent(stats.sweep_change(flat, "budget", pool=Pool.of(flat)), what="no trend")
    assert eq.verdict == HOLDS
    # a flat sweep with noisy runs is not "no trend": it is inconclusive
    noisy = sweep({0: 1.0, 256: 1.0, 512: 1.0, 1200: 1.0}, rel=0.25)
    eq = stats.equivalent(stats.sweep_change(noisy, "budget", pool=Pool.of(noisy)))
    assert eq.verdict == INCONCLUSIVE
    assert stats.equivalent(iv).verdict == FAILS  # a 40% fall is not "no trend"


def test_runs_needed_for_20_percent_at_the_measured_variance():
    # the second reference run's pooled between-run SD of log tok/s
    n = stats.runs_needed(0.094, 0.20)
    assert 3 <= n <= 6
    assert stats.runs_needed(0.20, 0.20) > n  # noisier: more runs


def test_two_equal_configurations_are_called_different_at_most_5_percent_of_the_time():
    """The procedure on simulated studies at the measured variance: 9 configurations of 4 runs
    (SD of log tok/s 0.094), two of them equal. A claim names its direction ("a is faster than
    b"), so its false verdict is "holds" in that direction: at most 5% by construction of a 90%
    interval; simulated here, with the simulation's own standard error (~0.4%) as tolerance."""
    rng = np.random.default_rng(7)
    n_sim, false = 3000, 0
    for _ in range(n_sim):
        vals = {f"c{i}": np.exp(rng.normal(0.1 * i, 0.094, 4)) for i in range(7)}
        vals["a"] = np.exp(rng.normal(0.0, 0.094, 4))
        vals["b"] = np.exp(rng.normal(0.0, 0.094, 4))
        false += stats.faster(stats.compare(Pool.of(table(**vals)), "a", "b")).verdict == HOLDS
    rate = false / n_sim
    assert rate <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / n_sim), rate
    # and a real 30% difference is found most of the time (the design's power)
    found = 0
    for _ in range(200):
        vals = {f"c{i}": np.exp(rng.normal(0.1 * i, 0.094, 4)) for i in range(7)}
        vals["a"] = np.exp(rng.normal(math.log(1.3), 0.094, 4))
        vals["b"] = np.exp(rng.normal(0.0, 0.094, 4))
        found += stats.faster(stats.compare(Pool.of(table(**vals)), "a", "b")).verdict == HOLDS
    assert found / 200 >= 0.8
