"""RESULTS.md, its tables and plots, rendered from the run records.

Every number in RESULTS.md is printed from a CSV under tables/ (rounded there first, so the text
and the CSV hold the same digits), and every section names the CSV and the rule that made it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from harness import parameters
from harness.analysis import (breakdown, configurations, findings, latency, limit, policies, flags,
                              stats, tables)
from harness.analysis.outcome import Figure, Outcome
from harness.record import read_run
from harness.util import sig
from harness.report import captions, plots
from harness.analysis import attribution

log = logging.getLogger(__name__)


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
    regime's tables and plots go under `<profile>/` (a `regime` view of the writer), and the
    tables the comparison of machines reads (compare.TABLES) are also written whole, with a
    `profile` column."""

    def __init__(self, tables: Path, plots: Path, prefix: str = "", *, _shared=None):
        self.tables, self.plots = tables, plots
        tables.mkdir(parents=True, exist_ok=True)
        plots.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix  # "<profile>/" in a regime's view; fixed for the view's life
        if _shared is None:
            # RESULTS.md's parts, every regime's tables by name, and the run ids measured
            # without the profile's limits (every table naming one marks it): one set per report
            _shared = ([], {}, set())
        self._shared = _shared
        self.parts, self.by_regime, self.unenforced = _shared

    def regime(self, name: str) -> Writer:
        """The same report, writing this regime's tables and plots under `<name>/`."""
        return Writer(self.tables, self.plots, f"{name}/", _shared=self._shared)

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

    def outcome(self, out: Outcome, rule: str) -> None:
        """An analysis unit's tables, notes and figures, in that order."""
        for name, table in out.tables.items():
            if len(table):
                self.table(name, table, rule)
        for note in out.notes:
            self.text(note + "\n")
        for f in out.figures:
            self.figure(f)

    def figure(self, f: Figure) -> None:
        """An analysis unit's figure, drawn by the plot function it names."""
        self.plot(f.name, getattr(plots, f.plot)(f.data), f.detail)


@dataclass(frozen=True)
class ReportInputs:
    """The findings rule's inputs, by name (the script converts Snakemake's lists into this)."""

    runs: str
    records: list
    io: list
    compute: list
    baselines: list
    layouts: list
    infos: list
    quota: list = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, named) -> ReportInputs:
        """From Snakemake's named input list (or any mapping of name -> path or paths)."""
        items = dict(named.items()) if hasattr(named, "items") else dict(named)
        return cls(**{k: v if isinstance(v, str) else [str(x) for x in v]
                      for k, v in items.items() if k in {f.name for f in dataclasses.fields(cls)}})


@dataclass(frozen=True)
class RegimeInputs:
    """One regime's ceilings, quota and stock baselines."""

    io: str
    compute: str
    quota: str | None
    baselines: list


def write_findings(inputs: ReportInputs, outputs: dict, config: dict) -> None:
    """RESULTS.md with its tables and plots, section by section; in a study of several regimes
    (profiles), the sections from the ceilings to the findings once per regime, then every
    finding's verdicts side by side. `outputs`: `results`, `tables`, `plots` paths."""
    from harness.config import study_profiles
    from harness.report.compare import TABLES

    d = _load(inputs, config)
    w = Writer(Path(outputs["tables"]), Path(outputs["plots"]))
    w.unenforced.update(tables.unenforced_runs(d.all_runs))
    _header(w, d)
    _attribution_section(w, d)
    names = study_profiles(config)
    verdicts_by: dict[str, list[dict]] = {}
    for i, name in enumerate(names):
        sub, sub_inputs = _regime(d, inputs, name, i, several=len(names) > 1)
        rw = w
        if len(names) > 1:
            rw = w.regime(name)
            rw.text(f"# Regime: {name}\n")
            rw.text(f"{config['profiles'][name].get('description', '')}\n")
        ceil = _ceilings(rw, sub, sub_inputs)
        summ = _configurations(rw, sub, sub_inputs)
        _distance_section(rw, limit.distance_to_limit(
            summ, sub.all_runs, sub.layouts,
            limit.Ceilings(ceil.io_by_path, ceil.moe_ceiling, sub.limits)), ceil, sub.limits)
        effect = config["profiles"][name].get("min_effect")
        rw.text(f"Minimum effect of a directional verdict in this regime: "
                f"{stats.MIN_EFFECT if effect is None else effect:.0%}"
                + (" (the profile's `min_effect`: the study's design cannot resolve "
                   f"{stats.MIN_EFFECT:.0%} here with the runs it can afford; README "
                   "\"Design\")" if effect is not None and effect != stats.MIN_EFFECT else "")
                + ".\n")
        study = findings.Study.of(sub.runs, sub.all_runs, sub.layouts, sub.q4, sub.q2,
                                  ceil.io_mb_s_median, ceil.compute_row("dense warm"),
                                  ceil.moe_ceiling.get(sub.q4, float("nan")), effect)
        verdicts_by[name] = _findings(rw, study)
        _design_section(rw, study)
        _policies(rw, policies.policy_study(sub.runs, sub.layouts, sub.limits.get("ram_bytes")))
        _breakdown(rw, breakdown.time_breakdown(sub.runs, summ))
    _closing(w, d, verdicts_by)
    w.write_whole(TABLES)
    out_md = Path(outputs["results"])
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text("\n".join(w.parts))
    log.info(f"wrote {out_md}")


