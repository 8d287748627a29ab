"""The regime a run is in, from the parts of its tokens' time (harness.box.counters measures
them around every decode): the mean steady token by part, the runs table's shares, and the
per-configuration table the attribution figure draws."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.record import measured_window

if TYPE_CHECKING:  # the runs table's callers have pandas; this module needs it only to build one
    import pandas as pd

# a run is bound by what takes at least this share of its median token's wall time
BOUND_SHARE = 0.6
CPU_BOUND, DISK_BOUND, MIXED = "cpu-bound", "disk-bound", "mixed"


def stacked(tok) -> dict:
    """The mean token's wall time by its parts (seconds), as the figure stacks them: the thread's
    user CPU without the hook, the hook, kernel CPU, throttled wait, other run-queue wait, I/O wait,
    sync wait (at a barrier for the other compute threads) and what stays unexplained. Means, not medians: the parts of a mean add up to its wall time
    (under a quota, tokens alternate between throttled and not, and a median token has no parts).
    `tok`: a run's generated-token rows (DataFrame)."""
    n = max(1, len(tok))

    def mean(col):
        return float(tok[col].clip(lower=0).sum()) / n if col in tok else 0.0

    hook, delay, wall = mean("hook_s"), mean("thread_delay_s"), mean("wall_s")
    # cpu.stat's throttled time is summed over the CPUs' run queues; the thread waits on one
    throttled = min(delay, mean("throttled_s"))
    out = {"wall_s": wall, "user_s": max(0.0, mean("thread_user_s") - hook), "hook_s": hook,
           "kernel_s": mean("thread_sys_s"), "throttled_s": throttled,
           "runqueue_s": max(0.0, delay - throttled), "io_wait_s": mean("io_wait_s"),
           "sync_s": mean("sync_wait_s")}
    out["unexplained_s"] = wall - sum(v for k, v in out.items() if k != "wall_s")
    return out


def regime(io_share: float, cpu_share: float) -> str:
    """The rule: a run is disk-bound when I/O wait is at least BOUND_SHARE of its mean token,
    CPU-bound when on-CPU time plus run-queue wait (the quota's throttling included) plus sync wait
    (the other compute threads on a CPU or waiting for one) is, and mixed otherwise (also when the
    counters are missing: nan shares)."""
    if io_share >= BOUND_SHARE:
        return DISK_BOUND
    if cpu_share >= BOUND_SHARE:
        return CPU_BOUND
    return MIXED


def between_share(gen, warmup: int) -> float:
    """The harness's own work between two decodes (tokens.csv harness_s: the counters, the row,
    the logits check, the expert log) over the decodes' time, the measured window's tokens
    only: outside the decode's clock and every tok/s. nan when not measured. It needs no kernel
    counter, so a run without them has it too."""
    steady = measured_window(gen, warmup)
    if "harness_s" not in steady or steady.empty or not steady.wall_s.sum() > 0:
        return float("nan")
    return float(steady.harness_s.clip(lower=0).sum() / steady.wall_s.sum())


def run_attribution(gen, warmup: int) -> dict:
    """The runs-table columns of the attribution, from a run's generated-token rows, over its
    measured window (record.measured_window: the `warmup` first generated tokens left out)."""
    nan = float("nan")
    cols = {"user_share": nan, "kernel_share": nan, "throttled_share": nan, "runqueue_share": nan,
            "io_wait_share": nan, "hook_share": nan, "sync_share": nan, "unexplained_share": nan,
            "disk_busy_share": nan, "identity_ok_share": nan, "throttled_period_share": nan,
            "cg_user_s_per_token": nan, "cg_sys_s_per_token": nan,
            "between_share": between_share(gen, warmup), "regime": MIXED}
    if gen.empty or "io_wait_s" not in gen or (gen.io_wait_s < 0).all():
        return cols
    steady = measured_window(gen, warmup)
    s = stacked(steady)
    wall = s["wall_s"]  # the mean steady token
    if not wall > 0:
        return cols
    for k in ("user", "kernel", "throttled", "runqueue", "io_wait", "hook", "sync", "unexplained"):
        cols[f"{k}_share"] = s[f"{k}_s"] / wall
    busy = steady.disk_busy_s[steady.disk_busy_s >= 0]
    cols["disk_busy_share"] = float(busy.sum() / steady.wall_s.sum()) if len(busy) else nan
    # CPU seconds, not shares of the token: what a policy that spins or a copy costs the quota
    for k in ("cg_user_s", "cg_sys_s"):
        got = steady[k][steady[k] >= 0] if k in steady else ()
        cols[f"{k}_per_token"] = float(got.mean()) if len(got) else nan
    checked = steady.identity_ok[steady.identity_ok >= 0]
    cols["identity_ok_share"] = float(checked.mean()) if len(checked) else nan
    periods = steady.nr_periods[steady.nr_periods >= 0].sum()
    if periods > 0:
        cols["throttled_period_share"] = float(steady.nr_throttled[steady.nr_throttled >= 0].sum()
                                               / periods)
    cpu = cols["user_share"] + cols["hook_share"] + cols["kernel_share"] + cols["throttled_share"] \
        + cols["runqueue_share"] + cols["sync_share"]
    cols["regime"] = regime(cols["io_wait_share"], cpu)
    return cols


PARTS = ("io_wait", "kernel", "user", "hook", "throttled", "runqueue", "sync", "unexplained")
# after the decode's parts, which add up to its wall time: the harness's work until the next decode
BETWEEN = "between"


def per_configuration(runs: pd.DataFrame) -> pd.DataFrame:
    """The mean steady token of each configuration, in seconds by part (medians over its ok
    repeats), with its regime: the table the attribution figure draws. Runs recorded before the
    attribution (no shares) are left out."""
    import pandas as pd

    if "io_wait_share" not in runs:
        return pd.DataFrame()
    ok = runs[(runs.status == "ok") & runs.io_wait_share.notna()
              & (runs.steady_tok_per_s > 0)].copy()
    if ok.empty:
        return pd.DataFrame()
    wall = 1.0 / ok.steady_tok_per_s
    for part in PARTS:
        ok[f"{part}_s"] = ok[f"{part}_share"] * wall
    ok["token_s"] = wall
    ok[f"{BETWEEN}_s"] = (ok[f"{BETWEEN}_share"] * wall if f"{BETWEEN}_share" in ok
                          else float("nan"))
    cols = (["steady_tok_per_s", "token_s"] + [f"{p}_s" for p in PARTS]
            + [f"{BETWEEN}_s", "io_wait_share", "identity_ok_share"])
    t = ok.groupby("run_id", sort=False)[cols].median()
    t["regime"] = ok.groupby("run_id", sort=False).regime.agg(lambda r: r.mode().iloc[0])
    t["repeats"] = ok.groupby("run_id", sort=False).size()
    if "profile" in ok:
        t.insert(0, "profile", ok.groupby("run_id", sort=False).profile.first())
    return t.reset_index()
