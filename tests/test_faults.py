"""Faults a user produces: a killed pipeline, a second measurement, a changed model, a full disk,
a killed I/O ceiling. After each, the machine is as before (no run cgroup, read-ahead restored, no
large leftover), the model unchanged, and a rerun completes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from harness.box import measurelock
from harness.run import supervise
from harness.box.conditions import read_ahead_file
from harness.config import adhoc_spec
from harness.box.limits import CGROOT, PARENT, Limits, block_device_of, cgroup_version
from harness.util import host_tag, sha256_file

ROOT = Path(__file__).resolve().parents[1]
needs_cgroups = pytest.mark.skipif(cgroup_version() is None, reason="needs writable cgroups")


def run_cgroups() -> list[Path]:
    return [d for c in ("memory", "blkio", "cpu", "cpuacct", "unified")
            for d in (CGROOT / c / PARENT).glob("run-*")]


def processes_under(path: Path) -> list[psutil.Process]:
    """Live processes that work in `path` (Snakemake's --directory) or name it."""
    out = []
    for p in psutil.process_iter(["cmdline", "status", "cwd"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
            continue
        if str(p.info["cwd"] or "").startswith(str(path)) or any(
                str(path) in part for part in (p.info["cmdline"] or [])):
            out.append(p)
    return out


def _workflow_dir(tmp_path) -> Path:
    shutil.copytree(ROOT / ".test" / "config", tmp_path / "config")
    cfg = yaml.safe_load((tmp_path / "config/experiments.yaml").read_text())
    cfg["experiments"] = {"long": {"model": "olmoe-q4", "mechanism": "pread+madvise",
                                   "tokens": 1500, "repeats": 1}}
    # a tenth of a CPU: the 1500 tokens take minutes, so the kill lands mid-generation
    cfg["profiles"][cfg["profile"]]["cpu_quota"] = 0.1
    (tmp_path / "config/experiments.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return tmp_path


@needs_cgroups
@pytest.mark.parametrize("who", ["snakemake-kill-9", "job-term"])
def test_a_killed_pipeline_stops_the_measurement_and_undoes_it(tmp_path, who):
    """SIGKILL to Snakemake alone (not its process group), or SIGTERM to the job's supervisor.
    (SIGTERM to Snakemake itself is its graceful stop: it lets the running job finish.)"""
    work = _workflow_dir(tmp_path)
    target = "results/runs/long/rep1/run.json"
    ra = read_ahead_file(block_device_of(work)).read_text()  # the device's own, before any run
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
                             "--directory", str(work), "--cores", "2", target],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    run_dir = work / "results/runs/long/rep1"
    deadline = time.time() + 600
    while time.time() < deadline and not list(run_dir.glob(".work-*/tokens.csv.part")):
        time.sleep(0.2)
    time.sleep(1.0)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    workers = [p for p in processes_under(work) if "harness.run.worker" in " ".join(p.cmdline())]
    assert workers, "no worker found measuring"
    if who == "snakemake-kill-9":
        os.kill(proc.pid, signal.SIGKILL)  # Snakemake alone: its job must notice by itself
    else:
        job = [p for p in processes_under(work) if "harness_run.py" in " ".join(p.cmdline())]
        assert len(job) == 1
        job[0].send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    gone, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, "the worker went on measuring after Snakemake died"
    deadline = time.time() + 30
    while time.time() < deadline and (run_cgroups() or processes_under(work)):
        time.sleep(0.5)
    assert not processes_under(work), "a process of the run survived"
    assert not run_cgroups(), "the run's cgroup was left behind"
    assert read_ahead_file(block_device_of(work)).read_text() == ra
    assert not list(run_dir.glob(".work-*")) and not (run_dir / "run.json").exists()
    marker = json.loads((run_dir / "run.incomplete.json").read_text())
    assert marker["status"] == "incomplete"
    assert ("gone" if who == "snakemake-kill-9" else "SIGTERM") in marker["reason"]
    # the rerun completes (a hard kill leaves Snakemake's own lock: --unlock, as the README says)
    cfg = yaml.safe_load((work / "config/experiments.yaml").read_text())
    cfg["experiments"]["long"]["tokens"] = 4
    (work / "config/experiments.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    base = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
            str(work), "--cores", "2"]
    subprocess.run(base + ["--unlock"], check=True, capture_output=True)
    res = subprocess.run(base + [target], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (run_dir / "run.json").exists() and not (run_dir / "run.incomplete.json").exists()


def test_a_second_measurement_waits_then_names_the_first(tmp_path, monkeypatch):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, %r)\n"
        "from pathlib import Path\nfrom harness.box import measurelock\n"
        "with measurelock.exclusive('run held-by-test', state_dir=Path(%r)):\n"
        "    print('held', flush=True); time.sleep(60)") % (str(ROOT), str(tmp_path))],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        with pytest.raises(measurelock.MeasurementBusy, match=rf"held-by-test \(pid {holder.pid}"):
            with measurelock.exclusive("second", wait_s=1.0, state_dir=tmp_path):
                pass
        assert time.monotonic() - t0 >= 1.0  # it waited first
    finally:
        holder.kill()
        holder.wait()
    # the holder is dead: its lock is recovered, not obeyed
    with measurelock.exclusive("third", wait_s=0, state_dir=tmp_path):
        assert measurelock.holder(tmp_path / measurelock.LOCK_NAME)["pid"] == os.getpid()


def test_a_planted_stale_lock_is_recovered(tmp_path):
    (tmp_path / measurelock.LOCK_NAME).write_text(json.dumps(
        {"pid": 999999, "what": "a run killed long ago", "since": "2026-01-01T00:00:00"}))
    with measurelock.exclusive("new", wait_s=0, state_dir=tmp_path):
        assert measurelock.holder(tmp_path / measurelock.LOCK_NAME)["what"] == "new"


def _run(manifest, model_info, layout, out, **kw):
    s = adhoc_spec("fault", Path(model_info["path"]).stem, kw.pop("mechanism", "none"),
                   tokens=4, time_limit_s=120, **kw)
    return supervise.run(s, out, lib_dir=manifest["lib_dir"], build=manifest,
                         model_info=model_info, layout_path=layout,
                         limits=Limits(device_path=model_info["path"]), time_limit_s=120)


def test_a_flipped_byte_in_the_model_stops_the_run_before_it_measures(manifest, tiny_models,
                                                                       tmp_path):
    m = tiny_models["olmoe-tiny-Q4_K_M"]
    copy = tmp_path / "model.gguf"
    shutil.copyfile(m["gguf"], copy)
    with open(copy, "r+b") as f:
        f.seek(os.path.getsize(copy) - 100)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    info = dict(m["info"], path=str(copy))
    with pytest.raises(supervise.RunFailed, match="has changed since it was made"):
        _run(manifest, info, m["layout"], tmp_path / "out")
    assert not (tmp_path / "out" / "tokens.csv").exists() and not run_cgroups()


def test_lookahead_over_write_in_place_runs_on_a_scratch_copy(manifest, tiny_models, tmp_path):
    m = tiny_models["olmoe-tiny-Q4_K_M"]
    rec = _run(manifest, m["info"], m["layout"], tmp_path / "out", mechanism="lookahead",
               lookahead_base="write-in-place")
    assert rec.status == "ok" and rec.scratch_copy is True
    assert sha256_file(m["gguf"]) == m["info"]["sha256"] and rec.model_unchanged
    # the copy was made in the run's own directory under results/, and is gone
    assert not list(Path(m["gguf"]).parent.glob(".scratch-*"))
    assert not list((tmp_path / "out").glob(".scratch-*"))


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)])


