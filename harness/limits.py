"""Kernel-enforced limits for one measurement: a fresh cgroup per run (v2 or v1).

RAM budget: cgroup v2 memory.max / v1 memory.limit_in_bytes (page cache, mlocked and anonymous
memory all count). Disk throttle: v2 io.max rbps / v1 blkio.throttle.read_bps_device on the
block device under the model's filesystem. The cgroup is removed in `close()`, which callers
run in a `finally` so it also happens when the measured process is killed.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

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
    for parent in (CGROOT / "memory" / PARENT, CGROOT / "blkio" / PARENT, CGROOT / PARENT):
        if not parent.is_dir():
            continue
        for d in parent.glob("run-*"):
            try:
                pid = int(d.name.split("-")[1])
            except (IndexError, ValueError):
                continue
            if Path(f"/proc/{pid}").exists():
                continue
            with contextlib.suppress(OSError):
                d.rmdir()
                removed.append(d)
    return removed


@dataclass
class Limits:
    ram_bytes: int | None = None
    read_bps: int | None = None
    device_path: str | None = None  # a file on the filesystem to throttle
    allow_unenforced: bool = False


@dataclass
class RunCgroup:
    limits: Limits
    version: int | None = None
    dirs: dict = field(default_factory=dict)  # controller -> path
    in_force: dict = field(default_factory=dict)
    name: str = ""

    def open(self) -> RunCgroup:
        reap_stale()
        lim = self.limits
        wanted = lim.ram_bytes is not None or lim.read_bps is not None
        self.version = cgroup_version()
        self.name = f"run-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            if self.version == 2:
                self._open_v2()
            elif self.version == 1:
                self._open_v1()
            elif wanted:
                raise LimitError("no writable cgroup hierarchy at /sys/fs/cgroup")
        except (OSError, LimitError) as exc:
            self.close()
            if wanted and not lim.allow_unenforced:
                raise LimitError(f"cannot enforce the machine profile's limits ({exc}); set "
                                 "profile.allow_unenforced: true to run without them") from exc
            self.in_force = {"ram_bytes": None, "read_bps": None, "error": str(exc)}
        return self

    def _mk(self, controller_root: Path) -> Path:
        parent = controller_root / PARENT
        parent.mkdir(exist_ok=True)
        d = parent / self.name
        d.mkdir()
        return d

    def _open_v1(self):
        lim = self.limits
        mem = self._mk(CGROOT / "memory")
        self.dirs["memory"] = mem
        if lim.ram_bytes is not None:
            (mem / "memory.limit_in_bytes").write_text(str(lim.ram_bytes))
            self.in_force["ram_bytes"] = int((mem / "memory.limit_in_bytes").read_text())
            with contextlib.suppress(OSError):  # no swap here, but never let it hide the budget
                (mem / "memory.swappiness").write_text("0")
        blk = self._mk(CGROOT / "blkio")
        self.dirs["blkio"] = blk
        if lim.read_bps is not None:
            dev = block_device_of(lim.device_path or ".")
            (blk / "blkio.throttle.read_bps_device").write_text(f"{dev} {lim.read_bps}")
            self.in_force["read_bps"] = lim.read_bps
            self.in_force["device"] = dev
        self.in_force["cgroup"] = "v1"

    def _open_v2(self):
        lim = self.limits
        parent = CGROOT / PARENT
        parent.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):
            (CGROOT / "cgroup.subtree_control").write_text("+memory +io")
            (parent / "cgroup.subtree_control").write_text("+memory +io")
        d = parent / self.name
        d.mkdir()
        self.dirs["unified"] = d
        if lim.ram_bytes is not None:
            (d / "memory.max").write_text(str(lim.ram_bytes))
            (d / "memory.swap.max").write_text("0") if (d / "memory.swap.max").exists() else None
            self.in_force["ram_bytes"] = lim.ram_bytes
        if lim.read_bps is not None:
            dev = block_device_of(lim.device_path or ".")
            (d / "io.max").write_text(f"{dev} rbps={lim.read_bps}")
            self.in_force["read_bps"] = lim.read_bps
            self.in_force["device"] = dev
        self.in_force["cgroup"] = "v2"

    @property
    def procs_files(self) -> list[Path]:
        if self.version == 2 and "unified" in self.dirs:
            return [self.dirs["unified"] / "cgroup.procs"]
        return [d / "cgroup.procs" for d in self.dirs.values()]

    @property
    def io_stat_file(self) -> str | None:
        """The file holding this cgroup's block-I/O byte counters."""
        if "blkio" in self.dirs:
            return str(self.dirs["blkio"] / "blkio.throttle.io_service_bytes")
        if "unified" in self.dirs:
            return str(self.dirs["unified"] / "io.stat")
        return None

    def enter(self) -> None:
        """Move the calling process into the cgroup (used in the child before exec)."""
        for f in self.procs_files:
            f.write_text(str(os.getpid()))

    def peak_bytes(self) -> int | None:
        d = self.dirs.get("memory") or self.dirs.get("unified")
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            with contextlib.suppress(OSError, ValueError):
                return int((d / name).read_text())
        return None

    def oom_killed(self) -> bool:
        """True if the kernel's OOM killer fired inside this cgroup."""
        d = self.dirs.get("memory") or self.dirs.get("unified")
        if d is None:
            return False
        for name, key in (("memory.oom_control", "oom_kill"), ("memory.events", "oom_kill")):
            with contextlib.suppress(OSError):
                for line in (d / name).read_text().splitlines():
                    k, _, v = line.partition(" ")
                    if k == key and int(v) > 0:
                        return True
        return False

    def close(self) -> None:
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
