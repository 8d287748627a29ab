"""The design's power calculation: runs needed per configuration, against its comparator, and what
the design costs."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from harness.analysis import design, stats


def resolves(var_a, var_b, n, effect):
    """The power criterion, written out: Welch's df for n runs a side, 90% interval, POWER."""
    se = math.sqrt((var_a + var_b) / n)
    df = (var_a + var_b) ** 2 * (n - 1) / (var_a ** 2 + var_b ** 2)
    return (sps.t.ppf(0.95, df) + sps.t.ppf(0.80, df)) * se <= math.log1p(effect)


@pytest.mark.parametrize("sd_a,sd_b,effect", [(0.078, 0.078, 0.10), (0.078, 0.078, 0.20),
                                              (0.003, 0.065, 0.10), (0.03, 0.03, 0.10)])
def test_runs_needed_is_the_fewest_that_resolve(sd_a, sd_b, effect):
    n = design.runs_needed(sd_a ** 2, sd_b ** 2, effect, most=40)
    assert n is not None and resolves(sd_a ** 2, sd_b ** 2, n, effect)
    assert n == 2 or not resolves(sd_a ** 2, sd_b ** 2, n - 1, effect)


def test_runs_needed_grows_with_noise_and_gives_up_past_the_most():
    # seed-box's between-run SD in the reference: 10% needs far more runs than 20%
    # (by hand: at n = 10, df 18, (1.734 + 0.862) * 0.078 * sqrt(2/10) = 0.0906 <= log 1.1;
    # at n = 9, df 16, 2.611 * 0.078 * sqrt(2/9) = 0.0960 > 0.0953)
    at10, at20 = (design.runs_needed(0.078 ** 2, 0.078 ** 2, e) for e in (0.10, 0.20))
    assert at10 == 10 and at20 < at10
    assert design.runs_needed(0.5 ** 2, 0.5 ** 2, 0.10) is None


def test_a_variance_that_borrows_df_from_the_others_needs_fewer_runs():
    # seed-box's configurations share one variance: each comparison's interval has the pool's
    # df, not only its own runs', so the same SD resolves the effect with fewer runs
    alone = design.runs_needed(0.088 ** 2, 0.088 ** 2, 0.20)
    pooled = design.runs_needed(0.088 ** 2, 0.088 ** 2, 0.20, prior_df_a=40, prior_df_b=40)
    # by hand: at n = 3 alone, df 4, (2.132 + 0.941) * 0.088 * sqrt(2/3) = 0.221 > log 1.2;
    # borrowing 40 df a side, df 84, (1.663 + 0.846) * 0.0719 = 0.180 <= 0.182
    assert (alone, pooled) == (4, 3)


