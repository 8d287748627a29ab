"""A run's steady window: how many generated tokens to leave out as warm-up and how many to
measure, chosen from long decodes (benchmarks/settling.py, docs/benchmarks.md), and whether a
run's window was steady (its per-token time had no trend beyond a stated bound).

Tokens are counted from the first generated token (index 0, what tokens.csv calls `index`); the
prompt's decode is never in a window."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

# a window is long enough when its figure moves by less than this when the window is doubled
DOUBLING_TOLERANCE = 0.03
# a run's window is not steady when its time per byte read (per token where it reads nothing)
# surely drifts by more than this over the window: the fitted line's change from the window's
# first token to its last, over its mean, with its whole 90% interval beyond the bound
DRIFT_BOUND = 0.15
# the check's stated power: the drift across the window it should flag (#48: 10%) and with what
# probability; each run's window says what it could flag (Drift.detectable) and how likely it
# flags this one (Drift.power). With the bound at 15% no window flags a 10% drift more often
# than not: RESULTS.md says so per configuration
DRIFT_EFFECT = 0.10
DRIFT_POWER = 0.80


def window_rate(wall_s, start: int, length: int) -> float:
    """Tokens per second over generated tokens [start, start + length) (index 0 is the first
    generated token); nan when the run has fewer."""
    w = np.asarray(wall_s, float)[start:start + length]
    return length / float(w.sum()) if len(w) == length and w.sum() > 0 else float("nan")


def doubling_change(wall_s, start: int, length: int) -> float:
    """|rate over [start, start + 2 length) / rate over [start, start + length) - 1|: how far a
    window's figure moves when it is made twice as long."""
    a, b = window_rate(wall_s, start, length), window_rate(wall_s, start, 2 * length)
    return abs(b / a - 1) if a == a and b == b else float("nan")


@dataclass(frozen=True)
class Window:
    warmup: int  # generated tokens left out before the window, the first among them (0..warmup-1)
    length: int  # generated tokens measured

    @property
    def tokens(self) -> int:
        """Generated tokens a run needs for it."""
        return self.warmup + self.length


# a window is judged with the windows of its length that start at most this many tokens later
# (where exactly it starts must not decide whether it passes), and must pass for this share of them
STARTS_JUDGED = 24
PASS_SHARE = 0.9