def _regime(d: Loaded, inputs: ReportInputs, name: str, i: int, several: bool):
    """One regime's runs, records and ceilings, as the single-regime sections read them (the
    rules name ceilings per profile, so even a one-profile study gets lists of one)."""
    if several:
        runs = d.all_runs[d.all_runs.profile == name]
        records = [r for r in d.records if r.spec.profile == name]
        d = dataclasses.replace(d, all_runs=runs, runs=d.runs[d.runs.profile == name],
                                records=records,
                                limits=records[0].limits_in_force if records else {})
    return d, RegimeInputs(
        io=inputs.io[i], compute=inputs.compute[i],
        quota=inputs.quota[i] if inputs.quota else None,
        baselines=[b for b in inputs.baselines if not several or f"/baselines/{name}/" in b])


@dataclass
class Loaded:
    """What every section reads: the runs (all, and the default length the findings compare), the
    models' metadata and layouts, the records, the configured pair of quants."""

    config: dict
    all_runs: pd.DataFrame
    runs: pd.DataFrame
    layouts: dict
    infos: dict
    records: list
    limits: dict
    any_synth: bool
    q4: str
    q2: str


def _load(inputs: ReportInputs, config: dict) -> Loaded:
    all_runs = pd.read_csv(inputs.runs)
    # Speed findings compare each configuration at its regime's common length
    # (configurations.at_study_length); a longer run beside it (the routing trace) feeds the routing
    # findings and the table of every configuration, not the comparisons.
    layouts = {Path(p).name.removesuffix(".layout.json"): json.loads(Path(p).read_text())
               for p in inputs.layouts}
    infos = {Path(p).name.removesuffix(".json"): json.loads(Path(p).read_text()) for p in inputs.infos}
    records = [read_run(p) for p in inputs.records]
    q4, q2 = _pair_models(config)
    if "disturbed" not in all_runs:  # runs.csv has carried it since format 2 of the run record
        all_runs["disturbed"] = flags.disturbed(all_runs)
    for name in parameters.RENAMED_VALUES:  # a runs.csv written before a value was renamed
        if name in all_runs:
            all_runs[name] = all_runs[name].map(lambda v: parameters.current_value(name, v))
    # the findings judge only repeats nothing else disturbed (RESULTS.md lists the others)
    judged = all_runs[configurations.at_study_length(all_runs) & ~all_runs.disturbed]
    return Loaded(config=config, all_runs=all_runs, runs=judged,
                  layouts=layouts, infos=infos, records=records,
                  limits=records[0].limits_in_force if records else {},
                  any_synth=any(i.get("synthetic") for i in infos.values()), q4=q4, q2=q2)


