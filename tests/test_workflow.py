"""The real workflow on the small test configuration: every rule, RESULTS.md whose numbers can be
followed to CSV rows, the report, and an interrupted run that finishes when run again."""

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def snakemake(workdir, *args, timeout=1500, check=True):
    res = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
                          "--directory", str(workdir), "--cores", "2", *args],
                         capture_output=True, text=True, timeout=timeout)
    if check:
        assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    return res


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    wd = tmp_path_factory.mktemp("wf")
    shutil.copytree(ROOT / ".test" / "config", wd / "config")
    snakemake(wd, "results/final")
    return wd


def test_dry_run_plans_every_stage(tmp_path):
    shutil.copytree(ROOT / ".test" / "config", tmp_path / "config")
    out = snakemake(tmp_path, "-n", "results/final").stdout
    for rule in ("build_llama", "synthetic_f16", "model", "layout", "io_ceiling", "compute_ceiling", "harness_run_rep2",
                 "stock_baseline", "harness_run_rep1", "runs_table", "findings", "verify_models",
                 "final"):
        assert re.search(rf"^{rule}\s+\d+", out, re.M), rule


def test_final_has_results_plots_and_one_record_per_run(pipeline):
    final = pipeline / "results" / "final"
    assert (final / "RESULTS.md").exists()
    for plot in ("tok_per_s", "majflt_per_token", "time_breakdown", "routing_heatmap", "locality",
                 "cache_simulation", "policy_study"):
        assert (final / "plots" / f"{plot}.png").stat().st_size > 1000, plot
    runs = pd.read_csv(final / "runs.csv")
    cfg = yaml.safe_load((pipeline / "config/experiments.yaml").read_text())
    from harness.config import expand

    expected = {(r.run_id, k) for r in expand(cfg) for k in range(1, r.repeats + 1)}
    # each disturbed first measurement was measured once more, at the end; nothing else was
    every = runs  # the findings judge every repeat nothing disturbed, re-runs included
    reruns, runs = runs[runs.rerun], runs[~runs.rerun]
    assert set(zip(runs.run_id, runs.repeat, strict=True)) == expected
    assert len(runs) == len(expected)
    flagged = json.loads((pipeline / "results/analysis/disturbed.json").read_text())["rerun"]
    assert sorted(zip(reruns.run_id, reruns.repeat)) == sorted((f["run_id"], f["repeat"])
                                                               for f in flagged)
    assert sorted((f["run_id"], f["repeat"]) for f in flagged) == sorted(
        zip(runs[runs.disturbed].run_id, runs[runs.disturbed].repeat))
    if len(reruns):
        assert reruns.start_utc.min() >= runs.end_utc.max()
    # llama-bench's JSON Lines records, one per configuration and repeat
    jsonl = [json.loads(x) for x in (final / "llama-bench.jsonl").read_text().splitlines()]
    jsonl = [r for r in jsonl if not r.get("rerun")]
    assert {(r["run_id"], r["repeat"]) for r in jsonl} == expected
    assert all(r["n_gen"] > 0 and r["avg_ts"] > 0 and r["build_commit"] for r in jsonl)
    lat = pd.read_csv(final / "tables/latency.csv")
    assert (lat.latency_p99_s >= lat.latency_p50_s).all() and (lat.ttft_s_median > 0).all()
    # each run's log says which run of how many it is, with the time left
    logs = "".join(p.read_text() for p in (pipeline / "logs/harness_run").rglob("*.log"))
    assert re.search(rf"run \d+ of {len(expected)} \(results/runs/.*\): about .* left", logs)
    assert (runs.status == "ok").all()
    assert runs.synthetic.all()
    # repeats interleaved: every repeat-1 run ended before any repeat-2 run started
    r1 = runs[runs.repeat == 1].end_utc.max()
    assert r1 <= runs[runs.repeat == 2].start_utc.min()
    # no two measurements overlap in time
    spans = sorted(zip(runs.start_utc, runs.end_utc, strict=True))
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert (runs.residency_at_start < 0.01).all()
    # the longest routing trace feeds findings 2/3; the findings' speed tables hold only the
    # default-length runs, so the longer pread+madvise run is not mixed into its baseline
    text = (final / "RESULTS.md").read_text()
    # prompt 8 + 24 + the 4 the first repeat decodes past its window (.test's later_tokens)
    assert "Routing trace: run `routing-trace` repeat 1 (36 tokens" in text
    # the first repeat of each configuration decoded past its window; the others did not, and
    # no figure counts those tokens
    first = runs[(runs.repeat == 1) & (runs.status == "ok")]
    assert (first.later_tok_per_s > 0).all() and runs[runs.repeat == 2].later_tok_per_s.isna().all()
    assert (runs.tokens_completed == runs.tokens).all()
    assert "The window against the tokens after it" in text
    f7 = pd.read_csv(final / "tables/finding7_switches.csv")
    pm = every[(every.entry == "pread-madvise") & (every.model == "olmoe-q4")
               & ~every.mlock_non_expert]
    # the findings compare steady tok/s (the measured window) of the repeats
    # nothing disturbed: the others stay in runs.csv, flagged, and out of the verdicts
    assert (every.disturbed == (every.flag_reason.fillna("") != "")).all()
    pm = pm[~pm.disturbed]
    assert f7.baseline_pread_madvise_median.iloc[0] == pytest.approx(pm.steady_tok_per_s.median(),
                                                                    rel=1e-3)
    # the bound is a floor on the tiny models' recorded runs: every configuration has one and no
    # repeat beats it. Its compute term is each quant's fastest fully cached llama-bench
    # repetition under every wait policy the runs use (spinning threads decode the tiny models
    # several times faster than passive ones), with llama-bench's warm-up.
    comp = pd.read_csv(final / "tables/compute_ceiling.csv")
    moe_rows = comp[comp.measurement.str.startswith("MoE fully cached, no RAM budget, --repack 0")]
    assert set(moe_rows.model) == {"olmoe-q4", "olmoe-q2"}
    for _, rows in moe_rows.groupby("model"):
        assert set(rows.omp_wait_policy) == set(every.omp_wait_policy)  # passive, libgomp, active
        assert rows.warmup.all() and (rows.repetitions == 5).all()
        assert (rows.fastest_tok_per_s >= rows.tok_per_s).all()
    dist = pd.read_csv(final / "tables/distance_to_limit.csv")
    assert set(dist.run_id) == set(every.run_id)
    assert (dist.floor_perfect_overlap_tok_per_s > 0).all()
    assert (dist.bound_errors == 0).all(), dist[dist.bound_errors > 0]
    assert "Bound errors: none" in text
    # the hook's share of a token, per configuration: its time per token at the median rate
    summ = pd.read_csv(final / "tables/summary.csv")
    assert summ.hook_share.to_numpy() == pytest.approx(
        (summ.hook_s_per_token * summ.tok_per_s_median).to_numpy(), rel=2e-3)  # 4 digits in the CSV
    assert ((summ.hook_share > 0) & (summ.hook_share < 0.5)).all(), summ.hook_share