def test_a_full_disk_during_the_scratch_copy_leaves_no_partial_copy(manifest, tiny_models,
                                                                    small_tmpfs, tmp_path):
    m = tiny_models["olmoe-tiny-Q4_K_M"]  # 24 MB: its copy does not fit the run's 16 MB disk
    out = small_tmpfs / "out"  # the run's directory, where the scratch copy is made
    with pytest.raises(OSError):
        _run(manifest, m["info"], m["layout"], out, mechanism="write-in-place")
    assert not list(out.glob(".scratch-*")) and not list(out.glob(".work-*"))
    assert (out / "run.incomplete.json").exists() and not run_cgroups()
    assert sha256_file(m["gguf"]) == m["info"]["sha256"]
    # a rerun that needs no copy completes on the same, still full-enough, file system
    rec = _run(manifest, m["info"], m["layout"], out)
    assert rec.status == "ok" and not (out / "run.incomplete.json").exists()


def _io_ceiling_reading(directory: Path) -> subprocess.Popen:
    """An I/O ceiling in its own process, caught reading (throttled to 2 MB/s)."""
    code = ("import sys; sys.path.insert(0, %r)\nfrom pathlib import Path\n"
            "from harness.stages.ceilings import io_ceiling\nfrom harness.box.limits import Limits\n"
            "io_ceiling(Path(%r), [64, 64], Limits(read_bps=2_000_000, device_path=%r))"
            ) % (str(ROOT), str(directory), str(directory))
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.time() + 120
    while time.time() < deadline and not run_cgroups():
        time.sleep(0.2)
    time.sleep(1.0)
    return proc


