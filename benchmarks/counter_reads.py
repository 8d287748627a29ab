"""Benchmark (not a test): what the worker's per-token bookkeeping costs, apart from the decode.

Around every llama_decode the worker reads the attribution's counters twice (TokenClock.read:
the run cgroup's cpuacct and cpu.stat, PSI, the disk's stat, the thread's rusage and schedstat,
the other threads' schedstat), /proc/self/io and the cgroup's io bytes twice (ProcessCounters),
and its RSS once; the files are held open and re-read with pread. This runs exactly those calls, in
a run cgroup made as a measured run's is (the profile's limits: none by default), in a loop, and
reports microseconds per token: the harness's own share of a token is that over the token's time.

    python benchmarks/counter_reads.py [tokens] [--device PATH]

tokens defaults to 2000. --device: a file on the disk a run would read (its device's stat file is
read, as a run's is).
"""

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.box.limits import Limits, run_cgroup  # noqa: E402
from harness.box.counters import TokenClock  # noqa: E402
from harness.run.worker import ProcessCounters  # noqa: E402


def one_token(clock: TokenClock, counters: ProcessCounters) -> None:
    """The worker's reads around one decode (harness.run.worker.Worker.decode_one), no decode."""
    counters.io()
    clock.read()
    clock.read(before=False)
    counters.io()
    counters.rss()


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    tokens = int(args[0]) if args else 2000
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else str(ROOT)
    with run_cgroup(Limits(device_path=device)) as cg:
        clock = TokenClock(cg.counter_files())
        counters = ProcessCounters(cg.io_stat_file)
        rounds = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(tokens):
                one_token(clock, counters)
            rounds.append((time.perf_counter() - t0) / tokens * 1e6)
        files = cg.counter_files().as_dict()
    print(json.dumps({"tokens_per_round": tokens, "rounds": len(rounds),
                      "us_per_token_median": statistics.median(rounds),
                      "us_per_token_min": min(rounds), "us_per_token_max": max(rounds),
                      "counter_files": files}, indent=2))


if __name__ == "__main__":
    main()
