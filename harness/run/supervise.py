"""Runs one harness configuration as a fresh process inside its own cgroup, after a cold start,
and turns what it streamed into the run's final records, also when the kernel killed it.

Outputs (all written atomically, so an interrupted run never leaves a finished-looking file):
  <out>/tokens.csv   one row per decode (prompt processing first, index -1)
  <out>/experts.csv  one row per expert activation (token, layer, rank, expert)
  <out>/run.json     every parameter, provenance, limits in force, status, summary
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.box import counters
from harness import libc, parameters, profile_keys
from harness.box import measurelock, pagecache
from harness import record as run_record
from harness.box.conditions import BoxRecord
from harness.contract import LOADED, THROTTLED, Status, WorkerParams
from harness.box.limits import Limits, RunCgroup, run_cgroup
from harness.box.identity import machine_info
from harness.catalog import BY_NAME as MECHANISMS, writes_model
from harness.run.mechanisms import REGISTRY
from harness.util import (atomic_path, atomic_write_json, left_by_dead_process, owner_tag, sha256_file,
                          resolve_wait_policy, utcnow, with_wait_policy)
from harness.models.checks import check_header

log = logging.getLogger(__name__)

class RunFailed(RuntimeError):
    pass


def _complete_lines(part: Path) -> list[str]:
    """Lines of a streamed .part file, without a last line cut off by a kill."""
    if not part.exists():
        return []
    text = part.read_text(errors="replace")
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines.pop()
    return lines


def _finalize_csv(part: Path, dst: Path, header: str) -> int:
    lines = _complete_lines(part) or [header + "\n"]
    with atomic_path(dst) as tmp:
        tmp.write_text("".join(lines))
    with contextlib.suppress(FileNotFoundError):
        part.unlink()
    return len(lines) - 1


def _wait_with_progress(proc, worker_log: Path, time_limit_s, gate=None) -> tuple[int, bool]:
    """Wait for the worker, relaying its progress lines (tokens done, tok/s so far) to our log,
    and SIGKILL it past the time limit. Returns (exit code, timed out). (The pipeline's death
    interrupts it like a signal: measurelock.interruptible.) `gate`: (the worker's out dir, what to do when its load is
    done) for a worker that waits at the throttle gate (contract.WorkerParams.throttle_gate);
    until it opens the worker is polled every few ms, so the gate costs the run no time."""
    deadline = time.monotonic() + time_limit_s if time_limit_s else None
    pos = 0
    next_relay = time.monotonic()
    while True:
        if gate is not None and (gate[0] / LOADED).exists():
            gate[1]()
            (gate[0] / THROTTLED).write_text("")
            gate = None
        try:
            rc = proc.wait(timeout=2.0 if gate is None else 0.005)
            break
        except subprocess.TimeoutExpired:
            rc = None
        if time.monotonic() < next_relay:
            continue
        next_relay = time.monotonic() + 2.0
        with open(worker_log, errors="replace") as f:
            f.seek(pos)
            chunk = f.read()
            pos = f.tell()
        for line in chunk.splitlines():
            if line.startswith("progress:"):
                log.info(line)
        if deadline is not None and time.monotonic() > deadline:
            proc.send_signal(signal.SIGKILL)
            return proc.wait(), True
    return rc, False


def _reap_leftovers(*dirs: Path) -> None:
    """Work and scratch directories of a supervisor killed before its cleanup (their names carry
    its pid): a hard-killed pipeline must not leave a model copy or a partial record behind."""
    for d in dirs:
        for p in left_by_dead_process(list(d.glob(".work-*")) + list(d.glob(".scratch-*"))):
            shutil.rmtree(p, ignore_errors=True)


def run(spec: dict, out_dir: os.PathLike, *, lib_dir: str, build: dict, model_info: dict,
        layout_path: str, limits: Limits, time_limit_s: float | None,
        watch_pid: int | None = -1) -> run_record.RunRecord:
    """spec: the run's configuration (run_id, model, mechanism, switches, prompt, tokens, ...).
    watch_pid: a process whose death stops the run, in whatever phase (default: the Snakemake
    that started it, measurelock.pipeline_pid; None: nothing). Returns the
    record written to run.json."""
    # a spec the record could not hold fails now, not after the measurement; from here on it is
    # the record's typed Spec, whose declarations give what the dict leaves out
    run_record.check_spec(spec, f"run {spec.get('run_id')}")
    spec = run_record.Spec(**spec)
    out = Path(out_dir)
    # the record holds the wait policy in force, not `auto`, and the later tokens decoded: the
    # first repeat's only (a sample of every configuration's rate after its window)
    spec = dataclasses.replace(spec, omp_wait_policy=resolve_wait_policy(spec.omp_wait_policy,
                                                                         limits.cpu_quota),
                               later_tokens=spec.later_tokens if spec.repeat == 1
                               and not spec.rerun else 0)
    model_path = model_info["path"]
    _check_inputs(model_path, json.loads(Path(layout_path).read_text()), limits, spec.mechanism)
    out.mkdir(parents=True, exist_ok=True)
    with measurelock.interruptible(watch_pid), \
            measurelock.exclusive(f"run {spec.run_id} rep {spec.repeat}"):
        # the identity record beside the layout (results/models), never in a user's own
        # directory, where a `source: path` model lives
        record_check = _check_model_unchanged(model_info, Path(layout_path).parent)
        model_stat = _stat_key(model_path)
        _reap_leftovers(out, Path(model_path).parent)
        for stale in (out / "run.incomplete.json", out / "run.failed.json"):
            stale.unlink(missing_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".work-{owner_tag()}-", dir=out))
        scratch = None
        # the model loads unthrottled (the RAM budget in force); the disk throttle applies from
        # the first decode: the load through a 150 MB/s throttle was a quarter of a study's time
        cg = run_cgroup(limits, defer_to_decode=True)
        record = {"run_id": spec.run_id, "spec": dataclasses.asdict(spec), "status": None,
                  "model_check": record_check}
        try:
            run_model, scratch = _model_to_run(spec, model_path, out)
            cached = (pagecache.residency(run_model) if spec.warm and spec.keep_cache
                      else 0.0)
            if cached > 0.999:
                # a benchmark of cached decoding: evicting and re-reading the whole file would
                # only put seconds of I/O between the measurements it pairs
                res_before = res_after_evict = cached
            else:
                res_before, res_after_evict = pagecache.cold_start(run_model)
                if spec.warm:
                    res_after_evict = pagecache.warm(run_model)
            cg.open()
            WorkerParams(
                out_dir=str(work), layout=layout_path, lib_dir=lib_dir, model_path=run_model,
                **{k: getattr(spec, k) for k in parameters.WORKER_KEYS},
                mechanism_options=spec.mechanism_options,
                cgroup_io_stat=cg.io_stat_file,
                hook=spec.hook, hook_lib=build.get("hook_lib"),
                hook_ab=spec.hook_ab, counters=cg.counter_files().as_dict(),
                throttle_gate=True,
            ).write(work / "params.json")
            record.update(start_utc=utcnow(), residency_before=res_before,
                          residency_at_start=res_after_evict, scratch_copy=scratch is not None)
            record.update(_measure(work, cg, lib_dir, time_limit_s,
                                   wait_policy=spec.omp_wait_policy))
            record["residency_after"] = pagecache.residency(run_model)
            record.update(_collect(work, out, spec))
            record.update(_provenance(limits, time_limit_s, cg, model_info, build, model_stat))
            record["attribution_sources"] = counters.sources(
                cg.counter_files(), with_wait_policy(os.environ, spec.omp_wait_policy))
            return _finish(record, out, work, model_path)
        except BaseException as exc:
            if not isinstance(exc, RunFailed):
                # what was measured is not a result: say so beside where the result would be
                atomic_write_json(out / "run.incomplete.json", {
                    **record, "status": "incomplete", "reason": f"{type(exc).__name__}: {exc}",
                    "end_utc": utcnow()})
            raise
        finally:
            cg.kill_all()
            cg.close()
            shutil.rmtree(work, ignore_errors=True)
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)


def _stat_key(path: str) -> tuple:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


def _check_model_unchanged(model_info: dict, verified_dir: Path | None = None) -> str | None:
    """The model's bytes against the sha256 recorded when it was made, before anything is
    measured: a changed file stops the pipeline instead of producing numbers for a different
    model. The full sha256 is read once per file and identity (size, mtime, inode, kept in
    `verified_dir`/<model file>.verified.json, default beside the model); a run of a file whose
    identity has not changed since checks that only. Returns how it was checked: `identity`,
    `sha256` or None (no sha256)."""
    want = model_info.get("sha256")
    if not want:
        return None
    path = Path(model_info["path"])
    record = _verified_file(path, verified_dir)
    if verified_identity(path, want, record):
        return "identity"
    got = sha256_file(path)
    if got != want:
        raise RunFailed(f"model file {path} has changed since it was made (sha256 "
                        f"{got[:16]}..., recorded {want[:16]}...): measurements would describe a "
                        "different model. Delete it and its .info.json to have it made again.")
    size, mtime_ns, ino = _stat_key(str(path))
    atomic_write_json(record, {"sha256": got, "size": size, "mtime_ns": mtime_ns, "ino": ino})
    return "sha256"


def _verified_file(model: Path, directory: Path | None = None) -> Path:
    return (directory or model.parent) / (model.name + ".verified.json")


def verified_identity(model: Path, sha256: str, record: Path) -> bool:
    """The file is the one whose sha256 was last read in full and matched `sha256` (`record`
    says): the same size, modification time and inode as then (a write or a replacement changes
    one of them)."""
    try:
        v = json.loads(record.read_text())
    except (OSError, ValueError):
        return False
    return v.get("sha256") == sha256 and [v.get("size"), v.get("mtime_ns"), v.get("ino")] == \
        list(_stat_key(str(model)))


def _check_inputs(model_path: str, layout: dict, limits: Limits, mechanism: str = "none") -> None:
    check_header(model_path, layout["file_size"])
    if not layout.get("n_expert") and MECHANISMS[mechanism].prefetches:
        raise RunFailed(f"{model_path} is dense (no experts); {mechanism} prefetches experts, so "
                        "its run would measure nothing it is for: use mechanism none, or a MoE "
                        "model")
    if limits.ram_bytes is not None and limits.ram_bytes <= layout["non_expert_bytes"]:
        raise RunFailed(f"config: the RAM budget ({limits.ram_bytes} bytes) is smaller than "
                        f"{model_path}'s non-expert tensors ({layout['non_expert_bytes']} bytes)")


def _model_to_run(spec: run_record.Spec, model_path: str, out: Path) -> tuple[str, Path | None]:
    """The model file itself, or for a mechanism that writes into the mapping a copy in the run's
    own directory under results/ (deleted by the caller): the model file, and the directory of a
    user's own model, are never written."""
    if not writes_model(spec.mechanism, spec.mechanism_options):
        return model_path, None
    scratch = Path(tempfile.mkdtemp(prefix=f".scratch-{owner_tag()}-", dir=out))
    run_model = str(scratch / Path(model_path).name)
    try:
        shutil.copyfile(model_path, run_model)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)  # a full disk leaves no partial copy
        raise
    return run_model, scratch


