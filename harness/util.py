"""Small shared helpers: atomic writes and hashing."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import tempfile
from pathlib import Path


def utcnow() -> str:
    """Now, in UTC, as every record's timestamps write it."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def sha256_file(path: os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def atomic_path(path: os.PathLike):
    """Yield a temporary path beside `path`; rename it into place only if the block succeeds,
    so an interrupted run never leaves a file that looks finished."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a killed writer's partial copy (a model's download or staging) is reaped by the next write
    # into its directory: the temporary name carries its owner (owner_tag)
    for left in left_by_dead_process(path.parent.glob(".tmp-*")):
        with contextlib.suppress(OSError):
            left.unlink()
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{owner_tag()}-{path.name}.", suffix=".tmp",
                               dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would make results unreadable to other users
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def atomic_write_text(path: os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def atomic_write_json(path: os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def host_tag() -> str:
    """8 hex digits naming this host: on a file system shared by several nodes, a leftover is
    judged only by the node that made it (another node's pids mean nothing here)."""
    return hashlib.sha256(os.uname().nodename.encode()).hexdigest()[:8]


def owner_tag() -> str:
    """<pid>-<host>: what names of work, scratch and ceiling files carry after their prefix."""
    return f"{os.getpid()}-{host_tag()}"


def owner_pid(path: Path) -> int | None:
    """The pid in a name of the form <prefix>-<pid>-<rest> (cgroups, work and scratch dirs)."""
    try:
        return int(path.name.lstrip(".").split("-")[1])
    except (IndexError, ValueError):
        return None


def left_by_dead_process(paths) -> list[Path]:
    """Those of `paths` whose owner (see owner_pid) is neither alive nor this process: what a
    supervisor killed before its cleanup left behind. A live owner's paths are never returned."""
    out, host = [], host_tag()
    for p in paths:
        parts = p.name.lstrip(".").split("-")
        if len(parts) > 2 and len(parts[2]) == 8 and parts[2] != host and _is_hex(parts[2]):
            continue  # another node's: its pid says nothing about this node's processes
        pid = owner_pid(p)
        if pid is not None and pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            out.append(p)
    return out


def _is_hex(s: str) -> bool:
    return all(c in "0123456789abcdef" for c in s)


def resolve_wait_policy(policy: str, cpu_quota: float | None) -> str:
    """The OpenMP wait policy in force: `auto` is passive under a CPU quota (a spinning thread
    spends the quota) and libgomp's own without one (a sleeping thread is slow to wake)."""
    if policy != "auto":
        return policy
    return "passive" if cpu_quota else "libgomp"


def with_wait_policy(env: dict, policy: str) -> dict:
    """The environment of a process that runs llama.cpp's OpenMP threads: OMP_WAIT_POLICY set to
    `policy` (harness.parameters' omp_wait_policy), or absent for `libgomp` (its own default),
    whatever the caller's shell set. libgomp reads it once, when it is loaded."""
    if policy == "auto":
        raise ValueError("resolve the `auto` wait policy against the run's CPU quota first")
    env = dict(env)
    env.pop("OMP_WAIT_POLICY", None)
    if policy != "libgomp":
        env["OMP_WAIT_POLICY"] = policy.upper()
    return env


def log_to(path: os.PathLike) -> None:
    """A workflow script's first call: stderr and the logging module into the rule's log file,
    line-buffered, each line stamped (what every Snakemake script of this workflow does)."""
    import logging
    import sys

    sys.stderr = open(path, "w", buffering=1)  # noqa: SIM115 - the process's stderr from now on
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s",
                        force=True)


def canonical(obj):
    """`obj` with every dict's keys in sorted order, recursively: Snakemake compares a rule's
    params by their repr, so a dict param must not change with the order keys were written in."""
    if isinstance(obj, dict):
        return {k: canonical(obj[k]) for k in sorted(obj, key=str)}
    if isinstance(obj, list | tuple):
        return type(obj)(canonical(v) for v in obj)
    return obj


def sig(x, digits: int = 4):
    """Round to `digits` significant digits (what both RESULTS.md's CSVs and its text show);
    what is not a number (None, text, a flag) is returned as it is."""
    if x is None or isinstance(x, str | bool) or str(getattr(x, "dtype", "")) == "bool":
        return x
    try:
        xf = float(x)
    except (TypeError, ValueError):
        return x
    if xf != xf or xf == 0:
        return xf
    return float(f"{xf:.{digits}g}")
