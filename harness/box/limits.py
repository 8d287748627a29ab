"""Kernel-enforced limits for one measurement: a fresh cgroup per run (v2 or v1).

RAM budget: cgroup v2 memory.max / v1 memory.limit_in_bytes (page cache, mlocked and anonymous
memory all count). Disk throttle: v2 io.max rbps/wbps / v1 blkio.throttle.{read,write}_bps_device
on the block device under the model's filesystem. CPU: v2 cpu.max / v1 cpu.cfs_quota_us, in CPUs
(0.25 = a quarter of one core's time per period, shared by all threads). Read-ahead: the device's
read_ahead_kb (harness.box.conditions), set before the measured process opens the model. Everything is undone
in `close()`, which callers run in a `finally` so it also happens when the measured process is
killed.

On cgroup v1, buffered writeback is issued by the kernel's flusher threads from the root blkio
cgroup, so a run's write throttle only sees writes the run issues itself (O_DIRECT, fsync in its own
context); the record keeps the cgroup's and the whole device's write bytes side by side so the
difference is visible.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import ClassVar
from pathlib import Path

from harness import profile_keys
from harness.box.counters import CounterFiles
from harness.box.conditions import (BoxError, DeviceReadahead, HeldFile, parse_keyed, read_value,
                                    restore_all_leftovers)
from harness.util import left_by_dead_process, owner_tag

CGROOT = Path("/sys/fs/cgroup")
PARENT = "moe-offload-bench"


class LimitError(RuntimeError):
    pass


def cgroup_version() -> int | None:
    if (CGROOT / "cgroup.controllers").exists():
        return 2
    if (CGROOT / "memory" / "memory.limit_in_bytes").exists():
        return 1
    return None


def block_device_of(path: os.PathLike) -> str:
    """'major:minor' of the whole disk holding path (throttles apply to whole disks)."""
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    sysdir = Path(f"/sys/dev/block/{major}:{minor}")
    if (sysdir / "partition").exists():
        parent = sysdir.resolve().parent
        major, minor = (parent / "dev").read_text().strip().split(":")
    return f"{major}:{minor}"


def reap_stale() -> list[Path]:
    """Remove run cgroups left by a supervisor that was killed before its cleanup (their name
    carries the creator's pid). Empty cgroups only: a live measurement is never touched."""
    removed = []
    for parent in (CGROOT / "memory" / PARENT, CGROOT / "blkio" / PARENT, CGROOT / "cpu" / PARENT,
                   CGROOT / "cpuacct" / PARENT, CGROOT / "unified" / PARENT, CGROOT / PARENT):
        if not parent.is_dir():
            continue
        for d in left_by_dead_process(parent.glob("run-*")):
            if _release(d):
                removed.append(d)
    return removed


def _release(d: Path, timeout_s: float = 10.0) -> bool:
    """Remove a dead supervisor's cgroup. Its worker was SIGKILLed with it (die_with_parent) but
    may still be inside, asleep in a read the disk throttle holds back (2 MB/s: seconds): lift
    the cgroup's throttles (every one the registry declares) so the read completes, kill what is
    left and wait for it to leave, then remove the cgroup."""
    for k in profile_keys.THROTTLES:
        with contextlib.suppress(OSError, ValueError):
            for line in (d / k.v1_file).read_text().splitlines():
                (d / k.v1_file).write_text(f"{line.split()[0]} 0")  # 0: no limit
    with contextlib.suppress(OSError, ValueError):
        for line in (d / "io.max").read_text().splitlines():
            (d / "io.max").write_text(" ".join(
                [line.split()[0], *(f"{k.v2_key}=max" for k in profile_keys.THROTTLES)]))
    kill_tasks([d / "cgroup.procs"], timeout_s)
    try:
        d.rmdir()
        return True
    except OSError:
        return False


def kill_tasks(procs_files: list[Path], timeout_s: float = 10.0) -> None:
    """SIGKILL every task listed in these cgroup.procs files (this process aside) and wait up to
    timeout_s for them to leave."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = set()
        for f in procs_files:
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in f.read_text().split())
        pids.discard(os.getpid())
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _device(self) -> str:
    return block_device_of(self.device_path or ".")


def _on_block_device(self) -> bool:
    """The file lives on a block device (not tmpfs, overlayfs, a network mount): a disk
    throttle and a read-ahead can apply to it."""
    return Path(f"/sys/dev/block/{self.device}").exists()


def _without_disk(self) -> Limits:
    """These limits less those that need a block device (the RAM budget and the quota stay)."""
    return dataclasses.replace(self, **{k: None for k in DISK_LIMITS})


_LIMIT_TYPES = {profile_keys.SIZE: int, profile_keys.INTEGER: int, profile_keys.NUMBER: float}

# What a run is held to: one field per limit of harness.profile_keys (None: no such limit; the
# device's read-ahead is recorded as it is), the file whose disk the disk limits apply to, and
# whether a run may go on where a limit cannot apply. Made from the registry: a new limit is a
# field here without an edit (its kernel writes are the cgroup classes' below).
Limits = dataclasses.make_dataclass("Limits", [
    *((k.limit, _LIMIT_TYPES[k.kind] | None, dataclasses.field(default=None))
      for k in profile_keys.LIMITS),
    ("device_path", str | None, dataclasses.field(default=None)),  # a file on the disk to limit
    ("allow_unenforced", bool, dataclasses.field(default=False)),
], kw_only=True, namespace={"device": property(_device),
                            "on_block_device": property(_on_block_device),
                            "without_disk": _without_disk})
Limits.__module__ = __name__
DISK_LIMITS = profile_keys.DISK_LIMITS


# The CFS period of a CPU quota. Each CPU's run queue draws quota from the cgroup's pool in slices
# of the host's sched_cfs_bandwidth_slice_us (5 ms here, recorded, not ours to change): with a
# quota of only a few slices per period one CPU can take it all while the other thread waits at
# a barrier, and tok/s stops being monotone in the quota (measured on the dense model, 2 threads,
# 20 ms period: 0.106 CPUs 0.08 tok/s, 0.229 3.9, 0.263 2.7; 100 ms: a step from 1.25 tok/s at
# 0.126 CPUs to 3.4 at 0.195). At 250 ms a quota of ~0.12 CPUs is ~6 slices and the rate is smooth
# (0.10 -> 1.88, 0.12 -> 2.06, 0.15 -> 2.67 tok/s), and a 0.5 s token still spans two periods.
CPU_PERIOD_US = 250_000


@dataclass
class RunCgroup:
    """A fresh cgroup for one measurement with the limits applied, made by `run_cgroup`: the
    subclass of this machine's hierarchy (CgroupV1 or CgroupV2, each reading its own counters);
    where there is none, this base class, which can only run unenforced."""

    limits: Limits
    dirs: dict = field(default_factory=dict)  # controller -> path
    in_force: dict = field(default_factory=dict)
    name: str = ""
    readahead: DeviceReadahead | None = None
    # True: open() applies the RAM budget and the read-ahead only; apply_decode_limits() adds the
    # disk throttles and the CPU quota (a run's worker starts and loads its model without them,
    # in the budget, and decodes under every limit from its first token)
    defer_to_decode: bool = False
    _restored: list = field(default_factory=list, repr=False)
    version: ClassVar[int | None] = None

    def open(self) -> RunCgroup:
        reap_stale()
        # any device's read-ahead a killed run left changed, not only this run's device
        self._restored = restore_all_leftovers()
        not_applicable = self._disk_limits_without_a_disk()
        lim = self.limits
        wanted = any(getattr(lim, k.limit) is not None for k in profile_keys.LIMITS)
        self.name = f"run-{owner_tag()}-{uuid.uuid4().hex[:8]}"
        try:
            if self.version is not None:
                self._create()
            elif wanted:
                raise LimitError("no writable cgroup hierarchy at /sys/fs/cgroup")
            self._apply_read_ahead()
        except (OSError, LimitError, BoxError) as exc:
            self.close()
            if wanted and not lim.allow_unenforced:
                raise LimitError(f"cannot enforce the machine profile's limits ({exc}); set "
                                 "profile.allow_unenforced: true to run without them") from exc
            self.in_force = {**{k.limit: None for k in profile_keys.LIMITS
                                if k.limit != "read_ahead_kb"}, "error": str(exc)}
            with contextlib.suppress(OSError, ValueError):
                self.in_force["read_ahead_kb"] = DeviceReadahead(lim.device, None).current_kb()
        if not_applicable:
            self.in_force["not_applicable"] = not_applicable
        others = [r for r in self._restored if r.get("device") != self.in_force.get("device")]
        if others:
            self.in_force["restored_other_devices"] = others
        return self

    def apply_decode_limits(self) -> None:
        """The throttles and the CPU quota a deferred cgroup left out at open(): from now on."""
        if self.defer_to_decode and self.dirs:
            self._throttle_disk()
            if any(getattr(self.limits, k.limit) is not None for k in profile_keys.THROTTLES):
                self.in_force["disk_throttle_from"] = "the first decode (the load read unthrottled)"
            if self.limits.cpu_quota is not None:
                self._apply_quota()
                self.in_force["cpu_quota_from"] = ("the first decode (the worker's start and the "
                                                   "load ran without it)")

    def _apply_quota(self) -> None:
        """Write the CPU quota (each hierarchy its own way)."""

    def _throttle_disk(self) -> None:
        """Write the read and write throttles (each hierarchy its own way)."""

    def _disk_limits_without_a_disk(self) -> dict:
        """A file off any block device (tmpfs, overlayfs) keeps the limits that still apply (the
        RAM budget, the CPU quota); the disk's cannot, and the profile must allow that. Returns
        {limit: why} for those left out."""
        lim = self.limits
        asked = [k for k in DISK_LIMITS if getattr(lim, k) is not None]
        if lim.on_block_device:
            return {}
        if asked and not lim.allow_unenforced:
            raise LimitError(
                f"{lim.device_path}: not on a block device (tmpfs or overlayfs?), so "
                f"{', '.join(asked)} cannot apply; the RAM budget and CPU quota would. Put the "
                "model on a disk, or set profile.allow_unenforced: true to measure without the "
                "disk's limits")
        why = f"{lim.device_path} is not on a block device"
        self.limits = lim.without_disk()
        return {k: why for k in asked}

    def _apply_read_ahead(self) -> None:
        """The device's read-ahead for this run; always recorded, set only when the profile says."""
        if not self.limits.on_block_device:
            self.in_force["read_ahead_kb"] = None  # no device: nothing to read ahead on
            return
        self.readahead = DeviceReadahead(self.limits.device, self.limits.read_ahead_kb).apply()
        self.in_force.update(self.readahead.in_force())
        if self.in_force.get("restored_leftover") is None:  # put back by restore_all_leftovers
            mine = [r for r in self._restored if r.get("device") == self.limits.device]
            self.in_force["restored_leftover"] = mine[0] if mine else None
        self.in_force["read_ahead_requested_kb"] = self.limits.read_ahead_kb

    def _mk(self, controller_root: Path) -> Path:
        parent = controller_root / PARENT
        parent.mkdir(exist_ok=True)
        d = parent / self.name
        d.mkdir()
        return d

    # --- what each hierarchy names its own way ---------------------------------------------
    # kind -> (controller directory, counter file), declared by each subclass
    COUNTERS: ClassVar[dict[str, tuple[str, str]]] = {}

    def _create(self) -> None:
        raise LimitError("no cgroup hierarchy")

    def _counter(self, kind: str) -> Path | None:
        controller, name = self.COUNTERS.get(kind, (None, None))
        d = self.dirs.get(controller)
        return d / name if d is not None else None

    def counter_files(self) -> CounterFiles:
        """Where the worker reads its per-token attribution (harness.run.attribution)."""
        cpu = self._counter("cpu")
        return CounterFiles(
            cpuacct_dir=str(self.dirs[self.CPUACCT]) if self.CPUACCT in self.dirs else None,
            cpu_stat=str(cpu) if cpu is not None else None,
            pressure_dir=str(self.dirs[self.PRESSURE]) if self.PRESSURE in self.dirs else None,
            device=self.limits.device)

    # the controller directories holding CPU usage and pressure (PSI) files, per hierarchy
    CPUACCT: ClassVar[str] = "cpuacct"
    PRESSURE: ClassVar[str] = "unified"

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs.values()]

    @property
    def io_stat_file(self) -> str | None:
        """The file holding this cgroup's block-I/O byte counters."""
        f = self._counter("io")
        return str(f) if f is not None else None

    def peak_bytes(self) -> int | None:
        f = self._counter("peak")
        return _int_file(f) if f is not None else None

    def oom_killed(self) -> bool:
        """True if the kernel's OOM killer fired inside this cgroup."""
        f = self._counter("oom")
        return f is not None and _oom_kills(f) > 0

    # --- shared -------------------------------------------------------------------------------

    def enter(self) -> None:
        """Move the calling process into the cgroup (used in the child before exec)."""
        for f in self.procs_files:
            f.write_text(str(os.getpid()))

    def io_bytes(self) -> dict:
        """Bytes this cgroup read from and wrote to block devices so far (-1 where unknown)."""
        return read_io_bytes(self.io_stat_file)

    def cpu_stat(self) -> dict:
        """CPU time used and time throttled by the quota (cpu.stat, the same keys in v1 and v2)."""
        f = self._counter("cpu")
        return parse_keyed(read_value(f)) if f is not None else {}

    def kill_all(self, timeout_s: float = 10.0) -> None:
        """SIGKILL every task still in the run's cgroups and wait for them to leave: nothing of a
        stopped measurement goes on measuring."""
        kill_tasks(self.procs_files, timeout_s)

    def close(self) -> None:
        if self.readahead is not None:
            self.readahead.restore()
        for d in self.dirs.values():
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    # processes still exiting: move stragglers out, then retry
                    with contextlib.suppress(OSError):
                        for pid in (d / "cgroup.procs").read_text().split():
                            (d.parent.parent / "cgroup.procs").write_text(pid)
                    time.sleep(0.1)
        self.dirs.clear()

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()


