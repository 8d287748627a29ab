"""Claims decided from the variance the runs really have: a ratio of tok/s with a 90% confidence
interval on the log scale, against a stated minimum effect; families of claims with Holm's
correction; a trend over a sweep by its change across the sweep; "no trend" only by equivalence.

Why this method. In the second reference run 93% of the variance of a run's log tok/s was between
runs, and the configurations share most of it (pooled SD of run means 0.094), so each comparison
uses a Student-t interval on the difference of mean log tok/s with the variance pooled across all
configurations of the study (many degrees of freedom from 2-4 runs each). Where one configuration
is clearly noisier than the pool (an F test at 5%), its comparisons use its own variance (Welch).
A percentile bootstrap over 3 runs covers about 70% at a nominal 90%, so none is used.
`tests/test_stats.py` simulates the procedure: two equal configurations are called different at
most 5% of the time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
LEVEL = 0.90  # two-sided confidence of every interval; each one-sided test is at 5%
ALPHA = (1 - LEVEL) / 2
MIN_EFFECT = 0.10  # a directional claim needs at least a 10% difference in tok/s
POWER = 0.80  # the smallest detectable effect is the one found with this probability


@dataclass(frozen=True)
class Pool:
    """The variance of log tok/s within configurations, pooled over the study."""

    var: float
    df: int
    per_config: dict  # config -> (n, mean log, variance or nan)
    noisy: frozenset  # configurations clearly noisier than the pool

    @classmethod
    def of(cls, runs: pd.DataFrame, value: str = "steady_tok_per_s", by: str = "run_id") -> Pool:
        y = runs.assign(_y=np.log(runs[value])).dropna(subset=["_y"])
        per, ss, df = {}, 0.0, 0
        for cfg, g in y.groupby(by):
            n = len(g)
            v = float(g._y.var(ddof=1)) if n > 1 else float("nan")
            per[cfg] = (n, float(g._y.mean()), v)
            if n > 1:
                ss += v * (n - 1)
                df += n - 1
        var = ss / df if df else float("nan")
        noisy = set()
        if df:
            for cfg, (n, _, v) in per.items():
                # F test of one configuration's variance against the rest of the pool
                rest_df = df - (n - 1)
                if n > 1 and rest_df > 0:
                    rest_var = (ss - v * (n - 1)) / rest_df
                    if rest_var > 0 and v / rest_var > sps.f.ppf(0.95, n - 1, rest_df):
                        noisy.add(cfg)
        if noisy:  # the pool is the variance the other configurations share
            kept = [(n, v) for c, (n, _, v) in per.items() if n > 1 and c not in noisy]
            df = sum(n - 1 for n, _ in kept)
            var = sum(v * (n - 1) for n, v in kept) / df if df else float("nan")
        return cls(var=var, df=df, per_config=per, noisy=frozenset(noisy))


@dataclass(frozen=True)
class Interval:
    """exp(estimate) is the ratio of geometric-mean tok/s; low/high its 90% interval."""

    estimate: float  # difference of mean log tok/s (a over b)
    se: float
    df: float
    n_a: int
    n_b: int
    method: str

    @property
    def half(self) -> float:
        return sps.t.ppf(1 - ALPHA, self.df) * self.se if self.df > 0 else float("inf")

    @property
    def low(self) -> float:
        return self.estimate - self.half

    @property
    def high(self) -> float:
        return self.estimate + self.half

    @property
    def ratio(self) -> tuple[float, float, float]:
        return math.exp(self.estimate), math.exp(self.low), math.exp(self.high)

    def detectable(self) -> float:
        """The smallest ratio (> 1) this comparison finds with POWER: the design's resolution."""
        if not self.df > 0:
            return float("inf")
        return math.exp((sps.t.ppf(1 - ALPHA, self.df) + sps.t.ppf(POWER, self.df)) * self.se)

    def p_above(self, log_threshold: float) -> float:
        """One-sided p of 'the true difference is at most log_threshold'."""
        if not self.se > 0:
            return 0.0 if self.estimate > log_threshold else 1.0
        return float(sps.t.sf((self.estimate - log_threshold) / self.se, self.df))

    def p_below(self, log_threshold: float) -> float:
        """One-sided p of 'the true difference is at least log_threshold'."""
        if not self.se > 0:
            return 0.0 if self.estimate < log_threshold else 1.0
        return float(sps.t.cdf((self.estimate - log_threshold) / self.se, self.df))

    def text(self) -> str:
        r, lo, hi = self.ratio
        return f"{r:.3f} (90% CI {lo:.3f}-{hi:.3f}; n {self.n_a} vs {self.n_b}, {self.method})"


