"""One measurement at a time on a machine, and a measurement that stops cleanly: a lock that every measuring step (a harness run, the
I/O ceiling, llama-bench ceilings and calibrations) holds while it measures.

The lock is an flock(2) on a file in the state directory (tmpfs, node-local), so the kernel
releases it when its holder dies, however it dies: a lock whose holder is dead is recovered, not
obeyed. The file names the holder (pid, what it measures, since when) so that a second
measurement that cannot get it says who has it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import logging
import os
import signal
import time
from pathlib import Path

from harness.box.conditions import STATE_DIR

log = logging.getLogger(__name__)
LOCK_NAME = "measurement.lock"
# how long a measurement waits for another one (the previous job's cleanup, typically) to finish
WAIT_S = float(os.environ.get("MOE_BENCH_LOCK_WAIT_S", "60"))


_held: dict[Path, int] = {}  # lock file -> how deeply this process holds it


class MeasurementBusy(RuntimeError):
    pass


class Interrupted(BaseException):
    """A signal (SIGTERM, SIGINT, SIGHUP) or the death of the pipeline that started the run: the
    measurement is stopped and undone, and the run is left marked incomplete. A BaseException, so
    that no `except Exception` on the way swallows it."""


INTERRUPT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


# the Snakemake process a measurement runs under: set by the workflow (common.smk) when it
# parses, in the process that then starts the jobs, and inherited by every job's script
PIPELINE_PID_ENV = "MOE_BENCH_PIPELINE_PID"
WATCH_EVERY_S = 1.0


def mark_pipeline() -> None:
    """Name this process as the pipeline every job started from here runs under (the workflow
    calls it when it parses)."""
    os.environ[PIPELINE_PID_ENV] = str(os.getpid())


def pipeline_pid() -> int | None:
    """The pid of the Snakemake that started this process (None outside a pipeline)."""
    try:
        return int(os.environ[PIPELINE_PID_ENV])
    except (KeyError, ValueError):
        return None


def alive(pid: int | None) -> bool:
    """None (nothing to watch) counts as alive; a zombie (exited, not yet reaped) as dead."""
    import psutil

    if pid is None:
        return True
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


@contextlib.contextmanager
def interruptible(watch_pid: int | None = -1):
    """Turn the stopping signals into Interrupted while a run is measured (main thread only: a
    signal handler cannot be set elsewhere), and put the old handlers back afterwards. While the
    block runs, `watch_pid` (default: the pipeline's, pipeline_pid()) is watched: once it is
    gone, the block is interrupted as by a signal, whatever it is doing (hashing a model,
    evicting it, staging a copy, waiting for llama-bench): a measurement nobody will read must
    not go on, holding the machine's lock."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    watch_pid = pipeline_pid() if watch_pid == -1 else watch_pid

    fired = []
    gone = threading.Event()

    def handler(signum, _frame):
        # the first signal stops the measurement; a second one (an impatient Ctrl-C) must not
        # break into the cleanup it started (the cgroup, the read-ahead, a scratch copy)
        if fired:
            return
        fired.append(signum)
        if gone.is_set():
            raise Interrupted(f"the pipeline that started this measurement (pid {watch_pid}) is "
                              "gone")
        raise Interrupted(f"stopped by {signal.Signals(signum).name}")

    done = threading.Event()

    def watch():
        while not done.wait(WATCH_EVERY_S):
            if not alive(watch_pid):
                gone.set()
                os.kill(os.getpid(), signal.SIGTERM)  # the handler above stops the main thread
                return

    old = {sig: signal.signal(sig, handler) for sig in INTERRUPT_SIGNALS}
    watcher = threading.Thread(target=watch, daemon=True, name="pipeline-watch") \
        if watch_pid is not None else None
    if watcher:
        watcher.start()
    try:
        yield
    finally:
        done.set()
        for sig, h in old.items():
            signal.signal(sig, h)


def holder(path: Path | None = None) -> dict:
    """What the lock file says of its holder ({} if nothing readable)."""
    path = path or STATE_DIR / LOCK_NAME
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text() or "{}")
    return {}


@contextlib.contextmanager
def exclusive(what: str, wait_s: float | None = None, state_dir: Path | None = None):
    """Hold the machine's measurement lock while the block runs. Waits up to `wait_s` for a live
    holder, then raises MeasurementBusy naming it. Reentrant within a process: a measurement made
    of several (the I/O ceiling's samples, each a llama-bench or a read in its own cgroup) holds
    it once around all of them, and the inner ones pass (an flock on a second descriptor of the
    same file would wait for the first)."""
    d = state_dir or STATE_DIR
    path = d / LOCK_NAME
    if _held.get(path):
        _held[path] += 1
        try:
            yield path
        finally:
            _held[path] -= 1
        return
    wait_s = WAIT_S if wait_s is None else wait_s
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except PermissionError:
        raise PermissionError(
            f"{path}: the measurement lock is root's. Measuring needs root: cgroup limits, the "
            "device's read-ahead and page-cache eviction are root's to set. Run as root (or "
            "under sudo).") from None
    try:
        deadline = time.monotonic() + wait_s
        said = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                h = holder(path)
                if time.monotonic() >= deadline:
                    raise MeasurementBusy(
                        f"another measurement is running on this machine: {h.get('what', '?')} "
                        f"(pid {h.get('pid', '?')}, since {h.get('since', '?')}); measurements "
                        f"must not overlap. Wait for it, or stop it (kill {h.get('pid', '<pid>')})"
                    ) from None
                if not said:
                    log.info(f"waiting for the measurement lock, held by pid {h.get('pid')} "
                             f"({h.get('what')})")
                    said = True
                time.sleep(0.5)
        # the previous holder's words (a dead pid, planted or left by a kill) are replaced
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "what": what, "since": dt.datetime.now(
            dt.UTC).isoformat(timespec="seconds")}).encode(), 0)
        _held[path] = 1
        try:
            yield path
        finally:
            _held.pop(path, None)
    finally:
        os.close(fd)  # releases the flock
