"""Every run parameter, declared once: its name, type, unit, default, allowed values, which
mechanisms read it, whether an experiment may list values of it, and what it means.

Everything else that names a run parameter is derived from this registry: the config's
expansion and its checks (`harness.config`: the keys, the sweepable set, every bound),
`harness.config.RunSpec` and the record's `harness.record.Spec`, each mechanism's options and
their defaults (`harness.run.mechanisms.base.make`), the mapping of a run spec into the worker's
parameters (`harness.run.supervise`), the command line (`python -m harness`), runs.csv's columns,
and the generated files: the schema's parameter entries (workflow/schemas/parameters.schema.yaml),
config/README.md's key table and docs/run-record.md (`python -m harness.docs` writes them; a test
checks they are current). Adding a parameter touches this file, the mechanism that reads it, and
the generated files. It imports only the mechanism catalog (harness.catalog, a leaf): everything
may import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness import catalog


@dataclass(frozen=True)
class Parameter:
    name: str
    type: type  # bool, int, float or str
    default: object  # None: no default (the experiment must set it, or the profile gives it)
    doc: str
    unit: str = ""
    choices: tuple = ()  # allowed values, when a closed set
    minimum: float | None = None
    maximum: float | None = None
    sweepable: bool = True  # an experiment may list values (one run per combination)
    mechanisms: tuple[str, ...] = ()  # the mechanisms that read it; () = every run uses it
    worker: bool = False  # passed to the worker process as it is (contract.WorkerParams)
    cli: tuple[str, ...] = ()  # `python -m harness` flags; () = not on the command line
    cli_default: object = None  # the command line's default where it differs (no profile there)
    # the allowed values are a registry's, not a fixed set: "mechanisms" or "base mechanisms"
    choices_from: str = ""
    exclusive_minimum: bool = False  # the value must be above `minimum`, not equal to it
    max_length: int | None = None  # strings: at most this many characters
    required: bool = False  # every experiment must set it (no default, and none from the profile)
    # False: it does not change what a run measures (how often, how long it may take): a run's
    # Snakemake params and its configuration's identity leave it out, so raising it re-measures
    # nothing already measured
    measured: bool = True

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


# values a parameter had under another name in older records and runs tables
# (format 2 and earlier wrote libgomp's own wait policy as `default`)
RENAMED_VALUES: dict[str, dict[str, str]] = {"omp_wait_policy": {"default": "libgomp"}}


def current_value(name: str, value):
    """A parameter's value under its current name (an older record's name converted)."""
    return RENAMED_VALUES.get(name, {}).get(value, value) if isinstance(value, str) else value


PARAMETERS: tuple[Parameter, ...] = (
    Parameter("model", str, None, "a model name of `models:`", required=True),
    Parameter("mechanism", str, None, "the prefetch mechanism (harness/catalog.py)",
              choices_from="mechanisms", required=True, worker=True, cli=("--mechanism",),
              cli_default="pread+madvise"),
    Parameter("mlock_non_expert", bool, False, "mlock every non-expert tensor at start",
              worker=True, cli=("--mlock-non-expert",)),
    Parameter("log_experts", bool, True,
              "per-activation logging (the original `-q` is `false`)", worker=True,
              cli=("-q", "--no-expert-log")),
    Parameter("threads", int, None, "decode threads (default: the profile's)", minimum=1,
              worker=True, cli=("-t", "--threads"), cli_default=2),
    # the bounds below refuse what would take hours or not fit a context: more often a typo
    # than a plan
    Parameter("prompt", str, "The history of the Roman Empire begins with", "seed prompt",
              sweepable=False, worker=True, cli=("-p", "--prompt"), max_length=4000),
    Parameter("tokens", int, 32, "tokens generated per run", unit="tokens", minimum=1,
              maximum=2048, worker=True, cli=("-n", "--tokens")),
    Parameter("warmup_tokens", int, 1, "generated tokens left out of the run's figure before "
              "its measured window, the first one (and its start-up work) among them; the window "
              "is the rest of `tokens` (docs/benchmarks.md, Settling)", unit="tokens", minimum=1,
              maximum=1024, worker=True, cli=("--warmup-tokens",)),
    Parameter("later_tokens", int, 0, "tokens the first repeat of a configuration decodes past "
              "its measured window (tokens.csv phase `later`), outside every figure: they show "
              "whether the window's rate held after it (runs.csv `later_tok_per_s`, "
              "`window_over_later`; RESULTS.md, The window against the tokens after it). Other "
              "repeats and re-runs decode none, and the record says so", unit="tokens",
              minimum=0, maximum=256, sweepable=False, worker=True, cli=("--later-tokens",),
              measured=False),
    Parameter("repeats", int, 3, "fresh-process repeats after a cold start, interleaved across "
              "entries", minimum=1, maximum=20, sweepable=False, measured=False),
    Parameter("time_limit_s", float, 1800, "per-run wall limit; a run past it is recorded as "
              "`killed: time`", unit="s", minimum=0, exclusive_minimum=True, maximum=6 * 3600,
              sweepable=False, cli=("--time-limit",), measured=False),
    Parameter("omp_wait_policy", str, "auto",
              "how llama.cpp's idle OpenMP threads wait at a barrier: `passive` (sleep at once), "
              "`libgomp` (libgomp's own default: spin a while, then sleep), `active` (spin), or "
              "`auto`: passive when the run has a CPU quota, libgomp's own when it has none; the "
              "worker's `OMP_WAIT_POLICY`, and llama-bench's in the ceilings. The record holds "
              "the policy `auto` chose. Under a quota a spinning thread spends the quota the "
              "kernel's reads need (finding 12, reference/vm-2026-12-04c); with the CPUs to "
              "itself a sleeping thread is slow to wake at every barrier (docs/benchmarks.md)",
              choices=("auto", "passive", "libgomp", "active"), cli=("--omp-wait-policy",)),
    Parameter("evict_after_load", bool, False,
              "page the expert tensors out after the load (`MADV_PAGEOUT`, `FADV_DONTNEED`) so "
              "decoding starts with no expert cached; off = what llama.cpp's populating load "
              "leaves (the study's case)", worker=True, cli=("--evict-after-load",)),
    Parameter("lru_budget_mb", int, 0, "lru-odirect: the expert cache's budget", unit="MiB",
              minimum=0, maximum=64 * 1024, mechanisms=("lru-odirect",), cli=("--lru-budget-mb",)),
    Parameter("prefetch_threads", int, 1, "threadpool: worker threads", minimum=1,
              mechanisms=("threadpool",), cli=("--prefetch-threads",)),
    Parameter("writeback", str, "kernel",
              "write-in-place: `kernel` (the study's: the flusher threads write the dirty pages, "
              "on cgroup v1 outside the run's throttle) or `sync` (the run starts each layer's "
              "writeback itself with `sync_file_range`, so the writes share its throttled disk)",
              choices=("kernel", "sync"), mechanisms=("write-in-place",), cli=("--writeback",)),
    Parameter("willneed_after_pread", bool, True,
              "pread+madvise: advise `MADV_WILLNEED` on each slab's mapped range after its pread "
              "(the study's design); off: the pread alone warms the page cache",
              mechanisms=("pread+madvise",), cli=("--no-willneed-after-pread",)),
    Parameter("cache_budget_mb", int, 900, "odirect-cache: the slabs its anonymous memory may "
              "hold beyond the layer being computed", unit="MiB", minimum=0,
              mechanisms=("odirect-cache",), cli=("--cache-budget-mb",)),
    Parameter("cache_policy", str, "lru", "odirect-cache: which slabs make room: `lru` (least "
              "recently routed) or `lfu` (least often routed since the start, counting slabs "
              "not cached too; ties least recent), the best online policy on this routing "
              "(RESULTS.md, What each cache policy would read)", choices=("lru", "lfu"),
              mechanisms=("odirect-cache",), cli=("--cache-policy",)),
    Parameter("cache_fill", bool, False, "odirect-cache: the cache holds what the run's memory "
              "limit leaves at its first decode (the limit less the non-expert tensors, the "
              "process's anonymous memory and `cache_fill_margin_mb`) instead of `cache_budget_mb` "
              "(which stands for a run without a memory limit); the record says how much "
              "(`cache_capacity_bytes`)",
              mechanisms=("odirect-cache",), cli=("--cache-fill",)),
    Parameter("cache_fill_margin_mb", int, 64, "odirect-cache with `cache_fill`: what the cache "
              "leaves of the memory limit for what may still grow beside it (the hook's buffers, "
              "Python's heap); too small and the run is killed for memory", unit="MiB",
              minimum=16, maximum=4096, mechanisms=("odirect-cache",),
              cli=("--cache-fill-margin-mb",)),
    Parameter("io_depth", int, 4, "odirect-cache: O_DIRECT reads in flight at once (reader "
              "threads)", minimum=1, maximum=64, mechanisms=("odirect-cache",),
              cli=("--io-depth",)),
    Parameter("warm_start", bool, True, "odirect-cache: before the first token, copy the "
              "slabs the model's load left in the page cache into the cache (up to its budget) "
              "instead of starting it empty", mechanisms=("odirect-cache",),
              cli=("--no-warm-start",)),
    Parameter("predict_experts", int, 8, "odirect-cache: experts of the next layer predicted "
              "from this layer's `ffn_norm` output and read in the background (0: none)",
              minimum=0, mechanisms=("odirect-cache",), cli=("--predict-experts",)),
    Parameter("lookahead_base", str, "madvise",
              "lookahead: the mechanism that makes each layer's routed slabs resident",
              choices_from="base mechanisms", mechanisms=("lookahead",), cli=("--lookahead-base",)),
    Parameter("lookahead_experts", int, 8, "lookahead: experts predicted per layer ahead",
              minimum=1, mechanisms=("lookahead",), cli=("--lookahead-experts",)),
    Parameter("lookahead_layers", int, 1, "lookahead: how many layers ahead to predict",
              minimum=1, maximum=2, mechanisms=("lookahead",), cli=("--lookahead-layers",)),
    Parameter("lookahead_call", str, "madvise",
              "lookahead: the read-ahead call for predicted slabs (`MADV_WILLNEED`, "
              "`POSIX_FADV_WILLNEED`, `readahead(2)`)", choices=("madvise", "fadvise", "readahead"),
              mechanisms=("lookahead",), cli=("--lookahead-call",)),
    Parameter("lookahead_source", str, "ffn_norm",
              "lookahead: the hidden state the next layer's router is applied to (`ffn_norm`, the "
              "router input of the layer, or `l_out`, its output)", choices=("ffn_norm", "l_out"),
              mechanisms=("lookahead",), cli=("--lookahead-source",)),
)
BY_NAME = {p.name: p for p in PARAMETERS}
RUN_KEYS = tuple(BY_NAME)
SWEEPABLE = tuple(p.name for p in PARAMETERS if p.sweepable)
# the values of keys only some mechanisms read, when an experiment leaves them out
MECHANISM_DEFAULTS = {p.name: p.default for p in PARAMETERS if p.mechanisms}
WORKER_KEYS = tuple(p.name for p in PARAMETERS if p.worker)
NOT_MEASURED = tuple(p.name for p in PARAMETERS if not p.measured)


def options_of(mechanism: str) -> tuple[str, ...]:
    """The run-spec keys a mechanism takes (its constructor's keyword arguments)."""
    return tuple(p.name for p in PARAMETERS if mechanism in p.mechanisms)


def option_defaults(mechanism: str) -> dict:
    """A mechanism's options with their declared defaults (what `make` fills in)."""
    return {p.name: p.default for p in PARAMETERS if mechanism in p.mechanisms}


def choices(p: Parameter) -> tuple:
    """The values `p` allows: its own closed set, or a registry's (the mechanisms, or those a
    lookahead can wrap); () for any value of its type."""
    if not p.choices_from:
        return p.choices
    return {"mechanisms": catalog.NAMES,
            "base mechanisms": catalog.base_mechanisms()}[p.choices_from]


def _is(value, kind: type) -> bool:
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def problem(p: Parameter, value) -> str:
    """Why `value` is not a valid value of `p` ("" when it is): its type, bounds and allowed
    values, as the schema states them, in the words a config error uses."""
    if not _is(value, p.type):
        return f"{value!r} is not a {p.type.__name__}"
    allowed = choices(p)
    if allowed and value not in allowed:
        among = f"the {p.choices_from}: " if p.choices_from else ""
        return f"{value!r} is not one of {among}{', '.join(map(str, allowed))}"
    if p.minimum is not None and (value <= p.minimum if p.exclusive_minimum else value < p.minimum):
        return f"{value!r} must be {'over' if p.exclusive_minimum else 'at least'} {p.minimum}"
    if p.maximum is not None and value > p.maximum:
        return (f"{value!r} is over the bound of {p.maximum} (a run that long, or that large, is "
                "a typo more often than a plan)")
    if p.max_length is not None and len(value) > p.max_length:
        return f"{len(value)} characters, over the bound of {p.max_length}"
    return ""


def _yaml(v) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def markdown_table() -> str:
    """config/README.md's table of experiment keys (generated: `python -m harness.docs`)."""
    rows = ["| key | type | default | read by | meaning |", "|---|---|---|---|---|"]
    for p in PARAMETERS:
        default = "-" if p.default is None else f"`{_yaml(p.default)}`"
        kind = p.type.__name__
        if p.minimum is not None:
            low = ">" if p.exclusive_minimum else ">="
            kind += f" {low} {_yaml(p.minimum)}" if p.maximum is None else \
                f" {_yaml(p.minimum)}-{_yaml(p.maximum)}"
        if p.max_length is not None:
            kind += f", at most {p.max_length} characters"
        kind += f" ({p.unit})" if p.unit else ""
        if p.choices:
            kind += ": " + ", ".join(f"`{c}`" for c in p.choices)
        elif p.choices_from:
            kind += f": one of the {p.choices_from}"
        users = ", ".join(f"`{m}`" for m in p.mechanisms) or "every run"
        listed = "" if p.sweepable else " One value, never a list."
        rows.append(f"| `{p.name}` | {kind} | {default} | {users} | {p.doc}.{listed} |")
    return "\n".join(rows) + "\n"


SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def value_schema(p: Parameter) -> dict:
    """The JSON schema of one value of `p`: type, bounds, allowed values. A string's length
    bound is left to harness.config's check, whose message does not echo a long value back."""
    out: dict = {"type": JSON_TYPES[p.type]}
    if p.minimum is not None:
        out["exclusiveMinimum" if p.exclusive_minimum else "minimum"] = p.minimum
    if p.maximum is not None:
        out["maximum"] = p.maximum
    if choices(p):
        out["enum"] = list(choices(p))
    return out


def _entry(p: Parameter) -> dict:
    """An experiment's entry for `p`. A sweepable one is a value or a list of values: the bounds
    stand beside the type (JSON schema applies them to numbers only) so that a bad value is
    named as it is, and an allowed set is on the items (harness.config names a bad single value)."""
    one = value_schema(p)
    doc = p.doc + (f" (at most {p.max_length} characters)" if p.max_length else "")
    if not p.sweepable:
        return {**one, "description": doc}
    bounds = {k: v for k, v in one.items() if k not in ("type", "enum")}
    return {"type": [one["type"], "array"], **bounds, "items": one, "description": doc}


# an experiment's key that is not a run parameter: the regimes it runs in
PROFILES_KEY = "profiles"
PROFILES_ENTRY = {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"type": "string"},
                  "description": "the profiles (regimes) this experiment runs under, of the "
                                 "study's `profile:`; unset, every one"}


