"""Analyses and verdict rules on small hand-made tables whose answers are known."""

import pandas as pd
import pytest

from harness.analysis import configurations, flags, floors, traces, window


def trace(rows):
    return pd.DataFrame(rows, columns=["token", "layer", "rank", "expert"])


def test_skew_counts_experts_for_80_percent_and_distinct():
    # layer 0: expert 0 five times, 1..5 once each (10 activations): 80% needs 0,1,2,3 -> 4 experts
    rows = [(t, 0, 0, 0) for t in range(5)] + [(5 + i, 0, 0, 1 + i) for i in range(5)]
    sk = traces.skew(trace(rows))
    assert sk.loc[0, "experts_for_80pct"] == 4
    assert sk.loc[0, "distinct_experts"] == 6
    assert sk.loc[0, "activations"] == 10


def test_locality_shared_fraction():
    # 2 experts per token; t0={0,1}, t1={1,2}, t2={2,3}: d=1 shares 1/2 each, d=2 shares nothing
    rows = [(0, 0, 0, 0), (0, 0, 1, 1), (1, 0, 0, 1), (1, 0, 1, 2), (2, 0, 0, 2), (2, 0, 1, 3)]
    loc = traces.locality(trace(rows), max_distance=2).set_index("distance")
    assert loc.loc[1, "shared_fraction"] == pytest.approx(0.5)
    assert loc.loc[2, "shared_fraction"] == pytest.approx(0.0)


def test_cache_simulation_belady_beats_lru_on_a_cyclic_trace():
    # one expert per token cycling 0,1,2: LRU with 2 slots always misses; Belady (keep out the
    # one used farthest ahead, the requested one included) misses t0,t1,t2 and then every third
    # request (t5, t8, t11): 6 hits
    rows = [(t, 0, 0, t % 3) for t in range(12)]
    cs = traces.cache_simulation(trace(rows), sizes=(2, 3)).set_index(["cache_experts_per_layer", "policy"])
    assert cs.loc[(2, "lru"), "hit_rate"] == 0.0
    assert cs.loc[(2, "belady"), "hit_rate"] == pytest.approx(6 / 12)
    assert cs.loc[(3, "lru"), "hit_rate"] == pytest.approx(9 / 12)  # only the 3 cold misses
    assert cs.loc[(3, "belady"), "hit_rate"] == pytest.approx(9 / 12)
    assert cs.loc[(2, "lfu"), "hit_rate"] <= cs.loc[(2, "belady"), "hit_rate"]


def test_writes_share_the_disk_only_when_the_cgroup_wrote_what_was_dirtied():
    runs = pd.DataFrame({"dirtied_bytes_per_token": [400e6, 410e6],
                         "cgroup_write_bytes_per_token": [0.0, 4096.0]})
    shared, why = configurations.writes_share_the_disk(runs)
    assert not shared and "not throttled" in why
    runs["cgroup_write_bytes_per_token"] = [395e6, 405e6]
    assert configurations.writes_share_the_disk(runs)[0]
    assert not configurations.writes_share_the_disk(runs.assign(dirtied_bytes_per_token=0.0))[0]


def test_summarize_median_spread_and_flag():
    runs = pd.DataFrame({"run_id": ["a"] * 3 + ["b"] * 3, "status": ["ok"] * 5 + ["killed: memory"],
                         "tok_per_s": [1.0, 1.1, 1.2, 1.0, 2.0, None]})
    for col in ("model", "quant", "synthetic", "mechanism", "mlock_non_expert", "log_experts",
                "lru_budget_mb", "prefetch_threads"):
        runs[col] = "x"
    s = configurations.summarize(runs).set_index("run_id")
    assert s.loc["a", "median"] == pytest.approx(1.1) and not s.loc["a", "wide_spread"]
    assert s.loc["b", "n"] == 2 and s.loc["b", "wide_spread"]  # (2-1)/1.5 > 25%
    assert s.loc["b", "statuses"] == "killed: memory,ok"
    assert s.loc["a", "mechanism"] == "x"


def test_summarize_keeps_runs_that_never_completed():
    runs = pd.DataFrame({"run_id": ["ok", "dead"], "status": ["ok", "killed: memory"],
                         "tok_per_s": [1.0, None], "mechanism": ["none", "lru-odirect"]})
    for col in ("model", "quant", "synthetic", "mlock_non_expert", "log_experts", "lru_budget_mb",
                "prefetch_threads"):
        runs[col] = "x"
    s = configurations.summarize(runs).set_index("run_id")
    assert s.loc["dead", "n"] == 0 and s.loc["dead", "mechanism"] == "lru-odirect"
    assert s.loc["dead", "statuses"] == "killed: memory"