def test_results_md_numbers_trace_to_named_csvs(pipeline):
    final = pipeline / "results" / "final"
    text = (final / "RESULTS.md").read_text()
    assert "synthetic" in text
    # every table is followed by the CSV it was printed from; check every number in it
    blocks = re.findall(r"((?:^\|.*\|\n)+)\n\*Source: \[(tables/[^\]]+\.csv)\]", text, re.M)
    assert len(blocks) >= 10
    checked = 0
    for table, src in blocks:
        cells = {c.strip() for line in table.splitlines()[2:] for c in line.strip("|").split("|")}
        with open(final / src) as f:
            csv_cells = {c for row in csv.reader(f) for c in row}
        for cell in cells:
            if re.fullmatch(r"-?\d+(\.\d+)?(e[-+]?\d+)?", cell):
                assert cell in csv_cells, (src, cell)
                checked += 1
    assert checked > 50
    assert "rule `" in text


def test_report_builds(pipeline):
    snakemake(pipeline, "--report", "report.html", "results/final")
    html = (pipeline / "report.html").read_text(errors="replace")
    assert "RESULTS" in html or "runs.csv" in html
    assert (pipeline / "report.html").stat().st_size > 100_000


def test_a_disturbed_repeat_is_measured_once_more_at_the_end(pipeline):
    """A repeat whose record says the host stole its CPUs is flagged; the next invocation
    re-runs it once, after everything else, and the verdicts judge the re-run instead."""
    runs = pd.read_csv(pipeline / "results/final/runs.csv")
    victim = runs[~runs.disturbed & ~runs.rerun].iloc[0]
    rec_path = pipeline / victim.record
    rec = json.loads(rec_path.read_text())
    rec["box"]["counters_delta"]["cpu_s"]["steal"] = 2 * rec["wall_s"]  # all of both CPUs
    rec_path.write_text(json.dumps(rec))
    snakemake(pipeline, "results/final")
    flagged = json.loads((pipeline / "results/analysis/disturbed.json").read_text())
    assert {"run_id": victim.run_id, "repeat": int(victim["repeat"]), "flag_reason": "CPU steal"} \
        in flagged["rerun"]
    after = pd.read_csv(pipeline / "results/final/runs.csv")
    mine = after[(after.run_id == victim.run_id) & (after["repeat"] == victim["repeat"])]
    assert sorted(mine.rerun) == [False, True]
    first, again = mine[~mine.rerun].iloc[0], mine[mine.rerun].iloc[0]
    assert first.disturbed and first.flag_reason == "CPU steal"
    # the re-run is a new measurement: the planted steal is not in it (whether the machine
    # disturbed it too is the machine's doing: a tiny model's millisecond tokens often are)
    again_rec = json.loads((pipeline / again.record).read_text())
    assert again_rec["box"]["counters_delta"]["cpu_s"]["steal"] < again_rec["wall_s"]
    assert again.start_utc > after[~after.rerun].end_utc.max()
    assert (pipeline / again.record).parent.name == f"rerun{victim['repeat']}"
    text = (pipeline / "results/final/RESULTS.md").read_text()
    assert "measured once more at the end" in text and victim.run_id in text