def compare(pool: Pool, a, b) -> Interval:
    """The interval of log tok/s of configuration a over b (nan, so inconclusive, where either has
    no run with a positive value: a log ratio of zeros says nothing)."""
    if a not in pool.per_config or b not in pool.per_config:
        missing = [c for c in (a, b) if c not in pool.per_config]
        return Interval(float("nan"), float("nan"), 0, 0, 0, f"no positive value for {missing}")
    na, ma, va = pool.per_config[a]
    nb, mb, vb = pool.per_config[b]
    if a in pool.noisy or b in pool.noisy:
        # Welch: each side its own variance (a side with one run borrows the pool's)
        va = va if na > 1 else pool.var
        vb = vb if nb > 1 else pool.var
        sa, sb = va / na, vb / nb
        se = math.sqrt(sa + sb)
        dfs = [(s ** 2 / (n - 1)) for s, n in ((sa, na), (sb, nb)) if n > 1]
        df = (sa + sb) ** 2 / sum(dfs) if dfs and sum(dfs) > 0 else 0.0
        return Interval(ma - mb, se, df, na, nb, "Welch")
    se = math.sqrt(pool.var * (1 / na + 1 / nb)) if pool.df else float("nan")
    return Interval(ma - mb, se, pool.df, na, nb, f"pooled SD {math.sqrt(pool.var):.3f}")


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str
    interval: Interval | None = None
    p_holds: float = float("nan")  # one-sided p against "no difference" (or the threshold)
    p_fails: float = float("nan")  # one-sided p against the claimed effect


def faster(iv: Interval, min_effect: float = MIN_EFFECT, what: str = "a is faster than b"
           ) -> Verdict:
    """'a is faster than b by at least min_effect': holds when the interval excludes no
    difference and the estimate reaches the effect; does not hold when the interval excludes the
    effect; otherwise inconclusive."""
    claim = math.log1p(min_effect)
    p_holds, p_fails = iv.p_above(0.0), iv.p_below(claim)
    if iv.low > 0 and iv.estimate >= claim:
        v = HOLDS
    elif iv.high < claim:
        v = FAILS
    else:
        v = INCONCLUSIVE
    return Verdict(v, f"{what}: ratio {iv.text()}, minimum effect {min_effect:.0%}, smallest "
                      f"detectable {iv.detectable() - 1:.0%}", iv, p_holds, p_fails)


def above(iv: Interval, threshold: float, what: str) -> Verdict:
    """A threshold claim ('ratio above T'): holds when the interval lies above T, does not hold
    when it lies below, else inconclusive."""
    t = math.log(threshold)
    p_holds, p_fails = iv.p_above(t), iv.p_below(t)
    v = HOLDS if iv.low > t else FAILS if iv.high < t else INCONCLUSIVE
    return Verdict(v, f"{what}: ratio {iv.text()} against {threshold:g}", iv, p_holds, p_fails)