def test_the_floor_bound_is_the_larger_part_with_overlap_and_their_sum_without():
    # 150 MB at 150 MB/s is 1 s of I/O; compute 0.5 s plus 150 MB x 2 ns/byte of kernel CPU on
    # one CPU: 0.8 s of CPU
    b = floors.floor_bound(150e6, 150e6, 0.5, 2e-9, cpus=1.0)
    assert b["floor_io_s"] == pytest.approx(1.0) and b["floor_cpu_s"] == pytest.approx(0.8)
    assert b["floor_perfect_overlap_tok_per_s"] == pytest.approx(1.0)
    assert b["floor_no_overlap_tok_per_s"] == pytest.approx(1 / 1.8)
    # under a quota of a tenth of a CPU the kernel's 0.3 CPU-seconds take 3 s of wall time
    b = floors.floor_bound(150e6, 150e6, 0.5, 2e-9, cpus=0.1)
    assert b["floor_perfect_overlap_tok_per_s"] == pytest.approx(1 / 3.5)


def test_each_read_path_reads_at_the_fastest_rate_its_own_kind_reached():
    io = pd.DataFrame({"pattern": ["sequential", "random", "random", "random", "random"],
                       "access": ["O_DIRECT", "buffered read", "buffered read", "O_DIRECT",
                                  "O_DIRECT"],
                       "mb_per_s": [140.0, 90.0, 120.0, 150.0, 130.0]})
    got = floors.read_path_io_ceilings(io, read_bps=150e6)
    assert got == {"O_DIRECT": 150e6, "buffered read": 120e6, "fault": 150e6}
    # a table from before the random reads: the sequential samples serve every path but
    # buffered reads, which get the throttle (or, unthrottled, the fastest sample)
    old = pd.DataFrame({"sample": [0, 1], "mb_per_s": [140.0, 145.0]})
    assert floors.read_path_io_ceilings(old, read_bps=150e6) == {
        "O_DIRECT": 145e6, "buffered read": 150e6, "fault": 145e6}
    assert floors.read_path_io_ceilings(old)["buffered read"] == 145e6
    seq, rnd = floors.io_patterns(io)
    assert len(seq) == 1 and len(rnd) == 4


def test_a_run_that_beats_its_floor_is_a_bound_error_and_one_that_does_not_is_not():
    t = pd.DataFrame({"steady_tok_per_s": [0.9, 1.1, 0.5, 0.5],
                      "floor_perfect_overlap_tok_per_s": [1.0, 1.0, 1.0, 1.0],
                      "window_read_bytes_per_token": [2e6, 2e6, 0.5e6, None],
                      "floor_bytes_per_token": [1e6, 1e6, 1e6, 1e6]})
    assert list(floors.bound_errors(t)) == [False, True, True, False]
    # a repeat flagged as disturbed is not judged; the others are, as before
    t["disturbed"] = [False, True, False, False]
    assert list(floors.bound_errors(t)) == [False, False, True, False]


def test_what_stands_in_the_way_is_the_largest_part_and_comes_out_each_way():
    def runs(**shares):
        base = {f"{k}_share": [0.0, 0.0] for k in ("io_wait", "kernel", "user", "hook",
                                                  "throttled", "runqueue", "sync")}
        return pd.DataFrame({**base, **{f"{k}_share": v for k, v in shares.items()}})

    disk = floors.in_the_way(runs(io_wait=[0.7, 0.6], kernel=[0.1, 0.1], user=[0.2, 0.3]))
    assert disk["part"] == "io_wait" and disk["io_wait_share"] == pytest.approx(0.65)
    # waiting for a CPU is throttled, run-queue and sync wait together: 0.2 + 0.15 + 0.15 > 0.45
    cpu = floors.in_the_way(runs(kernel=[0.45, 0.45], throttled=[0.2, 0.2],
                                  runqueue=[0.15, 0.15], sync=[0.15, 0.15]))
    assert cpu["part"] == "cpu_wait" and cpu["cpu_wait_share"] == pytest.approx(0.5)
    # the hook is user CPU
    assert floors.in_the_way(runs(kernel=[0.4] * 2, user=[0.3] * 2, hook=[0.2] * 2))["part"] \
        == "user"
    assert floors.in_the_way(runs(io_wait=[float("nan")] * 2)) == {}