def _oom_kills(path: Path) -> int:
    """The oom_kill count of a v1 memory.oom_control or v2 memory.events file."""
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
    return 0


def _int_file(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text())
    return None


class CgroupV1(RunCgroup):
    """cgroup v1: one directory per controller (memory, blkio, cpu)."""

    version = 1
    COUNTERS = {"io": ("blkio", "blkio.throttle.io_service_bytes"),
                "peak": ("memory", "memory.max_usage_in_bytes"),
                "oom": ("memory", "memory.oom_control"), "cpu": ("cpu", "cpu.stat")}

    def _create(self) -> None:
        lim = self.limits
        mem = self._mk(CGROOT / "memory")
        self.dirs["memory"] = mem
        if lim.ram_bytes is not None:
            (mem / "memory.limit_in_bytes").write_text(str(lim.ram_bytes))
            self.in_force["ram_bytes"] = int((mem / "memory.limit_in_bytes").read_text())
            with contextlib.suppress(OSError):  # no swap here, but never let it hide the budget
                (mem / "memory.swappiness").write_text("0")
        self.dirs["blkio"] = self._mk(CGROOT / "blkio")
        if not self.defer_to_decode:
            self._throttle_disk()
        if lim.cpu_quota is not None:
            cpu = self._mk(CGROOT / "cpu")
            self.dirs["cpu"] = cpu
            (cpu / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            if not self.defer_to_decode:
                self._apply_quota()
        # for the attribution only (no limit is set there): CPU seconds by user/system, and on a
        # hybrid host the unified hierarchy's pressure (PSI) files, which v1 has no equivalent of
        if (CGROOT / "cpuacct" / "cpuacct.usage_user").exists():
            self.dirs["cpuacct"] = self._mk(CGROOT / "cpuacct")
        if (CGROOT / "unified" / "cgroup.procs").exists():
            with contextlib.suppress(OSError):
                self.dirs["unified"] = self._mk(CGROOT / "unified")
        self.in_force["cgroup"] = "v1"

    def _apply_quota(self) -> None:
        cpu = self.dirs["cpu"]
        (cpu / "cpu.cfs_quota_us").write_text(str(round(self.limits.cpu_quota * CPU_PERIOD_US)))
        quota = int((cpu / "cpu.cfs_quota_us").read_text())
        self.in_force["cpu_quota"] = quota / CPU_PERIOD_US
        self.in_force["cpu_quota_us_per_period"] = [quota, CPU_PERIOD_US]

    def _throttle_disk(self) -> None:
        lim, blk = self.limits, self.dirs["blkio"]
        for k in profile_keys.THROTTLES:  # every throttle of the disk the registry declares
            if getattr(lim, k.limit) is not None:
                (blk / k.v1_file).write_text(f"{lim.device} {getattr(lim, k.limit)}")
                self.in_force[k.limit] = getattr(lim, k.limit)
                self.in_force["device"] = lim.device


class CgroupV2(RunCgroup):
    """cgroup v2: one unified directory with every controller enabled."""

    version = 2
    CPUACCT = PRESSURE = "unified"
    COUNTERS = {"io": ("unified", "io.stat"), "peak": ("unified", "memory.peak"),
                "oom": ("unified", "memory.events"), "cpu": ("unified", "cpu.stat")}

    # each limit and the controller it needs
    CONTROLLERS = (("memory", "ram_bytes"), *(("io", k.limit) for k in profile_keys.THROTTLES),
                   ("cpu", "cpu_quota"))

    def _enable_controllers(self, parent: Path) -> None:
        """Enable memory, io and cpu for the run cgroups, one at a time (one the hierarchy lacks
        must not cost the others), and refuse a limit whose controller is not there, naming it."""
        for ctl in ("memory", "io", "cpu"):
            for f in (CGROOT / "cgroup.subtree_control", parent / "cgroup.subtree_control"):
                with contextlib.suppress(OSError):
                    f.write_text(f"+{ctl}")
        enabled = set((read_value(parent / "cgroup.subtree_control") or "").split())
        missing = {ctl: key for ctl, key in self.CONTROLLERS
                   if getattr(self.limits, key) is not None and ctl not in enabled}
        if missing:
            raise LimitError("cgroup v2: " + "; ".join(
                f"the {ctl} controller (for {key}) is not available under {parent}"
                for ctl, key in missing.items()) + " (enable it in the parent's "
                "cgroup.subtree_control, or delegate it to this cgroup)")

    def _create(self) -> None:
        lim = self.limits
        parent = CGROOT / PARENT
        parent.mkdir(exist_ok=True)
        self._enable_controllers(parent)
        d = parent / self.name
        d.mkdir()
        self.dirs["unified"] = d
        if lim.ram_bytes is not None:
            (d / "memory.max").write_text(str(lim.ram_bytes))
            (d / "memory.swap.max").write_text("0") if (d / "memory.swap.max").exists() else None
            self.in_force["ram_bytes"] = lim.ram_bytes
        if not self.defer_to_decode:
            self._throttle_disk()
            if lim.cpu_quota is not None:
                self._apply_quota()
        self.in_force["cgroup"] = "v2"

    def _apply_quota(self) -> None:
        d = self.dirs["unified"]
        (d / "cpu.max").write_text(f"{round(self.limits.cpu_quota * CPU_PERIOD_US)} {CPU_PERIOD_US}")
        quota, period = (d / "cpu.max").read_text().split()
        self.in_force["cpu_quota"] = int(quota) / int(period)
        self.in_force["cpu_quota_us_per_period"] = [int(quota), int(period)]

    def _throttle_disk(self) -> None:
        lim = self.limits
        caps = {k.limit: getattr(lim, k.limit) for k in profile_keys.THROTTLES}
        written = [f"{k.v2_key}={caps[k.limit]}" for k in profile_keys.THROTTLES
                   if caps[k.limit] is not None]
        if written:
            (self.dirs["unified"] / "io.max").write_text(f"{lim.device} {' '.join(written)}")
            self.in_force.update(caps, device=lim.device)


def read_io_bytes(io_stat_file: str | HeldFile | None) -> dict:
    """{'read': bytes, 'write': bytes} from a v1 blkio.throttle.io_service_bytes or v2 io.stat file
    (a path, or the file held open for per-token reads); -1 each when there is no such file."""
    if not io_stat_file:
        return {"read": -1, "write": -1}
    if isinstance(io_stat_file, HeldFile):
        text, io_stat_file = io_stat_file.read(), io_stat_file.path
    else:
        try:
            text = Path(io_stat_file).read_text()
        except OSError:
            text = None
    if text is None:
        return {"read": -1, "write": -1}
    if io_stat_file.endswith("io.stat"):
        return {"read": sum(int(m) for m in re.findall(r"rbytes=(\d+)", text)),
                "write": sum(int(m) for m in re.findall(r"wbytes=(\d+)", text))}
    rows = [f for f in map(str.split, text.splitlines()) if len(f) == 3]
    return {"read": sum(int(f[2]) for f in rows if f[1] == "Read"),
            "write": sum(int(f[2]) for f in rows if f[1] == "Write")}


def run_cgroup(limits: Limits, *, defer_to_decode: bool = False) -> RunCgroup:
    """The cgroup of one measurement, of this machine's hierarchy (BenchExec's `initialize()`):
    CgroupV1 or CgroupV2, or the base class where there is none (it can only run unenforced)."""
    cls = {1: CgroupV1, 2: CgroupV2}.get(cgroup_version(), RunCgroup)
    return cls(limits, defer_to_decode=defer_to_decode)


def own_memory_limit(proc_cgroup: str = "/proc/self/cgroup", root: Path = CGROOT) -> int | None:
    """The memory limit (bytes) of the cgroup this process is in, v1 or v2; None when it has
    none (unlimited) or it cannot be read."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            f = root / "memory" / path.lstrip("/") / "memory.limit_in_bytes"
        elif controllers == "":
            f = root / path.lstrip("/") / "memory.max"
        else:
            continue
        try:
            text = f.read_text().strip()
        except OSError:
            continue
        # v1 writes "unlimited" as a page-rounded 2^63 - 1
        if text != "max" and int(text) < 1 << 62:
            return int(text)
    return None


def anonymous_rss(status: str = "/proc/self/status") -> int:
    """This process's anonymous resident memory (bytes): its heap, llama.cpp's buffers, and what
    a mechanism holds in anonymous mappings."""
    for line in Path(status).read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0
