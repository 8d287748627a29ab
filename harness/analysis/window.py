"""One run's figures over its generated tokens (tokens.csv rows of phase `gen`): the measured
window's rate and means (record.measured_window: after the run's `warmup_tokens`), the warm-up's
rate, the window's drift, and the per-token counts whose denominator is every generated token."""

from __future__ import annotations

import pandas as pd

from harness.analysis import steady
from harness.record import measured_window

NAN = float("nan")


def window_mean(gen: pd.DataFrame, col: str, warmup: int) -> float:
    """A tokens.csv column's mean over the measured window (nan where it is not recorded)."""
    w = measured_window(gen, warmup)
    return float(w[col].mean()) if col in w and len(w) else NAN


def steady_rate(gen: pd.DataFrame, warmup: int) -> float:
    """Generated tokens per second over the measured window: without the warm-up tokens, the
    first of which carries start-up work whose size depends on the mechanism (1.35x the steady
    mean in the second reference run), and during which caches fill (docs/benchmarks.md)."""
    steady = gen.iloc[warmup:]
    total = float(steady.wall_s.sum())
    return len(steady) / total if len(steady) and total > 0 else NAN


def decode_rate(gen: pd.DataFrame) -> float:
    """Every generated token over their decode time, the first included."""
    total = float(gen.wall_s.sum()) if len(gen) else NAN
    return len(gen) / total if len(gen) and total > 0 else NAN


def warmup_rate(gen: pd.DataFrame, warmup: int) -> float:
    """The warm-up's rate: the generated tokens before the window, the first left out."""
    w = gen.wall_s.iloc[1:warmup]
    return len(w) / float(w.sum()) if len(w) and w.sum() > 0 else NAN


def window_read(gen: pd.DataFrame, warmup: int) -> float:
    """The run cgroup's disk reads per token of the measured window (nan where not counted)."""
    w = gen.iloc[warmup:]
    if "cgroup_read_bytes" not in w or w.empty or (w.cgroup_read_bytes < 0).any():
        return NAN
    return float(w.cgroup_read_bytes.sum()) / len(w)


def window_drift(gen: pd.DataFrame, warmup: int):
    """The window's drift (harness.analysis.steady.drift): whether the run's figure was steady."""
    win = measured_window(gen, warmup)
    return steady.drift(win.wall_s.to_numpy(float),
                        read_bytes=win.cgroup_read_bytes if "cgroup_read_bytes" in win else None)


def mean_median_gap(gen: pd.DataFrame, warmup: int) -> float:
    """|mean / median - 1| of the window's tokens' times: large when a few tokens stalled."""
    steady = gen.wall_s.iloc[warmup:]
    med = float(steady.median()) if len(steady) else NAN
    return abs(float(steady.mean()) / med - 1) if med and med == med else NAN


def prompt_rate(tok: pd.DataFrame) -> float:
    """Prompt processing in tokens per second (the prompt's one batched decode)."""
    p = tok[tok.phase == "prompt"]
    return float(p.n_tokens.sum() / p.wall_s.sum()) if len(p) and p.wall_s.sum() > 0 else NAN


def per_token(gen: pd.DataFrame, col: str) -> float:
    """A tokens.csv column's sum over every generated token, per token (nan: not recorded)."""
    return float(gen[col].sum()) / len(gen) if len(gen) and col in gen else NAN


def counted_per_token(gen: pd.DataFrame, col: str) -> float:
    """Like per_token for a counter the machine may lack (recorded as -1): nan then."""
    v = per_token(gen, col)
    return v if v >= 0 else NAN


def missing(gen: pd.DataFrame) -> tuple[float, float]:
    """Routed bytes not resident before each layer's prefetch, per token, and what the cgroup
    read over them, on the generated tokens whose residency was measured (bytes_missing >= 0):
    the check under the byte accounting (1.0 = the kernel read nothing more)."""
    if "bytes_missing" not in gen:
        return NAN, NAN
    m = gen[gen.bytes_missing >= 0]
    miss = float(m.bytes_missing.mean()) if len(m) else NAN
    read = (float(m.cgroup_read_bytes.mean()) if len(m) and "cgroup_read_bytes" in m
            and (m.cgroup_read_bytes >= 0).all() else NAN)
    return miss, read / miss if miss > 0 and read == read else NAN