def test_kernel_cpu_per_byte_is_the_cheapest_run_of_each_read_path():
    runs = pd.DataFrame({"status": "ok", "mechanism": ["none", "madvise", "pread+madvise", "none"],
                         "kernel_share": [0.5, 0.2, 0.6, 0.5], "steady_tok_per_s": [1.0] * 4,
                         "cgroup_read_bytes_per_token": [100e6, 100e6, 100e6, 0.0]})
    cost = floors.kernel_cpu_per_byte(runs)
    assert cost["fault"] == pytest.approx(0.2 / 100e6)  # madvise's, the cheaper fault path
    assert cost["buffered read"] == pytest.approx(0.6 / 100e6)
    assert "O_DIRECT" not in cost  # no run of it read anything


def test_disturbed_repeats_are_those_something_else_read_the_disk_during():
    runs = pd.DataFrame({"foreign_read_bytes": [0.0, 40e6, 300e6, 300e6, float("nan")],
                         "cgroup_read_bytes_per_token": [1e8, 1e8, 1e8, 1e12, 1e8],
                         "tokens_completed": [16] * 5})
    assert list(flags.disturbed(runs)) == [False, False, True, False, False]
    assert flags.foreign_read(500, 200) == 300
    assert pd.isna(flags.foreign_read(500, -1)) and pd.isna(flags.foreign_read(None, 200))


def test_a_run_is_flagged_for_steal_or_a_stall_and_says_why():
    runs = pd.DataFrame({"foreign_read_bytes": [0.0, 0.0, 0.0, 0.0],
                         "cgroup_read_bytes_per_token": [1e6] * 4, "tokens_completed": [6] * 4,
                         "cpu_steal_s": [1.0, 30.0, 0.0, 0.0], "run_wall_s": [100.0] * 4,
                         "mean_median_gap": [0.02, 0.0, 0.4, 0.09]})
    assert list(flags.disturbed(runs)) == [False, True, True, False]
    assert list(flags.flag_reason(runs)) == ["", "CPU steal", "mean and median token disagree",
                                                ""]


def test_mean_median_gap_of_the_steady_tokens():
    gen = pd.DataFrame({"wall_s": [9.0, 1.0, 1.0, 1.0, 1.6]})  # the first token is left out
    assert window.mean_median_gap(gen, 1) == pytest.approx(0.15)


def test_every_table_naming_a_run_measured_without_limits_marks_it(tmp_path):
    from harness.report.writer import Writer

    w = Writer(tmp_path / "tables", tmp_path / "plots")
    w.unenforced = {"b"}
    t = w.table("any", pd.DataFrame({"run_id": ["a", "b"], "tok_per_s": [1.0, 2.0]}), "rule")
    assert list(t.limits_enforced) == [True, False]
    assert "limits_enforced" in (tmp_path / "tables/any.csv").read_text()
    plain = w.table("ceilings", pd.DataFrame({"sample": [0], "mb_per_s": [150.0]}), "rule")
    assert "limits_enforced" not in plain  # a table of no run is left as it is


def _fewest_misses(requests: list[set], size: int) -> int:
    """Brute force: every start of at most `size` keys and, at each miss, every choice (keep
    the key out, or take it in evicting any one): the fewest misses of any policy."""
    import functools
    import itertools

    flat = [e for s in requests for e in sorted(s)]
    keys = sorted(set(flat))

    @functools.lru_cache(maxsize=None)
    def best(i: int, cache: frozenset) -> int:
        if i == len(flat):
            return 0
        e = flat[i]
        if e in cache:
            return best(i + 1, cache)
        options = [best(i + 1, cache)]  # bypass
        if len(cache) < size:
            options.append(best(i + 1, cache | {e}))
        else:
            options += [best(i + 1, (cache - {v}) | {e}) for v in cache]
        return 1 + min(options)

    starts = [frozenset(c) for n in range(size + 1) for c in itertools.combinations(keys, n)]
    return min(best(0, s) for s in starts)


def test_the_window_floor_is_the_fewest_misses_any_cache_could_have_from_its_best_start():
    import random

    rng = random.Random(5)
    for trial in range(60):
        n_keys, size = rng.randint(2, 6), rng.randint(0, 3)
        requests = [set(rng.sample(range(n_keys), rng.randint(1, min(2, n_keys))))
                    for _ in range(rng.randint(1, 6))]
        assert traces.belady_misses_best_start(requests, size) == \
            _fewest_misses(requests, size), (trial, requests, size)