@needs_cgroups
def test_a_killed_io_ceiling_leaves_no_test_file(tmp_path):
    proc = _io_ceiling_reading(tmp_path)
    assert proc.poll() is None and list(tmp_path.glob(".io-*"))
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert not list(tmp_path.glob(".io-*")), "SIGTERM left the I/O ceiling's test file"
    assert not run_cgroups()


@needs_cgroups
def test_the_reaper_frees_a_task_a_dead_supervisors_throttle_holds(tmp_path, monkeypatch):
    """A SIGKILLed supervisor's worker dies with it but can stay in its cgroup, asleep in a read
    the throttle holds back: the next measurement's reaper lifts the throttle and removes it."""
    from harness.box import limits as limits_mod
    from harness.stages.ceilings import make_test_file

    data = tmp_path / "data.bin"
    make_test_file(data, 96 << 20)
    dead = subprocess.Popen(["true"])
    dead.wait()
    monkeypatch.setattr(limits_mod, "owner_tag", lambda: f"{dead.pid}-{host_tag()}")
    cg = limits_mod.run_cgroup(Limits(read_bps=1_000_000, device_path=str(data))).open()
    reader = subprocess.Popen(
        [sys.executable, "-m", "harness.stages.ceilings", "odirect", str(data), "0",
         str(96 << 20)], preexec_fn=cg.enter, stdout=subprocess.DEVNULL, cwd=ROOT)
    deadline = time.time() + 30
    while time.time() < deadline and cg.io_bytes()["read"] < (8 << 20):
        time.sleep(0.1)
    time.sleep(1.0)  # past any first burst: held back by the throttle now
    reader.kill()
    time.sleep(0.5)
    assert reader.poll() is None, "the killed reader should still be asleep in its read"
    monkeypatch.undo()
    limits_mod.reap_stale()
    assert not run_cgroups(), "the dead supervisor's cgroup was not reaped"
    assert reader.wait(timeout=10) == -signal.SIGKILL


def test_the_reaper_judges_only_its_own_hosts_leftovers(tmp_path):
    from harness.util import left_by_dead_process

    mine_dead = tmp_path / f".io-999999-{host_tag()}-ceiling.bin"
    other_host = tmp_path / ".io-999999-0badcafe-ceiling.bin"
    mine_live = tmp_path / f".io-{os.getpid()}-{host_tag()}-ceiling.bin"
    for p in (mine_dead, other_host, mine_live):
        p.write_text("x")
    assert left_by_dead_process([mine_dead, other_host, mine_live]) == [mine_dead]


@needs_cgroups
def test_killing_the_worker_is_a_failed_run_that_leaves_nothing(manifest, tiny_models, tmp_path):
    m = tiny_models["olmoe-tiny-Q4_K_M"]
    ra = read_ahead_file(block_device_of(m["gguf"])).read_text()
    code = ("import sys, json; sys.path.insert(0, %r)\n"
            "from harness.run import supervise\nfrom harness.config import adhoc_spec\n"
            "from harness.box.limits import Limits\n"
            "m = json.loads(%r)\nman = json.loads(%r)\n"
            "s = adhoc_spec('victim', 'olmoe-tiny-Q4_K_M', 'none', tokens=1500, time_limit_s=600)\n"
            "supervise.run(s, %r, lib_dir=man['lib_dir'], build=man, model_info=m['info'],\n"
            "              layout_path=m['layout'], limits=Limits(cpu_quota=0.1, read_ahead_kb=64,\n"
            "              device_path=m['gguf']), time_limit_s=600)\n"
            ) % (str(ROOT), json.dumps(m), json.dumps(manifest), str(tmp_path / "out"))
    sup = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    workers = []
    while time.time() < deadline and not workers:
        workers = [p for p in psutil.process_iter(["cmdline"])
                   if "harness.run.worker" in " ".join(p.info["cmdline"] or [])
                   and str(tmp_path) in " ".join(p.info["cmdline"] or [])]
        time.sleep(0.2)
    assert workers, "no worker started"
    time.sleep(1.0)
    workers[0].kill()
    _, err = sup.communicate(timeout=60)
    assert sup.returncode != 0 and "failed (exit -9)" in err  # a failed run, said so
    assert (tmp_path / "out" / "run.failed.json").exists()
    assert not (tmp_path / "out" / "run.json").exists()
    assert not list((tmp_path / "out").glob(".work-*")) and not run_cgroups()
    assert read_ahead_file(block_device_of(m["gguf"])).read_text() == ra
    # the rerun completes
    rec = _run(manifest, m["info"], m["layout"], tmp_path / "out")
    assert rec.status == "ok" and not (tmp_path / "out" / "run.failed.json").exists()


