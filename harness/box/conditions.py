"""What the kernel does beside a measurement: the block device's read-ahead (set for the run and
restored), and the host's own settings and counters that shape the numbers but are not ours to
change (DAMON, transparent huge pages, device and VM counters), recorded before and after.

Read-ahead matters because one cold page fault on a file mapping reads `read_ahead_kb` (doubled
by llama.cpp's POSIX_FADV_SEQUENTIAL) around the faulting page: at 8192 KB a 1.2-1.7 MB expert
slab costs a 16 MiB read. A file's read-ahead window is copied from the device when the file is
opened, so the value must be in force before the measured process opens the model.

A run that dies between setting and restoring (kill -9) leaves a state file under STATE_DIR
naming the device's original value and the pid that changed it; the next `DeviceReadahead.apply`
restores it first. STATE_DIR is on tmpfs, so a reboot (which resets the device) clears it too.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

SYS_DEV_BLOCK = Path("/sys/dev/block")
STATE_DIR = Path(os.environ.get("MOE_BENCH_STATE_DIR", "/run/moe-offload-bench"))
DAMON_ADMIN = Path("/sys/kernel/mm/damon/admin")
THP = Path("/sys/kernel/mm/transparent_hugepage")
VMSTAT_KEYS = ("pgpgin", "pgpgout", "pgmajfault", "nr_dirty", "nr_writeback", "nr_written",
               "workingset_refault_file", "pgsteal_kswapd", "pgsteal_direct", "pgscan_kswapd",
               "pgscan_direct")
SECTOR = 512


class BoxError(RuntimeError):
    pass


def whole_disk(major_minor: str) -> Path:
    """/sys/dev/block/<M:m> of the whole disk (a partition's parent)."""
    d = SYS_DEV_BLOCK / major_minor
    if (d / "partition").exists():
        d = d.resolve().parent
    return d.resolve()


def read_ahead_file(major_minor: str) -> Path:
    return whole_disk(major_minor) / "queue" / "read_ahead_kb"


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


@dataclass
class DeviceReadahead:
    """Sets a block device's read_ahead_kb for one measurement and restores it afterwards."""

    device: str  # "major:minor"
    want_kb: int | None  # None: leave the device as it is (only record it)
    original_kb: int | None = None
    restored_leftover: dict | None = None
    _applied: bool = field(default=False, repr=False)

    @property
    def state_file(self) -> Path:
        return STATE_DIR / f"read_ahead-{self.device.replace(':', '_')}.json"

    def current_kb(self) -> int:
        return int(read_ahead_file(self.device).read_text())

    def restore_leftover(self) -> dict | None:
        """Put back a value a killed run left behind; returns what was restored."""
        sf = self.state_file
        if not sf.exists():
            return None
        state = json.loads(sf.read_text())
        if state.get("pid") != os.getpid() and _pid_alive(state.get("pid", -1)):
            raise BoxError(f"read-ahead of {self.device} is held by live process {state['pid']} "
                           f"({sf}): another measurement is running")
        read_ahead_file(self.device).write_text(str(state["original_kb"]))
        sf.unlink()
        return state

    def apply(self) -> DeviceReadahead:
        self.restored_leftover = self.restore_leftover()
        self.original_kb = self.current_kb()
        if self.want_kb is None or self.want_kb == self.original_kb:
            return self
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"device": self.device, "original_kb": self.original_kb,
                                   "pid": os.getpid()}))
        tmp.replace(self.state_file)  # written before the change: a kill can never lose it
        try:
            read_ahead_file(self.device).write_text(str(self.want_kb))
        except OSError as exc:
            self.state_file.unlink(missing_ok=True)
            raise BoxError(f"cannot set read_ahead_kb of {self.device} to {self.want_kb}: {exc}") from exc
        self._applied = True
        if self.current_kb() != self.want_kb:
            self.restore()
            raise BoxError(f"read_ahead_kb of {self.device} did not take {self.want_kb}")
        return self

    def restore(self) -> None:
        if not self._applied:
            return
        read_ahead_file(self.device).write_text(str(self.original_kb))
        self.state_file.unlink(missing_ok=True)
        self._applied = False

    def in_force(self) -> dict:
        return {"device": self.device, "read_ahead_kb": self.current_kb(),
                "device_original_kb": self.original_kb, "set_by_run": self._applied,
                "restored_leftover": self.restored_leftover}


