"""A CPU quota that makes this machine compute like the profile's box.

The study's box decoded its dense model (Qwen2.5-0.5B Q8_0, llama-bench -p 0 -n 32, 2 threads) at
~2.0 tok/s; this machine is several times faster, so every question about hiding I/O behind
compute would be asked where there is almost no compute to hide behind. A profile with
`compute_target_tok_s` gets the CFS quota (in CPUs) under which the same llama-bench decode of the
dense model comes out at that rate, found by measurement: start from the unlimited rate, then
step the quota in proportion to target / measured until within the tolerance.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from harness.limits import CPU_PERIOD_US

log = logging.getLogger(__name__)

MIN_QUOTA = 1000 / CPU_PERIOD_US  # CPUs: CFS refuses quotas under 1 ms per period


def calibrate(measure: Callable[[float | None], float], target: float, *, cpus: float,
              tolerance: float = 0.05, max_steps: int = 10) -> dict:
    """measure(quota) -> tok/s (quota None = unlimited). Returns the quota whose measured rate is
    closest to target, and every step taken. Proportional steps: tok/s scales about linearly with
    CPU time when the decode is compute-bound, and the loop corrects what it does not."""
    if target <= 0:
        raise ValueError(f"compute_target_tok_s must be > 0, not {target}")
    steps = []
    free = measure(None)
    steps.append({"cpu_quota": None, "tok_per_s": free})
    log.info("calibration: unlimited %.3f tok/s, target %.3f", free, target)
    if not free or free <= target * (1 + tolerance):
        # already as slow as the target (or slower): no quota makes it faster
        return {"cpu_quota": None, "target_tok_s": target, "steps": steps,
                "reason": "unlimited rate is not above the target"}
    quota = max(MIN_QUOTA, cpus * target / free)
    # bracket: (quota, rate) pairs known to fall below / above the target
    lo: tuple[float, float | None] = (MIN_QUOTA, None)
    hi: tuple[float, float | None] = (cpus, free)
    for _ in range(max_steps):
        rate = measure(quota)
        steps.append({"cpu_quota": quota, "tok_per_s": rate})
        log.info("calibration: quota %.4f CPUs -> %.3f tok/s", quota, rate)
        if rate and abs(rate / target - 1) <= tolerance:
            break
        if not rate or rate < target:
            lo = (quota, rate)
        else:
            hi = (quota, rate)
        quota = _next_quota(lo, hi, target)
    best = min((s for s in steps if s["cpu_quota"] is not None and s["tok_per_s"]),
               key=lambda s: abs(s["tok_per_s"] / target - 1), default=None)
    return {"cpu_quota": best["cpu_quota"] if best else None, "target_tok_s": target,
            "tok_per_s_at_quota": best["tok_per_s"] if best else None, "steps": steps,
            "within_tolerance": bool(best and abs(best["tok_per_s"] / target - 1) <= tolerance),
            "tolerance": tolerance}


def _next_quota(lo: tuple, hi: tuple, target: float) -> float:
    """Interpolate log(quota) against log(rate) between the bracket's ends (the rate is monotone in
    the quota but neither linear nor smooth: throttled threads wait for each other); fall back to
    the bracket's geometric middle when an end has no rate or the guess hugs an end."""
    (ql, rl), (qh, rh) = lo, hi
    mid = math.sqrt(ql * qh)
    if not rl or not rh or rh <= rl:
        return mid
    f = (math.log(target) - math.log(rl)) / (math.log(rh) - math.log(rl))
    if not 0.15 <= f <= 0.85:
        f = min(max(f, 0.15), 0.85)  # always shrink the bracket by a real step
    return math.exp(math.log(ql) + f * (math.log(qh) - math.log(ql)))
