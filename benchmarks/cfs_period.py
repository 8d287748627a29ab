"""Benchmark (not a test): does the CFS period of the CPU quota make seed-box's runs differ from
each other? The same quota (CPUs) at several periods, the dense model's llama-bench decode (the
calibration's measurement: CPU-bound, warm, 2 threads, llama-bench's warm-up), rounds of one
measurement per period in rotating order, so that the machine's drift falls on every period
alike. Per period: the rate's median and the SD of log tok/s between measurements, against
limits.CPU_PERIOD_US's 250 ms.

    python benchmarks/cfs_period.py results/models/qwen-q8.gguf QUOTA [rounds] [tokens]
        [--periods-ms 250,100,500]

QUOTA in CPUs (results/ceilings/seed-box/cpu_quota.json's cpu_quota); rounds default to 6,
tokens to 32. Prints JSON (keep it in benchmarks/results/).
"""

import json
import math
import statistics
import sys
import tempfile

from fullsize import ROOT  # puts the checkout on sys.path

from harness.box import limits as box_limits
from harness.box import pagecache
from harness.stages.ceilings import llama_bench
from harness.box.identity import machine_info
from harness.box.limits import Limits


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) < 2:
        raise SystemExit(__doc__)
    model, quota = args[0], float(args[1])
    rounds = int(args[2]) if len(args) > 2 else 6
    tokens = int(args[3]) if len(args) > 3 else 32
    flag = next((a for a in sys.argv[1:] if a.startswith("--periods-ms=")), "--periods-ms=250,100,500")
    periods = [int(float(p) * 1000) for p in flag.split("=", 1)[1].split(",")]
    manifest = json.loads((ROOT / "results/build/llama.json").read_text())
    pagecache.warm(model)
    rates: dict[int, list] = {p: [] for p in periods}
    in_force: dict[int, list] = {p: [] for p in periods}  # what each measurement's cgroup held
    for k in range(rounds):
        order = periods[k % len(periods):] + periods[:k % len(periods)]
        for p in order:
            box_limits.CPU_PERIOD_US = p  # read when the run's cgroup is made
            with tempfile.NamedTemporaryFile("w", suffix=".log") as log:
                rec = llama_bench(manifest["llama_bench"], model, 2, tokens, "mmap",
                                  Limits(device_path=model, cpu_quota=quota), manifest["lib_dir"],
                                  log, warmup=True)
            rates[p].append(rec["tok_per_s"])
            in_force[p].append(rec["limits_in_force"])
            print(f"round {k + 1}: period {p / 1000:g} ms {rec['tok_per_s']} tok/s", file=sys.stderr)
    out = {"machine": machine_info(), "model": model, "cpu_quota": quota, "tokens": tokens,
           "rounds": rounds, "periods": {}}
    for p, r in rates.items():
        logs = [math.log(x) for x in r if x]
        out["periods"][f"{p / 1000:g} ms"] = {
            "tok_per_s": r, "median": statistics.median(r), "limits_in_force": in_force[p],
            "sd_log": statistics.stdev(logs) if len(logs) > 1 else None}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
