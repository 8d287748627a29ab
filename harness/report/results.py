"""RESULTS.md, its tables and plots, rendered from the run records.

Every number in RESULTS.md is printed from a CSV under tables/ (rounded there first, so the text
and the CSV hold the same digits), and every section names the CSV and the rule that made it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from types import SimpleNamespace
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from harness import parameters
from harness.analysis import metrics
from harness.run import attribution
from harness.report import captions, export
from harness.record import read_run
from harness.analysis import findings
from harness.report import plots
from harness.contract import Status

log = logging.getLogger(__name__)

STUDY = {
    "breakdown": "at the best configuration, pread 58% and compute 42% of the time per token; "
                 "madvise and logging under 0.2%",
}


def sig(x, digits: int = 4):
    """Round to `digits` significant digits (what both the CSV and RESULTS.md show)."""
    if x is None or isinstance(x, str | bool | np.bool_):
        return x
    try:
        xf = float(x)
    except (TypeError, ValueError):
        return x
    if math.isnan(xf) or xf == 0:
        return xf
    return float(f"{xf:.{digits}g}")


def rounded(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    for c in out.columns:
        if pd.api.types.is_float_dtype(out[c]):
            out[c] = out[c].map(sig)
    return out


def md_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):  # itertuples keeps each column's own type
        lines.append("| " + " | ".join("" if (isinstance(v, float) and math.isnan(v)) else str(v)
                                       for v in r) + " |")
    return "\n".join(lines)


class Writer:
    """RESULTS.md's parts and the tables and plots it links. In a study of several regimes each
    regime's tables and plots go under `<profile>/` (`prefix`), and the tables the comparison of
    machines reads (compare.TABLES) are also written whole, with a `profile` column."""

    def __init__(self, tables: Path, plots: Path):
        self.tables, self.plots = tables, plots
        tables.mkdir(parents=True, exist_ok=True)
        plots.mkdir(parents=True, exist_ok=True)
        self.parts: list[str] = []
        self.prefix = ""  # "<profile>/" inside a regime's section of a multi-regime study
        self.by_regime: dict[str, list[pd.DataFrame]] = {}
        # run ids measured without the profile's limits: every table naming one marks it
        self.unenforced: set[str] = set()

    def table(self, name: str, df: pd.DataFrame, rule: str) -> pd.DataFrame:
        if self.unenforced and "run_id" in df and "limits_enforced" not in df:
            df = df.assign(limits_enforced=~df.run_id.isin(self.unenforced))
        df = rounded(df)
        path = self.tables / f"{self.prefix}{name}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(path, index=False)
        if self.prefix:
            self.by_regime.setdefault(name, []).append(
                df.assign(profile=self.prefix.rstrip("/")))
        self.parts.append(md_table(df))
        self.parts.append(f"\n*Source: [tables/{self.prefix}{name}.csv](tables/{self.prefix}{name}.csv), "
                          f"rule `{rule}`.*\n")
        return df

    def write_whole(self, names) -> None:
        """The regimes' tables of these names, concatenated, at the top of tables/."""
        for name in names:
            if name in self.by_regime and not (self.tables / f"{name}.csv").exists():
                pd.concat(self.by_regime[name], ignore_index=True).to_csv(
                    self.tables / f"{name}.csv", index=False)

    def text(self, s: str) -> None:
        self.parts.append(s)

    def plot(self, name: str, fig, detail: str = "") -> None:
        """Save the figure under plots/ with its caption (harness.report.captions) below it."""
        caption = " ".join(filter(None, (captions.PLOTS[name], detail)))
        fig.tight_layout()
        path = self.plots / f"{self.prefix}{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        self.parts.append(f"![{name}](plots/{self.prefix}{name}.png)\n\n*{caption}*\n")


def write_findings(inputs, outputs, config: dict) -> None:
    """RESULTS.md with its tables and plots, section by section; in a study of several regimes
    (profiles), the sections from the ceilings to the findings once per regime, then every
    finding's verdicts side by side."""
    from harness.report.compare import TABLES
    from harness.config import study_profiles

    d = _load(inputs, config)
    w = Writer(Path(outputs.tables), Path(outputs.plots))
    if "limits_enforced" in d.all_runs:
        w.unenforced = set(d.all_runs.run_id[~d.all_runs.limits_enforced.astype(bool)])
    _header(w, d, inputs)
    _attribution_section(w, d)
    names = study_profiles(config)
    verdicts_by: dict[str, list[dict]] = {}
    for i, name in enumerate(names):
        sub, sub_inputs = _regime(d, inputs, name, i, several=len(names) > 1)
        if len(names) > 1:
            w.prefix = f"{name}/"
            w.text(f"# Regime: {name}\n")
            w.text(f"{config['profiles'][name].get('description', '')}\n")
        io_med, io_by_path, comp_t, moe_ceiling = _ceilings(w, sub, sub_inputs)
        summ = _configurations(w, sub, sub_inputs)
        _distance_section(w, summ, sub.all_runs, sub.layouts, io_by_path, moe_ceiling, sub.limits)
        verdicts_by[name] = _findings(w, sub, io_med, comp_t, moe_ceiling)
        _breakdown(w, sub.runs, summ)
    w.prefix = ""
    _closing(w, d, verdicts_by)
    w.write_whole(TABLES)
    out_md = Path(outputs.results)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text("\n".join(w.parts))
    log.info(f"wrote {out_md}")


