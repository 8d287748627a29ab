"""Benchmark (not a test): what the routing hook costs a fully cached token.

The same worker on the full-size model, everything cached, no limits (or the profile's CPU quota
with --quota), with the hook off (no eval callback: the bare decode), native (harness/build/hook.c
answers the scheduler, only routing nodes reach Python) and python (every node asks Python),
beside llama-bench --repack 0 (the same kernels), interleaved, several rounds. Reports tok/s per
measurement, the hook's cost per token in milliseconds (on - off), median and range over the
rounds, the on/off and on/llama-bench ratios, and the hook time the runs themselves recorded.

Process-to-process noise on a shared VM is several percent, more than the cost being measured, so
each round also runs the in-process A/B: one worker whose hook is switched off for every other
token (WorkerParams.hook_ab), on/off = mean wall of its off tokens / mean wall of its on tokens.
Adjacent tokens share the process, its mapping and the machine's moment.

    python benchmarks/hook_overhead.py results/models/olmoe-q4.gguf [rounds] [tokens] [--quota]

rounds defaults to 6 and tokens to 64: a cached token is ~35 ms here, so 16 tokens is half a
second, which the shared machine's noise swamps.
"""

import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from fullsize import ROOT, arguments, inputs, worker_run

import pandas as pd

from harness.parameters import BY_NAME
from harness.analysis import window
from harness.box import pagecache
from harness.stages.ceilings import llama_bench
from harness.config import adhoc_spec, study_profiles
from harness.profiles import cpu_quota_of
from harness.box.limits import Limits
from harness.box.identity import machine_info

MODES = ("off", "native", "python")


# what each measurement ran under, from its own record: the benchmark's output names them
CONDITIONS: list[dict] = []


def note_conditions(what: str, rec) -> None:
    box = rec.box
    # what was set, not what the run did under it (its peak memory, an OOM kill)
    limits = {k: v for k, v in rec.limits_in_force.items()
              if k not in ("peak_cgroup_bytes", "oom_killed")}
    CONDITIONS.append({"what": what, "limits_in_force": limits,
                       "damon_applied": box.get("damon_applied_during_run")})


def generated_rows(model, info, layout, manifest, mode, tokens, k, limits, ab=False) -> pd.DataFrame:
    """tokens.csv's generated rows of one worker run of demand paging, fully cached."""
    spec = adhoc_spec(f"hook-{mode}", info["name"], "none", entry="bench", log_experts=False,
                      tokens=tokens, time_limit_s=3600, repeat=k, warm=True, hook=mode, hook_ab=ab)
    gen, rec = worker_run(spec, manifest, info, layout, limits)
    note_conditions(f"hook-{mode}{' A/B' if ab else ''} round {k}", rec)
    return gen


def harness_tok_s(gen: pd.DataFrame) -> tuple[float, float]:
    """Steady tok/s of the generated tokens, as the pipeline reports a run (after the warm-up
    these runs take, the registry's: llama-bench runs a warm-up first), and the hook time the
    run recorded per token (ms)."""
    return (window.steady_rate(gen, BY_NAME["warmup_tokens"].default),
            1000 * float(gen.hook_s.median()))


def ab_ratio(gen: pd.DataFrame) -> tuple[float, float]:
    """An A/B run's on/off tok/s ratio and the hook's cost per token (ms), over its token pairs."""
    on, off = gen[gen.hook_on == 1].wall_s, gen[gen.hook_on == 0].wall_s
    if len(on) < 2 or abs(len(on) - len(off)) > 1:
        raise SystemExit(f"A/B run: {len(on)} tokens with the hook on, {len(off)} off")
    return off.mean() / on.mean(), 1000 * (on.mean() - off.mean())


