"""Benchmark (not a test): the whole harness against llama-bench on the same kernels.

The harness as a user runs it (`none`, every default: the native routing hook, the expert log,
the per-token counters), on the full-size model, fully cached, no limits; beside it the same
worker with the hook off (the bare decode) and `llama-bench --repack 0` (the stock tool on the
same build and weights, with its warm-up, since the harness's steady rate leaves the first token
out), interleaved in a rotating order for several rounds. The model stays cached throughout
(`keep_cache`: no eviction and re-read before each harness run), so paired measurements are
seconds apart, not a 4 GB read apart: this VM's speed drifts on that scale. Each round also runs the in-process A/B
(the hook switched off for every other token of one worker), which measures the hook's cost
without the process-to-process noise.

What a harness token costs beyond llama-bench's, in two clocks:
  - reported: the decode's own clock (tokens.csv wall_s), which every tok/s of the pipeline uses;
    the routing hook runs inside it.
  - end to end: the decode plus the harness's work between two decodes (tokens.csv harness_s:
    the per-token counters, the row, the logits check, the expert log); what the run's wall clock
    pays, not its tok/s.

Per round the ratio harness / llama-bench in each clock; over the rounds their geometric mean
with a 90% Student-t interval on the log ratios (rounds are paired: adjacent in time), and the
in-process decomposition: the hook's share of a token (A/B) and the harness's share between
decodes (harness_s over the decode).

    python benchmarks/harness_vs_llama_bench.py results/models/olmoe-q4.gguf [rounds] [tokens]

rounds defaults to 8 and tokens to 64. Results of a run are kept in benchmarks/results/.
"""

import json
import logging
import math
import statistics
import sys
import tempfile
from pathlib import Path

from fullsize import arguments, inputs, worker_run  # puts the checkout on sys.path

import pandas as pd
from scipy import stats as sps

from harness.parameters import BY_NAME
from harness.analysis import window
from harness.box import pagecache
from harness.stages.ceilings import llama_bench
from harness.box.identity import machine_info
from harness.box.limits import Limits
from harness.config import adhoc_spec
from harness.analysis import attribution
from harness.run import supervise

LEVEL = 0.90
BENCH = "llama-bench --repack 0"


def harness_run(model, info, layout, manifest, tokens, k, limits, **switches) -> tuple[pd.DataFrame, dict]:
    """One worker run of `none`, fully cached: its generated rows and its record. Every parameter
    is the default a user gets unless `switches` say otherwise (hook, hook_ab)."""
    spec = adhoc_spec(f"harness-{k}", info["name"], "none", entry="bench", tokens=tokens,
                      time_limit_s=3600, repeat=k, warm=True, keep_cache=True, **switches)
    return worker_run(spec, manifest, info, layout, limits)


def rates(gen: pd.DataFrame) -> dict:
    """Steady tok/s (the first generated token left out) in the decode's clock and end to end,
    and the per-token times behind them (ms, medians)."""
    steady = gen.iloc[1:]
    return {"reported": window.steady_rate(gen, BY_NAME["warmup_tokens"].default),
            "end_to_end": len(steady) / float(steady.wall_s.sum() + steady.harness_s.sum()),
            "decode_ms": 1000 * float(steady.wall_s.median()),
            "hook_ms": 1000 * float(steady.hook_s.median()),
            "harness_between_ms": 1000 * float(steady.harness_s.median()),
            "harness_between_share": attribution.between_share(
                gen, BY_NAME["warmup_tokens"].default)}


def ab_share(gen: pd.DataFrame) -> float:
    """The hook's share of a token from an A/B run: 1 - mean wall off / mean wall on."""
    on, off = gen[gen.hook_on == 1].wall_s.iloc[1:], gen[gen.hook_on == 0].wall_s
    if len(on) < 2 or len(off) < 2:
        raise SystemExit(f"A/B run: {len(on)} tokens with the hook on, {len(off)} off")
    return 1 - off.mean() / on.mean()