def _regime(d: Loaded, inputs, name: str, i: int, several: bool):
    """One regime's runs, records and ceilings, as the single-regime sections read them (the
    rules name ceilings per profile, so even a one-profile study gets lists of one)."""
    if several:
        runs = d.all_runs[d.all_runs.profile == name]
        records = [r for r in d.records if r.spec.profile == name]
        d = dataclasses.replace(d, all_runs=runs, runs=d.runs[d.runs.profile == name],
                                records=records,
                                limits=records[0].limits_in_force if records else {})
    quota = getattr(inputs, "quota", None)
    return d, SimpleNamespace(
        runs=inputs.runs, layouts=inputs.layouts, infos=inputs.infos, records=inputs.records,
        io=inputs.io[i], compute=inputs.compute[i], quota=quota[i] if quota else None,
        baselines=[b for b in inputs.baselines if not several or f"/baselines/{name}/" in b])


@dataclass
class Loaded:
    """What every section reads: the runs (all, and the default length the findings compare), the
    models' metadata and layouts, the records, the configured pair of quants."""

    config: dict
    all_runs: pd.DataFrame
    runs: pd.DataFrame
    run_length: int
    layouts: dict
    infos: dict
    records: list
    machines: pd.DataFrame
    limits: dict
    any_synth: bool
    q4: str
    q2: str


def _load(inputs, config: dict) -> Loaded:
    all_runs = pd.read_csv(inputs.runs)
    # Speed findings compare runs of the length most runs have; a longer run (the routing trace)
    # feeds the routing findings and the table of every configuration, not the comparisons.
    run_length = int(all_runs.tokens.mode().iloc[0]) if len(all_runs) else 0
    layouts = {Path(p).name.removesuffix(".layout.json"): json.loads(Path(p).read_text())
               for p in inputs.layouts}
    infos = {Path(p).name.removesuffix(".json"): json.loads(Path(p).read_text()) for p in inputs.infos}
    records = [read_run(p) for p in inputs.records]
    # every distinct machine the records name (one, unless results from elsewhere were mixed in)
    machines = (pd.DataFrame([r.machine for r in records]).drop_duplicates() if records
                else pd.DataFrame([{}]))
    q4, q2 = _pair_models(config)
    if "disturbed" not in all_runs:  # runs.csv has carried it since format 2 of the run record
        all_runs["disturbed"] = metrics.disturbed(all_runs)
    for name in parameters.RENAMED_VALUES:  # a runs.csv written before a value was renamed
        if name in all_runs:
            all_runs[name] = all_runs[name].map(lambda v: parameters.current_value(name, v))
    # the findings judge only repeats nothing else disturbed (RESULTS.md lists the others)
    judged = all_runs[(all_runs.tokens == run_length) & ~all_runs.disturbed]
    return Loaded(config=config, all_runs=all_runs, runs=judged,
                  run_length=run_length, layouts=layouts, infos=infos, records=records,
                  machines=machines,
                  limits=records[0].limits_in_force if records else {},
                  any_synth=any(i.get("synthetic") for i in infos.values()), q4=q4, q2=q2)


def _header(w: Writer, d: Loaded, inputs) -> None:
    from harness.config import study_profiles

    config, limits, machines, layouts, infos = d.config, d.limits, d.machines, d.layouts, d.infos
    any_synth, all_runs, records = d.any_synth, d.all_runs, d.records
    w.text("# RESULTS\n")
    w.text("Generated by moe-offload-bench on the machine below, from real runs. "
           + ("**Every model here is synthetic**: the original's exact shapes, tensor layout and "
              "tokenizer with seeded random weights. Byte counts, I/O patterns and FLOPs are the "
              "original model's; routing, and so anything derived from which experts are chosen, is a "
              "random-weight model's, not OLMoE's.\n" if any_synth else "\n"))
    w.text("## Machine and limits (as measured)\n")
    w.table("machine", machines.assign(profile=", ".join(study_profiles(config)),
                                       ram_budget_bytes=limits.get("ram_bytes"),
                                       read_bps_limit=limits.get("read_bps"),
                                       write_bps_limit=limits.get("write_bps"),
                                       cpu_quota=limits.get("cpu_quota"),
                                       cgroup=limits.get("cgroup")), "harness_run")
    _box_section(w, all_runs, records, inputs)
    w.text("## Models\n")
    w.table("models", pd.DataFrame([{
        "model": k, "synthetic": v.get("synthetic"), "quant": v.get("quant"), "shape": v.get("shape"),
        "file_bytes": v.get("bytes"), "non_expert_bytes": layouts[k]["non_expert_bytes"],
        "bytes_per_token": layouts[k]["bytes_per_token"], "sha256": v.get("sha256", "")[:16]}
        for k, v in infos.items()]), "model, layout")