MEASUREMENTS = ("harness_run_rep", "harness_rerun", "model", "synthetic_f16", "io_ceiling",
                "compute_ceiling", "cpu_quota", "stock_baseline")


def _reversed_keys(d):
    return {k: _reversed_keys(d[k]) for k in reversed(list(d))} if isinstance(d, dict) else d


def test_edits_that_change_no_measurement_plan_none(pipeline, tmp_path):
    """The same config with its keys in another order, or the build cache moved: nothing is
    measured again (a measurement depends on the build's identity, not where its cache is)."""
    cfg = yaml.safe_load((pipeline / "config/experiments.yaml").read_text())
    edits = {"keys-sorted": (cfg, True), "keys-reversed": (_reversed_keys(cfg), False),
             "cache-moved": ({**cfg, "build": {**cfg["build"],
                                               "cache_dir": str(tmp_path / "cache")}}, False)}
    for what, (c, sort_keys) in edits.items():
        f = tmp_path / f"{what}.yaml"
        f.write_text(yaml.safe_dump(c, sort_keys=sort_keys))
        # the target first: --configfile takes every argument after it as a file
        out = snakemake(pipeline, "-n", "results/final", "--configfile", str(f)).stdout
        for rule in MEASUREMENTS:
            assert not re.search(rf"^{rule}\S*\s+\d+$", out, re.M), (what, rule, out[-3000:])
        outputs = " ".join(re.findall(r"^\s+output: (.*)$", out, re.M))
        planned = re.findall(r"results/runs/([^/\s,]+)/re(?:p|run)\d+/run\.json", outputs)
        assert not planned, (what, planned)


