"""What the supervisor hands the measured process: one typed definition that both sides use
(the supervisor writes it, the worker reads it), so the contract exists once."""

from __future__ import annotations

import dataclasses
import enum
import json
import signal
from dataclasses import dataclass, field
from pathlib import Path


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


@dataclass(frozen=True)
class WorkerParams:
    out_dir: str  # where the worker streams its .part files and writes worker.json
    layout: str  # the model's layout file
    lib_dir: str | None  # the patched llama.cpp build
    model_path: str  # the file llama.cpp maps (a scratch copy for write-in-place)
    mechanism: str
    prompt: str
    tokens: int
    threads: int
    warmup_tokens: int = 1  # generated tokens before the measured window: residency is checked
    # on the prompt and on these only
    mlock_non_expert: bool = False
    log_experts: bool = True
    mechanism_options: dict = field(default_factory=dict)
    cgroup_io_stat: str | None = None  # the run cgroup's block-I/O counter file
    evict_after_load: bool = False
    # how the routing hook answers the scheduler's "ask": "native" (harness/build/hook.c, only wanted
    # nodes reach Python), "python" (every node asks Python), "off" (no hook: the bare decode,
    # for measuring the hook's cost; no routing is observed)
    hook: str = "native"
    hook_lib: str | None = None  # the built hook.c (the build manifest's hook_lib)
    # switch the hook off for every other generated token (tokens.csv hook_on): what the hook
    # costs, measured within one process; such a run's routing records have gaps
    hook_ab: bool = False
    # where the per-token attribution's counters are (harness.box.counters.CounterFiles as a dict)
    counters: dict = field(default_factory=dict)
    # True: after the load (and the mechanism's and context's setup), write out_dir/LOADED and
    # wait for out_dir/THROTTLED before the prompt: the supervisor applies the disk throttle
    # between the two, so the load reads unthrottled and every decode is throttled
    throttle_gate: bool = False

    def write(self, path: Path) -> None:
        Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=2))

    @classmethod
    def read(cls, path: Path) -> WorkerParams:
        data = json.loads(Path(path).read_text())
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{path}: unknown worker parameters {sorted(unknown)}")
        return cls(**data)