def _attribution_section(w: Writer, d: Loaded) -> None:
    """The figure a reader should look at first: where each configuration's token time goes."""
    t = attribution.per_configuration(d.all_runs)
    w.text("## Where a token's time goes\n")
    if t.empty:
        w.text("These runs were recorded without the per-token attribution.\n")
        return
    plots.attribution_plot(w, t)
    w.table("attribution", t, "runs_table")
    w.text(f"Parts of the decoding thread's wall time (`harness/run/attribution.py`): they explain a "
           f"token within 10% in {t.identity_ok_share.median():.0%} of tokens (median over "
           f"configurations). A run is disk-bound when I/O wait is at least "
           f"{attribution.BOUND_SHARE:.0%} of its mean steady token, CPU-bound when on-CPU time, "
           f"run-queue wait (the quota's throttling included) and sync wait (asleep at a barrier "
           f"while the other compute threads run or are throttled) are, mixed otherwise. "
           f"`between_s` (hatched): the harness's own work from the end of one decode to the "
           f"start of the next (the per-token counters, the row, the logits check, the expert "
           f"log), outside the decode's clock, so no tok/s includes it.\n")


def _ceilings(w: Writer, d: Loaded, inputs):
    io = pd.read_csv(inputs.io)
    compute = json.loads(Path(inputs.compute).read_text())
    w.text("## Ceilings\n")
    sequential, random = metrics.io_patterns(io)
    w.text("I/O: O_DIRECT sequential reads of the models' filesystem inside the profile's limits, "
           "with the CPU they cost (user and kernel, ms per MB read).\n")
    io_t = w.table("io_ceiling", sequential[[c for c in (
        "sample", "offset_bytes", "bytes", "mb_per_s", "cpu_ms_per_mb", "read_bps_limit")
        if c in sequential]], "io_ceiling")
    io_med = float(io_t.mb_per_s.median())
    if len(random):
        w.text("Reads as the mechanisms issue them: one expert slab of the MoE model at a time "
               "(`block_bytes`), at random slab-aligned offsets of a file evicted from the page "
               "cache, buffered and O_DIRECT, with `queue_depth` reads in flight (one thread "
               "each), inside the same limits; `cpu_ms_per_mb`: user and kernel CPU per MB read. "
               "The floor of a configuration reads at the fastest rate its read path reached "
               "here (O_DIRECT: the sequential samples too; faults: any sample).\n")
        w.table("io_random_reads", random[["sample", "access", "queue_depth", "block_bytes",
                                           "bytes", "mb_per_s", "cpu_ms_per_mb", "read_bps_limit",
                                           "cpu_quota"]], "io_ceiling")
    io_by_path = metrics.read_path_io_ceilings(io, d.limits.get("read_bps"))
    moe_row = "MoE fully cached, no RAM budget, --repack 0 (the harness's kernels)"
    quota_c = compute.get("cpu_quota")

    def ceiling_row(measurement: str, model: str, rec: dict | None) -> dict:
        # a record from before these switches: one repetition, --no-warmup, the `auto` policy
        rec = rec or {}
        return {"measurement": measurement, "model": model, "tok_per_s": rec.get("tok_per_s"),
                "fastest_tok_per_s": rec.get("fastest_tok_per_s", rec.get("tok_per_s")),
                "repetitions": rec.get("repetitions", 1), "warmup": bool(rec.get("warmup", False)),
                "omp_wait_policy": rec.get("omp_wait_policy"), "cpu_quota": quota_c}

    comp = pd.DataFrame([
        ceiling_row("dense cold", compute["dense_model"], compute["dense_cold"]),
        ceiling_row("dense warm", compute["dense_model"], compute["dense_warm"]),
        ceiling_row(moe_row, compute["moe_model"], compute["moe_warm"]),
        *(ceiling_row(moe_row, name, rec)
          for name, rec in (compute.get("moe_warm_other") or {}).items()),
        *(ceiling_row(moe_row, name, rec)
          for name, recs in (compute.get("moe_warm_policies") or {}).items()
          for rec in recs.values()),
        ceiling_row("MoE fully cached, no RAM budget, default repack", compute["moe_model"],
                    compute.get("moe_warm_default_repack"))])
    w.text("Compute: llama-bench `-p 0 -n N -r R`, under the CPU quota in force; the MoE ceiling "
           "of each quant the runs use, under each OpenMP wait policy its runs use "
           "(`omp_wait_policy`). `warmup`: llama-bench decoded one token before the measured ones "
           "(the MoE ceilings: the runs' steady rate leaves their first token out too); without "
           "it (`--no-warmup`, the dense model, as the study measured it) the first token's "
           "start-up work is in the figure. `tok_per_s`: the mean of the `repetitions`; the "
           "floor's compute term is each quant's fastest repetition under any of its policies "
           "(`fastest_tok_per_s`).\n")
    comp_t = w.table("compute_ceiling", comp, "compute_ceiling")
    # read by name, never by row position; the fastest policy and repetition of each quant
    moe = comp_t[comp_t.measurement == moe_row].groupby("model").fastest_tok_per_s.max()
    moe_ceiling = {str(k): float(v) for k, v in moe.items() if v == v}
    _quota_section(w, inputs, comp_t)

    return io_med, io_by_path, comp_t, moe_ceiling