def _header(w: Writer, d: Loaded) -> None:
    from harness.config import study_profiles

    config, layouts, infos = d.config, d.layouts, d.infos
    any_synth, all_runs, records = d.any_synth, d.all_runs, d.records
    w.text("# RESULTS\n")
    w.text("Generated by moe-offload-bench on the machine below, from real runs. "
           + ("**Every model here is synthetic**: the original's exact shapes, tensor layout and "
              "tokenizer with seeded random weights. Byte counts, I/O patterns and FLOPs are the "
              "original model's; routing, and so anything derived from which experts are chosen, is a "
              "random-weight model's, not OLMoE's.\n" if any_synth else "\n"))
    w.text("## Machine and limits (as measured)\n")
    w.table("machine", tables.machine_limits(records, study_profiles(config)), "harness_run")
    _box_section(w, all_runs, records)
    w.text("## Models\n")
    w.table("models", pd.DataFrame([{
        "model": k, "synthetic": v.get("synthetic"), "quant": v.get("quant"), "shape": v.get("shape"),
        "file_bytes": v.get("bytes"), "non_expert_bytes": layouts[k]["non_expert_bytes"],
        "bytes_per_token": layouts[k]["bytes_per_token"], "sha256": v.get("sha256", "")[:16]}
        for k, v in infos.items()]), "model, layout")


def _attribution_section(w: Writer, d: Loaded) -> None:
    """The figure a reader should look at first: where each configuration's token time goes."""
    t = attribution.per_configuration(d.all_runs)
    explained = tables.identity_ok_median(t)
    w.text("## Where a token's time goes\n")
    if t.empty:
        w.text("These runs were recorded without the per-token attribution.\n")
        return
    plots.attribution_plot(w, t)
    w.table("attribution", t, "runs_table")
    w.text(f"Parts of the decoding thread's wall time (`harness/box/counters.py`): they explain a "
           f"token within 10% in {explained:.0%} of tokens (median over "
           f"configurations). A run is disk-bound when I/O wait is at least "
           f"{attribution.BOUND_SHARE:.0%} of its mean steady token, CPU-bound when on-CPU time, "
           f"run-queue wait (the quota's throttling included) and sync wait (asleep at a barrier "
           f"while the other compute threads run or are throttled) are, mixed otherwise. "
           f"`between_s` (hatched): the harness's own work from the end of one decode to the "
           f"start of the next (the per-token counters, the row, the logits check, the expert "
           f"log), outside the decode's clock, so no tok/s includes it.\n")


def _ceilings(w: Writer, d: Loaded, inputs: RegimeInputs) -> tables.CeilingTables:
    c = tables.ceilings(inputs.io, inputs.compute, d.limits.get("read_bps"))
    w.text("## Ceilings\n")
    w.text("I/O: O_DIRECT sequential reads of the models' filesystem inside the profile's limits, "
           "with the CPU they cost (user and kernel, ms per MB read).\n")
    w.table("io_ceiling", c.io_sequential, "io_ceiling")
    if len(c.io_random):
        w.text("Reads as the mechanisms issue them: one expert slab of the MoE model at a time "
               "(`block_bytes`), at random slab-aligned offsets of a file evicted from the page "
               "cache, buffered and O_DIRECT, with `queue_depth` reads in flight (one thread "
               "each), inside the same limits; `cpu_ms_per_mb`: user and kernel CPU per MB read. "
               "The floor of a configuration reads at the fastest rate its read path reached "
               "here (O_DIRECT: the sequential samples too; faults: any sample).\n")
        w.table("io_random_reads", c.io_random, "io_ceiling")
    w.text("Compute: llama-bench `-p 0 -n N -r R`, under the CPU quota in force; the MoE ceiling "
           "of each quant the runs use, under each OpenMP wait policy its runs use "
           "(`omp_wait_policy`). `warmup`: llama-bench decoded one token before the measured ones "
           "(the MoE ceilings: the runs' steady rate leaves their warm-up out too); without "
           "it (`--no-warmup`, the dense model, as the study measured it) the first token's "
           "start-up work is in the figure. `tok_per_s`: the mean of the `repetitions`; the "
           "floor's compute term is each quant's fastest repetition under any of its policies "
           "(`fastest_tok_per_s`).\n")
    w.table("compute_ceiling", c.compute, "compute_ceiling")
    _quota_section(w, tables.quota(inputs.quota, c.dense_warm_tok_s))
    return c