def choose_window(curves: dict[str, list], max_tokens: int,
                  tolerance: float = DOUBLING_TOLERANCE) -> tuple[Window | None, pd.DataFrame]:
    """The window for these settling runs: `curves` maps a configuration to its runs'
    per-generated-token wall times; a window (warm-up w, length L) passes when every
    configuration's figure (the median over its runs) moves by less than `tolerance` when the
    window is doubled. A token's time varies with what it routes, so a short window can pass
    by the luck of its tokens: (w, L) qualifies when it passes and so do PASS_SHARE of the
    windows of length L starting at w .. w + STARTS_JUDGED - 1; the chosen one needs the fewest
    tokens (w + L). Returns it (None if none qualifies) and the table of every candidate
    (warmup, length, the largest configuration's change and which one, passes, and the share of
    the later starts that pass)."""
    rows = []
    for warmup in range(1, max_tokens):
        for length in range(2, (max_tokens - warmup) // 2 + 1):
            changes = {name: float(np.nanmedian([doubling_change(r, warmup, length) for r in runs]))
                       for name, runs in curves.items()}
            worst = max(changes, key=lambda k: -1 if math.isnan(changes[k]) else changes[k])
            rows.append({"warmup": warmup, "length": length, "tokens": warmup + 2 * length,
                         "worst_change": changes[worst], "worst": worst})
    table = pd.DataFrame(rows)
    if table.empty:
        return None, table
    table["passes"] = table.worst_change < tolerance
    passing = {(int(r.warmup), int(r.length)): bool(r.passes) for r in table.itertuples()}

    def later_share(w: int, n: int) -> float:
        starts = [passing.get((k, n)) for k in range(w, w + STARTS_JUDGED)]
        return float("nan") if None in starts else sum(starts) / len(starts)

    table["later_share"] = [later_share(int(w), int(n))
                            for w, n in zip(table.warmup, table.length, strict=True)]
    ok = table[table.passes & (table.later_share >= PASS_SHARE)]
    if ok.empty:
        return None, table
    best = ok.assign(run_tokens=ok.warmup + ok.length).sort_values(
        ["run_tokens", "worst_change"]).iloc[0]
    return Window(int(best.warmup), int(best.length)), table


@dataclass(frozen=True)
class Drift:
    """The trend over a window of time per byte read (or per token): the fitted line's change
    across the window over its mean, with a 90% interval, and whether it makes the window
    unsteady."""

    change: float
    low: float
    high: float
    steady: bool
    per_byte: bool = False
    se: float = float("nan")  # the change's standard error, from the line's residuals
    df: int = 0  # their degrees of freedom (tokens - 2)

    def power(self, effect: float = DRIFT_EFFECT, bound: float = DRIFT_BOUND) -> float:
        """The probability that this check flags a window whose true drift is `effect` (either
        sign), at this window's own noise: its estimate, spread like a t with the residuals'
        degrees of freedom around `effect`, must clear the bound by the interval's half-width."""
        from scipy import stats as sps

        if not (self.se > 0) or self.df < 1:
            return float("nan")
        t = sps.t.ppf(0.95, self.df)
        return float(sps.t.sf((bound - abs(effect)) / self.se + t, self.df))

    @property
    def detectable(self) -> float:
        """The smallest drift across the window this check flags with DRIFT_POWER probability at
        this window's own noise (nan where it could not be judged)."""
        from scipy import stats as sps

        if not (self.se > 0) or self.df < 1:
            return float("nan")
        return float(DRIFT_BOUND + (sps.t.ppf(0.95, self.df) + sps.t.ppf(DRIFT_POWER, self.df))
                     * self.se)

    @property
    def why(self) -> str:
        what = "time per byte read" if self.per_byte else "per-token time"
        return "" if self.steady else (
            f"{what} drifts {self.change:+.0%} across the window (90% CI "
            f"{self.low:+.0%} to {self.high:+.0%}), surely beyond +-{DRIFT_BOUND:.0%}")


def drift(wall_s, bound: float = DRIFT_BOUND, read_bytes=None) -> Drift:
    """Least-squares line through the window's time per byte read, where every token of it read
    some (a token's time varies with how many bytes its routing reads, the same in every run:
    dividing it out leaves what changed in the machine or the mechanism), else through its
    per-token times. Unsteady when the whole 90% interval of the change the line fits across the
    window lies beyond `bound`: a trend larger than the bound that the window's own noise cannot
    explain. Too few tokens to fit: steady, unjudged."""
    from scipy import stats as sps

    y = np.asarray(wall_s, float)
    per_byte = False
    if read_bytes is not None:
        b = np.asarray(read_bytes, float)
        if len(b) == len(y) and len(b) and np.all(np.isfinite(b)) and np.all(b > 0):
            y, per_byte = y / b, True
    n = len(y)
    if n < 3 or not np.all(np.isfinite(y)) or y.mean() <= 0:
        return Drift(float("nan"), float("nan"), float("nan"), True, per_byte)
    x = np.arange(n, dtype=float)
    fit = sps.linregress(x, y)
    span = (n - 1) / y.mean()
    t = sps.t.ppf(0.95, n - 2)
    change = fit.slope * span
    low, high = (fit.slope - t * fit.stderr) * span, (fit.slope + t * fit.stderr) * span
    unsteady = low > bound or high < -bound
    return Drift(float(change), float(low), float(high), not unsteady, per_byte,
                 float(fit.stderr * span), n - 2)


def drift_power_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: the drift its windows could flag with DRIFT_POWER probability
    (runs.csv `window_drift_detectable`), median and largest, and the probability that they
    flag a DRIFT_EFFECT drift (`window_drift_power`), median and smallest: the check's stated
    power, run by run. Empty where no run has them."""
    cols = ["window_drift_detectable", "window_drift_power"]
    if any(c not in runs for c in cols) or "configuration" not in runs:
        return pd.DataFrame()
    d = runs.assign(**{c: pd.to_numeric(runs[c], errors="coerce") for c in cols}).dropna(
        subset=cols)
    if d.empty:
        return pd.DataFrame()
    g = d.groupby("configuration", sort=True)
    return pd.DataFrame({"runs": g.size(),
                         "detectable_median": g.window_drift_detectable.median(),
                         "detectable_max": g.window_drift_detectable.max(),
                         "power_median": g.window_drift_power.median(),
                         "power_min": g.window_drift_power.min()}).reset_index()


# the window held when the tokens after it ran within this of its rate
LATER_TOLERANCE = 0.03


def window_against_later(runs: pd.DataFrame) -> pd.DataFrame:
    """Per run that decoded tokens past its window (the first repeat's `later_tokens`): its
    window's rate, the later tokens' and their ratio, and whether the window held (the later
    rate within LATER_TOLERANCE of it). Empty where no run did."""
    cols = ["run_id", "repeat", "steady_tok_per_s", "later_tok_per_s", "window_over_later"]
    if "later_tok_per_s" not in runs:
        return pd.DataFrame(columns=[*cols, "held"])
    later = pd.to_numeric(runs.later_tok_per_s, errors="coerce")
    out = runs.loc[later > 0, cols].copy()
    out["held"] = (pd.to_numeric(out.window_over_later, errors="coerce") - 1).abs() \
        <= LATER_TOLERANCE
    return out.reset_index(drop=True)