def schema() -> dict:
    """The config schema's parameter entries (workflow/schemas/parameters.schema.yaml, which
    config.schema.yaml refers to): `defaults` (each parameter with a default, and its default)
    and one experiment entry (every parameter; a sweepable one may be a list of values)."""
    defaults = {p.name: {**value_schema(p), "default": p.default, "description": p.doc}
                for p in PARAMETERS if p.default is not None}
    return {"$schema": SCHEMA_DIALECT, "$defs": {
        "defaults": {"type": "object", "additionalProperties": False,
                     "description": "values every experiment inherits unless it sets its own",
                     "properties": defaults},
        # a profile's `run_defaults`: no defaults of their own (filled in, they would override
        # the study's `defaults:`)
        "profile_defaults": {"type": "object", "additionalProperties": False,
                             "description": "run parameters every run of this profile takes "
                                            "unless its experiment sets them: between the "
                                            "study's defaults and the experiment",
                             "properties": {p.name: {**value_schema(p), "description": p.doc}
                                            for p in PARAMETERS if not p.required}},
        "experiment": {"type": "object", "additionalProperties": False,
                       "required": [p.name for p in PARAMETERS if p.required],
                       "properties": {**{p.name: _entry(p) for p in PARAMETERS},
                                      PROFILES_KEY: PROFILES_ENTRY}}}}