@needs_cgroups
def test_a_sigkilled_io_ceiling_leaves_a_file_the_next_one_removes(tmp_path):
    from harness.stages.ceilings import io_ceiling

    proc = _io_ceiling_reading(tmp_path)
    proc.kill()  # no cleanup at all
    proc.wait(timeout=30)
    assert list(tmp_path.glob(".io-*-ceiling.bin")), "SIGKILL should leave the file behind"
    rows = io_ceiling(tmp_path, [4], Limits(device_path=str(tmp_path)))
    assert len(rows) == 1 and rows[0]["mb_per_s"] > 0
    assert not list(tmp_path.glob(".io-*")), "the next ceiling did not remove the leftover"
    assert not run_cgroups(), "the killed ceiling's cgroup was not reaped"


def test_the_lock_is_reentrant_within_a_process_and_still_excludes_others(tmp_path):
    with measurelock.exclusive("outer", wait_s=0, state_dir=tmp_path):
        with measurelock.exclusive("inner sample", wait_s=0, state_dir=tmp_path):
            pass  # no wait, no deadlock on a second descriptor
        other = subprocess.run([sys.executable, "-c", (
            "import sys; sys.path.insert(0, %r)\nfrom pathlib import Path\n"
            "from harness.box import measurelock\n"
            "with measurelock.exclusive('other', wait_s=0, state_dir=Path(%r)):\n    pass"
        ) % (str(ROOT), str(tmp_path))], capture_output=True, text=True)
        assert other.returncode != 0 and "MeasurementBusy" in other.stderr
    with measurelock.exclusive("again", wait_s=0, state_dir=tmp_path):
        pass  # released after the outer block


def test_the_models_sha256_is_read_once_then_its_identity_checked(tiny_models, tmp_path):
    """A full sha256 the first time, the file's identity (size, mtime, inode) after; a write to
    the file changes its identity, so the next check reads it whole again and refuses it."""
    m = tiny_models["olmoe-tiny-Q2_K"]
    model = tmp_path / "m.gguf"
    shutil.copyfile(m["gguf"], model)
    info = {**m["info"], "path": str(model)}
    assert supervise._check_model_unchanged(info) == "sha256"
    assert supervise._check_model_unchanged(info) == "identity"
    with open(model, "r+b") as f:  # one byte changed in place: same size
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))
    with pytest.raises(supervise.RunFailed, match="has changed since it was made"):
        supervise._check_model_unchanged(info)
    # after the study: the bytes read in full again, and a changed model named
    from harness.models.checks import BadModelFile, verify_models

    info_path = tmp_path / "m.json"
    info_path.write_text(json.dumps(info))
    with pytest.raises(BadModelFile, match="changed during the study"):
        verify_models([info_path])
    shutil.copyfile(m["gguf"], model)
    assert verify_models([info_path]) == [{"model": info["name"], "path": str(model),
                                           "sha256": info["sha256"]}]


def test_a_ceiling_stops_when_the_pipeline_that_started_it_is_killed(tmp_path):
    """kill -9 of the Snakemake (here: a stand-in whose pid the job was given, as common.smk
    gives it) while a ceiling's tool runs: the job stops within seconds, the tool with it, and
    the measurement lock is free again."""
    pipeline = subprocess.Popen(["sleep", "120"])
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from pathlib import Path\n"
            "from harness.box import measurelock\nfrom harness.stages import ceilings\nfrom harness.box.limits import Limits\n"
            "measurelock.STATE_DIR = Path(%r)\n"
            "print('start', flush=True)\n"
            "ceilings.in_cgroup(Limits(device_path=%r), ['sleep', '90'])\n") % (
        str(ROOT), str(tmp_path / "state"), str(tmp_path))
    job = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=dict(os.environ, MOE_BENCH_PIPELINE_PID=str(pipeline.pid)))
    try:
        assert job.stdout.readline().strip() == "start"
        time.sleep(1.5)
        tools = [p for p in psutil.Process(job.pid).children(recursive=True)
                 if p.cmdline()[:1] == ["sleep"]]
        assert tools, "the ceiling's tool is not running"
        assert job.poll() is None
        pipeline.kill()  # kill -9 of "Snakemake"
        pipeline.wait()
        t0 = time.monotonic()
        job.wait(timeout=20)
        assert time.monotonic() - t0 < 10
        assert "pipeline that started this measurement" in job.stderr.read()
        gone, alive = psutil.wait_procs(tools, timeout=10)
        assert not alive, "the ceiling's tool went on"
        with measurelock.exclusive("after", wait_s=1.0, state_dir=tmp_path / "state"):
            pass  # the lock was released
    finally:
        for p in (job, pipeline):
            if p.poll() is None:
                p.kill()