def _worker_preexec(cg: RunCgroup):
    def preexec():
        libc.die_with_parent(signal.SIGKILL)  # never outlives the supervisor, however it dies
        if cg.dirs:
            cg.enter()
    return preexec


def _measure(work: Path, cg: RunCgroup, lib_dir: str, time_limit_s, *,
             wait_policy: str) -> dict:
    """The measured process in the run's cgroup, and what the kernel did beside it."""
    env = with_wait_policy(dict(os.environ, LLAMA_CPP_LIB_PATH=lib_dir), wait_policy)
    box = BoxRecord(cg.in_force.get("device")).begin()
    t0 = time.monotonic()
    with open(work / "worker.log", "w") as wlog:
        proc = subprocess.Popen([sys.executable, "-m", "harness.run.worker", str(work / "params.json")],
                                stdout=wlog, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=_worker_preexec(cg))
        try:
            rc, timed_out = _wait_with_progress(proc, work / "worker.log", time_limit_s,
                                                gate=(work, cg.apply_decode_limits))
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    wall = time.monotonic() - t0
    return {"wall_s": wall, "end_utc": utcnow(), "exit_code": rc,
            "status": Status.of(rc, timed_out=timed_out, oom_killed=cg.oom_killed()).value,
            "peak_cgroup_bytes": cg.peak_bytes(),
            # DAMON, writeback, device bytes: what else happened on this box during the run
            "box": box.finish(), "cgroup_io_bytes": cg.io_bytes(), "cgroup_cpu_stat": cg.cpu_stat()}