def geo_interval(ratios: list[float]) -> dict:
    """Geometric mean of paired ratios with a Student-t interval on their logs."""
    logs = [math.log(r) for r in ratios]
    n, mean = len(logs), statistics.fmean(logs)
    half = (sps.t.ppf(0.5 + LEVEL / 2, n - 1) * statistics.stdev(logs) / math.sqrt(n)
            if n > 1 else float("nan"))
    return {"geomean": math.exp(mean), "ci_low": math.exp(mean - half),
            "ci_high": math.exp(mean + half), "level": LEVEL, "n": n,
            "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def main():
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
    model, rounds, tokens = arguments(default_rounds=8)
    limits = Limits(device_path=str(model))
    manifest, info, layout = inputs(model)
    pagecache.warm(model)
    start = supervise.utcnow()
    order = ("harness", "bare", BENCH)
    per_round, policies = [], set()
    for k in range(1, rounds + 1):
        row = {"round": k}
        # the order rotates each round, so a drift of the shared machine favours no process
        for what in order[k % 3:] + order[:k % 3]:
            if what == BENCH:
                with tempfile.TemporaryDirectory() as d, open(Path(d) / "bench.log", "w") as logf:
                    b = llama_bench(manifest["llama_bench"], str(model), 2, tokens, "mmap", limits,
                                    manifest["lib_dir"], logf, ("--repack", "0"), warmup=True)
                if b.get("status") != "ok":
                    raise SystemExit(f"llama-bench failed: {b.get('status')}")
                row[BENCH] = b["tok_per_s"]
                policies.add(("llama-bench", b["omp_wait_policy"]))
                continue
            gen, rec = harness_run(model, info, layout, manifest, tokens, k, limits,
                                   **({"hook": "off"} if what == "bare" else {}))
            policies.add((what, rec.spec.omp_wait_policy))
            row[what] = rates(gen)
        gen, _ = harness_run(model, info, layout, manifest, 2 * tokens, k, limits, hook_ab=True)
        row["hook_share_ab"] = ab_share(gen)
        per_round.append(row)
        h, bench = row["harness"], row[BENCH]
        print(json.dumps({"round": k, "harness reported": h["reported"],
                          "harness end to end": h["end_to_end"], "bare": row["bare"]["reported"],
                          BENCH: bench, "hook share A/B": row["hook_share_ab"],
                          "between share": h["harness_between_share"]}), flush=True)

    def ratios(f):
        return [f(r) / r[BENCH] for r in per_round]

    hook_share = statistics.median(r["hook_share_ab"] for r in per_round)
    between = statistics.median(r["harness"]["harness_between_share"] for r in per_round)
    summary = {
        "benchmark": "benchmarks/harness_vs_llama_bench.py " + " ".join(sys.argv[1:]),
        "model": str(model), "synthetic": json.loads(Path(layout).read_text()).get("synthetic"),
        "tokens": tokens, "rounds": rounds, "start_utc": start, "end_utc": supervise.utcnow(),
        "machine": machine_info(), "build": manifest["key"],
        "omp_wait_policy": sorted(f"{w}: {p}" for w, p in policies),
        # process level, paired by round: harness / llama-bench
        "reported_over_llama_bench": geo_interval(ratios(lambda r: r["harness"]["reported"])),
        "end_to_end_over_llama_bench": geo_interval(ratios(lambda r: r["harness"]["end_to_end"])),
        "bare_over_llama_bench": geo_interval(ratios(lambda r: r["bare"]["reported"])),
        # in process, where the noise between processes does not enter
        "in_process": {
            "hook_share_ab": {"median": hook_share,
                              "min": min(r["hook_share_ab"] for r in per_round),
                              "max": max(r["hook_share_ab"] for r in per_round)},
            "harness_between_share": {
                "median": between,
                "min": min(r["harness"]["harness_between_share"] for r in per_round),
                "max": max(r["harness"]["harness_between_share"] for r in per_round)},
            "harness_between_ms": statistics.median(
                r["harness"]["harness_between_ms"] for r in per_round),
            "hook_recorded_ms": statistics.median(r["harness"]["hook_ms"] for r in per_round),
            "decode_ms": statistics.median(r["harness"]["decode_ms"] for r in per_round),
            # the harness's cost if its bare decode equals llama-bench's: in the reported clock
            # the hook only; end to end the work between decodes too
            "reported_cost_share": hook_share,
            "end_to_end_cost_share": 1 - (1 - hook_share) / (1 + between),
        },
        "tok_per_s_median": {
            "harness reported": statistics.median(r["harness"]["reported"] for r in per_round),
            "harness end to end": statistics.median(r["harness"]["end_to_end"] for r in per_round),
            "bare": statistics.median(r["bare"]["reported"] for r in per_round),
            BENCH: statistics.median(r[BENCH] for r in per_round)},
        "rounds_raw": per_round,
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
