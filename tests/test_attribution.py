"""Where a token's time goes: the identity on constructed counters, the regime rule each way, and
on real runs of the tiny model the classification coming out each way."""

import pandas as pd
import pytest

from harness.run import supervise
from harness.analysis.run_table import run_row
from harness.analysis.attribution import CPU_BOUND, DISK_BOUND, MIXED, regime, run_attribution
from harness.box.counters import Snapshot, parts
from harness.config import adhoc_spec
from harness.box.limits import Limits, cgroup_version


def snap(**kw):
    base = dict(thread_user_s=0.0, thread_sys_s=0.0, thread_run_s=0.0, thread_delay_s=0.0,
                cg_user_s=0.0, cg_sys_s=0.0, throttled_s=0.0, nr_periods=0, nr_throttled=0,
                io_some_s=0.0, io_full_s=0.0, mem_some_s=0.0, cpu_some_s=0.0, disk_busy_s=0.0,
                disk_read_bytes=0, siblings_busy_s=0.0)
    return Snapshot(**{**base, **kw})


def test_parts_add_up_or_the_row_says_they_do_not():
    a = snap()
    b = snap(thread_run_s=0.3, thread_sys_s=0.1, thread_delay_s=0.2, io_some_s=0.45)
    p = parts(a, b, wall=1.0)
    assert p["thread_user_s"] == pytest.approx(0.2) and p["thread_sys_s"] == pytest.approx(0.1)
    assert p["unexplained_s"] == pytest.approx(0.05) and p["identity_ok"] == 1
    # I/O wait measured independently: a token whose parts leave 30% unexplained is flagged
    p = parts(a, snap(thread_run_s=0.3, thread_delay_s=0.2, io_some_s=0.2), wall=1.0)
    assert p["unexplained_s"] == pytest.approx(0.3) and p["identity_ok"] == 0
    # ... and so is one whose parts explain more than its wall time
    p = parts(a, snap(thread_run_s=0.6, thread_delay_s=0.2, io_some_s=0.4), wall=1.0)
    assert p["identity_ok"] == 0
    # asleep at a barrier: explained only while the other threads ran or queued for a CPU
    p = parts(a, snap(thread_run_s=0.3, thread_delay_s=0.2, io_some_s=0.2, siblings_busy_s=0.25),
              wall=1.0)
    assert p["sync_wait_s"] == pytest.approx(0.25) and p["unexplained_s"] == pytest.approx(0.05)
    assert p["identity_ok"] == 1
    p = parts(a, snap(thread_run_s=0.3, thread_delay_s=0.2, io_some_s=0.2, siblings_busy_s=0.1),
              wall=1.0)
    assert p["sync_wait_s"] == pytest.approx(0.1) and p["identity_ok"] == 0
    # nothing left to explain: no sync wait, however busy the siblings were
    p = parts(a, snap(thread_run_s=0.6, thread_delay_s=0.2, io_some_s=0.2, siblings_busy_s=0.9),
              wall=1.0)
    assert p["sync_wait_s"] == 0 and p["unexplained_s"] == pytest.approx(0.0)
    # a missing source (no pressure files) is -1, and the identity is then not checked
    p = parts(snap(io_some_s=-1.0), snap(io_some_s=-1.0, thread_run_s=0.5), wall=1.0)
    assert p["io_wait_s"] == -1 and p["identity_ok"] == -1 and p["sync_wait_s"] == -1


def test_the_regime_rule_comes_out_each_way():
    assert regime(io_share=0.7, cpu_share=0.3) == DISK_BOUND
    assert regime(io_share=0.1, cpu_share=0.85) == CPU_BOUND
    assert regime(io_share=0.45, cpu_share=0.5) == MIXED
    assert regime(io_share=float("nan"), cpu_share=float("nan")) == MIXED


def _rows(**cols):
    n = len(next(iter(cols.values())))
    base = {c: [0.0] * n for c in ("thread_user_s", "thread_sys_s", "thread_delay_s", "io_wait_s",
                                     "throttled_s", "hook_s", "disk_busy_s", "sync_wait_s")}
    base.update(identity_ok=[1] * n, nr_periods=[4] * n, nr_throttled=[3] * n)
    return pd.DataFrame({**base, **cols})


