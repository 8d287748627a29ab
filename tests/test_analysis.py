"""Analyses and verdict rules on small hand-made tables whose answers are known."""

import pandas as pd
import pytest

from harness import analysis


def trace(rows):
    return pd.DataFrame(rows, columns=["token", "layer", "rank", "expert"])


def test_skew_counts_experts_for_80_percent_and_distinct():
    # layer 0: expert 0 five times, 1..5 once each (10 activations): 80% needs 0,1,2,3 -> 4 experts
    rows = [(t, 0, 0, 0) for t in range(5)] + [(5 + i, 0, 0, 1 + i) for i in range(5)]
    sk = analysis.skew(trace(rows))
    assert sk.loc[0, "experts_for_80pct"] == 4
    assert sk.loc[0, "distinct_experts"] == 6
    assert sk.loc[0, "activations"] == 10


def test_locality_shared_fraction():
    # 2 experts per token; t0={0,1}, t1={1,2}, t2={2,3}: d=1 shares 1/2 each, d=2 shares nothing
    rows = [(0, 0, 0, 0), (0, 0, 1, 1), (1, 0, 0, 1), (1, 0, 1, 2), (2, 0, 0, 2), (2, 0, 1, 3)]
    loc = analysis.locality(trace(rows), max_distance=2).set_index("distance")
    assert loc.loc[1, "shared_fraction"] == pytest.approx(0.5)
    assert loc.loc[2, "shared_fraction"] == pytest.approx(0.0)


def test_cache_simulation_belady_beats_lru_on_a_cyclic_trace():
    # one expert per token cycling 0,1,2: LRU with 2 slots always misses; Belady (evict the one
    # used farthest ahead) misses t0,t1,t2 then every other request: hits t3,t5,t7,t9,t11
    rows = [(t, 0, 0, t % 3) for t in range(12)]
    cs = analysis.cache_simulation(trace(rows), sizes=(2, 3)).set_index(["cache_experts_per_layer", "policy"])
    assert cs.loc[(2, "lru"), "hit_rate"] == 0.0
    assert cs.loc[(2, "belady"), "hit_rate"] == pytest.approx(5 / 12)
    assert cs.loc[(3, "lru"), "hit_rate"] == pytest.approx(9 / 12)  # only the 3 cold misses
    assert cs.loc[(3, "belady"), "hit_rate"] == pytest.approx(9 / 12)
    assert cs.loc[(2, "lfu"), "hit_rate"] <= cs.loc[(2, "belady"), "hit_rate"]


def test_writes_share_the_disk_only_when_the_cgroup_wrote_what_was_dirtied():
    runs = pd.DataFrame({"dirtied_bytes_per_token": [400e6, 410e6],
                         "cgroup_write_bytes_per_token": [0.0, 4096.0]})
    shared, why = analysis.writes_share_the_disk(runs)
    assert not shared and "not throttled" in why
    runs["cgroup_write_bytes_per_token"] = [395e6, 405e6]
    assert analysis.writes_share_the_disk(runs)[0]
    assert not analysis.writes_share_the_disk(runs.assign(dirtied_bytes_per_token=0.0))[0]


def test_summarize_median_spread_and_flag():
    runs = pd.DataFrame({"run_id": ["a"] * 3 + ["b"] * 3, "status": ["ok"] * 5 + ["killed: memory"],
                         "tok_per_s": [1.0, 1.1, 1.2, 1.0, 2.0, None]})
    for col in ("model", "quant", "synthetic", "mechanism", "mlock_non_expert", "log_experts",
                "lru_budget_mb", "prefetch_threads"):
        runs[col] = "x"
    s = analysis.summarize(runs).set_index("run_id")
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
    s = analysis.summarize(runs).set_index("run_id")
    assert s.loc["dead", "n"] == 0 and s.loc["dead", "mechanism"] == "lru-odirect"
    assert s.loc["dead", "statuses"] == "killed: memory"