def _collect(work: Path, out: Path, spec: run_record.Spec) -> dict:
    """The worker's streamed rows as final CSVs (also when it was killed) and its summary."""
    from harness.run.worker import EXPERT_FIELDS, TOKEN_FIELDS

    # through a temporary name and a rename: a link planted at out/worker.log is replaced, never
    # followed (the supervisor runs as root)
    with atomic_path(out / "worker.log") as tmp:
        shutil.copyfile(work / "worker.log", tmp)
    n_tok_rows = _finalize_csv(work / "tokens.csv.part", out / "tokens.csv", ",".join(TOKEN_FIELDS))
    _finalize_csv(work / "experts.csv.part", out / "experts.csv", ",".join(EXPERT_FIELDS))
    fields = REGISTRY[spec.mechanism].row_fields
    if fields:  # the mechanism's own per-layer rows (lookahead's predictions)
        _finalize_csv(work / "mechanism.csv.part", out / "mechanism.csv", ",".join(fields))
    summary = {}
    if (work / "worker.json").exists():
        summary = json.loads((work / "worker.json").read_text())
    # a killed worker wrote no summary: its rows less the prompt's, past-the-window ones aside
    return {"tokens_completed": summary.get("tokens_completed",
                                            max(0, min(n_tok_rows - 1, spec.tokens))),
            "summary": summary}