def _configurations(w: Writer, d: Loaded, inputs) -> pd.DataFrame:
    all_runs, run_length, infos, any_synth = d.all_runs, d.run_length, d.infos, d.any_synth
    w.text("## Every configuration (median of repeats, min-max)\n")
    w.text(f"The findings below compare the {run_length}-token runs; runs of another length appear "
           "here and, for routing, in findings 2 and 3.\n")
    summ = metrics.summarize(all_runs)
    faults = metrics.summarize(all_runs, "majflt_per_token")[["run_id", "median"]].rename(
        columns={"median": "majflt_per_token"})
    summ = summ.merge(faults, on="run_id", how="left")
    for col in ("read_amplification", "residency_decode_start", "first_token_s",
                "kernel_read_vs_missing", "hook_s_per_token", "mechanism_s_per_token"):
        summ = summ.merge(metrics.summarize(all_runs, col)[["run_id", "median"]].rename(
            columns={"median": col}), on="run_id", how="left")
    summ["synthetic"] = summ["synthetic"].astype(bool)
    enforced = (all_runs.groupby("run_id").limits_enforced.all() if "limits_enforced" in all_runs
                else pd.Series(True, index=summ.run_id))
    summ["limits_enforced"] = summ.run_id.map(enforced).fillna(True).astype(bool)
    # how much of a token the hook is: its time per token at the configuration's median rate
    summ["hook_share"] = summ["hook_s_per_token"] * summ["median"]
    w.table("summary", summ[["run_id", "synthetic", "quant", "mechanism", "mlock_non_expert",
                                      "log_experts", "tokens", "n", "median", "min", "max", "wide_spread",
                                      "majflt_per_token", "read_amplification",
                                      "kernel_read_vs_missing", "hook_s_per_token", "hook_share",
                                      "mechanism_s_per_token", "statuses",
                                      "limits_enforced"]].rename(
        columns={"median": "tok_per_s_median", "min": "tok_per_s_min", "max": "tok_per_s_max"}),
        "runs_table, findings")
    w.text("Read amplification: bytes the run's cgroup read from disk per generated token divided "
           "by the routed expert bytes per token, with the read-ahead in force. "
           "`kernel_read_vs_missing`: the same bytes over what the hook found not resident in the "
           "routed slabs just before each layer's prefetch (cachestat, or mincore for private "
           "copies; 1 = the kernel read nothing else). `hook_s_per_token`: wall time in the "
           "routing hook's own work (residency syscalls, ids, logging; the mechanism excluded), "
           "under the CPU quota; `hook_share`: that time over the median token's "
           "(hook_s_per_token x tok/s). `mechanism_s_per_token`: wall time in the mechanism's "
           "own calls (its per-layer work and, for lookahead, its prediction), apart from the "
           "hook's.\n")
    dist = all_runs[all_runs.disturbed].assign(flag_reason=metrics.flag_reason)
    w.text(f"### Repeats left out of the verdicts: {len(dist)}\n")
    w.text("A repeat the machine disturbed, by its recorded counters, is left out of the verdicts "
           "(it stays in the table above and in runs.csv, `disturbed`): the rest of the machine "
           f"read more than {metrics.DISTURBED_READ_BYTES / 1e6:.0f} MB (and over 1% of the "
           "run's own reads) from the models' disk, the host stole more than "
           f"{metrics.STEAL_BOUND:.0%} of its CPU time, or its mean and median steady token "
           f"differ by more than {metrics.MEAN_MEDIAN_GAP:.0%}. Unless the config sets "
           "`rerun_disturbed: false`, it is measured once more at the end of the study "
           "(runs.csv `rerun`): the re-run replaces it in the verdicts unless it is disturbed "
           "too, and then neither counts.\n")
    if len(dist):
        w.table("disturbed_repeats", dist[["run_id", "repeat", "rerun", "start_utc", "flag_reason",
                                           "foreign_read_bytes", "tok_per_s"]],
                "runs_table, findings")
    w.text("### Latency: time to first token, prompt processing, per-token percentiles\n")
    w.text("Time to first token is the prompt's decode and the first generated token's; the "
           "percentiles are over every steady token of every ok repeat (the first generated token "
           "left out). `results/final/llama-bench.jsonl` has each repeat as llama-bench's JSON "
           "record.\n")
    w.table("latency", export.latency_table(all_runs, Path(".")), "runs_table, final")
    w.text("### What the first token sees\n")
    w.text("llama.cpp's mmap load maps the file with MAP_POPULATE and POSIX_MADV_WILLNEED, so the "
           "load reads the model inside the run's RAM budget and decoding starts with part of it "
           "cached. Share of the model file resident right before the first decode (median over "
           "repeats) and the first generated token's time beside the median token's:\n")
    first = summ[["run_id", "residency_decode_start", "first_token_s", "median"]].copy()
    first["median_token_s"] = 1.0 / first.pop("median")
    w.table("first_token", first, "runs_table, findings")
    base_rows = []
    for p in inputs.baselines:
        b = json.loads(Path(p).read_text())
        for r in b["runs"]:
            base_rows.append({"model": b["model"], "synthetic": infos[b["model"]].get("synthetic"),
                              "load_mode": r["load_mode"], "tok_per_s": r.get("tok_per_s"),
                              "status": r.get("status", Status.OK.value if r["exit_code"] == 0
                                                else Status.FAILED.value)})
    if base_rows:
        w.text("Stock `llama-bench` decode under the same profile (what a user would run instead):\n")
        w.table("stock_baselines", pd.DataFrame(base_rows), "stock_baseline")
    plots.summary_plots(w, summ, any_synth)

    return summ