def _configurations(w: Writer, d: Loaded, inputs: RegimeInputs) -> pd.DataFrame:
    w.text("## Every configuration (median of repeats, min-max)\n")
    lengths = ", ".join(f"{k} of {n} tokens" for n, k in
                        d.runs.tokens.value_counts().sort_index().items())
    w.text("The findings below compare each configuration at its regime's most common run length, "
           "or at its own where it was measured only at another one (judged here: "
           f"{lengths or 'no runs'}); a run of another length beside its configuration's runs at "
           "the common one (a routing trace) appears here and, for routing, in the routing "
           "findings.\n")
    summ = tables.configuration_summary(d.all_runs)
    w.table("summary", tables.summary_table(summ), "runs_table, findings")
    w.text("Read amplification: bytes the run's cgroup read from disk per generated token divided "
           "by the routed expert bytes per token, with the read-ahead in force. "
           "`kernel_read_vs_missing`: the same bytes over what the hook found not resident in the "
           "routed slabs just before each layer's prefetch (cachestat, or mincore for private "
           "copies; 1 = the kernel read nothing else; measured on the warm-up tokens, the only "
           "ones that check residency). `hook_s_per_token`: wall time in the routing hook's own "
           "work per token of the measured window (reading and recording the routing; the "
           "mechanism excluded, and the residency checks, which run on the warm-up only), under "
           "the CPU quota; `hook_share`: that time over the median token's (hook_s_per_token x "
           "tok/s): what the instrumentation costs the figure. `mechanism_s_per_token`: wall "
           "time in the mechanism's own calls per window token (its per-layer work and, for "
           "lookahead, its prediction), apart from the hook's.\n")
    merged = configurations.merged_configurations(d.all_runs)
    if len(merged):
        w.text("Run ids whose resolved spec is the same (after `auto` and the defaults) are one "
               "configuration wherever the findings compare them, named by the first of the "
               "ids; runs.csv `configuration`:\n")
        w.table("merged_configurations", merged, "runs_table")
    dist = tables.disturbed_repeats(d.all_runs)
    w.text(f"### Repeats left out of the verdicts: {len(dist)}\n")
    w.text("A repeat the machine disturbed, by its recorded counters, is left out of the verdicts "
           "(it stays in the table above and in runs.csv, `disturbed`): the rest of the machine "
           f"read more than {flags.DISTURBED_READ_BYTES / 1e6:.0f} MB (and over 1% of the "
           "run's own reads) from the models' disk, the host stole more than "
           f"{flags.STEAL_BOUND:.0%} of its CPU time, or its mean and median steady token "
           f"differ by more than {flags.MEAN_MEDIAN_GAP:.0%}. Unless the config sets "
           "`rerun_disturbed: false`, it is measured once more at the end of the study "
           "(runs.csv `rerun`): the re-run replaces it in the verdicts unless it is disturbed "
           "too, and then neither counts.\n")
    if len(dist):
        w.table("disturbed_repeats", dist, "runs_table, findings")
    w.text("### Latency: time to first token, prompt processing, per-token percentiles\n")
    w.text("Time to first token is the prompt's decode and the first generated token's; the "
           "percentiles are over the measured window's tokens of every ok repeat (after each run's "
           "`warmup_tokens`). `results/final/llama-bench.jsonl` has each repeat as llama-bench's JSON "
           "record.\n")
    w.table("latency", latency.latency_table(d.all_runs, Path(".")), "runs_table, final")
    w.text("### What the first token sees\n")
    w.text("llama.cpp's mmap load maps the file with MAP_POPULATE and POSIX_MADV_WILLNEED, so the "
           "load reads the model inside the run's RAM budget and decoding starts with part of it "
           "cached. Share of the model file resident right before the first decode (median over "
           "repeats) and the first generated token's time beside the median token's:\n")
    w.table("first_token", tables.first_token(summ), "runs_table, findings")
    base = tables.stock_baselines(inputs.baselines, d.infos)
    if len(base):
        w.text("Stock `llama-bench` decode under the same profile (what a user would run instead):\n")
        w.table("stock_baselines", base, "stock_baseline")
    plots.summary_plots(w, summ, d.any_synth)
    return summ


def _findings(w: Writer, study: findings.Study) -> list[dict]:
    """Each unit of harness.analysis.findings judges, at the regime's minimum effect; this only
    renders."""
    verdicts = []
    for finding in findings.FINDINGS:
        out = finding.evaluate(study)
        w.text(f"## Finding {finding.number}: {finding.title}\n")
        w.text(f"Study: {finding.claim}.\n")
        w.text(f"Runs: {finding.needs}.\n")
        for name, table in out.tables.items():
            if len(table):
                w.table(name, table, "findings")
        for note in out.notes:
            w.text(note + "\n")
        w.text(f"**Verdict: {out.verdict.verdict}** ({out.verdict.reason}). Rule: {finding.rule}.\n")
        for f in out.figures:
            w.figure(f)
        verdicts.append({"finding": finding.number, "claim": finding.title,
                         "verdict": out.verdict.verdict, "why": out.verdict.reason})
    return verdicts


