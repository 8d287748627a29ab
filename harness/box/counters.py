"""Where a token's time goes, as the box counts it: counters read around every `llama_decode`,
their parts, and the identity they must add up to. (The regime a run is in, from these parts, is
the analysis's: harness.analysis.attribution.)

The decode's critical path is the thread that calls `llama_decode` (the worker's main thread:
ggml's OpenMP team joins it at every node), so a token's wall time is explained on that thread:

    wall = user CPU + kernel CPU + run-queue wait + I/O wait + sync wait + rest

- user / kernel CPU: the thread's on-CPU time (`CLOCK_THREAD_CPUTIME_ID`, ns), divided into
  user and kernel by its own `getrusage(RUSAGE_THREAD)`, whose split is sampled at the tick.
- run-queue wait: `/proc/thread-self/schedstat`'s run_delay, time runnable but not running. A task
  of a cgroup throttled by its CPU quota stays queued, so throttling lands here; the cgroup's own
  `throttled_time` (cpu.stat) says how much of it was the quota rather than other processes.
- I/O wait: the run cgroup's `io.pressure` "some" total (PSI): time at least one of the run's
  tasks was stalled on block I/O (page faults on the model, `pread`, O_DIRECT). It is measured
  independently of the other three, so the identity can fail: when a token's parts leave more than
  IDENTITY_TOLERANCE of its wall time unexplained (or overexplained), the row says so.
- sync wait: the thread asleep, not on I/O, at a barrier (OpenMP, ggml) while the other compute
  threads finish their share, or waiting for a mechanism's reader thread: with a passive OpenMP
  wait policy the decoding thread sleeps there instead of spinning, and under a CPU quota the
  other threads' throttling lands here rather than in its run-queue wait. It is what the other
  parts leave, bounded by an independent count: the process's other threads' on-CPU plus
  run-queue time (their schedstat) over the token, so a thread asleep while the others were
  asleep too stays unexplained.
- rest: what none of these explains. Sources this
  kernel does not fill are recorded as such (`sources()`): task delay accounting is off on this
  machine (`kernel.task_delayacct = 0`, a host setting we record and do not change), so per-thread
  block-I/O delay is not available and PSI is the I/O-wait source.

Beside those, counted for the whole cgroup and the device: the cgroup's CPU seconds over all
threads (cpuacct), its throttled time and periods, the disk's busy time (`/sys/block/<dev>/stat`
io_ticks, which counts foreign I/O too) and the bytes it read.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from dataclasses import dataclass, fields
from pathlib import Path

from harness.box import conditions
from harness.box.conditions import HeldFile, parse_keyed, read_value

IDENTITY_TOLERANCE = 0.10  # the parts explain a token's wall time within 10%, or the row says not


@dataclass(frozen=True)
class CounterFiles:
    """Where a run's counters are: the supervisor knows its cgroup, the worker reads them. Every
    path may be None (no such hierarchy, or unenforced): those parts are then -1 in the rows."""

    cpuacct_dir: str | None = None  # v1 cpuacct dir, or a v2 dir (cpu.stat usage_usec et al.)
    cpu_stat: str | None = None  # cpu.stat of the cgroup holding the CPU quota
    pressure_dir: str | None = None  # a v2 (or hybrid "unified") dir holding io/cpu/memory.pressure
    device: str | None = None  # "major:minor" of the disk under the model

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _psi_total(text: str | None, kind: str) -> float:
    """The `total=` (µs) of the "some" or "full" line of a pressure file, in seconds; -1 unknown."""
    for line in (text or "").splitlines():
        if line.startswith(kind + " "):
            for part in line.split():
                if part.startswith("total="):
                    return int(part[6:]) / 1e6
    return -1.0


@dataclass(frozen=True)
class Snapshot:
    thread_user_s: float
    thread_sys_s: float
    thread_run_s: float  # on-CPU (CLOCK_THREAD_CPUTIME_ID)
    thread_delay_s: float  # schedstat: runnable, not running
    cg_user_s: float
    cg_sys_s: float
    throttled_s: float
    nr_periods: int
    nr_throttled: int
    io_some_s: float
    io_full_s: float
    mem_some_s: float
    cpu_some_s: float
    disk_busy_s: float
    disk_read_bytes: int
    siblings_busy_s: float = -1.0  # the other threads' on-CPU + run-queue time, summed


class TokenClock:
    """Reads every counter of the attribution at one moment, from the thread that decodes. The
    files stay open (conditions.HeldFile): the reads happen twice a token."""

    def __init__(self, files: CounterFiles):
        self.files = files
        self._held: dict[str, HeldFile] = {}
        # resolved once: a partition's whole disk (conditions.whole_disk) is a sysfs walk
        self.dev_stat = None
        if files.device:
            with contextlib.suppress(OSError):
                self.dev_stat = conditions.device_stat_file(files.device)
        d = Path(files.cpuacct_dir) if files.cpuacct_dir else None
        self._v1_usage = d is not None and (d / "cpuacct.usage_user").exists()

    def _read(self, path) -> str | None:
        held = self._held.get(str(path))
        if held is None:
            held = self._held[str(path)] = HeldFile(path)
        return held.read()

    def _cgroup_cpu(self) -> tuple[float, float]:
        d = self.files.cpuacct_dir
        if not d:
            return -1.0, -1.0
        d = Path(d)
        if self._v1_usage:
            u, s = self._read(d / "cpuacct.usage_user"), self._read(d / "cpuacct.usage_sys")
            if u is not None and s is not None:
                return int(u) / 1e9, int(s) / 1e9
        st = parse_keyed(self._read(d / "cpu.stat"))
        if "user_usec" in st:
            return st["user_usec"] / 1e6, st["system_usec"] / 1e6
        return -1.0, -1.0

    def _throttle(self) -> tuple[float, int, int]:
        if not self.files.cpu_stat:
            return -1.0, -1, -1
        st = parse_keyed(self._read(self.files.cpu_stat))
        if "throttled_time" in st:  # v1: ns
            thr = st["throttled_time"] / 1e9
        elif "throttled_usec" in st:  # v2: µs
            thr = st["throttled_usec"] / 1e6
        else:
            return -1.0, -1, -1
        return thr, st.get("nr_periods", -1), st.get("nr_throttled", -1)

    def _pressure(self) -> tuple[float, float, float, float]:
        d = self.files.pressure_dir
        if not d:
            return -1.0, -1.0, -1.0, -1.0
        io = self._read(Path(d) / "io.pressure")
        return (_psi_total(io, "some"), _psi_total(io, "full"),
                _psi_total(self._read(Path(d) / "memory.pressure"), "some"),
                _psi_total(self._read(Path(d) / "cpu.pressure"), "some"))

    def _thread(self):
        # on-CPU time from CLOCK_THREAD_CPUTIME_ID, which brings the running task's runtime up to
        # date; schedstat's first field lags by up to a tick for the running thread (measured:
        # 0 ms on-CPU for 1 ms tokens), its run_delay is current while the thread runs. The file
        # is opened by the first read, from the decoding thread: thread-self is that thread.
        sched = (self._read("/proc/thread-self/schedstat") or "-1 -1 0").split()
        return resource.getrusage(resource.RUSAGE_THREAD), [int(time.thread_time_ns()), sched[1]]

    def _siblings(self) -> float:
        """The process's other threads' on-CPU plus run-queue time (schedstat), summed: the
        OpenMP team the decoding thread waits for at a barrier, and a mechanism's reader threads
        it waits for (odirect-cache's); an idle thread adds nothing. -1 when the threads cannot
        be listed."""
        me = str(threading.get_native_id())
        try:
            tids = os.listdir("/proc/self/task")
        except OSError:
            return -1.0
        total = 0
        for tid in tids:
            if tid == me:
                continue
            fields_ = (self._read(f"/proc/self/task/{tid}/schedstat") or "").split()
            if len(fields_) < 2:
                continue  # the thread exited between the listing and the read
            total += int(fields_[0]) + int(fields_[1])
        return total / 1e9

    def _disk(self) -> tuple[float, int]:
        st = conditions.parse_device_stat(self._read(self.dev_stat)) if self.dev_stat else {}
        return (st["io_ticks_s"], st["read_bytes"]) if st else (-1.0, -1)

    def close(self) -> None:
        for held in self._held.values():
            held.close()
        self._held.clear()

    def read(self, before: bool = True) -> Snapshot:
        """Before a decode the thread's own counters are read last, after it first: they sit
        right next to the decode's clock, so what the thread does while reading the other files
        falls outside both. Measured on the tiny model under a 0.05 CPU quota: timing a window
        around all the reads instead put a whole 245 ms sleep (no run-queue wait, no I/O) into
        about one token in ten, inside the counter reads, not the decode."""
        if not before:
            ru, sched = self._thread()
        cg_u, cg_s = self._cgroup_cpu()
        thr, periods, throttled = self._throttle()
        io_some, io_full, mem_some, cpu_some = self._pressure()
        busy, dread = self._disk()
        siblings = self._siblings()
        if before:
            ru, sched = self._thread()
        return Snapshot(
            thread_user_s=ru.ru_utime, thread_sys_s=ru.ru_stime,
            thread_run_s=int(sched[0]) / 1e9, thread_delay_s=int(sched[1]) / 1e9,
            cg_user_s=cg_u, cg_sys_s=cg_s, throttled_s=thr, nr_periods=periods,
            nr_throttled=throttled, io_some_s=io_some, io_full_s=io_full, mem_some_s=mem_some,
            cpu_some_s=cpu_some, disk_busy_s=busy, disk_read_bytes=dread,
            siblings_busy_s=siblings)


def parts(a: Snapshot, b: Snapshot, wall: float) -> dict:
    """A token's parts between two snapshots around its decode (wall: its measured wall time).
    Counters this machine does not have come out as -1, and the identity is then not checked
    (identity_ok -1)."""

    def d(name):
        x, y = getattr(a, name), getattr(b, name)
        return y - x if x >= 0 and y >= 0 else -1

    io, delay, run = d("io_some_s"), d("thread_delay_s"), d("thread_run_s")
    # on-CPU time from schedstat (ns); rusage's user/system split is sampled at the tick (4 ms
    # here), so it only divides that time, and a sub-tick token's split is coarse
    sys_ = b.thread_sys_s - a.thread_sys_s
    if run >= 0:
        sys_ = min(sys_, run)
        user = run - sys_
    else:
        user = b.thread_user_s - a.thread_user_s
    if io >= 0 and delay >= 0:
        rest = wall - (user + sys_ + delay + io)
        siblings = d("siblings_busy_s")
        # asleep at a barrier only while a sibling ran or waited for a CPU (-1: not measured)
        sync = min(max(0.0, rest), siblings) if siblings >= 0 else -1
        unexplained = rest - max(0.0, sync)
        ok = int(abs(unexplained) <= IDENTITY_TOLERANCE * wall)
    else:
        sync, unexplained, ok = -1, -1, -1
    return {
        "thread_user_s": user, "thread_sys_s": sys_, "thread_delay_s": delay, "io_wait_s": io,
        "sync_wait_s": sync, "unexplained_s": unexplained, "cg_user_s": d("cg_user_s"), "cg_sys_s": d("cg_sys_s"),
        "throttled_s": d("throttled_s"), "nr_periods": int(d("nr_periods")),
        "nr_throttled": int(d("nr_throttled")), "io_full_s": d("io_full_s"),
        "mem_stall_s": d("mem_some_s"), "cpu_stall_s": d("cpu_some_s"),
        "disk_busy_s": d("disk_busy_s"), "device_read_bytes": int(d("disk_read_bytes")),
        "identity_ok": ok}


def sources(files: CounterFiles, worker_env: dict) -> dict:
    """Which sources this kernel fills, read once per run into its record: a part whose source is
    missing is -1 in the rows, and this says why; and the OpenMP wait policy the worker's
    environment set (None: libgomp's default), which decides what idle threads cost."""
    clock = TokenClock(files)
    snap = clock.read()
    return {
        "thread_rusage": True,
        "schedstat": snap.thread_run_s >= 0,
        "task_delayacct": read_value(Path("/proc/sys/kernel/task_delayacct")),
        "cgroup_cpu": snap.cg_user_s >= 0, "cpu_stat_throttle": snap.throttled_s >= 0,
        "psi": snap.io_some_s >= 0, "disk_stat": snap.disk_busy_s >= 0,
        "omp_wait_policy": worker_env.get("OMP_WAIT_POLICY"),
    }
