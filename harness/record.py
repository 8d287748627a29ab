"""The run record (`run.json`), the worker's summary inside it and the per-token row
(`tokens.csv`), each declared once with a unit and a sentence per field, and one pair of
functions that write and read a record (`write_run`, `read_run`).

`run.json` carries `format`: FORMAT_VERSION. A record without one is format 1 (every record
written before the format existed, the committed reference runs among them): `read_run`
converts it, filling what format 1 did not yet record with its "not recorded" value; format 2
wrote parameter values since renamed (harness.parameters.RENAMED_VALUES), which it renames;
format 3 did not yet say how the model was checked (always a full sha256). A record
of a newer format, or with a field this version does not know, is refused with a message that
names the versions. `python -m harness.docs` writes docs/run-record.md, the reference page of
every field (a test checks the page is current).

Nested parts the kernel or the host fill with a varying set of keys (the box's counters, the
machine facts, the build's file advice) stay dicts; what the analysis reads from them is a
property here, so no reader outside this module looks into a record's dicts.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from harness import parameters, profile_keys

FORMAT_VERSION = 4


def f(doc: str, unit: str = "", default=None, factory=None):
    """A documented field: its unit and what it is (docs/run-record.md)."""
    meta = {"doc": doc, "unit": unit}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _param(name: str):
    """A run parameter's field: its documentation, unit and default from harness.parameters."""
    p = parameters.BY_NAME[name]
    return f(p.doc, p.unit, default=p.default)


class RecordError(ValueError):
    pass


@dataclass(frozen=True)
class Moment:
    """The model file and the run's cgroup at one moment of the worker."""

    residency: float | None = f("share of the model file's pages in the page cache", "fraction")
    cgroup_read_bytes: int | None = f("bytes the run's cgroup had read from disk so far", "bytes")
    t_unix: float | None = f("when", "s since the epoch")


@dataclass(frozen=True)
class WorkerSummary:
    """What the measured process reports when it ends (empty for a run killed before)."""

    tokens_completed: int | None = f("generated tokens decoded", "tokens")
    later_tokens_completed: int | None = f("tokens decoded past the measured window (the first "
                                           "repeat's `later_tokens`)", "tokens")
    prompt_tokens: list = f("the prompt's token ids", "", factory=list)
    generated_tokens: list = f("the generated token ids (greedy)", "", factory=list)
    generated_text: str | None = f("the generated text")
    load_s: float | None = f("the model load's wall time", "s")
    model_moments: dict = f("`before_load`, `after_load`, `before_first_decode`: a Moment each",
                            "", factory=dict)
    mlocked_bytes: int | None = f("bytes of non-expert tensors mlocked", "bytes")
    mlocked_tensors: int | None = f("non-expert tensors mlocked", "count")
    hook: str | None = f("the routing hook's path: `native` (C), `python` or `off`")
    hook_nodes_asked: int | None = f("graph nodes the scheduler asked the C hook about", "count")
    hook_residency: str | None = f("how the C hook measured residency: `cachestat` or `mincore`")
    hook_residency_calls: int | None = f("residency calls the C hook made", "count")
    hook_nodes_passed: int | None = f("nodes the C hook passed to Python", "count")
    hook_calls: int | None = f("routing decisions the hook handled", "count")
    bytes_routed: int | None = f("routed expert bytes over the run", "bytes")
    bytes_prefetched: int | None = f("bytes the mechanism's syscalls returned", "bytes")
    byte_accounting_ok: bool | None = f("prefetched bytes equal routed bytes in every layer "
                                        "(null: the mechanism does not prefetch)")
    bytes_read_ahead: int | None = f("bytes a lookahead read ahead", "bytes")
    cache_capacity_bytes: int | None = f("the bytes odirect-cache's cache could hold (with "
                                         "cache_fill: measured from the memory limit at the "
                                         "first decode)", "bytes")
    bytes_warm_start: int | None = f("bytes odirect-cache copied from the page cache into its "
                                     "cache before the first token (warm_start)", "bytes")
    cache_hits: int | None = f("expert-cache hits (lru-odirect)", "count")
    cache_misses: int | None = f("expert-cache misses (lru-odirect)", "count")
    mapping: dict = f("the model's mapping: start, length, file offset", "", factory=dict)

    def moment(self, name: str) -> Moment | None:
        m = self.model_moments.get(name)
        return Moment(**m) if m else None


