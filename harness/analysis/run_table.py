"""The runs table (runs.csv): one row per run record. Each column is declared once, below, with
its unit, what it means, where it comes from and how its value is computed from the run; the row,
the table's column order and docs/run-record.md's runs.csv section all come from RUN_COLUMNS.
A new column is one `Column(...)` line here (and `python -m harness.docs`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable

import pandas as pd

from harness import parameters, profile_keys
from harness.analysis import attribution, flags, window
from harness.analysis.configurations import configuration_ids
from harness.record import RunRecord, read_run

NAN = float("nan")


class Run:
    """One run record with its tokens.csv (and mechanism.csv), read once: what every column's
    value is computed from."""

    def __init__(self, record_path):
        self.path = Path(record_path)
        self.rec: RunRecord = read_run(self.path)
        self.spec = self.rec.spec
        self.warmup = self.spec.warmup_tokens
        self.tok = pd.read_csv(self.path.parent / "tokens.csv")
        self.gen = self.tok[self.tok.phase == "gen"]
        self.later = self.tok[self.tok.phase == "later"]  # past the window: in no figure

    def per(self, col: str) -> float:
        """Per generated token, the first included (nan: not recorded)."""
        return window.per_token(self.gen, col)

    def moment(self, name: str):
        return self.rec.summary.moment(name)

    @cached_property
    def drift(self):
        return window.window_drift(self.gen, self.warmup)

    @cached_property
    def attribution(self) -> dict:
        return attribution.run_attribution(self.gen, self.warmup)

    @cached_property
    def missing(self) -> tuple[float, float]:
        return window.missing(self.gen)

    @cached_property
    def lookahead(self) -> dict:
        return lookahead_quality(self.path.parent / "mechanism.csv")


@dataclass(frozen=True)
class Column:
    name: str
    unit: str
    doc: str
    source: str  # where the value comes from: run.json, tokens.csv, mechanism.csv, or analysis
    value: Callable[[Run], object] | None = None  # None: runs_table adds it from the whole table


# per steady token: the measured window's tokens (after the run's warmup_tokens)
_STEADY = "tokens.csv, measured window"
# per generated token: every generated token, the first included
_GEN = "tokens.csv, generated tokens"


def _per(col: str) -> Callable[[Run], float]:
    return lambda r: r.per(col)


def _counted(col: str) -> Callable[[Run], float]:
    return lambda r: window.counted_per_token(r.gen, col)


def _load_read_bytes(r: Run):
    before, after = r.moment("before_load"), r.moment("after_load")
    return after.cgroup_read_bytes - before.cgroup_read_bytes if before and after else None


def _read_amplification(r: Run) -> float:
    cg, routed = window.counted_per_token(r.gen, "cgroup_read_bytes"), r.per("bytes_routed")
    return cg / routed if cg == cg and routed > 0 else NAN


def _window_over_later(r: Run) -> float:
    later = window.decode_rate(r.later)
    return window.steady_rate(r.gen, r.warmup) / later if later > 0 else NAN


def _decode_start_residency(r: Run):
    m = r.moment("before_first_decode")
    return m.residency if m else None


def _decode_read(r: Run) -> float:
    tok, n = r.tok[r.tok.phase != "later"], len(r.gen)
    ok = "cgroup_read_bytes" in tok and n and (tok.cgroup_read_bytes >= 0).all()
    return float(tok.cgroup_read_bytes.sum()) / n if ok else NAN


def _damon_applied(r: Run):
    d = r.rec.damon_applied
    return sum(v.get("sz_applied", 0) for v in d.values()) if d else None


_PARTS = (("user", "user CPU"), ("kernel", "kernel CPU"), ("throttled", "throttled by the quota"),
          ("runqueue", "runnable, waiting for a CPU"), ("io_wait", "stalled on block I/O"),
          ("hook", "the routing hook"), ("sync", "asleep at a barrier while other threads ran"),
          ("unexplained", "what no part explains"), ("disk_busy", "the device busy"))


def _attributed(name: str, unit: str, doc: str) -> Column:
    return Column(name, unit, doc, _STEADY, lambda r: r.attribution[name])


def _lookahead(name: str, unit: str, doc: str) -> Column:
    return Column(name, unit, doc, "mechanism.csv", lambda r: r.lookahead[name])


RUN_COLUMNS: tuple[Column, ...] = (
    Column("run_id", "", "the configuration's id", "run.json", lambda r: r.rec.run_id),
    Column("repeat", "count", "which repeat (1-based)", "run.json spec", lambda r: r.spec.repeat),
    Column("entry", "", "the experiment entry it expands from", "run.json spec",
           lambda r: r.spec.entry),
    Column("rerun", "", "a disturbed repeat measured once more at the end of the study",
           "run.json spec", lambda r: r.spec.rerun),
    Column("profile", "", "the machine profile (regime) measured under", "run.json spec",
           lambda r: r.spec.profile),
    Column("quant", "", "the model's quantization type", "run.json model",
           lambda r: r.rec.model.quant),
    Column("synthetic", "", "the model has random weights with the original's shapes",
           "run.json model", lambda r: r.rec.model.synthetic),
    # every run parameter, as the record holds it (`auto` resolved)
    *(Column(p.name, p.unit, p.doc, "run.json spec", lambda r, n=p.name: getattr(r.spec, n))
      for p in parameters.PARAMETERS),
    Column("status", "", "`ok`, `killed: memory`, `killed: time` or `failed`", "run.json",
           lambda r: r.rec.status),
    Column("tokens_completed", "tokens", "generated tokens decoded", "run.json",
           lambda r: r.rec.tokens_completed),
    Column("tok_per_s", "tok/s", "generated tokens over their decode time, the first included",
           _GEN, lambda r: window.decode_rate(r.gen)),
    Column("steady_tok_per_s", "tok/s", "the run's figure: the steady tokens over their decode "
           "time", _STEADY, lambda r: window.steady_rate(r.gen, r.warmup)),
    Column("mean_median_gap", "fraction", "|mean / median - 1| of the steady tokens' times",
           _STEADY, lambda r: window.mean_median_gap(r.gen, r.warmup)),
    Column("warmup_tok_per_s", "tok/s", "the warm-up's rate: the generated tokens before the "
           "window, the first left out", "tokens.csv, warm-up tokens",
           lambda r: window.warmup_rate(r.gen, r.warmup)),
    Column("window_drift", "fraction", "the fitted change across the window of time per byte "
           "read (per-token time where a token read nothing), over its mean "
           "(harness.analysis.steady.drift)", _STEADY, lambda r: r.drift.change),
    Column("window_drift_low", "fraction", "its 90% interval's low end", _STEADY,
           lambda r: r.drift.low),
    Column("window_drift_high", "fraction", "its high end", _STEADY, lambda r: r.drift.high),
    Column("window_steady", "", "false: the drift's whole 90% interval is beyond +-15%; the "
           "repeat is flagged like a disturbed one", _STEADY, lambda r: r.drift.steady),
    Column("window_drift_detectable", "fraction", "the smallest drift across the window the "
           "check flags with 80% probability at this window's own noise (its stated power; "
           "harness.analysis.steady.Drift.detectable)", _STEADY, lambda r: r.drift.detectable),
    Column("window_drift_power", "fraction", "the probability that the check flags a 10% drift "
           "across this window at its own noise (harness.analysis.steady.Drift.power)", _STEADY,
           lambda r: r.drift.power()),
    Column("run_wall_s", "s", "the measured process's wall time, load included", "run.json",
           lambda r: r.rec.wall_s),
    Column("load_s", "s", "the model load's wall time", "run.json summary",
           lambda r: r.rec.summary.load_s),
    Column("prompt_tok_per_s", "tok/s", "the prompt's batched decode", "tokens.csv, prompt",
           lambda r: window.prompt_rate(r.tok)),
    Column("later_tok_per_s", "tok/s", "the tokens decoded past the window (the first repeat's "
           "`later_tokens`; empty: none)", "tokens.csv, later tokens",
           lambda r: window.decode_rate(r.later)),
    Column("window_over_later", "x", "the window's rate over the later tokens' (above 1: slower "
           "after the window)", "tokens.csv", _window_over_later),
    Column("majflt_per_token", "count", "major page faults", _GEN, _per("majflt")),
    Column("bytes_prefetched_per_token", "bytes", "bytes the mechanism's syscalls returned", _GEN,
           _per("bytes_prefetched")),
    Column("bytes_routed_per_token", "bytes", "bytes of the routed experts' slabs", _GEN,
           _per("bytes_routed")),
    Column("disk_read_bytes_per_token", "bytes", "the process's read bytes (/proc/self/io)", _GEN,
           _per("disk_read_bytes")),
    Column("pread_s_per_token", "s", "time in the mechanism's pread calls", _GEN, _per("pread_s")),
    Column("madvise_s_per_token", "s", "time in its madvise calls", _GEN, _per("madvise_s")),
    Column("other_prefetch_s_per_token", "s", "time in its other work", _GEN,
           _per("other_prefetch_s")),
    Column("wall_s_per_token", "s", "decode wall time", _GEN, _per("wall_s")),
    Column("peak_rss_bytes", "bytes", "the largest resident set size after a decode",
           "tokens.csv", lambda r: int(r.tok.rss_bytes.max()) if len(r.tok) else None),
    Column("peak_cgroup_bytes", "bytes", "the run cgroup's peak memory", "run.json",
           lambda r: r.rec.peak_cgroup_bytes),
    Column("byte_accounting_ok", "", "prefetched bytes equal routed bytes in every layer (empty: "
           "the mechanism does not prefetch)", "run.json summary",
           lambda r: r.rec.summary.byte_accounting_ok),
    Column("residency_at_start", "fraction", "share of the model cached when the process "
           "started", "run.json", lambda r: r.rec.residency_at_start),
    Column("machine_cpus", "count", "the machine's CPUs (what CPU steal is a share of)",
           "run.json machine", lambda r: r.rec.machine_cpus),
    # every table and verdict that uses an unenforced run says so
    Column("limits_enforced", "", "false: the profile's limits could not be applied and the run "
           "went on without them (profile.allow_unenforced)", "run.json limits_in_force",
           lambda r: r.rec.limits_enforced),
    # each profile limit with a column (harness.profile_keys): the value in force, empty for none
    *(Column(k.column, k.unit, f"the profile's `{k.name}` as the kernel held the run to it "
             "(empty: none)", "run.json limits_in_force", lambda r, k=k: r.rec.limit(k.limit))
      for k in profile_keys.LIMITS if k.column),
    Column("fadvise", "", "the posix_fadvise advice llama.cpp gives the model file",
           "run.json build", lambda r: ",".join(r.rec.file_advice) or None),
    Column("cache_capacity_bytes", "bytes", "odirect-cache: the bytes its cache could hold",
           "run.json summary", lambda r: r.rec.summary.cache_capacity_bytes),
    Column("bytes_warm_start", "bytes", "odirect-cache: slabs copied in from the page cache "
           "before the first token", "run.json summary", lambda r: r.rec.summary.bytes_warm_start),
    Column("residency_decode_start", "fraction", "share of the model file in the page cache when "
           "decoding began", "run.json summary",
           _decode_start_residency),
    Column("load_read_bytes", "bytes", "what the run's cgroup read during the model's load",
           "run.json summary", _load_read_bytes),
    Column("first_token_s", "s", "the first generated token's decode time", _GEN,
           lambda r: float(r.gen.wall_s.iloc[0]) if len(r.gen) else NAN),
    Column("cgroup_read_bytes_per_token", "bytes", "the run cgroup's disk reads", _GEN,
           _counted("cgroup_read_bytes")),
    Column("read_amplification", "x", "bytes the disk delivered per routed expert byte", _GEN,
           _read_amplification),
    Column("dirtied_bytes_per_token", "bytes", "bytes the process dirtied", _GEN,
           _per("dirtied_bytes")),
    # over the tokens residency was measured on (the warm-up: none runs in the window)
    Column("bytes_missing_per_token", "bytes", "routed bytes not resident before each layer's "
           "prefetch", _GEN, lambda r: r.missing[0]),
    Column("kernel_read_vs_missing", "x", "the cgroup's reads over the missing routed bytes (1.0: "
           "the kernel read nothing more)", _GEN, lambda r: r.missing[1]),
    # over the measured window, like the figure they are a share of: the warm-up's hook also runs
    # the residency checks, which no window token pays
    Column("hook_s_per_token", "s", "the routing hook's own time per window token (the warm-up's "
           "residency checks are not in it)", _STEADY,
           lambda r: window.window_mean(r.gen, "hook_s", r.warmup)),
    Column("mechanism_s_per_token", "s", "time in the mechanism's own calls per window token",
           _STEADY, lambda r: window.window_mean(r.gen, "mechanism_s", r.warmup)),
    Column("cgroup_write_bytes_per_token", "bytes", "the run cgroup's disk writes", _GEN,
           _per("cgroup_write_bytes")),
    Column("device_read_bytes", "bytes", "the device's reads during the run (other processes "
           "included)", "run.json box", lambda r: r.rec.device_read_bytes),
    Column("device_write_bytes", "bytes", "the device's writes during the run", "run.json box",
           lambda r: r.rec.device_write_bytes),
    Column("foreign_read_bytes", "bytes", "what the rest of the machine read from the same disk "
           "during the run", "run.json box",
           lambda r: flags.foreign_read(r.rec.device_read_bytes, r.rec.cgroup_read_bytes)),
    Column("cpu_steal_s", "s", "CPU time the host stole during the run, over all CPUs",
           "run.json box", lambda r: r.rec.cpu_steal_s),
    Column("damon_pageout_bytes", "bytes", "what the host's DAMON paged out during the run",
           "run.json box", lambda r: (r.rec.damon_applied.get("pageout") or {}).get("sz_applied")),
    Column("damon_applied_bytes", "bytes", "what every DAMON scheme applied to during the run",
           "run.json box", _damon_applied),
    Column("decode_read_bytes_per_token", "bytes", "the cgroup's reads from the first decode on "
           "(the prompt's included), per generated token", "tokens.csv", _decode_read),
    Column("window_read_bytes_per_token", "bytes", "the run cgroup's disk reads per token of the "
           "measured window: what the window's floor bounds", _STEADY,
           lambda r: window.window_read(r.gen, r.warmup)),
    Column("prompt_tokens", "tokens", "the prompt's tokens (the first generated token's position "
           "in the routing trace)", "tokens.csv, prompt",
           lambda r: int(r.tok[r.tok.phase == "prompt"].n_tokens.sum())),
    Column("harness_s_per_token", "s", "the harness's own work between two decodes", _GEN,
           _per("harness_s")),
    *(_attributed(f"{part}_share", "fraction", f"{what}, as a share of the mean steady token")
      for part, what in _PARTS),
    _attributed("identity_ok_share", "fraction", "steady tokens whose parts explain their wall "
                "time within 10%"),
    _attributed("throttled_period_share", "fraction", "CFS periods the cgroup was throttled in"),
    _attributed("cg_user_s_per_token", "CPU-s", "the run cgroup's user CPU over all threads"),
    _attributed("cg_sys_s_per_token", "CPU-s", "its system CPU"),
    _attributed("between_share", "fraction", "the harness's work between decodes, beside the "
                "mean steady token"),
    _attributed("regime", "", "`disk-bound`, `CPU-bound` or `mixed`, from the attribution"),
    _lookahead("lookahead_precision", "fraction", "predicted experts that were routed"),
    _lookahead("lookahead_recall", "fraction", "routed experts that were predicted"),
    _lookahead("lookahead_wasted_bytes_per_token", "bytes", "bytes read ahead for experts not "
               "routed"),
    _lookahead("lookahead_resident_share", "fraction", "of the bytes read ahead, the share "
               "already resident when their layer ran"),
    Column("start_utc", "", "when the measured process started (ISO 8601)", "run.json",
           lambda r: r.rec.start_utc),
    Column("end_utc", "", "when it ended", "run.json", lambda r: r.rec.end_utc),
    Column("record", "", "the run.json it comes from", "analysis", lambda r: str(r.path)),
    Column("configuration", "", "the configuration the run measures: runs of the same resolved "
           "spec are one, named by the first of their run ids "
           "(harness.analysis.configurations.configuration_ids)", "analysis"),
    Column("flag_reason", "", "why the machine disturbed this repeat (empty: it did not)",
           "analysis (harness.analysis.flags.flag_reason)"),
    Column("disturbed", "", "flagged: left out of the verdicts, never out of the tables",
           "analysis"),
)
RUN_FIELDS = [c.name for c in RUN_COLUMNS]
ROW_COLUMNS = tuple(c for c in RUN_COLUMNS if c.value is not None)


def lookahead_quality(path: Path) -> dict:
    """A lookahead run's prediction quality over its generated tokens (mechanism.csv)."""
    cols = {"lookahead_precision": NAN, "lookahead_recall": NAN,
            "lookahead_wasted_bytes_per_token": NAN, "lookahead_resident_share": NAN}
    if not path.exists():
        return cols
    m = pd.read_csv(path)
    gen = m[m.token >= 0]
    if gen.empty:
        return cols
    n_tok = gen.token.nunique()
    return {"lookahead_precision": float(gen.hits.sum() / gen.n_predicted.sum()),
            "lookahead_recall": float(gen.hits.sum() / gen.n_routed.sum()),
            "lookahead_wasted_bytes_per_token": float(gen.wasted_bytes.sum() / n_tok),
            "lookahead_resident_share": float(gen.predicted_resident_bytes.sum()
                                              / gen.predicted_bytes.sum())}