def _findings(w: Writer, d: Loaded, io_med, comp_t, moe_ceiling) -> list[dict]:
    """Each unit of harness.analysis.findings judges; this only renders."""
    all_runs, runs, layouts, q4, q2 = d.all_runs, d.runs, d.layouts, d.q4, d.q2
    trace_run = _trace_run(all_runs, q4)
    trace = None
    if trace_run is not None:
        trace = pd.read_csv(Path(trace_run.record).parent / "experts.csv")
    study = findings.Study(runs=runs, layouts=layouts, q4=q4, q2=q2, io_mb_s=io_med,
                    dense_ceiling=_ceiling(comp_t, "dense warm"),
                    moe_ceiling=moe_ceiling.get(q4, float("nan")),
                    trace=trace, trace_synthetic=bool(trace_run.synthetic) if trace_run is not None
                    else True, n_expert=layouts.get(q4, {}).get("n_expert", 0))
    verdicts = []
    for finding in findings.FINDINGS:
        out = finding.evaluate(study)
        w.text(f"## Finding {finding.number}: {finding.title}\n")
        w.text(f"Study: {finding.claim}.\n")
        w.text(f"Runs: {finding.needs}.\n")
        if finding.number == "2" and trace_run is not None:
            w.text(f"Routing trace: run `{trace_run['run_id']}` repeat {trace_run['repeat']} "
                   f"({int(trace.token.nunique())} tokens incl. the prompt, {study.n_expert} "
                   "experts).\n")
        for name, table in out.tables.items():
            if len(table):
                w.table(name, table, "findings")
        for note in out.notes:
            w.text(note + "\n")
        w.text(f"**Verdict: {out.verdict.verdict}** ({out.verdict.reason}). Rule: {finding.rule}.\n")
        for name, draw in out.figures:  # each finding draws its own figures; this only renders
            w.plot(name, draw())
        verdicts.append({"finding": finding.number, "claim": finding.title,
                         "verdict": out.verdict.verdict, "why": out.verdict.reason})

    return verdicts


def _breakdown(w: Writer, runs: pd.DataFrame, summ: pd.DataFrame) -> None:
    """The time breakdown at the best pread+madvise configuration."""
    w.text("### Time breakdown at the best pread+madvise configuration\n")
    w.text(f"Study: {STUDY['breakdown']}.\n")
    cands = summ[(summ.mechanism == "pread+madvise") & summ.run_id.isin(runs.run_id)].sort_values(
        "median", ascending=False)
    if len(cands):
        bd = metrics.time_breakdown(runs, cands.iloc[0].run_id)
        bd_t = w.table("time_breakdown", pd.DataFrame([bd]), "findings")
        plots.time_breakdown(w, bd_t, bd["run_id"])
        logoff = summ[(summ.mechanism == "pread+madvise") & (~summ.log_experts.astype(bool))]
        logon = summ[(summ.mechanism == "pread+madvise") & summ.log_experts.astype(bool)
                     & summ.mlock_non_expert.astype(bool)]
        if len(logoff) and len(logon):
            w.table("logging_on_off", pd.DataFrame([
                {"logging": "on", "run_id": logon.iloc[0].run_id, "tok_per_s_median": logon.iloc[0]["median"]},
                {"logging": "off", "run_id": logoff.iloc[0].run_id,
                 "tok_per_s_median": logoff.iloc[0]["median"]}]), "findings")