def test_adding_an_entry_plans_only_its_runs(pipeline):
    cfg_path = pipeline / "config/experiments.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["experiments"]["extra"] = {"model": "olmoe-q2", "mechanism": "madvise", "repeats": 1}
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    out = snakemake(pipeline, "-n", "results/final").stdout
    assert re.search(r"^harness_run_rep1\s+1$", out, re.M), out[-2000:]
    # exactly one new measurement: the new entry's, no finished run planned again
    outputs = " ".join(re.findall(r"^\s+output: (.*)$", out, re.M))
    # re-runs of disturbed repeats too: a new record rewrites disturbed.json, and that must not
    # measure a finished re-run again
    planned = set(re.findall(r"results/runs/([^/\s,]+)/re(?:p|run)\d+/run\.json", outputs))
    assert planned == {"extra"}, planned
    for rule in ("build_llama", "model ", "io_ceiling", "compute_ceiling", "stock_baseline"):
        assert not re.search(rf"^{rule}\s+\d+", out, re.M), rule



def test_raising_repeats_plans_only_the_new_repeats(pipeline):
    """`repeats` does not change what a finished repeat measured: raising it plans the new
    rounds only (it once re-measured every repeat of the entry, which was a params change)."""
    cfg_path = pipeline / "config/experiments.yaml"
    before = cfg_path.read_text()
    cfg = yaml.safe_load(before)
    cfg["experiments"]["lru"]["repeats"] = 2
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    try:
        out = snakemake(pipeline, "-n", "results/final").stdout
    finally:
        cfg_path.write_text(before)
    outputs = " ".join(re.findall(r"^\s+output: (.*)$", out, re.M))
    planned = set(re.findall(r"results/runs/([^/\s,]+/re(?:p|run)\d+)/run\.json", outputs))
    assert {p for p in planned if p.startswith("lru")} == {"lru--lru-budget-mb-0/rep2",
                                                           "lru--lru-budget-mb-8/rep2"}, planned
    # and no finished repeat of any entry is planned again
    assert not [p for p in planned if (pipeline / "results/runs" / p / "run.json").exists()]

