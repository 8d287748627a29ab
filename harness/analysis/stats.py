"""Claims decided from the variance the runs really have: a ratio of tok/s with a 90% confidence
interval on the log scale, against a stated minimum effect; families of claims with Holm's
correction; a trend over a sweep by its change across the sweep; "no trend" only by equivalence.

Why this method. Most of the variance of a run's log tok/s is between runs, and with 2-4 runs a
configuration's own variance has 1-3 degrees of freedom: a Welch interval from it alone is very
wide. But the configurations do not share one variance either (reference vm-2026-12-04c,
disk-box: SDs from 0.001 to 0.065, Bartlett's chi-square 30.9 on 14 df), so a pooled variance is
too wide for the quiet ones and too narrow for the noisy ones. Each configuration's variance is
therefore moderated toward a prior fitted to all of them (limma's empirical Bayes, Smyth 2004):
the prior's df says how much the configurations share, from nothing (each its own) to everything
(the pooled variance); intervals are Welch-Satterthwaite's over the moderated variances.
A percentile bootstrap over 3 runs covers about 70% at a nominal 90%, so none is used.
`tests/test_stats.py` simulates the procedure on the reference's own per-configuration SDs: its
90% intervals' coverage and the false-verdict rate for two equal configurations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
# a finding whose configurations have no runs in a regime: nothing was judged there
NOT_RUN = "not run"
LEVEL = 0.90  # two-sided confidence of every interval; each one-sided test is at 5%
ALPHA = (1 - LEVEL) / 2
MIN_EFFECT = 0.10  # a directional claim needs at least a 10% difference in tok/s
POWER = 0.80  # the smallest detectable effect is the one found with this probability


# How much of the fitted prior's df a configuration's variance is moderated with. Fitted from
# 15-16 configurations of 1-3 df each whose SDs differ up to 60-fold (the reference), the prior
# is overconfident: at full weight 90% intervals covered 82-84% in simulations drawn from the
# reference's own per-configuration SDs and run counts, at a quarter (and never below a
# configuration's own variance) 89.6-89.9%, against 90.5-92.7% for Welch's with each
# configuration's own variance alone, whose intervals are 1.2-1.5x as wide
# (tests/test_stats.py holds the simulation).
PRIOR_WEIGHT = 0.25


@dataclass(frozen=True)
class Pool:
    """The variance of log tok/s within configurations, as the study's configurations share it:
    each configuration's own variance moderated toward the study's (an empirical-Bayes prior with
    `d0` degrees of freedom around `s0sq`, estimated from how much the configurations' variances
    differ: limma's moderated t, Smyth 2004). Configurations that share one variance give an
    infinite `d0`, and every comparison uses the pooled variance with its pooled df; very
    different ones give a small `d0`, and each configuration mostly its own."""

    var: float  # the pooled variance (what the configurations share, equally weighted by df)
    df: int
    per_config: dict  # config -> (n, mean log, variance or nan)
    d0: float = math.inf  # the prior's degrees of freedom
    s0sq: float = float("nan")  # the prior's variance

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
        d0, s0sq = prior([(n - 1, v) for n, _, v in per.values() if n > 1 and v > 0])
        return cls(var=var, df=df, per_config=per, d0=d0, s0sq=s0sq if d0 < math.inf else var)

    def moderated(self, cfg) -> tuple[float, float]:
        """(variance, df) of one configuration's runs: its own variance moderated toward the
        prior, with the prior's df weighted by PRIOR_WEIGHT and never below its own estimate;
        with an infinite prior df (the configurations share one variance), the pooled one."""
        n, _, v = self.per_config[cfg]
        if not self.d0 < math.inf:
            return self.var, float(self.df)
        # a configuration of one run has no variance of its own to protect: the prior's, whole
        d0 = self.d0 * PRIOR_WEIGHT if n > 1 else self.d0
        own = (n - 1) * v if n > 1 and v == v else 0.0
        var = (d0 * self.s0sq + own) / (d0 + n - 1)
        return (max(var, v) if n > 1 and v == v else var), d0 + n - 1


def _trigamma_inverse(y: float) -> float:
    """x with trigamma(x) = y (Newton's method, as limma's trigammaInverse)."""
    from scipy.special import polygamma

    x = 0.5 + 1.0 / y
    for _ in range(50):
        tri = float(polygamma(1, x))
        dif = tri * (1 - tri / y) / float(polygamma(2, x))
        x += dif
        if -dif / x < 1e-8:
            break
    return x


def prior(variances: list[tuple[int, float]]) -> tuple[float, float]:
    """The prior (d0, s0sq) of the configurations' variances, each (df, variance): fitted by
    moments of log variance (Smyth 2004, section 6.2). d0 is infinite where the variances
    differ no more than their own sampling noise does (they share one variance)."""
    from scipy.special import digamma, polygamma

    if len(variances) < 3:
        return math.inf, float("nan")
    d = np.array([k for k, _ in variances], float)
    z = np.log([v for _, v in variances])
    e = z - digamma(d / 2) + np.log(d / 2)
    emean = float(e.mean())
    evar = float(((e - emean) ** 2).sum() / (len(e) - 1) - polygamma(1, d / 2).mean())
    if evar <= 0:
        return math.inf, math.exp(emean)
    d0 = 2 * _trigamma_inverse(evar)
    return d0, math.exp(emean + float(digamma(d0 / 2)) - math.log(d0 / 2))


def _exp(x: float) -> float:
    """exp that gives inf or 0 past a float's range: an interval whose df is a fraction (a
    configuration of one run, known only through a weak prior) is that wide, not an error."""
    return math.exp(min(max(x, -700.0), 700.0)) if x == x else x


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
        return _exp(self.estimate), _exp(self.low), _exp(self.high)

    def detectable(self, min_effect: float = 0.0) -> float:
        """The smallest true ratio (> 1) for which the rule as applied (`faster`) holds with
        POWER: the interval's low end above no change and its high end not below `min_effect`,
        so the estimate must pass the larger of the two bars. At a true effect of exactly
        `min_effect` the second bar is passed 95% of the time: the effect is resolved when the
        first is passed with POWER, which is the design's criterion (harness.analysis.design)."""
        if not self.df > 0 or not self.se == self.se:
            return float("inf")
        t = sps.t.ppf(1 - ALPHA, self.df)
        bar = max(t * self.se, math.log1p(min_effect) - t * self.se)
        return _exp(bar + sps.t.ppf(POWER, self.df) * self.se)

    def resolves(self, min_effect: float) -> bool:
        """Whether a true effect of `min_effect` holds with POWER at this interval's SE and df."""
        return self.detectable(min_effect) <= 1 + min_effect + 1e-12

    def detectable_above(self, threshold: float) -> float:
        """The smallest true ratio for which 'the interval lies above `threshold`' (stats.above)
        holds with POWER."""
        if not self.df > 0 or not self.se == self.se:
            return float("inf")
        q = sps.t.ppf(1 - ALPHA, self.df) + sps.t.ppf(POWER, self.df)
        return _exp(math.log(threshold) + q * self.se)

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
        r, lo, hi = (f"{x:.3f}" if x < 1e4 else f"{x:.3g}" for x in self.ratio)
        return f"{r} (90% CI {lo}-{hi}; n {self.n_a} vs {self.n_b}, {self.method})"