def test_io_bound_estimate():
    # 150 MB per token at 150 MB/s, plus 0.5 s compute: 1.5 s per token
    assert analysis.io_bound_estimate(150e6, 150.0, 0.5) == pytest.approx(1 / 1.5)


def test_oracle_reads_only_what_no_cache_of_that_size_could_keep():
    # one layer, slabs of 10 bytes; tokens 0 (prompt) .. 3 route {0,1}, {0,2}, {0,1}, {0,2}
    rows = [(0, 0, 0, 0), (0, 0, 1, 1), (1, 0, 0, 0), (1, 0, 1, 2), (2, 0, 0, 0), (2, 0, 1, 1),
            (3, 0, 0, 0), (3, 0, 1, 2)]
    ex = trace(rows)
    # room for all three slabs: after the prompt, only token 1's expert 2 is ever read
    assert analysis.oracle_missed_bytes(ex, {0: 10}, 30, first_gen_token=1) == pytest.approx(10 / 3)
    # room for two: Belady keeps 0 and swaps the other each token: one slab per token
    assert analysis.oracle_missed_bytes(ex, {0: 10}, 20, first_gen_token=1) == pytest.approx(10)
    # no room: every routed slab is read
    assert analysis.oracle_missed_bytes(ex, {0: 10}, 0, first_gen_token=1) == pytest.approx(20)


def test_limit_bounds_no_and_perfect_overlap():
    b = analysis.limit_bounds(150e6, 150.0, 0.5)  # 1 s of I/O, 0.5 s of compute per token
    assert b["no_overlap"] == pytest.approx(1 / 1.5) and b["perfect_overlap"] == pytest.approx(1.0)


def test_disturbed_repeats_are_those_something_else_read_the_disk_during():
    runs = pd.DataFrame({"foreign_read_bytes": [0.0, 40e6, 300e6, 300e6, float("nan")],
                         "cgroup_read_bytes_per_token": [1e8, 1e8, 1e8, 1e12, 1e8],
                         "tokens_completed": [16] * 5})
    assert list(analysis.disturbed(runs)) == [False, False, True, False, False]
    assert analysis.foreign_read({"read_bytes": 500}, {"read": 200}) == 300
    assert pd.isna(analysis.foreign_read({"read_bytes": 500}, {"read": -1}))


def test_a_run_is_flagged_for_steal_or_a_stall_and_says_why():
    runs = pd.DataFrame({"foreign_read_bytes": [0.0, 0.0, 0.0, 0.0],
                         "cgroup_read_bytes_per_token": [1e6] * 4, "tokens_completed": [6] * 4,
                         "cpu_steal_s": [1.0, 30.0, 0.0, 0.0], "run_wall_s": [100.0] * 4,
                         "mean_median_gap": [0.02, 0.0, 0.4, 0.09]})
    assert list(analysis.disturbed(runs)) == [False, True, True, False]
    assert list(analysis.flag_reason(runs)) == ["", "CPU steal", "mean and median token disagree",
                                                ""]


def test_mean_median_gap_of_the_steady_tokens():
    gen = pd.DataFrame({"wall_s": [9.0, 1.0, 1.0, 1.0, 1.6]})  # the first token is left out
    assert analysis.mean_median_gap(gen) == pytest.approx(0.15)


def test_every_table_naming_a_run_measured_without_limits_marks_it(tmp_path):
    from harness.report import Writer

    w = Writer(tmp_path / "tables", tmp_path / "plots")
    w.unenforced = {"b"}
    t = w.table("any", pd.DataFrame({"run_id": ["a", "b"], "tok_per_s": [1.0, 2.0]}), "rule")
    assert list(t.limits_enforced) == [True, False]
    assert "limits_enforced" in (tmp_path / "tables/any.csv").read_text()
    plain = w.table("ceilings", pd.DataFrame({"sample": [0], "mb_per_s": [150.0]}), "rule")
    assert "limits_enforced" not in plain  # a table of no run is left as it is