def table(sds: dict, n: int, profile="p", rate=1.0, seed=0):
    """Runs of each configuration whose log tok/s have exactly the given SD."""
    rows = []
    z = np.array([-1.0, 1.0] * (n // 2) + [0.0] * (n % 2))
    z = z / z.std(ddof=1)
    for c, sd in sds.items():
        for k, y in enumerate(z):
            rows.append({"configuration": f"{c}@{profile}", "run_id": f"{c}@{profile}",
                         "repeat": k + 1, "steady_tok_per_s": rate * math.exp(sd * y)})
    return pd.DataFrame(rows)


def test_a_configuration_is_designed_against_the_noisier_comparator():
    runs = table({"pread-madvise": 0.01, "pread-madvise-mlock": 0.06, "quiet": 0.01,
                  "noisy": 0.06}, 4)
    d = design.regime_design(runs).set_index("configuration")
    assert (d.against.drop("pread-madvise-mlock@p") == "pread-madvise-mlock@p").all()
    assert d.loc["pread-madvise-mlock@p", "against"] == "pread-madvise@p"
    # the noisier configuration needs at least as many runs, and 20% fewer than 10%
    assert d.loc["noisy@p", "runs_at_10"] >= d.loc["quiet@p", "runs_at_10"]
    assert d.loc["noisy@p", "runs_at_20"] < d.loc["noisy@p", "runs_at_10"]
    assert d.loc["quiet@p", "sd"] == pytest.approx(
        math.sqrt(stats.Pool.of(runs, by="configuration").moderated("quiet@p")[0]))


def test_the_cost_counts_each_configuration_at_its_runs_and_rate():
    runs = table({"pread-madvise": 0.02, "slow": 0.02}, 2, rate=0.5)
    d = design.regime_design(runs)
    n = int(d.runs_at_20.max())
    # every configuration n runs of 40 s fixed plus 36 tokens at 0.5 tok/s
    assert design.cost_minutes(d, runs, 36, 40.0, 0.20) == pytest.approx(2 * n * (40 + 72) / 60, rel=1e-3)


def test_a_configs_run_minutes_are_estimated_from_the_rates_its_run_ids_had():
    config = {"profile": "p", "profiles": {"p": {"threads": 2}},
              "models": {"m": {"source": "synthetic", "shape": "olmoe-tiny", "quant": "Q4_K_M"}},
              "defaults": {"prompt": "Hello", "tokens": 11, "warmup_tokens": 1, "repeats": 2},
              "experiments": {"known": {"model": "m", "mechanism": "none"},
                              "new": {"model": "m", "mechanism": "madvise", "repeats": 1},
                              "capped": {"model": "m", "mechanism": "none", "repeats": 1,
                                         "time_limit_s": 50, "prompt": "Hi"}}}
    runs = pd.DataFrame({"run_id": ["known", "known", "other"], "profile": "p",
                         "steady_tok_per_s": [0.5, 0.5, 0.25]})
    plan = design.planned_minutes(config, runs, fixed_s=40.0).set_index("profile")
    # known: 2 x (40 + 22 s); new: the profile's median rate (0.5), 40 + 22 s; capped at 50 s
    assert plan.loc["p", "runs"] == 4
    assert plan.loc["p", "minutes"] == pytest.approx((2 * 62 + 62 + 50) / 60)
    # measured: 10 tokens at 0.5 tok/s in each run that finished; the capped run measured nothing
    assert plan.loc["p", "measured_share"] == pytest.approx(3 * 20 / (2 * 62 + 62 + 50))


@pytest.mark.parametrize("sd_a,sd_b,effect", [(0.078, 0.078, 0.30), (0.03, 0.05, 0.10),
                                              (0.003, 0.065, 0.20)])
def test_at_the_designed_repeats_a_true_minimum_effect_holds_by_the_rule_with_the_power(
        sd_a, sd_b, effect):
    """The design and the verdict rule agree: at the runs the design asks for, simulated studies
    whose true difference is exactly the minimum effect are called `holds` by stats.faster (the
    rule as applied, both clauses) at least POWER of the time, less the simulation's own
    tolerance; with no true difference, at most 5%. Each side's variance is its own runs'
    (Welch's interval), as the design assumes with no borrowed df."""
    n = design.runs_needed(sd_a ** 2, sd_b ** 2, effect, most=40)
    rng = np.random.default_rng(48)

    def share_holding(true_log_ratio, runs, sims=3000):
        held = 0
        for _ in range(sims):
            a = rng.normal(true_log_ratio, sd_a, runs)
            b = rng.normal(0.0, sd_b, runs)
            va, vb = a.var(ddof=1) / runs, b.var(ddof=1) / runs
            df = (va + vb) ** 2 / (va ** 2 / (runs - 1) + vb ** 2 / (runs - 1))
            iv = stats.Interval(a.mean() - b.mean(), math.sqrt(va + vb), df, runs, runs, "sim")
            held += stats.faster(iv, effect).verdict == stats.HOLDS
        return held / sims

    tolerance = 2 * math.sqrt(stats.POWER * (1 - stats.POWER) / 3000)
    assert share_holding(math.log1p(effect), n) >= stats.POWER - tolerance
    assert share_holding(0.0, n) <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 3000)
    # the power rests on the repeats: with two runs a side (where the design asked for more)
    # the same true effect holds less often
    if n > 2:
        assert share_holding(math.log1p(effect), 2) < stats.POWER - tolerance
