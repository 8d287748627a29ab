"""Routing traces (experts.csv): how skewed and local the routing is, and what expert caches of
each policy would hit on it (Belady's optimum among them)."""

from __future__ import annotations

from collections import Counter, OrderedDict
from pathlib import Path

import numpy as np
import pandas as pd

from harness.contract import Status



def skew(experts: pd.DataFrame, coverage: float = 0.8) -> pd.DataFrame:
    """Per layer: how many experts cover `coverage` of the activations, and how many distinct."""
    rows = []
    for layer, g in experts.groupby("layer"):
        counts = g.expert.value_counts().sort_values(ascending=False).to_numpy()
        cum = np.cumsum(counts) / counts.sum()
        rows.append({"layer": int(layer), "experts_for_80pct": int(np.searchsorted(cum, coverage - 1e-12)
                                                                    + 1),
                     "distinct_experts": int(len(counts)), "activations": int(counts.sum())})
    return pd.DataFrame(rows)


def token_sets(experts: pd.DataFrame) -> dict[int, list[set]]:
    """layer -> per-token sets of routed experts, in token order."""
    out = {}
    for layer, g in experts.groupby("layer"):
        out[int(layer)] = [set(x) for _, x in g.sort_values("token").groupby("token").expert]
    return out


def locality(experts: pd.DataFrame, max_distance: int = 16) -> pd.DataFrame:
    """Mean share of token t's routed experts also routed at token t+d, over layers and t."""
    sets = token_sets(experts)
    rows = []
    for d in range(1, max_distance + 1):
        shares = [len(s[t] & s[t + d]) / len(s[t]) for s in sets.values() for t in range(len(s) - d)
                  if s[t]]
        if shares:
            rows.append({"distance": d, "shared_fraction": float(np.mean(shares)), "pairs": len(shares)})
    return pd.DataFrame(rows)


def belady_hits(requests: list[set], size: int) -> list[tuple[int, object, bool]]:
    """Belady's optimal cache of `size` entries over steps of requested keys: (step, key, hit) for
    every request in order. On a miss with a full cache the key used farthest ahead is not kept:
    a cached one (evicted), or the requested one itself (read, and not cached)."""
    flat = [(t, e) for t, s in enumerate(requests) for e in sorted(s)]
    next_use = {}
    nxt = [0] * len(flat)
    for i in range(len(flat) - 1, -1, -1):
        t, e = flat[i]
        nxt[i] = next_use.get(e, float("inf"))
        next_use[e] = i  # the request's place in the whole sequence, not only its step
    cache: dict = {}
    out = []
    for i, (t, e) in enumerate(flat):
        hit = e in cache
        if not hit and size <= 0:
            out.append((t, e, False))
            continue
        if not hit and len(cache) >= size:
            victim = max(cache, key=cache.get)
            if nxt[i] >= cache[victim]:  # the new key is needed last of all: keep the others
                out.append((t, e, False))
                continue
            del cache[victim]
        cache[e] = nxt[i]
        out.append((t, e, hit))
    return out


def _simulate(requests: list[set], size: int, policy: str) -> tuple[int, int]:
    hits = total = 0
    if policy == "belady":
        res = belady_hits(requests, size)
        return sum(h for _, _, h in res), len(res)
    lru: OrderedDict[int, None] = OrderedDict()
    freq: Counter = Counter()
    for s in requests:
        for e in sorted(s):
            total += 1
            freq[e] += 1
            if e in lru:
                hits += 1
                lru.move_to_end(e)
                continue
            if len(lru) >= size:
                if policy == "lru":
                    lru.popitem(last=False)
                else:  # lfu: evict the least frequently used so far (ties: least recent)
                    victim = min(lru, key=lambda x: freq[x])
                    del lru[victim]
            lru[e] = None
    return hits, total


def cache_simulation(experts: pd.DataFrame, sizes=(8, 16, 24, 32, 40, 48, 56, 64)) -> pd.DataFrame:
    """Hit rate of LRU, LFU and Belady's optimal policy for per-layer expert caches of each size:
    the best any expert cache could do on the recorded routing trace."""
    sets = token_sets(experts)
    rows = []
    for size in sizes:
        for policy in ("lru", "lfu", "belady"):
            h = t = 0
            for reqs in sets.values():
                hh, tt = _simulate(reqs, size, policy)
                h, t = h + hh, t + tt
            rows.append({"cache_experts_per_layer": size, "policy": policy,
                         "hit_rate": h / t if t else float("nan")})
    return pd.DataFrame(rows)


def belady_misses_best_start(requests: list[set], size: int) -> int:
    """The fewest misses any cache of `size` entries can have on these steps of requested keys,
    its contents at the start chosen as well as possible: Belady's rule from a cache holding the
    `size` keys first requested earliest (which is where Belady would be had it seen them
    before). tests/test_analysis.py checks it against every policy and start on tiny traces."""
    if size <= 0:
        return sum(len(s) for s in requests)
    first_use: dict = {}
    for t, s in enumerate(requests):
        for e in sorted(s):
            first_use.setdefault(e, t)
    start = sorted(first_use, key=first_use.get)[:size]
    # the start state as requests Belady has already served (its misses there are free)
    warm = [set(start)]
    res = belady_hits(warm + list(requests), size)
    return sum(1 for t, _, hit in res if t >= 1 and not hit)


def trace_run(runs: pd.DataFrame, model: str):
    """The runs-table row of the longest logged routing trace of `model` (the study's used 64
    tokens), None when no ok run logged one. Every mechanism routes identically
    (tests/test_harness.py), so the mechanism only breaks ties: `none` first."""
    cand = runs[(runs.status == Status.OK.value) & (runs.log_experts.astype(bool))]
    if len(cand[cand.model == model]):
        cand = cand[cand.model == model]
    if cand.empty:
        return None
    cand = cand.assign(_not_none=cand.mechanism != "none")
    return cand.sort_values(["tokens_completed", "_not_none", "repeat"],
                            ascending=[False, True, True]).iloc[0]


def read_trace(run) -> pd.DataFrame:
    """A run's routing trace (experts.csv beside its record)."""
    return pd.read_csv(Path(run["record"]).parent / "experts.csv")


def configuration_trace(runs: pd.DataFrame, config) -> pd.DataFrame | None:
    """The routing trace (every decode: the prompt's and each generated token's) of a logged run
    of this configuration's model and length (`config`: a summary row), its own runs first."""
    cand = runs[(runs.model == config.model) & (runs.tokens == config.tokens)
                & (runs.status == Status.OK.value)]
    cand = pd.concat([cand[cand.run_id == config.run_id], cand[cand.log_experts.astype(bool)]])
    for rec in cand.record:
        ex = pd.read_csv(Path(rec).parent / "experts.csv")
        if len(ex):
            return ex
    return None


def routing_heatmap(experts: pd.DataFrame, n_layer: int, n_expert: int) -> np.ndarray:
    m = np.zeros((n_layer, n_expert))
    for (layer, e), c in experts.groupby(["layer", "expert"]).size().items():
        m[int(layer), int(e)] = c
    return m
