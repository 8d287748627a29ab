"""harness.analysis.policies: each cache policy's bytes on traces with known answers, and on the
committed reference's own routing, where the page cache's measured bytes stand beside it."""

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis import policies
from harness.analysis.policies import Step, replay

REF = Path(__file__).resolve().parents[1] / "reference/vm-2026-12-06/results"
SLAB = {0: 10}  # one layer, every slab 10 bytes


def steps(*sets) -> list[Step]:
    """One layer, one step per decode (the first the prompt's)."""
    return [Step(i - 1, 0, frozenset((0, e) for e in s)) for i, s in enumerate(sets)]


def total(read: dict) -> int:
    return sum(read.values())


def test_a_cycle_one_slab_too_long_defeats_recency_and_frequency_and_not_the_oracle():
    trace = steps(*([{1}, {2}, {3}] * 4))  # three slabs, room for two
    got = {p: total(replay(trace, SLAB, 20, p)) for p in policies.POLICIES}
    assert got["lru"] == 12 * 10  # every request misses
    assert got["belady"] == 60  # 3 cold, then 3 of 9: the slab needed last is read, not kept
    # counts tie on a cycle: LFU thrashes like LRU (test below: where it does not)
    assert got["lfu"] == got["lfu-aged"] == 120 and got["arc"] <= 120
    assert min(got.values()) == got["belady"]  # no policy reads less than the oracle


def test_frequency_beats_recency_when_a_hot_slab_recurs_between_scans():
    # slab 1, then two slabs never seen again, six times over; room for two
    trace = steps(*[s for r in range(6) for s in ({1}, {100 + 2 * r}, {101 + 2 * r})])
    lru, lfu = total(replay(trace, SLAB, 20, "lru")), total(replay(trace, SLAB, 20, "lfu"))
    assert lru == 180  # the scan pushes the hot slab out every time
    assert lfu == 140  # once its count leads (round 3), the hot slab stays: 2 misses a round
    # plain LFU admits every slab it reads: with room for one the hot slab is pushed out too
    assert total(replay(trace, SLAB, 10, "lfu")) == 180


def test_a_slab_asked_for_in_a_step_is_never_evicted_within_it():
    # three slabs at once in room for two: one is read and not kept, none asked for is evicted
    read = replay(steps({1, 2, 3}, {1, 2}), SLAB, 20, "lru")
    assert read == {-1: 30, 0: 0}
    # no room at all: everything is read, every time
    assert total(replay(steps({1}, {1}), SLAB, 5, "lfu")) == 20


def test_unequal_slabs_are_counted_at_their_sizes():
    two_layers = [Step(-1, 0, frozenset({(0, 1)})), Step(-1, 1, frozenset({(1, 1)})),
                  Step(0, 0, frozenset({(0, 1)})), Step(0, 1, frozenset({(1, 1)}))]
    read = replay(two_layers, {0: 10, 1: 30}, 35, "lru")
    assert read == {-1: 40, 0: 40}  # 40 bytes never fit in 35: each decode reads both again
    assert replay(two_layers, {0: 10, 1: 30}, 40, "lru") == {-1: 40, 0: 0}


def test_the_window_counts_only_tokens_after_the_warm_up():
    assert policies.window_bytes({-1: 100, 0: 50, 1: 20, 2: 10}, warmup=1, done=3) == 15
    assert policies.window_bytes({-1: 100}, warmup=2, done=2) != policies.window_bytes(
        {-1: 100}, warmup=2, done=2)  # no window: nan


def test_the_reference_routing_replays_as_the_page_cache_and_odirect_cache_read_it():
    lay = json.loads((REF / "models/olmoe-q4.layout.json").read_text())
    slab = {int(k): v for k, v in lay["slab_bytes_per_layer"].items()}
    runs = pd.read_csv(REF / "final/runs.csv").set_index(["run_id", "repeat"])
    madvise = runs.loc[("madvise@disk-box", 1)]
    trace = pd.read_csv(REF / "runs/madvise@disk-box/rep1/experts.csv")
    args = (int(madvise.prompt_tokens), int(madvise.warmup_tokens), int(madvise.tokens_completed))
    t = policies.policy_table(trace, *args, slab, 1825361100 - lay["non_expert_bytes"])
    mb = t.set_index("policy").mb_per_window_token
    # the page cache reads like an LRU of the whole budget: within 5% of what madvise read
    assert mb["lru"] == pytest.approx(madvise.window_read_bytes_per_token / 1e6, rel=0.05)
    # the best online policy reads about a sixth less; the oracle about 2.5x less than LRU
    assert mb["lfu"] < 0.9 * mb["lru"] and mb["arc"] < mb["lru"]
    assert mb["belady"] == pytest.approx(74.9, rel=0.02) and mb.min() == mb["belady"]
    # odirect-cache's own LRU of 1,200 MiB on its own routing, beside what it read
    odc = runs.loc[("odirect-cache@disk-box", 1)]
    trace = pd.read_csv(REF / "runs/odirect-cache@disk-box/rep1/experts.csv")
    steps_ = policies.decode_steps(trace, int(odc.prompt_tokens))
    lru = policies.window_bytes(replay(steps_, slab, 1200 * 2**20, "lru"), int(odc.warmup_tokens),
                                int(odc.tokens_completed))
    assert lru == pytest.approx(odc.window_read_bytes_per_token, rel=0.05)


def test_finding13_shows_a_cache_runs_bytes_beside_its_own_replay():
    """odirect-cache@disk-box in vm-2026-12-06 (LRU, 1,200 MiB): the disk bytes its cgroup read
    per window token and its policy's replay on its own routing, side by side."""
    from harness.analysis.findings.beyond_study import _bytes_against_replay

    runs = pd.read_csv(REF / "final/runs.csv")
    r = runs[(runs.run_id == "odirect-cache@disk-box") & (runs["repeat"] == 1)].copy()
    r["record"] = str(REF / "runs/odirect-cache@disk-box/rep1/run.json")
    r["cache_policy"], r["cache_capacity_bytes"] = "lru", 1200 * 2**20
    lay = json.loads((REF / "models/olmoe-q4.layout.json").read_text())
    t = _bytes_against_replay(r, {"olmoe-q4": lay})
    assert len(t) == 1 and t.read_over_replay.iloc[0] == pytest.approx(1.0, abs=0.05)
    # at half the capacity the replay reads far more than the run did: the gap shows
    r["cache_capacity_bytes"] = 600 * 2**20
    assert _bytes_against_replay(r, {"olmoe-q4": lay}).read_over_replay.iloc[0] < 0.9