def _design_section(w: Writer, study: findings.Study) -> None:
    """How many runs each configuration needs, from this study's own variances: the next
    study's repeats (harness.analysis.design)."""
    from harness.analysis import design

    ok, value, effect = study.ok(any_wait_policy=True), study.value, study.min_effect
    if ok[value].notna().sum() < 2:
        return
    t = design.regime_design(ok, value, by=findings.CONFIG)
    col = f"runs_at_{round(100 * effect)}"
    w.text("### Design: runs each configuration needs\n")
    w.text("From this study's own variances (each configuration's, moderated as the verdicts "
           "moderate them): the runs a side each configuration and the configuration it is "
           f"compared against need to resolve a difference of 10-30% at {stats.POWER:.0%} power "
           "with a 90% interval (`runs_at_<effect %>`; empty past "
           f"{design.MOST_RUNS}). A configuration with fewer runs than its column at this "
           f"regime's minimum effect ({effect:.0%}) cannot resolve it: its verdicts say so. "
           "The next study's repeats come from this table "
           "(`python -m harness.analysis.design results/final/runs.csv`).\n")
    if col in t:
        short = t[t[col].isna() | (t.runs < t[col])]
        w.text(f"{len(short)} of {len(t)} configurations have fewer runs than they need at "
               f"{effect:.0%}.\n")
    w.table("design", t, "findings")


def _policies(w: Writer, out: Outcome) -> None:
    """What each cache policy would read on this regime's own routing (the yardstick of a cache
    mechanism)."""
    w.text("### What each cache policy would read\n")
    w.text("Replayed on the regime's longest routing trace, over its measured window "
           "(`harness/analysis/policies.py`): LRU, LFU (counts since the start, kept for slabs "
           "not cached too), LFU aged (half-life "
           f"{policies.LFU_HALF_LIFE_TOKENS} decodes), ARC and Belady's optimum, each from an "
           "empty cache at the prompt, at real slab sizes.\n")
    w.outcome(out, "findings")


def _breakdown(w: Writer, out: Outcome) -> None:
    """The time breakdown at the best configuration of the study's design."""
    w.text(f"### Time breakdown at the best {breakdown.STUDY_DESIGN} configuration\n")
    w.text(f"Study: {breakdown.STUDY_BREAKDOWN}.\n")
    w.outcome(out, "findings")