@dataclass(frozen=True)
class ModelRef:
    """The model file the run measured."""

    name: str | None = f("the model's name in the config")
    path: str | None = f("the file measured (on a cluster, the node-local copy)")
    sha256: str | None = f("its sha256, checked before the run")
    synthetic: bool | None = f("random weights with the original's shapes (not its numbers)")
    seed: int | None = f("the synthetic model's seed")
    quant: str | None = f("its quantization type, e.g. Q4_K_M")
    source: str | None = f("`synthetic`, `huggingface` or `path`")
    staged_from: str | None = f("the shared file a node-local copy was made from")


def _spec_fields() -> list[tuple]:
    """record.Spec's fields: the run's id and entry, every run parameter of harness.parameters
    (its unit, sentence and default from there), and what the supervisor adds."""
    params = [(p.name, p.type, _param(p.name)) for p in parameters.PARAMETERS]
    return [
        ("run_id", str, f("the configuration's id (`<entry>--<key>-<value>...[@<profile>]`)")),
        ("entry", str, f("the experiment entry it expands from")),
        *params,
        ("profile", str, f("the machine profile (regime) measured under", default="")),
        ("mechanism_options", dict, f("the options the mechanism was given", "", factory=dict)),
        ("repeat", int, f("which repeat (1-based)", "count", default=1)),
        ("rerun", bool, f("a disturbed repeat measured once more at the end of the study",
                          default=False)),
        ("warm", bool, f("started with the model cached instead of cold (benchmarks)",
                         default=False)),
        ("keep_cache", bool, f("with warm: a model already wholly cached was neither evicted nor "
                               "re-read before the run (benchmarks)", default=False)),
        ("hook", str, f("the routing hook's path asked for", default="native")),
        ("hook_ab", bool, f("hook off on every other generated token (benchmarks)", default=False)),
    ]


# The run's configuration: derived from harness.parameters, so a new run parameter is a field
# here (and a row of docs/run-record.md) without an edit.
Spec = dataclasses.make_dataclass(
    "Spec", _spec_fields(), frozen=True,
    namespace={"__doc__": "The run's configuration: the run parameters of harness.parameters, "
                          "and which repeat."})
Spec.__module__ = __name__  # pickling finds it here


def check_spec(spec: dict, where: str = "run spec") -> None:
    """Refuse a spec the record could not hold, before anything is measured: a key the record
    does not declare, or a run parameter missing."""
    known = {x.name for x in dataclasses.fields(Spec)}
    unknown = sorted(set(spec) - known)
    missing = [k for k in parameters.RUN_KEYS if k not in spec]
    if unknown or missing:
        raise RecordError(f"{where}: " + "; ".join(
            ([f"keys the run record does not declare: {', '.join(unknown)}"] if unknown else [])
            + ([f"run parameters missing: {', '.join(missing)}"] if missing else [])))


