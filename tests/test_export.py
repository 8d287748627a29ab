"""llama-bench-shaped records, latency percentiles and the study's progress line, on hand-made
run trees with known answers."""

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis import latency
from harness.report import export
from harness.run import progress


def make_run(root: Path, run_id: str, repeat: int, prompt_s: float, token_s: list[float],
             wall_s: float = 100.0) -> dict:
    d = root / "results/runs" / run_id / f"rep{repeat}"
    d.mkdir(parents=True)
    rows = [{"index": -1, "phase": "prompt", "n_tokens": 8, "wall_s": prompt_s}]
    rows += [{"index": i, "phase": "gen", "n_tokens": 1, "wall_s": t} for i, t in enumerate(token_s)]
    pd.DataFrame(rows).to_csv(d / "tokens.csv", index=False)
    (d / "run.json").write_text(json.dumps({
        "run_id": run_id, "wall_s": wall_s, "start_utc": "2026-12-04T07:00:00",
        "model": {"name": "olmoe-q4", "quant": "Q4_K_M", "path": "/nowhere.gguf"},
        "build": {"commit": "0c1e57098bba43ac"}, "machine": {"cpu_model": "EPYC"},
        "limits_in_force": {"cpu_quota": 0.1}}))
    return {"run_id": run_id, "repeat": repeat, "threads": 2, "mechanism": "none",
            "mlock_non_expert": False, "synthetic": True, "status": "ok", "profile": "seed-box",
            "regime": "cpu-bound", "steady_tok_per_s": 1.0, "prompt_tok_per_s": 8 / prompt_s,
            "record": f"results/runs/{run_id}/rep{repeat}/run.json"}


def test_llama_bench_records_carry_its_field_names_and_ours(tmp_path):
    runs = pd.DataFrame([make_run(tmp_path, "a", 1, 2.0, [3.0, 1.0, 1.0, 2.0]),
                         make_run(tmp_path, "a", 2, 2.0, [3.0, 1.0, 1.0, 1.0])])
    out = tmp_path / "llama-bench.jsonl"
    assert export.write_jsonl(runs, tmp_path, out) == 2
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    r = recs[0]
    for field in ("build_commit", "model_filename", "model_type", "model_size", "n_threads",
                  "n_prompt", "n_gen", "avg_ts", "stddev_ts", "samples_ts"):
        assert field in r, field
    assert r["build_commit"] == "0c1e570" and r["n_prompt"] == 8 and r["n_gen"] == 4
    # the steady tokens (the first left out): 1, 1, 2 s -> 1, 1, 0.5 tok/s
    assert r["samples_ts"] == [1.0, 1.0, 0.5] and r["avg_ts"] == pytest.approx(2.5 / 3)
    assert r["ttft_s"] == pytest.approx(5.0)  # prompt 2 s + first token 3 s
    assert r["latency_p50_s"] == pytest.approx(1.0) and r["run_id"] == "a" and r["repeat"] == 1


def test_latency_percentiles_per_configuration_over_every_repeats_tokens(tmp_path):
    runs = pd.DataFrame([make_run(tmp_path, "a", 1, 4.0, [9.0] + [1.0] * 99),
                         make_run(tmp_path, "a", 2, 2.0, [9.0] + [1.0] * 96 + [10.0] * 3)])
    t = latency.latency_table(runs, tmp_path).set_index("run_id")
    assert t.loc["a", "tokens"] == 198
    assert t.loc["a", "latency_p50_s"] == 1.0 and t.loc["a", "latency_p99_s"] > 1.0
    assert t.loc["a", "ttft_s_median"] == pytest.approx(12.0)  # 13 and 11
    assert t.loc["a", "prompt_tok_per_s_median"] == pytest.approx(3.0)  # 2 and 4 tok/s


def test_progress_counts_finished_runs_and_corrects_the_estimate_by_them(tmp_path):
    dirs = [f"results/runs/r{i}/rep1" for i in range(4)]
    first = progress.line(dirs, dirs[0], tmp_path)
    assert first.startswith("run 1 of 4") and "8 min" in first  # 4 x the expected 120 s
    for i, wall in ((0, 60.0), (1, 90.0)):
        make_run(tmp_path, f"r{i}", 1, 1.0, [1.0], wall_s=wall)
    third = progress.line(dirs, dirs[2], tmp_path)
    assert third.startswith("run 3 of 4") and "median of 2 finished run(s) 75 s" in third
    assert "about 2 min" in third  # two runs left at 75 s
