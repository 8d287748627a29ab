"""The floor a run is held to: the bytes its window must read at best, the fastest each read
path reached, the kernel CPU a byte costs, and a run that beats its floor (a bound error)."""

from __future__ import annotations


import pandas as pd

from harness.contract import Status
from harness import parameters
from harness.analysis.traces import belady_misses_best_start


def read_path_of(run) -> str:
    """The read path of a runs-table row's configuration (harness.catalog.read_path), through
    the base mechanism a lookahead wraps (its `lookahead_base` column; the parameter's default
    where a table has none)."""
    from harness import catalog

    base = run.get("lookahead_base")
    if not isinstance(base, str):
        base = parameters.BY_NAME["lookahead_base"].default
    return catalog.read_path(run["mechanism"], {"lookahead_base": base})


def window_floor_bytes(experts: pd.DataFrame, slab_bytes: dict[int, int], cache_bytes: float,
                       positions) -> float:
    """Bytes that any run must read over the routing of the decodes at `positions` (the measured
    window's tokens, by sequence position), with a cache of `cache_bytes` (the RAM budget less
    the non-expert tensors) started with the best possible contents: a floor that needs no
    credit for what was resident. Slabs of unequal size (some layers carry other quant types)
    are bounded by the smallest: a cache of C bytes holds at most C / smallest slabs, so no
    policy misses fewer slabs than Belady with that many, and each miss reads at least the
    smallest slab."""
    if experts.empty or not slab_bytes:
        return float("nan")
    sel = experts[experts.token.isin(set(positions))]
    smallest = min(slab_bytes.values())
    steps = [{(int(layer), int(e)) for e in g.expert}
             for (_, layer), g in sel.groupby(["token", "layer"], sort=True)]
    return float(belady_misses_best_start(steps, int(max(0, cache_bytes) // smallest)) * smallest)


def token_embedding_bytes(layout: dict) -> tuple[int, int]:
    """The token embedding's bytes and one row's (a token reads one row of it, not all of it:
    the rest may hold experts), from a model's layout; (0, 0) where it has none."""
    for t in layout.get("tensors", []):
        if t.get("name") == "token_embd.weight" and not t.get("expert"):
            rows = int(t["shape"][-1]) if t.get("shape") else 0
            return int(t["bytes"]), (-(-int(t["bytes"]) // rows) if rows else int(t["bytes"]))
    return 0, 0


def floor_cache_bytes(ram_budget: float, layout: dict, window_tokens: int) -> float:
    """The expert bytes a RAM budget can hold at best over a window of `window_tokens`: the
    budget less the non-expert tensors, of which the token embedding needs only the rows the
    window's tokens read (one each), not all of it."""
    embd, row = token_embedding_bytes(layout)
    needed = min(embd, row * max(0, int(window_tokens)))
    return ram_budget - (layout["non_expert_bytes"] - embd + needed)


def kernel_cpu_per_byte(runs: pd.DataFrame) -> pd.Series:
    """Per read path (harness.catalog.read_path), the least kernel CPU seconds any ok run of it
    spent per byte its cgroup read: the decoding thread's kernel time per steady token over the
    bytes per token. The least, because a floor may not charge more than the cheapest run paid
    (kernel time also holds work other than reading)."""
    need = {"kernel_share", "steady_tok_per_s", "cgroup_read_bytes_per_token", "mechanism"}
    if not need <= set(runs) or runs.empty:
        return pd.Series(dtype=float)
    ok = runs[(runs.status == Status.OK.value) & (runs.steady_tok_per_s > 0)
              & (runs.cgroup_read_bytes_per_token > 1e6)]
    cost = ok.kernel_share / ok.steady_tok_per_s / ok.cgroup_read_bytes_per_token
    return cost.groupby(ok.apply(read_path_of, axis=1) if len(ok) else ok.mechanism).min()


def io_patterns(io: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The I/O ceiling's sequential and random-read samples (harness.stages.ceilings); a table from
    before the random reads were measured holds sequential ones only."""
    if "pattern" not in io:
        return io, io.iloc[0:0]
    return io[io.pattern == "sequential"], io[io.pattern == "random"]


def read_path_io_ceilings(io: pd.DataFrame, read_bps: float | None = None) -> dict[str, float]:
    """Per read path (harness.catalog.read_path), bytes/s: the fastest any I/O ceiling sample
    of the path's kind ran. O_DIRECT: its sequential and random samples; buffered reads: the
    random buffered ones; faults (the page cache's read-ahead, neither kind): every sample. The
    fastest, because a floor may not assume a read slower than one measured. A kind with no
    samples gets the profile's read throttle, else the fastest sample of any kind."""
    sequential, random = io_patterns(io)
    rates = pd.to_numeric(io.mb_per_s, errors="coerce") * 1e6
    fastest = float(rates.max()) if rates.notna().any() else float("nan")
    fallback = float(read_bps) if read_bps else fastest

    def best(rows):
        r = pd.to_numeric(rows.mb_per_s, errors="coerce") * 1e6 if len(rows) else rows
        return float(r.max()) if len(rows) and r.notna().any() else fallback

    direct = pd.concat([sequential, random[random.access == "O_DIRECT"]] if len(random)
                       else [sequential])
    return {"O_DIRECT": best(direct),
            "buffered read": best(random[random.access == "buffered read"] if len(random)
                                  else random),
            "fault": fastest if fastest == fastest else fallback}


def floor_bound(floor_bytes: float, io_bytes_per_s: float, compute_s: float,
                kernel_s_per_byte: float, cpus: float) -> dict:
    """The fastest a token can be: the floor's bytes at the I/O ceiling, and the compute ceiling's
    time plus the kernel CPU those bytes cost at the cheapest measured rate, spread over the CPUs
    the run may use (its quota, or its threads); with perfect overlap (the larger) and none."""
    io_s = floor_bytes / io_bytes_per_s if io_bytes_per_s > 0 else float("nan")
    kernel = floor_bytes * (kernel_s_per_byte if kernel_s_per_byte == kernel_s_per_byte else 0.0)
    cpu_s = compute_s + kernel / cpus
    return {"floor_io_s": io_s, "floor_cpu_s": cpu_s,
            "floor_perfect_overlap_tok_per_s": 1.0 / max(io_s, cpu_s) if max(io_s, cpu_s) > 0
            else float("nan"),
            "floor_no_overlap_tok_per_s": 1.0 / (io_s + cpu_s) if io_s + cpu_s > 0 else float("nan")}


# the parts of a token grouped by what would have to shrink for it to approach its floor
IN_THE_WAY = {
    "io_wait": "waiting on the disk",
    "kernel": "kernel CPU (the page cache's copies, faults and read calls)",
    "user": "user CPU (the matmuls, the routing hook, the mechanism's own work)",
    "cpu_wait": "waiting for a CPU (the quota's throttling, a barrier, other processes)",
}


def in_the_way(runs: pd.DataFrame) -> dict:
    """What stands between a configuration and its floor, from its attribution: its mean steady
    token's parts (median over its repeats) in four groups, the largest named `part`. `runs`: the
    configuration's ok repeats (runs-table rows). Empty when they carry no attribution."""
    med = {k: float(runs[f"{k}_share"].median()) if f"{k}_share" in runs else 0.0
           for k in ("io_wait", "kernel", "user", "hook", "throttled", "runqueue", "sync")}
    if runs.empty or med["io_wait"] != med["io_wait"]:
        return {}
    groups = {"io_wait": med["io_wait"], "kernel": med["kernel"],
              "user": med["user"] + med["hook"],
              "cpu_wait": med["throttled"] + med["runqueue"] + med["sync"]}
    groups = {k: (v if v == v else 0.0) for k, v in groups.items()}
    part = max(groups, key=groups.get)
    return {"part": part, "what": IN_THE_WAY[part],
            **{f"{k}_share": v for k, v in groups.items()}}


def bound_errors(table: pd.DataFrame) -> pd.Series:
    """Runs that beat their floor: faster than its perfect-overlap tok/s, or reading fewer bytes
    in the measured window than it says must be read. Either means the bound is wrong. A
    repeat flagged as disturbed (column `disturbed`) is not judged: its figure is not trusted
    (the verdicts leave it out too)."""
    num = {c: pd.to_numeric(table[c], errors="coerce") for c in (
        "steady_tok_per_s", "floor_perfect_overlap_tok_per_s", "window_read_bytes_per_token",
        "floor_bytes_per_token")}
    faster = num["steady_tok_per_s"] > num["floor_perfect_overlap_tok_per_s"]
    fewer = num["window_read_bytes_per_token"] < num["floor_bytes_per_token"] * (1 - 1e-9)
    judged = ~table["disturbed"].fillna(False).astype(bool) if "disturbed" in table else True
    return ((faster.fillna(False) | fewer.fillna(False)) & judged).astype(bool)
