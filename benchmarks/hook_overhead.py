"""Benchmark (not a test): the routing hook's overhead on the full-size synthetic OLMoE Q4_K_M,
everything cached, no limits: harness mechanism `none` vs llama-bench `tg` on the same model and
threads, interleaved, several repeats each. Prints one JSON line per measurement and a summary.

    python benchmarks/hook_overhead.py results/models/olmoe-q4.gguf [repeats] [tokens]
"""

import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import pagecache, supervise
from harness.ceilings import llama_bench
from harness.config import adhoc_spec
from harness.limits import Limits


def main():
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
    model = Path(sys.argv[1]).resolve()
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    manifest = json.loads((ROOT / "results/build/llama.json").read_text())
    info = json.loads(model.with_suffix(".json").read_text())
    layout = str(model.with_name(model.stem + ".layout.json"))
    pagecache.warm(model)
    harness_tps, bench_tps = [], []
    for k in range(repeats):
        with tempfile.TemporaryDirectory() as d, open(Path(d) / "bench.log", "w") as logf:
            b = llama_bench(manifest["llama_bench"], str(model), 2, tokens, "mmap", Limits(),
                            manifest["lib_dir"], logf)
            bench_tps.append(b["tok_per_s"])
            spec = adhoc_spec("hook-overhead", info["name"], "none", entry="bench",
                              log_experts=False, tokens=tokens, repeats=repeats, time_limit_s=3600,
                              repeat=k + 1, warm=True)
            rec = supervise.run(spec, Path(d) / "run", lib_dir=manifest["lib_dir"], build=manifest,
                                model_info=info, layout_path=layout, limits=Limits(),
                                time_limit_s=3600)
            import pandas as pd

            tok = pd.read_csv(Path(d) / "run" / "tokens.csv")
            gen = tok[tok.phase == "gen"]
            harness_tps.append(len(gen) / gen.wall_s.sum())
        print(json.dumps({"repeat": k + 1, "llama_bench_tg": bench_tps[-1],
                          "harness_none": harness_tps[-1], "status": rec["status"]}), flush=True)
    mh, mb = statistics.median(harness_tps), statistics.median(bench_tps)
    print(json.dumps({"median_harness_none": mh, "median_llama_bench_tg": mb,
                      "harness_over_bench": mh / mb, "overhead_pct": 100 * (1 - mh / mb),
                      "harness_samples": harness_tps, "bench_samples": bench_tps}))


if __name__ == "__main__":
    main()