def _closing(w: Writer, d: Loaded, verdicts_by: dict[str, list[dict]]) -> None:
    any_synth = d.any_synth
    w.text("## Verdicts\n")
    unenforced = (~d.all_runs.limits_enforced.astype(bool)).sum() if "limits_enforced" in d.all_runs \
        else 0
    if unenforced:
        w.text(f"**{unenforced} run(s) were measured without the profile's limits** "
               "(`allow_unenforced`; runs.csv `limits_enforced`): these verdicts describe an "
               "unlimited machine for them, not the profile's box.\n")
        verdicts_by = {k: [dict(v, why=v["why"] + " [limits not enforced in some runs]")
                           for v in vs] for k, vs in verdicts_by.items()}
    if len(verdicts_by) == 1:
        w.table("verdicts", pd.DataFrame(next(iter(verdicts_by.values()))), "findings")
    else:
        w.text("Each finding in each regime, side by side; `same_in_every_regime` is false where "
               "a finding holds in one regime and not in another.\n")
        rows: dict[str, dict] = {}
        for name, verdicts in verdicts_by.items():
            for v in verdicts:
                row = rows.setdefault(v["finding"], {"finding": v["finding"], "claim": v["claim"]})
                row[name] = v["verdict"]
                row[f"why ({name})"] = v["why"]
        t = pd.DataFrame(list(rows.values()))
        t["same_in_every_regime"] = t[list(verdicts_by)].nunique(axis=1) == 1
        w.table("verdicts", t, "findings")
    w.text("## Caveats\n")
    w.text("- A shared, noisy machine: each comparison is a ratio of steady tok/s (the first "
           "generated token left out) with a 90% confidence interval from the runs, the variance "
           "pooled across configurations (Welch for a configuration an F test finds clearly "
           "noisier); a directional claim needs its interval above no change and an estimate of "
           "at least 10%, fails when the interval excludes 10%, and is inconclusive otherwise; "
           "families are refuted only after Holm's correction (`harness/analysis/stats.py`). Tables show "
           "medians with min-max; a spread over 25% of the median is flagged `wide_spread`.\n"
           "- These numbers are this machine's, under the limits above, this hour: not a portable "
           "hardware spec, and not the original study's box.\n"
           + ("- Synthetic models: routing-derived findings (2, 3, the cache simulation) describe "
              "random weights, not OLMoE.\n" if any_synth else "")
           + "- Per-run records, logs and per-token CSVs: `results/runs/<run_id>/rep<k>/` (path in "
             "runs.csv).\n")


def _pair_models(config: dict) -> tuple[str, str]:
    """The Q4_K_M and Q2_K models of the study's pair (by quant), falling back to config order."""
    by_quant = {m.get("quant"): name for name, m in config["models"].items()}
    return by_quant.get("Q4_K_M", config["ceilings"]["moe_model"]), by_quant.get("Q2_K", "")


def _trace_run(runs: pd.DataFrame, model: str):
    """The longest logged routing trace of `model` (the study's used 64 tokens). Every mechanism
    routes identically (tests/test_harness.py), so the mechanism only breaks ties: `none` first."""
    cand = runs[(runs.status == Status.OK.value) & (runs.log_experts.astype(bool))]
    if len(cand[cand.model == model]):
        cand = cand[cand.model == model]
    if cand.empty:
        return None
    cand = cand.assign(_not_none=cand.mechanism != "none")
    return cand.sort_values(["tokens_completed", "_not_none", "repeat"],
                            ascending=[False, True, True]).iloc[0]


def _box_section(w: Writer, runs: pd.DataFrame, records: list, inputs) -> None:
    """The kernel's conditions beside every run: read-ahead, file advice, DAMON, THP, writeback."""
    w.text("### The box beside the runs\n")
    w.text("Every run record carries these; the table shows each run's values (median over its "
           "repeats). `read_ahead_kb` is the models' device read-ahead in force; llama.cpp's "
           "`posix_fadvise` advice on the file doubles it for faults on the mapping. "
           "`damon_pageout_bytes` is what the host's DAMON `pageout` scheme (not ours to change) "
           "reclaimed machine-wide during the run; `dirtied` bytes are page-cache pages the run "
           "made dirty, `cgroup_write` what its own cgroup wrote to disk, `device_write` what the "
           "whole disk wrote.\n")
    cols = ["read_ahead_kb", "fadvise", "cpu_quota", "damon_pageout_bytes", "device_read_bytes",
            "device_write_bytes", "dirtied_bytes_per_token", "cgroup_write_bytes_per_token"]
    have = [c for c in cols if c in runs]
    if have:
        g = runs.groupby("run_id")
        t = pd.concat([g[c].median() if pd.api.types.is_numeric_dtype(runs[c]) else g[c].first()
                       for c in have], axis=1).reset_index()
        w.table("box_conditions", t, "harness_run")
    rec = next((r for r in records if r.box), None)
    if rec:
        damon = rec.damon_state
        rows = [{"kdamond": k["kdamond"], "state": k["state"], "operations": c.get("operations"),
                 "action": sc.get("action"),
                 "min_age_aggregations": (sc.get("access_pattern", {}).get("age", {}) or {}).get("min"),
                 "aggr_us": c.get("intervals_us", {}).get("aggr_us")}
                for k in damon for c in k["contexts"] for sc in c["schemes"]]
        thp = rec.thp
        w.text(f"Transparent huge pages: enabled `{thp.get('enabled')}`, defrag "
               f"`{thp.get('defrag')}`.\n")
        if rows:
            w.text("DAMON on this host (recorded, never changed by the pipeline). A `pageout` scheme "
                   "evicts regions idle for its minimum age, machine-wide and outside the run's "
                   "cgroup: it can evict the model's page cache between a configuration's layers "
                   "and tokens, more the slower the configuration, and cannot touch mlocked pages, "
                   "so it may add to the gain of mlock.\n")
            w.table("damon", pd.DataFrame(rows), "harness_run")