def _provenance(limits: Limits, time_limit_s, cg: RunCgroup, model_info: dict, build: dict,
                model_stat: tuple) -> dict:
    model_path = model_info["path"]
    # the sha256 was checked before the run; any write since would have changed size or mtime
    unchanged = _stat_key(model_path) == model_stat
    return {
        "limits_in_force": cg.in_force,
        "limits_requested": {**{k.limit: getattr(limits, k.limit) for k in profile_keys.LIMITS},
                             "time_limit_s": time_limit_s},
        "model": {k: model_info.get(k) for k in ("name", "path", "sha256", "synthetic", "seed",
                                                 "quant", "source", "staged_from")},
        "model_sha256_checked_before": model_info.get("sha256"), "model_unchanged": unchanged,
        "build": {k: build.get(k) for k in ("commit", "patch_sha256", "cmake_flags", "key",
                                            "source_kind", "file_advice", "hook_lib")},
        "machine": machine_info()}


def _finish(record: dict, out: Path, work: Path, model_path: str) -> run_record.RunRecord:
    """A failed run leaves run.failed.json and raises; a result is written last, atomically."""
    if record["status"] == Status.FAILED.value:
        tail = "\n".join((out / "worker.log").read_text(errors="replace").splitlines()[-15:])
        atomic_write_json(out / "run.failed.json", record)
        raise RunFailed(f"run {record['run_id']} failed (exit {record['exit_code']}); worker log "
                        f"tail:\n{tail}")
    if not record["model_unchanged"]:
        raise RunFailed(f"run {record['run_id']}: model file {model_path} changed during the run")
    typed = run_record.from_dict(record)  # a field the record type does not declare fails here
    run_record.write_run(out / "run.json", typed)  # last: its presence means the run is complete
    log.info(f"run {record['run_id']}: {record['status']}, {record['tokens_completed']} tokens, "
        f"{record['wall_s']:.1f} s")
    return typed