def welch_df(sa: float, sb: float, da: float, db: float) -> float:
    """Welch-Satterthwaite's df of a difference whose sides have squared standard errors sa, sb
    on da, db degrees of freedom (a side with none, da or db 0, contributes no df); without
    variance, the two df summed."""
    if not sa + sb > 0:
        return da + db
    return (sa + sb) ** 2 / ((sa ** 2 / da if da else math.inf)
                             + (sb ** 2 / db if db else math.inf))


def compare(pool: Pool, a, b) -> Interval:
    """The interval of log tok/s of configuration a over b (nan, so inconclusive, where either has
    no run with a positive value: a log ratio of zeros says nothing). Each side's variance is its
    moderated one (Pool.moderated); with unequal ones, Welch-Satterthwaite's df."""
    if a not in pool.per_config or b not in pool.per_config:
        missing = [c for c in (a, b) if c not in pool.per_config]
        return Interval(float("nan"), float("nan"), 0, 0, 0, f"no positive value for {missing}")
    na, ma, _ = pool.per_config[a]
    nb, mb, _ = pool.per_config[b]
    if not pool.d0 < math.inf:
        se = math.sqrt(pool.var * (1 / na + 1 / nb)) if pool.df else float("nan")
        return Interval(ma - mb, se, pool.df, na, nb, f"pooled SD {math.sqrt(pool.var):.3f}")
    (va, da), (vb, db) = pool.moderated(a), pool.moderated(b)
    sa, sb = va / na, vb / nb
    se = math.sqrt(sa + sb)
    df = welch_df(sa, sb, da, db)
    return Interval(ma - mb, se, df, na, nb,
                    f"moderated SDs {math.sqrt(va):.3f}, {math.sqrt(vb):.3f} (prior df {pool.d0:.1f})")


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str
    interval: Interval | None = None
    p_holds: float = float("nan")  # one-sided p against "no difference" (or the threshold)
    p_fails: float = float("nan")  # one-sided p against the claimed effect