def spread(values) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main():
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
    model, rounds, tokens = arguments(default_rounds=6)
    cfg = yaml.safe_load((ROOT / "config/experiments.yaml").read_text())
    quota_file = ROOT / f"results/ceilings/{study_profiles(cfg)[0]}/cpu_quota.json"
    quota = cpu_quota_of(str(quota_file)) if "--quota" in sys.argv else None
    limits = Limits(cpu_quota=quota, device_path=str(model))
    manifest, info, layout = inputs(model)
    pagecache.warm(model)
    samples = {m: [] for m in (*MODES, "llama-bench --repack 0")}  # process level, tok/s
    recorded = {m: [] for m in MODES}  # the hook time each run wrote into tokens.csv (ms/token)
    ab = {m: {"ratio": [], "cost_ms": []} for m in MODES[1:]}  # in-process A/B, per round
    bench = "llama-bench --repack 0"
    processes = (*MODES, bench)
    for k in range(1, rounds + 1):
        # the order rotates each round, so a drift of the shared machine does not favour one
        # measurement, llama-bench included
        for mode in processes[k % 4:] + processes[:k % 4]:
            if mode == bench:
                with tempfile.TemporaryDirectory() as d, open(Path(d) / "bench.log", "w") as logf:
                    b = llama_bench(manifest["llama_bench"], str(model), 2, tokens, "mmap", limits,
                                    manifest["lib_dir"], logf, ("--repack", "0"))
                samples[bench].append(b["tok_per_s"])
                note_conditions(f"{bench} round {k}", b)
                continue
            tok_s, hook_ms = harness_tok_s(generated_rows(model, info, layout, manifest, mode,
                                                          tokens, k, limits))
            samples[mode].append(tok_s)
            recorded[mode].append(hook_ms)
        for mode in ab:
            ratio, cost = ab_ratio(generated_rows(model, info, layout, manifest, mode, 2 * tokens,
                                                  k, limits, ab=True))
            ab[mode]["ratio"].append(ratio)
            ab[mode]["cost_ms"].append(cost)
        print(json.dumps({"round": k, **{m: s[-1] for m, s in samples.items()},
                          **{f"{m} A/B on/off": v["ratio"][-1] for m, v in ab.items()}}), flush=True)
    off = samples["off"]
    summary = {"model": str(model), "tokens": tokens, "rounds": rounds, "cpu_quota": quota,
               "machine": machine_info(), "build": manifest["key"], "hook_lib": manifest["hook_lib"],
               # every distinct set of limits the measurements ran under (read-ahead included),
               # and the DAMON work applied during any of them
               "limits_in_force": [json.loads(x) for x in sorted({json.dumps(c["limits_in_force"],
                                                                  sort_keys=True) for c in CONDITIONS})],
               "damon_applied": [c for c in CONDITIONS if c["damon_applied"] and any(
                   v.get("sz_applied") for v in c["damon_applied"].values())]}
    for mode in ("native", "python"):
        cost_ms = [1000 * (1 / on - 1 / o) for on, o in zip(samples[mode], off, strict=True)]
        ratio = [on / o for on, o in zip(samples[mode], off, strict=True)]
        summary[mode] = {"cost_ms_per_token_median": statistics.median(cost_ms),
                         "cost_ms_min": min(cost_ms), "cost_ms_max": max(cost_ms),
                         "on_over_off_median": statistics.median(ratio),
                         "on_over_off_min": min(ratio), "on_over_off_max": max(ratio),
                         "recorded_hook_ms_per_token_median": statistics.median(recorded[mode])}
        summary[mode]["on_over_llama_bench_median"] = statistics.median(
            on / b for on, b in zip(samples[mode], samples[bench], strict=True))
    # the bare worker against the stock tool with the same kernels: what is not the hook's
    summary["off_over_llama_bench"] = spread([o / b for o, b in zip(off, samples[bench], strict=True)])
    summary["in_process_ab"] = {m: {"on_over_off": spread(v["ratio"]),
                                    "cost_ms_per_token": spread(v["cost_ms"])}
                                for m, v in ab.items()}
    summary["tok_per_s_median"] = {m: statistics.median(s) for m, s in samples.items()}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