def holm(pvalues: list[float], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down: which of the hypotheses are rejected with familywise error alpha."""
    pvalues = [1.0 if not p == p else p for p in pvalues]  # no test (nan): never rejected
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    out = [False] * len(pvalues)
    for k, i in enumerate(order):
        if pvalues[i] > alpha / (len(pvalues) - k):
            break
        out[i] = True
    return out


def family(parts: list[Verdict], what: str) -> Verdict:
    """A finding made of several comparisons: it holds only if every part holds (an
    intersection-union test, at the parts' own level); it does not hold when at least one part
    is refuted after Holm's correction across the parts; otherwise inconclusive."""
    if parts and all(p.verdict == HOLDS for p in parts):
        return Verdict(HOLDS, f"{what}: all {len(parts)} parts hold")
    refuted = holm([p.p_fails for p in parts])
    if any(refuted):
        which = "; ".join(p.reason for p, r in zip(parts, refuted) if r)
        return Verdict(FAILS, f"{what}: refuted after Holm's correction over {len(parts)} "
                              f"parts: {which}")
    open_ = "; ".join(p.reason for p in parts if p.verdict != HOLDS)
    return Verdict(INCONCLUSIVE, f"{what}: {open_}")


def sweep_change(runs: pd.DataFrame, x: str, value: str = "steady_tok_per_s", pool: Pool | None = None
                 ) -> Interval:
    """The change of log tok/s across a sweep (the fitted line's value at the largest x minus at
    the smallest), from every run, with the pool's variance where one is given (its df) and the
    fit's own residual variance otherwise."""
    d = runs.assign(_y=np.log(runs[value])).dropna(subset=["_y", x])
    xs, ys = d[x].to_numpy(float), d._y.to_numpy(float)
    span = xs.max() - xs.min()
    sxx = float(((xs - xs.mean()) ** 2).sum())
    if len(xs) < 3 or sxx == 0:
        return Interval(float("nan"), float("nan"), 0, len(xs), 0, "too few runs")
    slope = float(((xs - xs.mean()) * (ys - ys.mean())).sum() / sxx)
    if pool is not None and pool.df:
        var, df, how = pool.var, pool.df, "pooled"
    else:
        resid = ys - (ys.mean() + slope * (xs - xs.mean()))
        var, df, how = float((resid ** 2).sum() / (len(xs) - 2)), len(xs) - 2, "fit residuals"
    return Interval(slope * span, math.sqrt(var / sxx) * span, df, len(xs), len(set(xs)),
                    f"line over {len(set(xs))} settings, {how}")


def equivalent(iv: Interval, margin: float = MIN_EFFECT, what: str = "no difference") -> Verdict:
    """'No difference' (or 'no trend'), by two one-sided tests: holds when the whole interval
    lies within +-margin; does not hold when it lies wholly outside; else inconclusive."""
    m = math.log1p(margin)
    if -m < iv.low and iv.high < m:
        v = HOLDS
    elif iv.low > m or iv.high < -m:
        v = FAILS
    else:
        v = INCONCLUSIVE
    return Verdict(v, f"{what}: ratio {iv.text()} against a margin of +-{margin:.0%}", iv)


def runs_needed(sd: float, effect: float = 0.20, df_pool: int | None = None) -> int:
    """Runs per configuration so that a difference of `effect` between two configurations is
    found with POWER by a 90% interval, for a between-run SD of log tok/s `sd`."""
    for n in range(2, 50):
        df = df_pool if df_pool else 2 * (n - 1)
        se = sd * math.sqrt(2 / n)
        if (sps.t.ppf(1 - ALPHA, df) + sps.t.ppf(POWER, df)) * se <= math.log1p(effect):
            return n
    return 50


def against_constant(pool: Pool, cfg, constant: float) -> Interval:
    """log(constant) over a configuration's mean log value: how many times the configuration is
    below a fixed figure (a ceiling), with the pool's variance."""
    n, m, v = pool.per_config[cfg]
    var = pool.var if pool.df else v
    df = pool.df if pool.df else n - 1
    return Interval(math.log(constant) - m, math.sqrt(var / n) if var == var else float("nan"),
                    df, n, 0, "against a constant")


def mean_above(values, threshold: float, what: str) -> Verdict:
    """A share (0-1) measured per run, against a threshold: t interval of the mean over runs."""
    x = np.asarray(pd.Series(values).dropna(), float)
    if len(x) < 2:
        return Verdict(INCONCLUSIVE, f"{what}: {len(x)} run(s), an interval needs 2")
    m, se = float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x)))
    half = sps.t.ppf(1 - ALPHA, len(x) - 1) * se
    v = HOLDS if m - half > threshold else FAILS if m + half < threshold else INCONCLUSIVE
    return Verdict(v, f"{what}: {m:.2f} (90% CI {m - half:.2f}-{m + half:.2f}, {len(x)} runs) "
                      f"against {threshold:.2f}")
