"""What an expert cache of each policy would read, replayed on a run's own routing trace: bytes
per token of the measured window at a capacity in bytes, real slab sizes, a cold start at the
prompt. The yardstick a cache mechanism is held to (its bytes beside its own policy's replay),
and what the best online policy could save over the page cache's LRU.

A decode is one step per layer: the prompt's decode asks for every prompt position's experts of
a layer at once, each generated token for its own. A slab asked for in a step is never evicted
to make room within that step; a miss that finds no room is read and not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import pandas as pd

from harness.analysis.outcome import Figure, Outcome

POLICIES = ("lru", "lfu", "lfu-aged", "arc", "belady")
LFU_HALF_LIFE_TOKENS = 16  # aged LFU: a request's weight halves every 16 decodes


@dataclass(frozen=True)
class Step:
    decode: int  # -1 the prompt's decode, then 0, 1, ... the generated tokens
    layer: int
    keys: frozenset  # (layer, expert) slabs asked for


def decode_steps(trace: pd.DataFrame, n_prompt: int) -> list[Step]:
    """The routing trace (experts.csv: token = sequence position) as decode steps in order."""
    t = trace.assign(decode=(trace.token - n_prompt).clip(lower=-1))
    return [Step(int(d), int(layer), frozenset((int(layer), int(e)) for e in g.expert))
            for (d, layer), g in t.groupby(["decode", "layer"], sort=True)]


def replay(steps: list[Step], slab: dict[int, int], capacity: float, policy: str,
           half_life: float = LFU_HALF_LIFE_TOKENS) -> dict[int, int]:
    """Bytes read per decode by a cache of `capacity` bytes run by `policy`, from empty."""
    if policy == "arc":
        return _replay_arc(steps, slab, capacity)
    next_use = _next_uses(steps) if policy == "belady" else None
    cache: OrderedDict = OrderedDict()  # key -> None, least recent first
    used = 0
    score: dict = {}  # lfu: count; lfu-aged: (decayed count, decode of last update)
    read = {s.decode: 0 for s in steps}
    for i, s in enumerate(steps):
        for key in sorted(s.keys):
            if policy == "lfu":
                score[key] = score.get(key, 0) + 1
            elif policy == "lfu-aged":
                v, at = score.get(key, (0.0, s.decode))
                score[key] = (v * 0.5 ** ((s.decode - at) / half_life) + 1.0, s.decode)
        for key in sorted(s.keys):
            if key in cache:
                cache.move_to_end(key)
                continue
            size = slab[key[0]]
            read[s.decode] += size
            while used + size > capacity:
                victim = _victim(cache, s, policy, score, next_use, i)
                if victim is None or (policy == "belady"
                                      and next_use[i].get(key, 1e18) >= next_use[i].get(victim, 1e18)):
                    victim = None
                    break
                del cache[victim]
                used -= slab[victim[0]]
            if used + size <= capacity:
                cache[key] = None
                used += size
    return read


def _victim(cache: OrderedDict, step: Step, policy: str, score: dict, next_use, i: int):
    candidates = [k for k in cache if k not in step.keys]
    if not candidates:
        return None
    if policy == "lru":
        return candidates[0]
    if policy == "lfu":
        return min(candidates, key=lambda k: score.get(k, 0))  # ties: least recent (order)
    if policy == "lfu-aged":
        def aged(k):
            v, at = score.get(k, (0.0, step.decode))
            return v * 0.5 ** ((step.decode - at) / LFU_HALF_LIFE_TOKENS)
        return min(candidates, key=aged)
    if policy == "belady":
        return max(candidates, key=lambda k: next_use[i].get(k, 1e18))
    raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")


def _next_uses(steps: list[Step]) -> list[dict]:
    """Per step, each key's next step of use after it (absent: never again)."""
    out: list[dict] = [{} for _ in steps]
    nxt: dict = {}
    for i in range(len(steps) - 1, -1, -1):
        out[i] = dict(nxt)
        for k in steps[i].keys:
            nxt[k] = i
    return out