def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_and_interrupt(workdir, target, sig):
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
                             "--directory", str(workdir), "--cores", "2", target],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            # as at a terminal: a shell's background job (nohup ... &) inherits
                            # SIGINT ignored, which would make the Ctrl-C case a no-op
                            preexec_fn=_default_sigint)
    run_dir = workdir / "results/runs/long/rep1"
    deadline = time.time() + 600
    while time.time() < deadline and not list(run_dir.glob(".work-*/tokens.csv.part")):
        time.sleep(0.2)
    time.sleep(1.0)  # mid-generation
    assert proc.poll() is None, "the run finished before it could be interrupted"
    if sig == signal.SIGINT:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole process group
    else:
        os.killpg(proc.pid, signal.SIGKILL)  # the harshest interruption: no cleanup at all
    proc.wait(timeout=120)
    assert not (run_dir / "run.json").exists()
    return run_dir


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_interrupted_run_finishes_when_run_again(tmp_path, sig):
    shutil.copytree(ROOT / ".test" / "config", tmp_path / "config")
    cfg = yaml.safe_load((tmp_path / "config/experiments.yaml").read_text())
    cfg["experiments"] = {"long": {"model": "olmoe-q4", "mechanism": "pread+madvise", "tokens": 1500,
                                   "repeats": 1}}
    (tmp_path / "config/experiments.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    target = "results/runs/long/rep1/run.json"
    run_dir = _start_and_interrupt(tmp_path, target, sig)
    if sig == signal.SIGKILL:  # a hard kill leaves snakemake's lock, as README says
        snakemake(tmp_path, "--unlock")
    snakemake(tmp_path, target)  # the same command again
    assert (run_dir / "run.json").exists()
    tok = pd.read_csv(run_dir / "tokens.csv")
    # the prompt and 1500 generated tokens (and the 4 past the window .test's first repeat adds)
    assert len(tok[tok.phase != "later"]) == 1501 and tok["index"].is_unique
    assert not list(run_dir.glob(".work-*")) and not list(run_dir.glob("*.part"))
    from harness.box.limits import CGROOT, PARENT

    stale = [d for d in (CGROOT / "memory" / PARENT).glob("run-*")
             if not Path(f"/proc/{d.name.split('-')[1]}").exists()]
    assert not stale  # the killed run's cgroup was reaped


def test_a_study_of_two_regimes_reports_each_and_their_verdicts_side_by_side(tmp_path):
    """profile: [a, b]: every experiment, ceiling and baseline under each profile, one RESULTS.md
    with a section per regime and the verdicts side by side; the CPU-bound regime's runs are
    classified CPU-bound from their attribution."""
    shutil.copytree(ROOT / ".test" / "config", tmp_path / "config")
    cfg = yaml.safe_load((tmp_path / "config/experiments.yaml").read_text())
    cfg["profile"] = ["tiny-box", "tiny-slow"]
    # a fiftieth of a CPU (5 ms a period): at a twentieth a faster machine decoded a 6-token
    # run's millisecond tokens inside one period's quota, never throttled
    cfg["profiles"]["tiny-slow"] = dict(cfg["profiles"]["tiny-box"], cpu_quota=0.02,
                                        description="the tiny models on a fiftieth of a CPU")
    cfg["experiments"] = {k: cfg["experiments"][k] for k in ("baseline", "pread-madvise")}
    cfg["defaults"]["tokens"] = 6
    # threads that spin at barriers: `auto` would make them sleep under these quotas, and a
    # millisecond token's unattributed sleeps make runs "mixed" (measured: 7 of 23 once)
    cfg["defaults"]["omp_wait_policy"] = "libgomp"
    (tmp_path / "config/experiments.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    snakemake(tmp_path, "results/final")
    final = tmp_path / "results/final"
    for p in ("tiny-box", "tiny-slow"):
        assert (tmp_path / f"results/ceilings/{p}/cpu_quota.json").exists()
        assert (final / f"tables/{p}/summary.csv").exists()
    runs = pd.read_csv(final / "runs.csv")
    assert set(runs.profile) == {"tiny-box", "tiny-slow"}
    assert all(r.endswith("@" + p) for r, p in zip(runs.run_id, runs.profile, strict=True))
    slow = runs[runs.profile == "tiny-slow"]
    # on millisecond tokens one unattributed barrier sleep can make a run "mixed" (measured: 1 of
    # 12 once); none is disk-bound, and the runs as a whole wait for CPU
    assert (slow.regime != "disk-bound").all() and (slow.regime == "cpu-bound").mean() >= 0.75
    assert (slow.throttled_share + slow.runqueue_share).median() > 0.5
    text = (final / "RESULTS.md").read_text()
    assert "# Regime: tiny-box" in text and "# Regime: tiny-slow" in text
    verdicts = pd.read_csv(final / "tables/verdicts.csv")
    assert {"tiny-box", "tiny-slow", "same_in_every_regime"} <= set(verdicts.columns)
    assert list(verdicts.finding.astype(str)) == ["1a", "1b", "2", "3", "4", "5", "6", "7", "8", "9",
                                                  "10", "11", "12", "13"]
    # the comparison of machines reads the whole tables, each row naming its regime
    assert set(pd.read_csv(final / "tables/summary.csv").profile) == {"tiny-box", "tiny-slow"}
    assert (final / "plots/attribution.png").stat().st_size > 1000