def run_row(record_path) -> dict:
    """runs.csv's row of one run record: every column with a value, in RUN_COLUMNS' order."""
    run = Run(record_path)
    return {c.name: c.value(run) for c in ROW_COLUMNS}


def runs_table(record_paths: list) -> pd.DataFrame:
    """One row per run record, with `configuration`, `flag_reason` and `disturbed` (left out of
    the verdicts)."""
    table = pd.DataFrame([run_row(Path(p)) for p in record_paths],
                         columns=[c.name for c in ROW_COLUMNS])
    table["configuration"] = configuration_ids(table)
    table["flag_reason"] = flags.flag_reason(table)
    table["disturbed"] = table.flag_reason != ""
    return table[RUN_FIELDS]


def disturbed_repeats(record_paths: list) -> list[dict]:
    """The repeats the machine disturbed (flags.flag_reason), first measurements only: a re-run
    is never re-run."""
    table = runs_table(record_paths)
    if table.empty:
        return []
    bad = table[table.disturbed & ~table.rerun]
    return [{"run_id": r.run_id, "repeat": int(r.repeat), "flag_reason": r.flag_reason}
            for r in bad.itertuples()]


def reference_section() -> list[str]:
    """docs/run-record.md's runs.csv section."""
    out = ["## runs.csv", "", "One row per run record (`results/final/runs.csv`, written by "
           "`harness.analysis.run_table.runs_table` from the columns declared in "
           "`harness.analysis.run_table.RUN_COLUMNS`). *Per token* columns average the generated "
           "tokens (the first included); *share* columns are of the mean token of the measured "
           "window (after the run's `warmup_tokens`). Empty cells: not recorded by that run (an "
           "older format, a mechanism that does not do it, or a counter the machine lacks).", "",
           "| column | unit | what | from |", "|---|---|---|---|"]
    return out + [f"| `{c.name}` | {c.unit} | {c.doc} | {c.source} |" for c in RUN_COLUMNS]