def _replay_arc(steps: list[Step], slab: dict[int, int], capacity: float) -> dict[int, int]:
    """ARC (Megiddo and Modha) over entries: as many as the capacity holds of the mean slab."""
    c = int(capacity // (sum(slab.values()) / len(slab))) if slab else 0
    t1, t2, b1, b2 = OrderedDict(), OrderedDict(), OrderedDict(), OrderedDict()
    p = 0.0
    read = {s.decode: 0 for s in steps}

    def replace(in_b2: bool, keep) -> bool:
        """Move one resident entry to its ghost list (T1's when T1 is over its target p); False
        when every resident entry is asked for in this step."""
        prefer_t1 = bool(t1) and (len(t1) > p or (in_b2 and len(t1) == p))
        for lst, ghost in (((t1, b1), (t2, b2)) if prefer_t1 else ((t2, b2), (t1, b1))):
            k = next((k for k in lst if k not in keep), None)
            if k is not None:
                del lst[k]
                ghost[k] = None
                return True
        return False

    for s in steps:
        for x in sorted(s.keys):
            if x in t1 or x in t2:
                (t1 if x in t1 else t2).pop(x)
                t2[x] = None
                continue
            read[s.decode] += slab[x[0]]
            if c <= 0:
                continue
            if x in b1 or x in b2:
                if x in b1:
                    p = min(c, p + max(1.0, len(b2) / max(1, len(b1))))
                    del b1[x]
                else:
                    p = max(0.0, p - max(1.0, len(b1) / max(1, len(b2))))
                    del b2[x]
                if len(t1) + len(t2) >= c and not replace(x in b2, s.keys):
                    continue
                t2[x] = None
                continue
            if len(t1) + len(b1) >= c:
                if len(t1) < c and b1:
                    b1.popitem(last=False)
                    if not replace(False, s.keys):
                        continue
                else:
                    victim = next((k for k in t1 if k not in s.keys), None)
                    if victim is None:
                        continue
                    del t1[victim]
            elif len(t1) + len(t2) + len(b1) + len(b2) >= c:
                if len(t1) + len(t2) + len(b1) + len(b2) >= 2 * c and b2:
                    b2.popitem(last=False)
                if len(t1) + len(t2) >= c and not replace(False, s.keys):
                    continue
            t1[x] = None
    return read


def window_bytes(read: dict[int, int], warmup: int, done: int) -> float:
    """Bytes per token of the measured window: generated tokens warmup .. done - 1."""
    window = range(warmup, done)
    return sum(read.get(d, 0) for d in window) / len(window) if len(window) else float("nan")


def policy_table(trace: pd.DataFrame, n_prompt: int, warmup: int, done: int,
                 slab: dict[int, int], capacity: float) -> pd.DataFrame:
    """MB per window token of every policy at `capacity`, and each over Belady's."""
    steps = decode_steps(trace, n_prompt)
    rows = [{"policy": p, "capacity_mb": capacity / 1e6,
             "mb_per_window_token": window_bytes(replay(steps, slab, capacity, p), warmup,
                                                 done) / 1e6} for p in POLICIES]
    t = pd.DataFrame(rows)
    oracle = float(t.set_index("policy").mb_per_window_token["belady"])
    t["over_belady"] = t.mb_per_window_token / oracle if oracle > 0 else float("nan")
    return t


def replay_of_run(run, layout: dict, policy: str, capacity: float) -> float:
    """Bytes per window token `policy` at `capacity` reads on this run's own routing (its
    experts.csv beside its record, its own window): what a cache mechanism's run is held to."""
    from harness.analysis import traces

    slab = {int(k): v for k, v in layout["slab_bytes_per_layer"].items()}
    steps = decode_steps(traces.read_trace(run), int(run["prompt_tokens"]))
    return window_bytes(replay(steps, slab, capacity, policy), int(run["warmup_tokens"]),
                        int(run["tokens_completed"]))


def policy_study(runs: pd.DataFrame, layouts: dict, ram_budget: float | None) -> Outcome:
    """Per model with a logged routing trace in these runs (one regime's): every policy's bytes
    per window token at the capacity a cache mechanism has (the RAM budget less the model's
    non-expert tensors, which it keeps; the floor's cache is larger by the token embedding but a
    row a token), replayed on its longest trace's own window."""
    from harness.analysis import traces

    tables, notes = [], []
    if not ram_budget:
        return Outcome(None, notes=["No RAM budget in this regime: no capacity to replay at."])
    for model in sorted(set(runs.model)):
        run = traces.trace_run(runs, model)
        lay = layouts.get(model)
        if run is None or lay is None or not lay.get("slab_bytes_per_layer"):
            continue
        slab = {int(k): v for k, v in lay["slab_bytes_per_layer"].items()}
        capacity = ram_budget - lay["non_expert_bytes"]
        warmup = int(run["warmup_tokens"])  # the run's own window, as its rate's
        t = policy_table(traces.read_trace(run), int(run.prompt_tokens), warmup,
                         int(run.tokens_completed), slab, capacity)
        tables.append(t.assign(model=model, trace=run.run_id))
        notes.append(f"`{model}`: replayed on `{run.run_id}` repeat {int(run['repeat'])}'s routing "
                     f"({int(run.tokens_completed)} generated tokens, window after "
                     f"{warmup}), capacity {capacity / 1e6:.0f} MB.")
    if not tables:
        return Outcome(None, notes=["No run logged its routing: nothing to replay."])
    table = pd.concat(tables, ignore_index=True)
    return Outcome(None, {"policy_study": table}, notes,
                   figures=[Figure("policy_study", "policy_study", table)])
