"""Benchmark (not a test): routing statistics of a synthetic OLMoE-like model after a 64-token
greedy decode with mechanism `none`: how many experts take 80% of a layer's routings, distinct
experts per layer, and the share of routed experts that tokens 1 and 8 apart have in common.
This is how the generator's knobs in harness.models.synthetic were chosen. Shapes: default a 4-layer
512-dim 64-expert model (~15 s); --deep the full shape's 16 layers and 2048-dim attention with
8x narrower experts (~50 s); --full the pipeline's full-size shape (a 4.2 GB file, ~6 min).

    python benchmarks/routing_calibration.py [MATRIX ROUTER [EMBED_SHARED RECENCY QK_NORM_GAIN [RECENCY_PAIRS]]] [--deep|--full]

Study (OLMoE-1B-7B): 80% of routings on 20-33 of 64, 44-59 distinct, 35.7% shared at d=1, 20.8% at
d=8. Measured here 2026-12-03 (80% / distinct / d1 / d8; all outputs in
benchmarks/results/routing_calibration-2026-12-03.txt):
    scales only (1.5 4.0), 4-layer:       28 / 59   / 0.288 / 0.257
    scales only, --deep:                  25 / 54   / 0.328 / 0.313
    scales only, --full:                  25.5 / 54.5 / 0.301 / 0.281
    0.5 2.5 2.0 32, 4-layer:              27 / 57   / 0.357 / 0.242
    0.5 2.5 2.0 32, --full:               29 / 59   / 0.279 / 0.230
    0.3 6.0 1.5 64, --deep:               29.5 / 60 / 0.295 / 0.229
    0.3 6.0 1.5 64, --full (chosen):      29 / 59   / 0.306 / 0.225
"""

import dataclasses
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd

from harness.models import synthetic
from harness.analysis import traces
from harness.models.layout import read_layout
from harness.util import atomic_write_json


def main():
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if args:
        synthetic.MATRIX_SCALE, synthetic.ROUTER_SCALE = float(args[0]), float(args[1])
    if len(args) > 2:
        synthetic.EMBED_SHARED, synthetic.RECENCY = float(args[2]), float(args[3])
        synthetic.QK_NORM_GAIN = float(args[4])
    if len(args) > 5:
        synthetic.RECENCY_PAIRS = int(args[5])
    man = json.loads((ROOT / "results/build/llama.json").read_text())
    if "--full" in sys.argv:  # the pipeline's own full-size shape (a 4.2 GB file, minutes)
        shape = synthetic.SHAPES["olmoe-1b-7b"]
    elif "--deep" in sys.argv:  # the full shape's depth and attention, experts 8x narrower
        shape = dataclasses.replace(synthetic.SHAPES["olmoe-1b-7b"], name="calibration-deep", n_ff=128)
        synthetic.SHAPES["calibration-deep"] = shape
    else:
        shape = synthetic.Shape("olmoe", "calibration", n_layer=4, n_embd=512, n_ff=256, n_head=4,
                             n_head_kv=4, n_vocab=50304, vocab_file="models/ggml-vocab-gpt-neox.gguf",
                             context_length=4096, rms_eps=1e-5, rope_freq_base=10000.0, n_expert=64,
                             n_expert_used=8)
        synthetic.SHAPES["calibration"] = shape
    with tempfile.TemporaryDirectory() as tmp:
        measure(man, shape, Path(tmp))


def measure(man: dict, shape, d: Path) -> None:
    f16, q = d / "f16.gguf", d / "q4.gguf"
    synthetic.write_f16(shape, 1, Path(man["source_tree"]) / shape.vocab_file, f16)
    synthetic.quantize(man, f16, q, "Q4_K_M", 2, log_file=subprocess.DEVNULL)
    atomic_write_json(d / "layout.json", read_layout(q))
    os.makedirs(d / "run")
    (d / "params.json").write_text(json.dumps({
        "out_dir": str(d / "run"), "layout": str(d / "layout.json"), "lib_dir": man["lib_dir"],
        "model_path": str(q), "mlock_non_expert": False, "mechanism": "none",
        "prompt": "The history of the Roman Empire begins with", "tokens": 64, "threads": 2,
        "log_experts": True}))
    subprocess.run([sys.executable, "-m", "harness.run.worker", str(d / "params.json")],
                   stderr=subprocess.DEVNULL, check=True)
    ex = pd.read_csv(d / "run/experts.csv.part")
    sk, loc = traces.skew(ex), traces.locality(ex)
    print(json.dumps({"recipe": synthetic.weight_recipe(), "shape": shape.name,
                      "experts_for_80pct_median": float(sk.experts_for_80pct.median()),
                      "distinct_median": float(sk.distinct_experts.median()),
                      "shared_d1": float(loc.shared_fraction.iloc[0]),
                      "shared_d8": float(loc.shared_fraction.iloc[7])}))


if __name__ == "__main__":
    main()
