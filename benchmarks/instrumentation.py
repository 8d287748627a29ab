"""Benchmark (not a test): what the harness's instrumentation costs each mechanism's token.

Per mechanism, the full-size model fully cached (no limits, `keep_cache`: seconds between the
paired runs), two runs per round in alternating order: every token measured like a warm-up
token (`warmup_tokens` = tokens: the routing hook's residency checks, cachestat or mincore of
every routed slab before and after the mechanism, on every token) and every token after the first
measured like a window token (`warmup_tokens` = 1: the hook reads the routing and runs the
mechanism, nothing more). The ratio of their mean decode times over tokens 2..n is what the
residency checks cost a token, which the pipeline keeps out of every figure it compares; the
rest of the hook (reading the routing, the expert log's copy) is in both and is measured, for
`none`, by benchmarks/harness_vs_llama_bench.py against llama-bench.

    python benchmarks/instrumentation.py results/models/olmoe-q4.gguf [rounds] [tokens]

rounds defaults to 4 and tokens to 32. Results are printed as JSON (keep them in
benchmarks/results/).
"""

import json
import math
import statistics
import sys

from fullsize import arguments, inputs, worker_run  # puts the checkout on sys.path

from scipy import stats as sps

from harness.box.identity import machine_info
from harness.box.limits import Limits
from harness.config import adhoc_spec

MECHANISMS = ("none", "madvise", "pread+madvise", "odirect-cache")


def decode_s(model, info, layout, manifest, mechanism, tokens, warmup, k) -> float:
    """Mean decode wall time of generated tokens 2..n of one fully cached run."""
    spec = adhoc_spec(f"instr-{mechanism}-{warmup}-{k}", info["name"], mechanism, entry="bench",
                      tokens=tokens, warmup_tokens=warmup, time_limit_s=3600, repeat=k,
                      warm=True, keep_cache=True)
    gen, _ = worker_run(spec, manifest, info, layout, Limits(device_path=str(model)))
    return float(gen.wall_s.iloc[1:].mean())


def main() -> int:
    model, rounds, tokens = arguments(4)
    if tokens == 64 and len(sys.argv) < 4:
        tokens = 32
    manifest, info, layout = inputs(model)
    out = {"machine": machine_info(), "model": str(model), "rounds": rounds, "tokens": tokens,
           "mechanisms": {}}
    for mech in MECHANISMS:
        ratios = []
        for k in range(rounds):
            order = (tokens, 1) if k % 2 == 0 else (1, tokens)  # alternate which runs first
            t = {w: decode_s(model, info, layout, manifest, mech, tokens, w, k) for w in order}
            ratios.append(t[tokens] / t[1])
        logs = [math.log(r) for r in ratios]
        m = statistics.mean(logs)
        half = (sps.t.ppf(0.95, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
                if len(logs) > 1 else float("inf"))
        out["mechanisms"][mech] = {
            "checks_every_token_over_window_tokens": math.exp(m),
            "ci90": [math.exp(m - half), math.exp(m + half)], "rounds": ratios}
        print(f"{mech}: residency checks cost {math.exp(m) - 1:+.1%} of a token "
              f"(90% CI {math.exp(m - half) - 1:+.1%} to {math.exp(m + half) - 1:+.1%})",
              file=sys.stderr)
    print(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