@dataclass(frozen=True)
class RunRecord:
    """One measured run: `results/runs/<run_id>/rep<k>/run.json`."""

    run_id: str = f("the configuration's id")
    spec: Spec = f("the run's configuration")
    status: str = f("`ok`, `killed: memory`, `killed: time` or `failed`")
    format: int = f("this record's format version", default=FORMAT_VERSION)
    start_utc: str | None = f("when the measured process started (ISO 8601)")
    end_utc: str | None = f("when it ended (ISO 8601)")
    wall_s: float | None = f("the measured process's wall time", "s")
    exit_code: int | None = f("its exit code (negative: the signal that killed it)")
    tokens_completed: int = f("generated tokens decoded", "tokens", default=0)
    residency_before: float | None = f("share of the model cached before the cold start",
                                       "fraction")
    residency_at_start: float | None = f("share cached when the process started (cold: ~0)",
                                         "fraction")
    residency_after: float | None = f("share cached when it ended", "fraction")
    scratch_copy: bool = f("measured on a scratch copy of the model (a mechanism that writes "
                           "into the weights)", default=False)
    peak_cgroup_bytes: int | None = f("the run cgroup's peak memory", "bytes")
    cgroup_io_bytes: dict = f("`read`, `write`: the run cgroup's disk bytes", "bytes",
                              factory=dict)
    cgroup_cpu_stat: dict = f("the run cgroup's cpu.stat at the end (throttling)", "",
                              factory=dict)
    box: dict = f("what the rest of the machine did during the run: transparent huge pages, "
                  "the scheduler, DAMON, counter deltas (CPU time by kind, the disk's bytes)",
                  "", factory=dict)
    summary: WorkerSummary = f("the worker's own summary", "", factory=WorkerSummary)
    limits_in_force: dict = f("the limits the kernel held the run to: "
                              + ", ".join(f"`{k.limit}`" + (f" ({k.unit})" if k.unit else "")
                                          for k in profile_keys.LIMITS)
                              + ", `device`, `cgroup`, and `error` when they could not be applied",
                              "", factory=dict)
    limits_requested: dict = f("the limits the profile asked for (the same keys) and the "
                               "time limit", "", factory=dict)
    model: ModelRef = f("the model file measured", "", factory=ModelRef)
    model_sha256_checked_before: str | None = f("the sha256 checked before the run")
    model_check: str | None = f("how the model's bytes were checked before the run: `sha256` "
                                "(read in full), `identity` (size, mtime and inode unchanged "
                                "since a full read matched), or empty (no sha256 recorded)",
                                default="sha256")
    model_unchanged: bool | None = f("the model's size and mtime were the same after the run")
    build: dict = f("the llama.cpp build: commit, patch sha256, CMake flags, cache key, the "
                    "file advice llama.cpp gives", "", factory=dict)
    machine: dict = f("hostname, CPU model, cores, RAM, kernel, Python, and the cluster job's "
                      "facts", "", factory=dict)
    attribution_sources: dict = f("which kernel counters the token attribution could read",
                                  "", factory=dict)

    # --- what the analysis reads from the dicts ---------------------------------------------
    @property
    def limits_enforced(self) -> bool:
        return not self.limits_in_force.get("error")

    def limit(self, name: str):
        """A limit in force (`ram_bytes`, `read_bps`, `write_bps`, `cpu_quota`,
        `read_ahead_kb`), None when none was."""
        return self.limits_in_force.get(name)

    @property
    def counters_delta(self) -> dict:
        return self.box.get("counters_delta") or {}

    @property
    def device_read_bytes(self) -> float | None:
        return (self.counters_delta.get("device") or {}).get("read_bytes")

    @property
    def device_write_bytes(self) -> float | None:
        return (self.counters_delta.get("device") or {}).get("write_bytes")

    @property
    def cgroup_read_bytes(self) -> int:
        """-1 when the cgroup's counter was not available."""
        v = self.cgroup_io_bytes.get("read")
        return -1 if v is None else v

    @property
    def machine_cpus(self) -> int | None:
        return self.machine.get("cores")

    @property
    def cpu_steal_s(self) -> float | None:
        return (self.counters_delta.get("cpu_s") or {}).get("steal")

    @property
    def damon_applied(self) -> dict:
        return self.box.get("damon_applied_during_run") or {}

    @property
    def damon_state(self) -> list:
        """The host's DAMON kdamonds, contexts and schemes at the run's end."""
        return self.box.get("damon") or []

    @property
    def thp(self) -> dict:
        """Transparent huge pages: `enabled`, `defrag`."""
        return self.box.get("thp") or {}

    @property
    def file_advice(self) -> list[str]:
        return list((self.build.get("file_advice") or {}).get("posix_fadvise", []))

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------