def faster(iv: Interval, min_effect: float = MIN_EFFECT, what: str = "a is faster than b"
           ) -> Verdict:
    """'a is faster than b by at least min_effect', by the 90% interval alone: holds when it lies
    above no change and reaches the effect (a is faster, and by as much as the effect for all
    these runs can tell); does not hold when it lies below the effect (a is slower, the same, or
    faster by less than the effect); otherwise (it spans no change and the effect) inconclusive.
    The three are disjoint, and a true effect of exactly `min_effect` holds with POWER at the
    repeats the design chose for it (tests/test_design.py simulates it); an estimate below the
    effect can hold, which the ratio beside the verdict shows."""
    claim = math.log1p(min_effect)
    p_holds, p_fails = iv.p_above(0.0), iv.p_below(claim)
    if iv.high < claim:
        v = FAILS
    elif iv.low > 0:
        v = HOLDS
    else:
        v = INCONCLUSIVE
    detectable = iv.detectable(min_effect) - 1
    # the claim's size is below what these runs resolve: an inconclusive verdict was likely
    # whatever the truth, and the reason says so
    unresolved = (f"; these runs cannot resolve {min_effect:.0%} (their 90% interval is "
                  f"{iv.high - iv.low:.2f} wide in log tok/s; they resolve {detectable:.0%} at "
                  f"{POWER:.0%} power)"
                  if v == INCONCLUSIVE and not iv.resolves(min_effect) else "")
    return Verdict(v, f"{what}: ratio {iv.text()}, minimum effect {min_effect:.0%}, smallest "
                      f"detectable {detectable:.0%} (the rule as applied){unresolved}", iv,
                   p_holds, p_fails)


def above(iv: Interval, threshold: float, what: str) -> Verdict:
    """A threshold claim ('ratio above T'): holds when the interval lies above T, does not hold
    when it lies below, else inconclusive."""
    t = math.log(threshold)
    p_holds, p_fails = iv.p_above(t), iv.p_below(t)
    v = HOLDS if iv.low > t else FAILS if iv.high < t else INCONCLUSIVE
    return Verdict(v, f"{what}: ratio {iv.text()} against {threshold:g}, smallest detectable "
                      f"{iv.detectable_above(threshold):.3g} (the rule as applied)", iv,
                   p_holds, p_fails)


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


@dataclass(frozen=True)
class LackOfFit:
    """Whether a straight line is the data of a sweep: the F test of the settings' means about
    the fitted line against the runs' spread about their own setting's mean (pure error)."""

    f: float
    p: float
    df_lof: int
    df_pe: int
    means: pd.Series  # mean log value per setting, in setting order

    @property
    def fits(self) -> bool:
        return not self.p < 0.05

    @property
    def monotone(self) -> str:
        """`rising`, `falling`, or `not monotone` (the settings' means, in setting order)."""
        d = np.diff(self.means.to_numpy(float))
        return "rising" if (d > 0).all() else "falling" if (d < 0).all() else "not monotone"


def lack_of_fit(runs: pd.DataFrame, x: str, value: str = "steady_tok_per_s") -> LackOfFit:
    d = runs.assign(_y=np.log(runs[value])).dropna(subset=["_y", x])
    xs, ys = d[x].to_numpy(float), d._y.to_numpy(float)
    means = d.groupby(x)._y.mean().sort_index()
    k, n = len(means), len(ys)
    nan = float("nan")
    if k < 3 or n <= k:
        return LackOfFit(nan, nan, max(k - 2, 0), max(n - k, 0), means)
    slope, icept = np.polyfit(xs, ys, 1)
    counts = d.groupby(x)._y.count().sort_index()
    fitted = icept + slope * means.index.to_numpy(float)
    ss_lof = float((counts.to_numpy() * (means.to_numpy() - fitted) ** 2).sum())
    ss_pe = float(((ys - d[x].map(means).to_numpy(float)) ** 2).sum())
    df_lof, df_pe = k - 2, n - k
    if ss_pe <= 0:
        return LackOfFit(math.inf, 0.0 if ss_lof > 0 else 1.0, df_lof, df_pe, means)
    f = (ss_lof / df_lof) / (ss_pe / df_pe)
    return LackOfFit(f, float(sps.f.sf(f, df_lof, df_pe)), df_lof, df_pe, means)


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


def against_constant(pool: Pool, cfg, constant: float) -> Interval:
    """log(constant) over a configuration's mean log value: how many times the configuration is
    below a fixed figure (a ceiling), with the pool's variance."""
    n, m, _ = pool.per_config[cfg]
    var, df = pool.moderated(cfg) if pool.df else (float("nan"), 0)
    return Interval(math.log(constant) - m, math.sqrt(var / n) if var == var else float("nan"),
                    df, n, 0, "against a constant")


def against_measured(pool: Pool, cfg, samples) -> Interval:
    """Like against_constant for a figure measured `samples` times (a ceiling's repetitions, in
    tok/s): the interval of its mean log over the configuration's, with both variances and
    Welch-Satterthwaite's df. One sample: that figure taken as exact (against_constant)."""
    values = [float(s) for s in samples if s and s > 0]
    if len(values) < 2:
        return against_constant(pool, cfg, values[0] if values else float("nan"))
    logs = np.log(np.asarray(values))
    n, m, _ = pool.per_config[cfg]
    var, df = pool.moderated(cfg) if pool.df else (float("nan"), 0)
    sa, sb = var / n, float(logs.var(ddof=1)) / len(logs)
    se = math.sqrt(sa + sb)
    return Interval(float(logs.mean()) - m, se, welch_df(sa, sb, df, len(logs) - 1), n, len(logs),
                    f"against {len(logs)} measurements of it")


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