def restore_all_leftovers() -> list[dict]:
    """Restore every device a dead run left changed (cleanup after a hard kill); a live
    process's setting, this one's included, is not a leftover."""
    out = []
    for sf in sorted(STATE_DIR.glob("read_ahead-*.json")) if STATE_DIR.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, KeyError, BoxError):
            state = json.loads(sf.read_text())
            if state.get("pid") == os.getpid():
                continue
            r = DeviceReadahead(state["device"], None).restore_leftover()
            if r:
                out.append(r)
    return out


# --- the host's settings and counters, recorded ---------------------------------------------------


def read_value(p: Path) -> str | None:
    """A small kernel file's text, stripped; None where it cannot be read."""
    try:
        return Path(p).read_text().strip()
    except OSError:
        return None


class HeldFile:
    """A small kernel file read again and again (a counter around every token): opened once, on
    the first read, and re-read from offset 0 with pread, which makes the kernel render it anew.
    Opening and closing every counter file twice a token cost 0.58 ms a token; held open, the
    same reads (and the other threads' schedstat) cost 0.13 ms (benchmarks/counter_reads.py,
    benchmarks/results/counter_reads-2026-12-04*.txt). Opened lazily so that /proc/thread-self names the thread that
    reads; None where it cannot be read, as read_value."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._fd: int | None = None

    def read(self) -> str | None:
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            return os.pread(self._fd, 65536, 0).decode().strip()
        except OSError:
            self.close()  # a file that went away (an exited thread's) is opened anew next time
            return None

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def __del__(self):
        self.close()


def parse_keyed(text: str | None) -> dict:
    """'key value' lines (cpu.stat and the like) as {key: int}; lines that are not are skipped."""
    out = {}
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[k] = int(v)
    return out


def _tree(d: Path, depth: int = 6) -> dict:
    """A sysfs directory as nested dicts of its files' first lines."""
    out = {}
    for p in sorted(d.iterdir()):
        if p.is_dir() and depth > 0:
            out[p.name] = _tree(p, depth - 1)
        elif p.is_file():
            v = read_value(p)
            if v is not None:
                out[p.name] = v.splitlines()[0] if v else ""
    return out


def damon_snapshot(refresh: bool = True) -> list[dict]:
    """Every kdamond: state, operations, monitoring intervals and each scheme with its stats.
    refresh: ask the kernel to update the schemes' stats files first (`update_schemes_stats` is a
    read command, it changes no setting)."""
    kd = DAMON_ADMIN / "kdamonds"
    out = []
    if not kd.is_dir():
        return out
    for d in sorted(p for p in kd.iterdir() if p.is_dir()):
        state = read_value(d / "state")
        if refresh and state == "on":
            with contextlib.suppress(OSError):
                (d / "state").write_text("update_schemes_stats")
        ctxs = []
        for c in sorted(p for p in (d / "contexts").iterdir() if p.is_dir()):
            schemes = []
            for s in sorted(p for p in (c / "schemes").iterdir() if p.is_dir()):
                schemes.append({
                    "index": int(s.name), "action": read_value(s / "action"),
                    "access_pattern": _tree(s / "access_pattern"),
                    "quotas": _tree(s / "quotas", 1),
                    "filters": _tree(s / "ops_filters", 2) if (s / "ops_filters").is_dir() else {},
                    "stats": {k: int(v) for k, v in _tree(s / "stats").items() if v.isdigit()}})
            ctxs.append({"operations": read_value(c / "operations"),
                         "intervals_us": _tree(c / "monitoring_attrs" / "intervals", 0),
                         "schemes": schemes})
        out.append({"kdamond": int(d.name), "state": state, "contexts": ctxs})
    return out