def _quota_section(w: Writer, inputs, comp_t: pd.DataFrame) -> None:
    quota_path = getattr(inputs, "quota", None)
    if not quota_path:
        return
    q = json.loads(Path(quota_path).read_text())
    w.text(f"CPU quota in force: **{sig(q.get('cpu_quota'))}** CPUs ({q.get('how')}).\n")
    target = q.get("target_tok_s")
    if target:
        dense = _ceiling(comp_t, "dense warm")
        off = dense / target - 1
        w.text(f"Dense compute ceiling under it: {sig(dense)} tok/s, {off:+.0%} from the "
               f"{target} tok/s target ({'within' if abs(off) <= 0.2 else 'outside'} 20%).\n")
    if q.get("io_share_target"):
        w.text(f"Calibrated toward an I/O-wait share of {q['io_share_target']} of the steady token "
               f"of pread+madvise+mlock on {q.get('moe_model')} (cold harness runs, "
               f"harness.run.attribution): reached {sig(q.get('io_share_at_quota'))}"
               + (f"; {q['reason']}" if q.get("reason") else "") + ".\n")
    elif q.get("steps"):
        w.text(f"Calibration toward {q.get('target_tok_s')} tok/s on the dense model "
               f"(llama-bench, warm), each step one measurement:\n")
    if q.get("steps"):
        w.table("cpu_quota_calibration", pd.DataFrame(q["steps"]), "cpu_quota")


def _ceiling(comp_t: pd.DataFrame, measurement: str) -> float:
    rows = comp_t[comp_t.measurement == measurement].tok_per_s
    return float(rows.iloc[0]) if len(rows) else float("nan")