def _closing(w: Writer, d: Loaded, verdicts_by: dict[str, list[dict]]) -> None:
    any_synth = d.any_synth
    w.text("## Verdicts\n")
    unenforced = tables.unenforced_count(d.all_runs)
    if unenforced:
        w.text(f"**{unenforced} run(s) were measured without the profile's limits** "
               "(`allow_unenforced`; runs.csv `limits_enforced`): these verdicts describe an "
               "unlimited machine for them, not the profile's box.\n")
    if len(verdicts_by) > 1:
        w.text("Each finding in each regime, side by side; `same_in_every_regime` is false where "
               "a finding holds in one regime and not in another.\n")
    w.table("verdicts", tables.verdicts_side_by_side(verdicts_by, unenforced), "findings")
    w.text("## Caveats\n")
    w.text("- A shared, noisy machine: each comparison is a ratio of steady tok/s (over each "
           "run's measured window) with a 90% confidence interval from the runs, each "
           "configuration's variance moderated toward what all of them share (an empirical-Bayes "
           "prior; Welch-Satterthwaite's df); a directional claim needs its interval above no "
           "change and an estimate of "
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


def _box_section(w: Writer, runs: pd.DataFrame, records: list) -> None:
    """The kernel's conditions beside every run: read-ahead, file advice, DAMON, THP, writeback."""
    w.text("### The box beside the runs\n")
    w.text("Every run record carries these; the table shows each run's values (median over its "
           "repeats). `read_ahead_kb` is the models' device read-ahead in force; llama.cpp's "
           "`posix_fadvise` advice on the file doubles it for faults on the mapping. "
           "`damon_pageout_bytes` is what the host's DAMON `pageout` scheme (not ours to change) "
           "reclaimed machine-wide during the run; `dirtied` bytes are page-cache pages the run "
           "made dirty, `cgroup_write` what its own cgroup wrote to disk, `device_write` what the "
           "whole disk wrote.\n")
    box = tables.box_conditions(runs)
    if box is not None:
        w.table("box_conditions", box, "harness_run")
    host = tables.damon_schemes(records)
    if host is None:
        return
    thp, damon = host
    w.text(f"Transparent huge pages: enabled `{thp.get('enabled')}`, defrag "
           f"`{thp.get('defrag')}`.\n")
    if len(damon):
        w.text("DAMON on this host (recorded, never changed by the pipeline). A `pageout` scheme "
               "evicts regions idle for its minimum age, machine-wide and outside the run's "
               "cgroup: it can evict the model's page cache between a configuration's layers "
               "and tokens, more the slower the configuration, and cannot touch mlocked pages, "
               "so it may add to the gain of mlock.\n")
        w.table("damon", damon, "harness_run")


def _quota_section(w: Writer, q: tables.Quota | None) -> None:
    if q is None:
        return
    rec = q.record
    w.text(f"CPU quota in force: **{sig(rec.get('cpu_quota'))}** CPUs ({rec.get('how')}).\n")
    if q.dense_off_target is not None:
        w.text(f"Dense compute ceiling under it: {sig(q.dense_tok_s)} "
               f"tok/s, {q.dense_off_target:+.0%} from the {rec['target_tok_s']} tok/s target "
               f"({'within' if q.within_target else 'outside'} "
               f"{tables.WITHIN_TARGET:.0%}).\n")
    if rec.get("io_share_target"):
        w.text(f"Calibrated toward an I/O-wait share of {rec['io_share_target']} of the steady "
               f"token of pread+madvise+mlock on {rec.get('moe_model')} (cold harness runs, "
               f"harness.run.attribution): reached {sig(rec.get('io_share_at_quota'))}"
               + (f"; {rec['reason']}" if rec.get("reason") else "") + ".\n")
    elif len(q.steps):
        w.text(f"Calibration toward {rec.get('target_tok_s')} tok/s on the dense model "
               f"(llama-bench, warm), each step one measurement:\n")
    if len(q.steps):
        w.table("cpu_quota_calibration", q.steps, "cpu_quota")


def _distance_section(w: Writer, out: Outcome, ceil: tables.CeilingTables, limits: dict) -> None:
    """Every configuration beside its floor (harness.analysis.limit computes it)."""
    w.text("## Distance to the limit\n")
    io = ceil.io_by_path
    w.text("The floor of each configuration, per token of its measured window: the *bytes* any "
           "run must read in that window (Belady's optimal cache, the RAM budget of "
           f"{limits.get('ram_bytes')} bytes less the non-expert tensors, over the window's own "
           "routing, started with the best possible contents, so that no credit for what was "
           "resident is needed; slabs of unequal size counted at the smallest), read at the "
           "fastest rate the I/O ceiling measured for the configuration's read path "
           f"(`io_mb_per_s`: O_DIRECT {sig(io['O_DIRECT'] / 1e6)}, buffered read "
           f"{sig(io['buffered read'] / 1e6)}, fault {sig(io['fault'] / 1e6)} "
           "MB/s); the "
           "*CPU*: the model's fully cached compute ceiling under this regime's quota (its "
           "fastest llama-bench repetition under any wait policy its runs use) plus the "
           "kernel CPU those bytes cost at the cheapest rate any run of the same read path paid "
           "(`kernel_us_per_mb`), over the CPUs the run may use. With perfect overlap the larger "
           "of the two, with none their sum. `x_from_floor`: how many times slower the "
           "configuration (its median steady tok/s) is than its perfect-overlap floor. A repeat "
           "faster than its floor, or reading fewer bytes in its window than it "
           "(`window_read_bytes_per_token`), is a **bound error**: the floor is wrong (a repeat "
           "flagged as disturbed is not judged).\n")
    if "distance_to_limit" not in out.tables:
        return
    w.table("distance_to_limit", out.tables["distance_to_limit"], "findings")
    for note in out.notes:
        w.text(note + "\n")
    bad = out.tables.get("bound_errors")
    if bad is not None and len(bad):
        w.text(f"**Bound errors: {len(bad)} repeat(s) beat their floor.**\n")
        w.table("bound_errors", bad, "findings")
    else:
        w.text("Bound errors: none (no repeat beat its floor).\n")