def _build(cls, data: dict, where: str):
    known = {x.name for x in dataclasses.fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise RecordError(f"{where}: fields this version (format {FORMAT_VERSION}) does not know: "
                          f"{', '.join(sorted(unknown))}")
    return cls(**data)


def from_dict(data: dict, where: str = "run record") -> RunRecord:
    """A record of the current format from its JSON object; older formats converted."""
    data = dict(data)
    version = data.pop("format", 1)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise RecordError(f"{where}: format {version!r} is newer than this version reads "
                          f"(formats 1 to {FORMAT_VERSION}): update moe-offload-bench")
    # format 1 -> 2: the same fields, fewer of them; what it did not record takes the field's
    # "not recorded" value (its default)
    spec = dict(data.pop("spec", {}))
    spec.setdefault("run_id", data.get("run_id"))
    # format 2 -> 3: parameter values renamed since (libgomp's wait policy was `default`), and a
    # default that changed: every run before format 3 that does not name its wait policy had
    # libgomp's (the parameter's default is `auto` now)
    spec = {k: parameters.current_value(k, v) for k, v in spec.items()}
    if version < 3:
        spec.setdefault("omp_wait_policy", "libgomp")
    # format 3 -> 4: model_check is new; every earlier run read the whole sha256 (its default)
    data["spec"] = _build(Spec, spec, f"{where}: spec")
    data["summary"] = _build(WorkerSummary, data.get("summary") or {}, f"{where}: summary")
    data["model"] = _build(ModelRef, data.get("model") or {}, f"{where}: model")
    for name in ("cgroup_io_bytes", "cgroup_cpu_stat", "box", "limits_in_force", "limits_requested",
                 "build", "machine", "attribution_sources"):
        if data.get(name) is None:
            data.pop(name, None)
    return _build(RunRecord, data, where)


def read_run(path) -> RunRecord:
    path = Path(path)
    return from_dict(json.loads(path.read_text()), str(path))


def write_run(path, record: RunRecord) -> None:
    """The record as JSON, written atomically (its presence means the run is complete)."""
    from harness.util import atomic_write_json

    atomic_write_json(Path(path), {**record.as_dict(), "format": FORMAT_VERSION})


# --- tokens.csv -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    name: str
    unit: str
    doc: str


# one row per llama_decode: the prompt's (index -1) and each generated token's, in this order
TOKEN_COLUMNS = (
    Column("index", "", "-1 for the prompt's batched decode, then 0, 1, ... per generated token"),
    Column("phase", "", "`prompt`, `gen`, or `later` (past the measured window: the first "
           "repeat's `later_tokens`)"),
    Column("n_tokens", "tokens", "tokens in the decode's batch"),
    Column("token_id", "", "the token sampled (greedy) after the decode"),
    Column("wall_s", "s", "the decode's wall time"),
    Column("majflt", "count", "major page faults of the process during the decode"),
    Column("minflt", "count", "minor page faults"),
    Column("pread_s", "s", "time in the mechanism's pread calls"),
    Column("madvise_s", "s", "time in its madvise calls"),
    Column("other_prefetch_s", "s", "time in its other work (populate, waits, cache upkeep)"),
    Column("bytes_prefetched", "bytes", "bytes its syscalls returned"),
    Column("bytes_routed", "bytes", "bytes of the routed experts' slabs"),
    Column("disk_read_bytes", "bytes", "the process's read bytes (/proc/self/io read_bytes)"),
    Column("cgroup_read_bytes", "bytes", "the run cgroup's disk read bytes (-1: unknown)"),
    Column("rss_bytes", "bytes", "resident set size after the decode"),
    Column("t_unix", "s since the epoch", "when the decode ended"),
    Column("dirtied_bytes", "bytes", "bytes the process dirtied (/proc/self/io)"),
    Column("cgroup_write_bytes", "bytes", "the run cgroup's disk write bytes"),
    Column("bytes_missing", "bytes", "routed bytes not resident before each layer's prefetch "
           "(-1: not measured: a token of the measured window, where no residency check runs)"),
    Column("bytes_missing_after", "bytes", "routed bytes still not resident after it (-1: not "
           "measured)"),
    Column("bytes_read", "bytes", "bytes the mechanism read itself"),
    Column("hook_s", "s", "the routing hook's own time (the mechanism's excluded)"),
    Column("mechanism_s", "s", "time in the mechanism's own calls: its per-layer work and, for "
           "lookahead, its prediction (apart from the hook's)"),
    Column("hook_on", "0/1", "the hook was on for this decode (an A/B run switches it)"),
    Column("harness_s", "s", "the harness's own work between two decodes (rows, checks, sampling)"),
    Column("thread_user_s", "s", "the decoding thread's user CPU (CLOCK_THREAD_CPUTIME_ID, split "
           "by RUSAGE_THREAD)"),
    Column("thread_sys_s", "s", "its kernel CPU"),
    Column("thread_delay_s", "s", "runnable but not running (schedstat run_delay): CPU-quota "
           "throttling and other processes"),
    Column("io_wait_s", "s", "a task of the run stalled on block I/O (the cgroup's io.pressure "
           "some)"),
    Column("sync_wait_s", "s", "asleep, not on I/O, while the process's other threads (the "
           "OpenMP team at a barrier, a mechanism's readers) ran or waited for a CPU (what the "
           "other parts leave, at most those threads' on-CPU plus run-queue time; -1: not "
           "measured)"),
    Column("unexplained_s", "s", "wall minus user, kernel, run-queue, I/O and sync wait"),
    Column("cg_user_s", "CPU-s", "the run cgroup's user CPU over all threads (cpuacct)"),
    Column("cg_sys_s", "CPU-s", "its system CPU"),
    Column("throttled_s", "s", "the cgroup's throttled time (cpu.stat, summed over CPUs)"),
    Column("nr_periods", "count", "CFS periods that elapsed"),
    Column("nr_throttled", "count", "of them, periods the cgroup was throttled in"),
    Column("io_full_s", "s", "all of the run's tasks stalled on I/O (io.pressure full)"),
    Column("mem_stall_s", "s", "a task stalled on memory (memory.pressure some)"),
    Column("cpu_stall_s", "s", "a task waited for a CPU (cpu.pressure some)"),
    Column("disk_busy_s", "s", "the device's busy time (io_ticks; other processes included)"),
    Column("device_read_bytes", "bytes", "the device's read bytes (other processes included)"),
    Column("identity_ok", "0/1", "the parts explain the wall time within 10% (-1: not checked)"),
)
TOKEN_FIELDS = [c.name for c in TOKEN_COLUMNS]


def measured_window(gen, warmup: int):
    """The generated-token rows (tokens.csv, phase `gen`) of a run's measured window: those after
    its `warmup` first ones (the run's warmup_tokens); a run that ended before its window keeps
    its last token. Every steady figure (tok/s, attribution, latency) is over these rows."""
    warmup = max(0, int(warmup))
    return gen.iloc[warmup:] if len(gen) > warmup else gen.iloc[-1:]


def reference_lines() -> list[str]:
    """docs/run-record.md's lines for every field of every record type, with its unit, and for
    tokens.csv's columns (harness.docs adds runs.csv's, which the analysis declares)."""
    out = ["# The run record: every field and its unit", "",
           "Generated by `python -m harness.docs` from `harness/record.py` (a test checks it "
           f"is current). `run.json` is format {FORMAT_VERSION}; `harness.record.read_run` reads "
           "it and converts formats 1 (records without `format`), 2 (parameter values since "
           "renamed: `omp_wait_policy` `default` is `libgomp`) and 3 (no `model_check`: a full "
           "sha256 before every run).", ""]
    for cls in (RunRecord, Spec, WorkerSummary, Moment, ModelRef):
        out += [f"## {cls.__name__}", "", (cls.__doc__ or "").strip(), "",
                "| field | type | unit | what |", "|---|---|---|---|"]
        for x in dataclasses.fields(cls):
            t = x.type if isinstance(x.type, str) else getattr(x.type, "__name__", str(x.type))
            out.append(f"| `{x.name}` | {t.replace('|', 'or')} | {x.metadata.get('unit', '')} | "
                       f"{x.metadata.get('doc', '')} |")
        out.append("")
    out += ["## tokens.csv", "", "One row per `llama_decode`.", "",
            "| column | unit | what |", "|---|---|---|"]
    out += [f"| `{c.name}` | {c.unit} | {c.doc} |" for c in TOKEN_COLUMNS]
    return out
