"""What the supervisor hands the measured process: one typed definition that both sides use
(the supervisor writes it, the worker reads it), so the contract exists once."""

from __future__ import annotations

import dataclasses
import enum
import json
import signal
from dataclasses import field
from pathlib import Path

from harness import parameters


class Status(str, enum.Enum):
    """How a measurement ended. A kill by its limits is a result, not an error."""

    OK = "ok"
    MEMORY = "killed: memory"
    TIME = "killed: time"
    FAILED = "failed"

    @classmethod
    def of(cls, exit_code: int, *, timed_out: bool = False, oom_killed: bool = False) -> Status:
        if timed_out:
            return cls.TIME
        if exit_code == 0:
            return cls.OK
        if exit_code == -signal.SIGKILL and oom_killed:
            return cls.MEMORY
        return cls.FAILED


LOADED, THROTTLED = "loaded", "throttled"  # the gate's two files in the worker's out_dir
GATE_WAIT_S = 120.0  # the worker gives up on a supervisor that never opens the gate


def _write(self, path: Path) -> None:
    Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=2))


def _read(cls, path: Path):
    data = json.loads(Path(path).read_text())
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"{path}: unknown worker parameters {sorted(unknown)}")
    return cls(**data)


def _run_parameter(p: parameters.Parameter):
    """A run parameter the worker takes (harness.parameters, `worker=True`), with its declared
    default; one declared without a default (the profile gives threads) must be passed."""
    return (p.name, p.type) if p.default is None else \
        (p.name, p.type, field(default=p.default))


# What the supervisor hands the worker: where things are, how the hook runs, and every run
# parameter declared `worker=True` in harness.parameters (made from the registry, so a new
# worker parameter is here without an edit). Keyword-only: the order is free.
WorkerParams = dataclasses.make_dataclass("WorkerParams", [
    ("out_dir", str),  # where the worker streams its .part files and writes worker.json
    ("layout", str),  # the model's layout file
    ("lib_dir", str | None),  # the patched llama.cpp build
    ("model_path", str),  # the file llama.cpp maps (a scratch copy for write-in-place)
    *(_run_parameter(p) for p in parameters.PARAMETERS if p.worker),
    ("mechanism_options", dict, field(default_factory=dict)),
    ("cgroup_io_stat", str | None, field(default=None)),  # the run cgroup's block-I/O counters
    # how the routing hook answers the scheduler's "ask": "native" (harness/build/hook.c, only
    # wanted nodes reach Python), "python" (every node asks Python), "off" (no hook: the bare
    # decode, for measuring the hook's cost; no routing is observed)
    ("hook", str, field(default="native")),
    ("hook_lib", str | None, field(default=None)),  # the built hook.c (the manifest's hook_lib)
    # switch the hook off for every other generated token (tokens.csv hook_on): what the hook
    # costs, measured within one process; such a run's routing records have gaps
    ("hook_ab", bool, field(default=False)),
    # where the per-token attribution's counters are (harness.box.counters.CounterFiles as a dict)
    ("counters", dict, field(default_factory=dict)),
    # True: after the load (and the mechanism's and context's setup), write out_dir/LOADED and
    # wait for out_dir/THROTTLED before the prompt: the supervisor applies the disk throttle
    # between the two, so the load reads unthrottled and every decode is throttled
    ("throttle_gate", bool, field(default=False)),
], frozen=True, kw_only=True, namespace={"write": _write, "read": classmethod(_read)})
WorkerParams.__module__ = __name__