def damon_applied(before: list[dict], after: list[dict]) -> dict:
    """Bytes and regions each running scheme acted on between two snapshots, by action."""
    def flat(snap):
        return {(k["kdamond"], ci, s["index"]): s for k in snap
                for ci, c in enumerate(k["contexts"]) for s in c["schemes"]}

    b, a = flat(before), flat(after)
    out: dict[str, dict] = {}
    for key, s in a.items():
        if key not in b:
            continue
        d = out.setdefault(s["action"] or "?", {"sz_applied": 0, "nr_applied": 0, "sz_tried": 0})
        for k in d:
            d[k] += s["stats"].get(k, 0) - b[key]["stats"].get(k, 0)
    return out


def thp_settings() -> dict:
    return {k: read_value(THP / k) for k in ("enabled", "defrag", "shmem_enabled")}


def sched_settings() -> dict:
    """Host scheduler settings that shape a CPU quota's effect (see limits.CPU_PERIOD_US)."""
    v = read_value(Path("/proc/sys/kernel/sched_cfs_bandwidth_slice_us"))
    return {"sched_cfs_bandwidth_slice_us": int(v) if v and v.isdigit() else None}


def device_stat(major_minor: str) -> dict:
    """Whole-disk counters (/sys/block/<dev>/stat): bytes read and written since boot."""
    return parse_device_stat(read_value(device_stat_file(major_minor)))


def device_stat_file(major_minor: str) -> Path:
    return whole_disk(major_minor) / "stat"


def parse_device_stat(text: str | None) -> dict:
    """A /sys/block/<dev>/stat line: bytes and requests read and written, and the time the
    device had requests in flight (io_ticks, its busy time)."""
    f = (text or "").split()
    if len(f) < 10:
        return {}
    return {"read_bytes": int(f[2]) * SECTOR, "write_bytes": int(f[6]) * SECTOR,
            "reads": int(f[0]), "writes": int(f[4]), "io_ticks_s": int(f[9]) / 1e3}


def vmstat() -> dict:
    out = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/vmstat").read_text().splitlines():
            k, _, v = line.partition(" ")
            if k in VMSTAT_KEYS:
                out[k] = int(v)
    return out


CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_seconds() -> dict:
    """Machine-wide CPU time by kind (/proc/stat), in seconds: with the run's own CPU use it says
    whether anything else ran, and `steal` whether the host took the VM's CPUs away."""
    hz = os.sysconf("SC_CLK_TCK")
    with contextlib.suppress(OSError, ValueError):
        f = Path("/proc/stat").read_text().splitlines()[0].split()
        if f[0] == "cpu":
            return {k: int(v) / hz for k, v in zip(CPU_FIELDS, f[1:], strict=False)}
    return {}


def counters(major_minor: str | None) -> dict:
    return {"device": device_stat(major_minor) if major_minor else {}, "vmstat": vmstat(),
            "cpu_s": cpu_seconds()}


def delta(before: dict, after: dict) -> dict:
    """after - before for every numeric leaf both have (nested one level)."""
    out = {}
    for k, v in after.items():
        if isinstance(v, dict):
            out[k] = delta(before.get(k, {}), v)
        elif isinstance(v, int | float) and isinstance(before.get(k), int | float):
            out[k] = v - before[k]
    return out


@dataclass
class BoxRecord:
    """Settings and counters around one measurement; `finish()` returns the record's `box`."""

    device: str | None
    start: dict = field(default_factory=dict)

    def begin(self) -> BoxRecord:
        self.start = {"counters": counters(self.device), "damon": damon_snapshot(),
                      "thp": thp_settings(), "sched": sched_settings()}
        return self

    def finish(self) -> dict:
        end_counters = counters(self.device)
        damon_end = damon_snapshot()
        return {
            "thp": self.start.get("thp"),
            "sched": self.start.get("sched"),
            "damon": damon_end,
            "damon_applied_during_run": damon_applied(self.start.get("damon", []), damon_end),
            "counters_delta": delta(self.start.get("counters", {}), end_counters),
        }
