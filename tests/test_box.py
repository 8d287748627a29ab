"""The box beside the run: read-ahead set and restored (also after kill -9), the host's DAMON,
device and VM counters recorded, and the CPU quota calibration."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.box import conditions, measurelock
from harness.stages.calibrate import CalibrationError, calibrate
from harness.box.limits import Limits, LimitError, block_device_of, cgroup_version, run_cgroup

needs_cgroups = pytest.mark.skipif(cgroup_version() is None, reason="no cgroup hierarchy")


def other_value(orig: int) -> int:
    return 64 if orig != 64 else 256


@pytest.fixture
def device(tmp_path):
    dev = block_device_of(tmp_path)
    ra = conditions.read_ahead_file(dev)
    orig = int(ra.read_text())
    yield dev, orig
    ra.write_text(str(orig))  # whatever happened, the device goes back


@needs_cgroups
def test_read_ahead_is_in_force_inside_and_restored_after(device, tmp_path):
    dev, orig = device
    want = other_value(orig)
    code = f"print(open('{conditions.read_ahead_file(dev)}').read().strip())"
    with run_cgroup(Limits(read_ahead_kb=want, device_path=str(tmp_path))) as cg:
        seen = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              preexec_fn=cg.enter).stdout.strip()
        assert cg.in_force["read_ahead_kb"] == want
        assert cg.in_force["device_original_kb"] == orig
    assert int(seen) == want
    assert conditions.DeviceReadahead(dev, None).current_kb() == orig
    assert not conditions.DeviceReadahead(dev, None).state_file.exists()


@needs_cgroups
def test_read_ahead_left_by_a_killed_run_is_restored_by_the_next(device, tmp_path):
    dev, orig = device
    want = other_value(orig)
    code = ("import sys,time\nfrom harness.box.limits import Limits, run_cgroup\n"
            f"cg = run_cgroup(Limits(read_ahead_kb={want}, device_path={str(tmp_path)!r})).open()\n"
            "print('ready', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, signal.SIGKILL)  # no finally runs
    proc.wait()
    assert conditions.DeviceReadahead(dev, None).current_kb() == want  # left changed
    state = json.loads(conditions.DeviceReadahead(dev, None).state_file.read_text())
    assert state["original_kb"] == orig and state["pid"] == proc.pid
    # the next measurement, whatever it wants, first puts the original back
    with run_cgroup(Limits(device_path=str(tmp_path))) as cg:
        assert cg.in_force["restored_leftover"]["original_kb"] == orig
        assert cg.in_force["read_ahead_kb"] == orig  # native: the device's own value, recorded
    assert conditions.DeviceReadahead(dev, None).current_kb() == orig


def test_read_ahead_held_by_a_live_process_is_an_error(device, tmp_path, monkeypatch):
    dev, _ = device
    monkeypatch.setattr(conditions, "STATE_DIR", tmp_path / "state")
    (tmp_path / "state").mkdir()
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        conditions.DeviceReadahead(dev, None).state_file.write_text(
            json.dumps({"device": dev, "original_kb": 128, "pid": sleeper.pid}))
        with pytest.raises(conditions.BoxError, match="live process"):
            conditions.DeviceReadahead(dev, 128).apply()
    finally:
        sleeper.kill()


def test_a_held_counter_file_is_rendered_anew_at_every_read(tmp_path):
    """A counter file read twice a token stays open; each pread from offset 0 must show the
    kernel's current count, not the first read's text."""
    held = conditions.HeldFile("/proc/self/io")

    def wchar():
        return int(dict(line.split(": ") for line in held.read().splitlines())["wchar"])

    before = wchar()
    (tmp_path / "x").write_bytes(b"x" * (1 << 20))
    assert wchar() - before >= 1 << 20
    # a file that is not there reads as None, and is found once it exists
    gone = conditions.HeldFile(tmp_path / "later")
    assert gone.read() is None
    (tmp_path / "later").write_text("7\n")
    assert gone.read() == "7"
    held.close()
    gone.close()


def test_damon_applied_counts_each_schemes_bytes_between_snapshots():
    def snap(sz, nr):
        return [{"kdamond": 0, "state": "on", "contexts": [{"schemes": [
            {"index": 0, "action": "pageout", "stats": {"sz_applied": sz, "nr_applied": nr,
                                                        "sz_tried": 10 * sz}}]}]}]

    d = conditions.damon_applied(snap(1000, 3), snap(5096, 7))
    assert d == {"pageout": {"sz_applied": 4096, "nr_applied": 4, "sz_tried": 40960}}
    assert conditions.damon_applied(snap(5, 1), snap(5, 1))["pageout"]["sz_applied"] == 0


def test_box_record_sees_device_bytes_written(tmp_path):
    dev = block_device_of(tmp_path)
    rec = conditions.BoxRecord(dev).begin()
    with open(tmp_path / "w.bin", "wb") as f:
        f.write(os.urandom(32 << 20))
        f.flush()
        os.fsync(f.fileno())
    out = rec.finish()
    assert out["counters_delta"]["device"]["write_bytes"] >= 32 << 20
    cpu = out["counters_delta"]["cpu_s"]
    assert set(cpu) >= {"user", "system", "idle", "steal"} and cpu["system"] > 0  # it wrote 32 MiB
    assert out["thp"]["enabled"] is None or "[" in out["thp"]["enabled"]
    for k in out["damon"]:  # this machine's DAMON, as it is (nothing here changes it)
        assert k["state"] in ("on", "off")


@needs_cgroups
def test_cpu_quota_holds_a_busy_process_to_its_share(tmp_path):
    code = "import time\nt=time.time()\nwhile time.time()-t<2.5: pass\n"
    with run_cgroup(Limits(cpu_quota=0.25, device_path=str(tmp_path))) as cg:
        t0 = time.process_time()
        subprocess.run([sys.executable, "-c", code], preexec_fn=cg.enter)
        stat = cg.cpu_stat()
        assert cg.in_force["cpu_quota"] == 0.25
    assert time.process_time() - t0 < 1.0
    # 2.5 s of wall time at a quarter of a CPU: throttled in most of its ten 250 ms periods
    assert stat.get("nr_throttled", 0) >= 5, stat


def test_calibration_finds_the_quota_of_a_linear_machine():
    calls = []

    def measure(q):
        calls.append(q)
        return 20.0 * (2.0 if q is None else q) / 2.0

    res = calibrate(measure, 2.0, cpus=2)
    assert res["within_tolerance"] and abs(res["cpu_quota"] - 0.2) < 0.01
    assert calls[0] is None and len(calls) == 6  # unlimited, the step and the check twice each
    assert res["check_tok_per_s"] == pytest.approx(2.0)


def _linear(q):
    return 20.0 * (2.0 if q is None else q) / 2.0


def _power(q):
    return 20.0 * ((2.0 if q is None else q) / 2.0) ** 1.5


def _disturbed_at(calls_disturbed, factor):
    calls = []

    def measure(q):
        calls.append(q)
        return _power(q) / factor if len(calls) in calls_disturbed else _power(q)
    return measure


def test_calibration_measures_again_a_step_that_another_process_disturbed():
    """As in a main job whose calibration overlapped with a test run: a step's rate at a third.
    One disturbed measurement: its pair disagrees and a third decides. Both of a pair disturbed
    (more CPU, slower than the step before): both steps are measured again. Either way the quota
    comes out right."""
    res = calibrate(_disturbed_at({5}, 3), 2.0, cpus=2)
    assert res["within_tolerance"] and _power(res["cpu_quota"]) == pytest.approx(2.0, rel=0.05)
    assert any(len(s["samples"]) == 3 for s in res["steps"])
    res = calibrate(_disturbed_at({5, 6}, 10), 2.0, cpus=2)
    assert res["within_tolerance"] and _power(res["cpu_quota"]) == pytest.approx(2.0, rel=0.05)
    assert any(s.get("superseded") for s in res["steps"])
    assert any(s.get("remeasured") for s in res["steps"])


def test_calibration_on_a_machine_that_does_not_hold_still_fails_loudly():
    noisy = iter([40.0, 40.0] + [1.0, 1.0, 0.3, 0.3] * 20)
    with pytest.raises(CalibrationError, match="not steady"):
        calibrate(lambda q: next(noisy), 2.0, cpus=2)
    calls = []

    def drifting(q):  # steady during the search, slower by half from the check on
        calls.append(q)
        return _linear(q) / (2 if len(calls) >= 5 else 1)

    with pytest.raises(CalibrationError, match="measured again"):
        calibrate(drifting, 2.0, cpus=2)


def test_one_unlucky_check_measurement_does_not_fail_the_calibration():
    calls = []

    def once_slow(q):  # the first check measurement a quarter slower, the rest as before
        calls.append(q)
        return _linear(q) * (0.75 if len(calls) == 5 else 1)

    res = calibrate(once_slow, 2.0, cpus=2)
    assert res["within_tolerance"] and len(res["check_samples"]) == 3
    assert res["check_tok_per_s"] == pytest.approx(2.0)


def test_calibration_corrects_a_machine_that_is_not_linear():
    def rate(q):  # a step where throttled threads start waiting for each other (as measured)
        q = 2.0 if q is None else q
        return 20.0 * (q / 2.0) ** 1.5 * (0.6 if q < 0.3 else 1.0)

    res = calibrate(rate, 2.0, cpus=2, max_steps=10)
    assert res["within_tolerance"], res["steps"]
    assert abs(rate(res["cpu_quota"]) / 2.0 - 1) <= 0.10
    assert len(res["steps"]) > 2


def test_calibration_that_cannot_reach_the_target_says_so():
    res = calibrate(lambda q: 40.0 if q is None or q > 0.3 else 0.5, 2.0, cpus=2)
    assert not res["within_tolerance"] and res["cpu_quota"] is not None


def test_calibration_gives_no_quota_when_the_machine_is_already_slower():
    res = calibrate(lambda q: 1.5, 2.0, cpus=2)
    assert res["cpu_quota"] is None and "not above" in res["reason"]


def test_machine_facts_name_the_scheduler_job_when_there_is_one(monkeypatch):
    from harness.box.identity import machine_info

    assert "slurm_job_id" not in machine_info() or "SLURM_JOB_ID" in __import__("os").environ
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_PARTITION", "small")
    monkeypatch.setenv("SLURMD_NODENAME", "node7")
    info = machine_info()
    assert (info["slurm_job_id"], info["slurm_partition"], info["slurm_node"]) == ("4242", "small",
                                                                                   "node7")


def _io_machine(disk_s: float, compute_cpu_s: float, cpus: float = 2.0):
    """A token that reads for disk_s and computes for compute_cpu_s CPU-seconds, under a quota:
    its I/O-wait share, as the attribution would measure it (no overlap)."""
    def measure(quota):
        compute = compute_cpu_s / (quota if quota is not None else cpus)
        return disk_s / (disk_s + compute)
    return measure


def test_io_share_calibration_finds_the_quota_of_the_target_split():
    from harness.stages.calibrate import calibrate_io_share

    measure = _io_machine(disk_s=1.27, compute_cpu_s=0.1)
    out = calibrate_io_share(measure, 0.58, cpus=2)
    assert out["within_tolerance"] and abs(out["io_share_at_quota"] - 0.58) <= 0.08
    # the split it found is the machine's at that quota (less CPU: less I/O share)
    assert measure(out["cpu_quota"]) == out["io_share_at_quota"]
    assert out["cpu_quota"] < 2 and len(out["steps"]) >= 2


def test_io_share_calibration_on_a_machine_that_cannot_reach_the_split_says_so():
    from harness.stages.calibrate import calibrate_io_share

    # compute dominates even with every CPU: no quota, and the reachable split is recorded
    out = calibrate_io_share(_io_machine(disk_s=0.1, compute_cpu_s=2.0), 0.58, cpus=2)
    assert out["cpu_quota"] is None and not out["within_tolerance"]
    assert "reachable split is 0.09" in out["reason"]


def test_a_model_off_any_block_device_keeps_the_ram_budget_and_names_what_cannot_apply():
    shm = Path("/dev/shm")
    if not shm.is_dir() or cgroup_version() is None:
        pytest.skip("no /dev/shm tmpfs or no cgroups here")
    model = shm / f"moe-bench-test-{os.getpid()}.gguf"
    model.write_bytes(b"\0" * 4096)
    try:
        lim = Limits(ram_bytes=256 << 20, read_bps=150_000_000, read_ahead_kb=128,
                     device_path=str(model))
        assert not lim.on_block_device
        with pytest.raises(LimitError, match="read_bps, read_ahead_kb cannot apply"):
            run_cgroup(lim).open()
        with run_cgroup(dataclasses.replace(lim, allow_unenforced=True)) as cg:
            assert cg.in_force["ram_bytes"] == 256 << 20  # the budget still holds
            assert set(cg.in_force["not_applicable"]) == {"read_bps", "read_ahead_kb"}
            assert cg.in_force.get("read_bps") is None and not cg.in_force.get("error")
    finally:
        model.unlink()


@needs_cgroups
def test_a_leftover_read_ahead_is_restored_whatever_device_the_next_run_uses(device, tmp_path):
    """A killed run's read-ahead on the disk is put back by the next run's cgroup even when that
    run measures a file elsewhere (here: on no block device at all)."""
    dev, orig = device
    want = other_value(orig)
    dead = subprocess.Popen(["true"])
    dead.wait()
    conditions.STATE_DIR.mkdir(parents=True, exist_ok=True)
    conditions.DeviceReadahead(dev, None).state_file.write_text(
        json.dumps({"device": dev, "original_kb": orig, "pid": dead.pid}))
    conditions.read_ahead_file(dev).write_text(str(want))
    with run_cgroup(Limits(device_path="/dev/shm", allow_unenforced=True)) as cg:
        assert [r["original_kb"] for r in cg.in_force["restored_other_devices"]] == [orig]
    assert conditions.DeviceReadahead(dev, None).current_kb() == orig


def test_a_second_signal_cannot_break_into_the_cleanup():
    cleaned = []
    with pytest.raises(measurelock.Interrupted):
        with measurelock.interruptible():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # the first signal ends this
            finally:
                os.kill(os.getpid(), signal.SIGINT)  # impatient: a second Ctrl-C
                time.sleep(0.2)
                cleaned.append(True)  # reached: the second signal did not raise here
    assert cleaned == [True]


def test_a_user_who_is_not_root_is_told_what_needs_root(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(measurelock.os, "open", refuse)
    with pytest.raises(PermissionError, match="Measuring needs root"):
        with measurelock.exclusive("test", state_dir=tmp_path / "lock"):
            pass


def test_a_killed_writers_partial_copy_is_reaped_by_the_next_write(tmp_path):
    from harness.util import atomic_write_text, host_tag

    dead = subprocess.Popen(["true"])
    dead.wait()
    left = tmp_path / f".tmp-{dead.pid}-{host_tag()}-model.gguf.x1.tmp"
    live = tmp_path / f".tmp-{os.getppid()}-{host_tag()}-model.gguf.x2.tmp"  # a live writer's
    left.write_bytes(b"partial")
    live.write_bytes(b"in progress")
    atomic_write_text(tmp_path / "other.json", "{}")
    assert not left.exists() and live.exists()


def test_v2_controllers_are_enabled_one_by_one_and_a_missing_one_is_named(tmp_path, monkeypatch):
    """On a hierarchy without the io controller, the memory and cpu ones are still enabled and a
    run that asks for a disk throttle is refused naming `io`; one that does not ask runs."""
    from harness.box import limits as lim_mod

    root = tmp_path / "cgroup"
    parent = root / lim_mod.PARENT
    parent.mkdir(parents=True)
    for d in (root, parent):
        (d / "cgroup.subtree_control").write_text("")
    writes = []

    real_write = Path.write_text

    def write_text(self, data, *a, **k):  # a hierarchy whose io controller cannot be enabled
        if self.name == "cgroup.subtree_control":
            if data == "+io":
                raise OSError(22, "Invalid argument")
            writes.append(data)
            current = set(self.read_text().split())
            return real_write(self, " ".join(sorted(current | {data[1:]})), *a, **k)
        return real_write(self, data, *a, **k)

    monkeypatch.setattr(lim_mod, "CGROOT", root)
    monkeypatch.setattr(Path, "write_text", write_text)
    cg = lim_mod.CgroupV2(Limits(ram_bytes=1 << 30, read_bps=150_000_000,
                                 device_path=str(tmp_path)))
    with pytest.raises(lim_mod.LimitError, match=r"the io controller \(for read_bps\)"):
        cg._enable_controllers(parent)
    assert set((parent / "cgroup.subtree_control").read_text().split()) == {"memory", "cpu"}
    assert "+memory" in writes and "+cpu" in writes
    lim_mod.CgroupV2(Limits(ram_bytes=1 << 30, device_path=str(tmp_path)))._enable_controllers(parent)


def test_the_io_share_calibration_measures_after_the_studys_own_warm_up():
    import yaml

    from harness.stages.ceilings import IO_SHARE_RUN, io_share_window

    c = yaml.safe_load((Path(__file__).resolve().parents[1] / "config/experiments.yaml").read_text())
    c["profile"] = "disk-box"
    warmup = c["defaults"]["warmup_tokens"]
    assert warmup == 4 and io_share_window(c) == (warmup + IO_SHARE_RUN["measured_tokens"], warmup)
    c["profiles"]["disk-box"]["run_defaults"] = {"warmup_tokens": 2}  # a profile's own warm-up wins
    assert io_share_window(c) == (2 + IO_SHARE_RUN["measured_tokens"], 2)