def test_run_attribution_leaves_out_the_first_token_and_shares_add_up():
    # first token: all I/O; the steady ones: throttled CPU
    gen = _rows(wall_s=[2.0, 1.0, 1.0], thread_user_s=[0.0, 0.2, 0.2],
                thread_delay_s=[0.0, 0.75, 0.75], throttled_s=[0.0, 1.4, 1.4],
                io_wait_s=[2.0, 0.0, 0.0])
    a = run_attribution(gen, 1)
    assert a["regime"] == CPU_BOUND
    assert a["throttled_share"] == pytest.approx(0.75) and a["io_wait_share"] == 0
    total = sum(a[k] for k in ("user_share", "hook_share", "kernel_share", "throttled_share",
                               "runqueue_share", "io_wait_share", "sync_share",
                               "unexplained_share"))
    assert total == pytest.approx(1.0)
    assert a["throttled_period_share"] == pytest.approx(0.75)
    assert a["between_share"] != a["between_share"]  # no harness_s column: not measured
    # measured without the kernel's counters too (they are -1 where this kernel lacks them)
    bare = _rows(wall_s=[2.0, 1.0, 1.0], io_wait_s=[-1.0] * 3, harness_s=[0.5, 0.1, 0.1])
    b = run_attribution(bare, 1)
    assert b["io_wait_share"] != b["io_wait_share"] and b["between_share"] == pytest.approx(0.1)


def test_the_harness_s_work_between_decodes_is_a_share_of_the_steady_decodes():
    gen = _rows(wall_s=[2.0, 1.0, 3.0], thread_user_s=[2.0, 1.0, 3.0],
                harness_s=[5.0, 0.1, 0.3])  # the first token's 5 s are left out
    assert run_attribution(gen, 1)["between_share"] == pytest.approx(0.4 / 4.0)
    # the warm-up a run declares is what is left out: two tokens, and only the 3 s one counts
    assert run_attribution(gen, 2)["between_share"] == pytest.approx(0.3 / 3.0)


def _run(manifest, model, out, limits, **kw):
    s = adhoc_spec(f"attr-{out.name}", "olmoe-tiny-Q4_K_M", "none", tokens=10, time_limit_s=300,
                   **kw)
    rec = supervise.run(s, out, lib_dir=manifest["lib_dir"], build=manifest,
                        model_info=model["info"], layout_path=model["layout"], limits=limits,
                        time_limit_s=300)
    assert rec.status == "ok"
    return run_row(out / "run.json")


@pytest.mark.skipif(cgroup_version() is None, reason="needs a writable cgroup hierarchy")
def test_a_cached_model_under_a_tiny_quota_is_cpu_bound_and_a_cold_one_on_a_slow_disk_is_not(
        manifest, tiny_models, tmp_path):
    model = tiny_models["olmoe-tiny-Q4_K_M"]
    cpu = _run(manifest, model, tmp_path / "cpu", Limits(cpu_quota=0.05, device_path=model["gguf"]),
               warm=True)
    assert cpu["regime"] == CPU_BOUND, cpu
    # waiting for CPU: mostly the quota's throttling, on the decoding thread's run queue or, when
    # it sleeps at a barrier (passive waiting under a quota), its siblings'; on a busy box partly
    # other processes
    assert cpu["throttled_share"] + cpu["runqueue_share"] + cpu["sync_share"] > 0.5, cpu
    assert cpu["io_wait_share"] < 0.05, cpu
    disk = _run(manifest, model, tmp_path / "disk",
                Limits(read_bps=1_000_000, read_ahead_kb=0, device_path=model["gguf"]),
                evict_after_load=True)
    assert disk["regime"] == DISK_BOUND, disk
    assert disk["io_wait_share"] > 0.6 and disk["throttled_share"] == 0
    for name, r in (("cpu", cpu), ("disk", disk)):
        # the parts explain most tokens within 10%, or within the counters' millisecond where a
        # token takes a few (on a faster machine a tiny model's unthrottled token is 1-4 ms, of
        # which 0.4-0.6 ms went unexplained: runs.csv's identity_ok_share, at 10% alone, was
        # 0.56-0.78 there); a part left out (a 235 ms throttle) would fail both
        tok = pd.read_csv(tmp_path / name / "tokens.csv").iloc[2:]
        explained = (tok.unexplained_s.abs() <= 0.10 * tok.wall_s) | (tok.unexplained_s.abs() < 1e-3)
        assert explained.mean() >= 0.8, tok
        # and the typical token entirely, beyond the counters' millisecond (the mean share is
        # not asserted: on tokens of a millisecond one CFS wait landing between the decode's
        # clock and the thread's counters is 245 ms of run-queue wait outside the token)
        beyond = (tok.unexplained_s.abs() - 1e-3).clip(lower=0)
        assert (beyond / tok.wall_s).median() < 0.10, tok
