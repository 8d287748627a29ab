"""The distance to the limit: every configuration beside its floor, the fastest any run of it
could be on this box, and the repeats that beat it (bound errors: the floor is wrong). An
analysis unit like the findings: it returns its tables, notes and verdict, and renders nothing
(harness.report.results prints it)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from harness.analysis import floors, traces
from harness.analysis.outcome import Outcome
from harness.analysis.stats import FAILS, HOLDS, INCONCLUSIVE, Verdict
from harness.contract import Status
from harness.util import sig


@dataclass(frozen=True)
class Ceilings:
    """What the floor is built from, per regime: the fastest read rate of each read path
    (bytes/s), each MoE model's fastest fully cached compute ceiling (tok/s), and the limits in
    force (the RAM budget, the CPU quota)."""

    io_by_path: dict[str, float]
    moe_ceiling: dict[str, float]
    limits: dict


def _s(x) -> str:
    """A number as RESULTS.md writes it (harness.util.sig)."""
    return str(sig(x))


def distance_to_limit(summ: pd.DataFrame, runs: pd.DataFrame, layouts: dict,
                      ceilings: Ceilings) -> Outcome:
    """Per configuration of `summ` (harness.analysis.configurations.summarize rows), its floor against
    its median steady tok/s; tables `distance_to_limit` and `bound_errors`; a note per model on
    its best configuration and what stands in its way (its attribution); the verdict "holds"
    when no judged repeat beat its floor."""
    budget = ceilings.limits.get("ram_bytes")
    quota = ceilings.limits.get("cpu_quota")
    io_by_path = ceilings.io_by_path
    # a floor no mechanism can pass: the fastest any read path ran and the least kernel CPU any
    # path paid per byte, whatever the configuration's own path
    per_byte = floors.kernel_cpu_per_byte(runs)
    cheapest = float(per_byte.min()) if len(per_byte) else float("nan")
    fastest_io = max((v for v in io_by_path.values() if v == v), default=float("nan"))
    rows, trace_of, errors, best_inputs = [], {}, [], {}
    for _, s in summ.iterrows():
        lay = layouts.get(s.model)
        mine = runs[(runs.run_id == s.run_id) & (runs.status == Status.OK.value)]
        if lay is None or mine.empty or not budget:
            continue
        key = (s.model, s.tokens)
        if key not in trace_of:  # greedy decoding routes alike in every run of a model and length
            trace_of[key] = traces.configuration_trace(runs, s)
        ex = trace_of[key]
        slab = {int(k): v for k, v in lay["slab_bytes_per_layer"].items()}
        path = floors.read_path_of(s)
        cost, io_bps = cheapest, fastest_io
        ceiling = ceilings.moe_ceiling.get(s.model)
        compute_s = 1.0 / ceiling if ceiling else float("nan")
        cpus = min(float(quota), float(mine.threads.iloc[0])) if quota else float(mine.threads.iloc[0])
        per_run = []
        for _, r in mine.iterrows():
            # the cache the RAM budget leaves once the always-needed tensors are in it
            window = int(r.get("tokens_completed") or 0) - int(r.get("warmup_tokens", 1) or 1)
            fb = _window_floor(ex, slab, floors.floor_cache_bytes(budget, lay, window), r)
            per_run.append({"run_id": s.run_id, "repeat": r["repeat"],
                            "disturbed": bool(r.get("disturbed", False)),
                            "steady_tok_per_s": r.steady_tok_per_s,
                            "window_read_bytes_per_token": r.get("window_read_bytes_per_token"),
                            "floor_bytes_per_token": fb,
                            **floors.floor_bound(fb, io_bps, compute_s, cost, cpus)})
        pr = pd.DataFrame(per_run)
        pr["bound_error"] = floors.bound_errors(pr)
        errors.append(pr[pr.bound_error])
        steady = mine.steady_tok_per_s.median()  # the findings' figure: the measured window's
        row = {"run_id": s.run_id, "steady_tok_per_s_median": steady, "read_path": path,
               "io_mb_per_s": io_bps / 1e6,
               "window_read_bytes_per_token": pr.window_read_bytes_per_token.median(),
               "floor_bytes_per_token": pr.floor_bytes_per_token.median(),
               "kernel_us_per_mb": cost * 1e12, "compute_s": compute_s,
               **{k: pr[k].median() for k in ("floor_io_s", "floor_cpu_s",
                                              "floor_perfect_overlap_tok_per_s",
                                              "floor_no_overlap_tok_per_s")},
               "bound_errors": int(pr.bound_error.sum())}
        row["x_from_floor"] = (row["floor_perfect_overlap_tok_per_s"] / steady
                               if steady else float("nan"))
        rows.append(row)
        best_inputs[s.run_id] = (s.model, mine)
    if not rows:
        return Outcome(Verdict(INCONCLUSIVE, "no configuration with a layout, ok runs and a RAM "
                                             "budget to bound"))
    table = pd.DataFrame(rows)
    notes = []
    models = table.run_id.map(lambda rid: best_inputs[rid][0])
    for model, of_model in table.groupby(models, sort=False):
        best = of_model.loc[of_model.steady_tok_per_s_median.idxmax()]
        notes.append(_best_note(model, best, best_inputs[best.run_id][1]))
    bad = pd.concat(errors, ignore_index=True)
    tables = {"distance_to_limit": table}
    if len(bad):
        tables["bound_errors"] = bad
        v = Verdict(FAILS, f"{len(bad)} repeat(s) beat their floor: the floor is wrong")
    else:
        v = Verdict(HOLDS, "no repeat beat its floor")
    return Outcome(v, tables, notes)


def _window_floor(trace: pd.DataFrame | None, slab: dict, cache_bytes: float, run) -> float:
    """The bytes per window token any run must read over this run's measured window (its
    tokens after warmup_tokens, by position in the routing trace): Belady from the best start
    (harness.analysis.floors.window_floor_bytes). nan without a trace or a window."""
    warmup = int(run.get("warmup_tokens", 1) or 1)
    done = int(run.get("tokens_completed") or 0)
    n_prompt = run.get("prompt_tokens")
    if trace is None or done <= warmup or n_prompt is None or n_prompt != n_prompt:
        return float("nan")
    first = int(n_prompt) + warmup
    positions = range(first, int(n_prompt) + done)
    return floors.window_floor_bytes(trace, slab, cache_bytes, positions) / len(positions)


def _best_note(model: str, best, mine: pd.DataFrame) -> str:
    """The best configuration of a model, its distance, and what stands in its way."""
    head = (f"Best configuration of `{model}`: `{best.run_id}`, "
            f"{_s(best.steady_tok_per_s_median)} steady tok/s, {_s(best.x_from_floor)}x from "
            f"its floor of {_s(best.floor_perfect_overlap_tok_per_s)} tok/s (floor time per "
            f"token: I/O {_s(best.floor_io_s)} s, CPU {_s(best.floor_cpu_s)} s). ")
    way = floors.in_the_way(mine)
    if not way:
        return head + "Its runs carry no attribution, so what stands in its way is not measured."
    shares = ", ".join(f"{label} {way[k + '_share']:.0%}" for k, label in (
        ("io_wait", "I/O wait"), ("kernel", "kernel CPU"), ("user", "user CPU"),
        ("cpu_wait", "waiting for a CPU")))
    text = (f"What stands in its way, from its attribution: {way['what']}, the largest part of its "
            f"mean steady token ({shares}).")
    steady_bytes = best.window_read_bytes_per_token
    if way["part"] == "io_wait" and steady_bytes == steady_bytes and best.floor_bytes_per_token > 0:
        text += (f" It reads {_s(steady_bytes / 1e6)} MB a token of its measured window where "
                 f"the window's floor reads {_s(best.floor_bytes_per_token / 1e6)} MB "
                 f"({_s(steady_bytes / best.floor_bytes_per_token)}x): bytes a better cache or "
                 f"prediction would not read.")
    return head + text