def _distance_section(w: Writer, summ, runs, layouts, io_by_path: dict[str, float],
                      moe_ceiling: dict, limits: dict) -> None:
    """Every configuration beside its floor: the fastest any run of it could be on this box."""
    w.text("## Distance to the limit\n")
    budget = limits.get("ram_bytes")
    quota = limits.get("cpu_quota")
    per_byte = metrics.kernel_cpu_per_byte(runs)
    w.text("The floor of each configuration, per token: the *bytes* any run must read from its "
           "first decode on (Belady's optimal cache of the whole RAM budget, "
           f"{budget} bytes, on the run's own routing trace, started empty, less every byte of "
           "the model resident when decoding began, as each repeat measured it, in the page cache or "
           "in a mechanism's own memory), read at the "
           "fastest rate the I/O ceiling measured for the configuration's read path "
           f"(`io_mb_per_s`: O_DIRECT {sig(io_by_path['O_DIRECT'] / 1e6)}, buffered read "
           f"{sig(io_by_path['buffered read'] / 1e6)}, fault {sig(io_by_path['fault'] / 1e6)} "
           "MB/s); the "
           "*CPU*: the model's fully cached compute ceiling under this regime's quota (its "
           "fastest llama-bench repetition under any wait policy its runs use) plus the "
           "kernel CPU those bytes cost at the cheapest rate any run of the same read path paid "
           "(`kernel_us_per_mb`), over the CPUs the run may use. With perfect overlap the larger "
           "of the two, with none their sum. `x_from_floor`: how many times slower the "
           "configuration (its median steady tok/s) is than its perfect-overlap floor. A repeat faster than its floor, or "
           "reading fewer bytes than it, is a **bound error**: the floor is wrong (a repeat flagged "
           "as disturbed is not judged).\n")
    rows, traces, errors = [], {}, []
    for _, s in summ.iterrows():
        lay = layouts.get(s.model)
        mine = runs[(runs.run_id == s.run_id) & (runs.status == Status.OK.value)]
        if lay is None or mine.empty or not budget:
            continue
        key = (s.model, s.tokens)
        if key not in traces:  # greedy decoding routes alike in every run of a model and length
            traces[key] = _trace(runs, s)
        ex = traces[key]
        slab = {int(k): v for k, v in lay["slab_bytes_per_layer"].items()}
        path = metrics.read_path_of(s)
        cost = float(per_byte.get(path, float("nan")))
        io_bps = io_by_path.get(path, io_by_path["fault"])
        ceiling = moe_ceiling.get(s.model)
        compute_s = 1.0 / ceiling if ceiling else float("nan")
        cpus = min(float(quota), float(mine.threads.iloc[0])) if quota else float(mine.threads.iloc[0])
        per_run = []
        for _, r in mine.iterrows():
            resident = metrics.resident_at_decode_start(r, lay["file_size"])
            fb = (metrics.floor_read_bytes(ex, slab, budget, resident) / s.tokens
                  if ex is not None else float("nan"))
            per_run.append({"run_id": s.run_id, "repeat": r["repeat"],
                            "disturbed": bool(r.get("disturbed", False)),
                            "steady_tok_per_s": r.steady_tok_per_s,
                            "decode_read_bytes_per_token": r.get("decode_read_bytes_per_token"),
                            "floor_bytes_per_token": fb,
                            **metrics.floor_bound(fb, io_bps, compute_s, cost, cpus)})
        pr = pd.DataFrame(per_run)
        pr["bound_error"] = metrics.bound_errors(pr)
        errors.append(pr[pr.bound_error])
        steady = mine.steady_tok_per_s.median()  # the findings' figure: the first token out
        row = {"run_id": s.run_id, "steady_tok_per_s_median": steady, "read_path": path,
               "io_mb_per_s": io_bps / 1e6,
               "decode_read_bytes_per_token": pr.decode_read_bytes_per_token.median(),
               "floor_bytes_per_token": pr.floor_bytes_per_token.median(),
               "kernel_us_per_mb": cost * 1e12, "compute_s": compute_s,
               **{k: pr[k].median() for k in ("floor_io_s", "floor_cpu_s",
                                              "floor_perfect_overlap_tok_per_s",
                                              "floor_no_overlap_tok_per_s")},
               "bound_errors": int(pr.bound_error.sum())}
        row["x_from_floor"] = (row["floor_perfect_overlap_tok_per_s"] / steady
                               if steady else float("nan"))
        rows.append(row)
    if not rows:
        return
    t = w.table("distance_to_limit", pd.DataFrame(rows), "findings")
    models = summ.set_index("run_id").model
    for model, of_model in t.groupby(t.run_id.map(models), sort=False):
        best = of_model.loc[of_model.steady_tok_per_s_median.idxmax()]
        w.text(f"Best configuration of `{model}`: `{best.run_id}`, "
               f"{sig(best.steady_tok_per_s_median)} steady tok/s, {sig(best.x_from_floor)}x from "
               f"its floor of {sig(best.floor_perfect_overlap_tok_per_s)} tok/s (floor time per "
               f"token: I/O {sig(best.floor_io_s)} s, CPU {sig(best.floor_cpu_s)} s). "
               + _in_the_way_text(runs[(runs.run_id == best.run_id)
                                       & (runs.status == Status.OK.value)], best) + "\n")
    bad = pd.concat(errors, ignore_index=True)
    if len(bad):
        w.text(f"**Bound errors: {len(bad)} repeat(s) beat their floor.**\n")
        w.table("bound_errors", bad, "findings")
    else:
        w.text("Bound errors: none (no repeat beat its floor).\n")


def _in_the_way_text(mine: pd.DataFrame, best) -> str:
    """What stands between the best configuration and its floor, from its attribution."""
    way = metrics.in_the_way(mine)
    if not way:
        return "Its runs carry no attribution, so what stands in its way is not measured."
    shares = ", ".join(f"{label} {way[k + '_share']:.0%}" for k, label in (
        ("io_wait", "I/O wait"), ("kernel", "kernel CPU"), ("user", "user CPU"),
        ("cpu_wait", "waiting for a CPU")))
    text = (f"What stands in its way, from its attribution: {way['what']}, the largest part of its "
            f"mean steady token ({shares}).")
    steady_bytes = mine.cgroup_read_bytes_per_token.median() \
        if "cgroup_read_bytes_per_token" in mine else float("nan")
    if way["part"] == "io_wait" and steady_bytes == steady_bytes and best.floor_bytes_per_token > 0:
        text += (f" It reads {sig(steady_bytes / 1e6)} MB a steady token where the floor's whole "
                 f"decode (the prompt's reads included) averages "
                 f"{sig(best.floor_bytes_per_token / 1e6)} MB a generated token "
                 f"({sig(steady_bytes / best.floor_bytes_per_token)}x): bytes a better cache or "
                 f"prediction would not read.")
    return text


def _trace(runs, s) -> pd.DataFrame | None:
    """The routing trace (every decode: the prompt's and each generated token's) of a logged run
    of this configuration's model and length, its own first."""
    cand = runs[(runs.model == s.model) & (runs.tokens == s.tokens) & (runs.status == Status.OK.value)]
    cand = pd.concat([cand[cand.run_id == s.run_id], cand[cand.log_experts.astype(bool)]])
    for rec in cand.record:
        ex = pd.read_csv(Path(rec).parent / "experts.csv")
        if len(ex):
            return ex
    return None
