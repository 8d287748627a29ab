"""The formats people who benchmark LLM inference already read: one JSON Lines record per
configuration and repeat in llama-bench's field names (as `llama-bench -o jsonl` writes them, so
llama.cpp's own comparison scripts can read it), with this pipeline's own fields beside them
(the latency table per configuration is harness.analysis.latency's).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from harness.record import RunRecord, measured_window, read_run

from harness.analysis.latency import PERCENTILES, generated as _generated, ttft as _ttft


def llama_bench_record(run: pd.Series, record: RunRecord, root: Path) -> dict:
    """One run as llama-bench's JSON record (its field names where they apply) plus ours."""
    prompt, gen = _generated(root / run.record)
    steady = measured_window(gen, record.spec.warmup_tokens)
    ts = (1.0 / steady.wall_s).to_numpy(float) if len(steady) else np.array([])
    model, build, machine = record.model, record.build, record.machine
    lat = steady.wall_s.to_numpy(float)
    return {
        # llama-bench's fields
        "build_commit": (build.get("commit") or "")[:7], "build_number": 0,
        "cpu_info": machine.get("cpu_model"), "gpu_info": "", "backends": "CPU",
        "model_filename": model.path, "model_type": f"{model.name} {model.quant}",
        "model_size": _size(model.path), "model_n_params": None,
        "n_batch": None, "n_ubatch": None, "n_threads": int(run.threads),
        "type_k": "f16", "type_v": "f16", "n_gpu_layers": 0, "use_mmap": True, "embeddings": False,
        "n_prompt": int(prompt.n_tokens.sum()) if len(prompt) else 0, "n_gen": int(len(gen)),
        "test_time": record.start_utc,
        "avg_ns": int(np.mean(lat) * 1e9) if len(lat) else None,
        "stddev_ns": int(np.std(lat, ddof=1) * 1e9) if len(lat) > 1 else 0,
        "avg_ts": float(np.mean(ts)) if len(ts) else None,
        "stddev_ts": float(np.std(ts, ddof=1)) if len(ts) > 1 else 0.0,
        "samples_ns": [int(x * 1e9) for x in lat], "samples_ts": [float(x) for x in ts],
        # this pipeline's
        "run_id": run["run_id"], "repeat": int(run["repeat"]), "profile": run.get("profile"),
        "rerun": bool(run.get("rerun", False)), "disturbed": bool(run.get("disturbed", False)),
        "mechanism": run.mechanism, "mlock_non_expert": bool(run.mlock_non_expert),
        "synthetic": bool(run.synthetic), "status": run.status, "regime": run.get("regime"),
        "steady_tok_per_s": run.get("steady_tok_per_s"), "ttft_s": _ttft(prompt, gen),
        "prompt_tok_per_s": run.get("prompt_tok_per_s"),
        **{f"latency_p{p}_s": float(np.percentile(lat, p)) if len(lat) else None
           for p in PERCENTILES},
        "limits_in_force": record.limits_in_force, "record": run.record,
    }


def _size(path) -> int | None:
    try:
        return Path(path).stat().st_size
    except (OSError, TypeError):
        return None


def write_jsonl(runs: pd.DataFrame, root: Path, out: Path) -> int:
    """results/final/llama-bench.jsonl: one line per configuration and repeat."""
    lines = []
    for _, run in runs.iterrows():
        if not isinstance(run.record, str):
            continue
        record = read_run(root / run.record)
        lines.append(json.dumps(llama_bench_record(run, record, root), default=str))
    out.write_text("\n".join(lines) + ("\n" if lines else ""))
    return len(lines)