def test_the_window_floor_reads_only_the_windows_tokens_at_the_smallest_slab():
    # two layers, slabs of 10 and 12 bytes; tokens at positions 5, 6, 7 route layer 0 to
    # experts 1, 2, 1 and layer 1 to 3, 3, 3
    rows = [(t, 0, e) for t, e in ((5, 1), (6, 2), (7, 1))] + [(t, 1, 3) for t in (5, 6, 7)]
    ex = pd.DataFrame(rows, columns=["token", "layer", "expert"]).assign(rank=0)
    slab = {0: 10, 1: 12}
    # room for 3 slabs of the smallest size: everything fits from the best start
    assert floors.window_floor_bytes(ex, slab, 30, [5, 6, 7]) == 0
    # room for 1: (0,1) (1,3) (0,2) (1,3) (0,1) (1,3) from a start holding (0,1): (1,3) is kept
    # once read, (0,2) and the second (0,1) are read and not kept: 3 misses
    assert floors.window_floor_bytes(ex, slab, 10, [5, 6, 7]) == 3 * 10
    # the window only: (0,2) (1,3) (0,1) (1,3) from a start holding (0,2): 2 misses
    assert floors.window_floor_bytes(ex, slab, 10, [6, 7]) == 2 * 10


def test_the_floor_leaves_the_token_embedding_but_a_row_a_token_to_the_cache():
    """A mechanism that keeps the token embedding out of memory (a token reads one row of it)
    has room for more experts than the budget less every non-expert tensor. On a trace that
    cycles through four slabs, such a cache of four never misses: the old floor (room for two)
    said it must read, so it would have been a bound error; the floor now holds below it."""
    layout = {"non_expert_bytes": 50,
              "tensors": [{"name": "token_embd.weight", "shape": [4, 30], "bytes": 30,
                           "expert": False},
                          {"name": "output.weight", "shape": [4, 10], "bytes": 20,
                           "expert": False}]}
    assert floors.token_embedding_bytes(layout) == (30, 1)
    budget, positions = 70, list(range(8))
    rows = [(t, 0, t % 4) for t in positions]
    ex = pd.DataFrame(rows, columns=["token", "layer", "expert"]).assign(rank=0)
    slab = {0: 10}
    old = floors.window_floor_bytes(ex, slab, budget - layout["non_expert_bytes"], positions)
    cache = floors.floor_cache_bytes(budget, layout, len(positions))
    assert cache == 70 - (50 - 30 + 1 * 8)  # 42 bytes: four slabs of 10 (the old: two)
    new = floors.window_floor_bytes(ex, slab, cache, positions)
    mechanism_reads = 0  # an LRU of four slabs holding the cycle reads nothing in the window
    assert old > mechanism_reads and new <= mechanism_reads
    table = pd.DataFrame({"steady_tok_per_s": [1.0, 1.0], "floor_perfect_overlap_tok_per_s": [2.0, 2.0],
                          "window_read_bytes_per_token": [mechanism_reads] * 2,
                          "floor_bytes_per_token": [old / 8, new / 8]})
    assert list(floors.bound_errors(table)) == [True, False]
    # a model without an embedding in its layout: the budget less the non-expert tensors
    assert floors.floor_cache_bytes(budget, {"non_expert_bytes": 50}, 8) == 20


def test_the_machine_table_shows_each_profiles_own_limits():
    from pathlib import Path

    from harness.analysis.tables import machine_limits
    from harness.record import read_run

    runs = Path(__file__).resolve().parents[1] / "reference/vm-2026-12-06/results/runs"
    records = [read_run(runs / f"{c}@{p}/rep1/run.json") for c in ("baseline", "madvise")
               for p in ("seed-box", "disk-box")]
    t = machine_limits(records, ["seed-box", "disk-box"]).set_index("profile")
    assert list(t.index) == ["seed-box", "disk-box"]
    # seed-box ran under its calibrated CPU quota, disk-box under none: the rows say so
    assert t.loc["seed-box", "cpu_quota"] == pytest.approx(0.09189, abs=1e-4)
    assert pd.isna(t.loc["disk-box", "cpu_quota"])
    assert (t.ram_budget_bytes == 1825357824).all() and (t.hostname == "vm").all()
    # the records of one profile only: one row, and a profile with no runs has none
    disk_only = [r for r in records if r.spec.profile == "disk-box"]
    assert list(machine_limits(disk_only, ["seed-box", "disk-box"]).profile) == ["disk-box"]
