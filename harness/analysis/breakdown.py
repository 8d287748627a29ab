"""The study's time breakdown, re-measured: the time per token of the best configuration of the
study's surviving design (pread+madvise), split into pread, madvise, the mechanism's other work
and compute, and that design with expert logging on and off. An analysis unit like the findings:
it returns its tables and figures, and renders nothing."""

from __future__ import annotations

import pandas as pd

from harness.contract import Status
from harness.analysis.outcome import Figure, Outcome

# the study broke down the time of its surviving design, at its best configuration
STUDY_DESIGN = "pread+madvise"
STUDY_BREAKDOWN = ("at the best configuration, pread 58% and compute 42% of the time per token; "
                   "madvise and logging under 0.2%")


def time_breakdown(runs: pd.DataFrame, summ: pd.DataFrame) -> Outcome:
    """`runs`: the judged runs; `summ`: configurations.summarize's rows (its `median` is tok/s)."""
    design = summ[summ.mechanism == STUDY_DESIGN]
    cands = design[design.run_id.isin(runs.run_id)].sort_values("median", ascending=False)
    if cands.empty:
        return Outcome(None, notes=[f"No {STUDY_DESIGN} runs to break down."])
    bd = run_breakdown(runs, cands.iloc[0].run_id)
    tables = {"time_breakdown": pd.DataFrame([bd])}
    logoff = design[~design.log_experts.astype(bool)]
    logon = design[design.log_experts.astype(bool) & design.mlock_non_expert.astype(bool)]
    if len(logoff) and len(logon):
        tables["logging_on_off"] = pd.DataFrame([
            {"logging": "on", "run_id": logon.iloc[0].run_id,
             "tok_per_s_median": logon.iloc[0]["median"]},
            {"logging": "off", "run_id": logoff.iloc[0].run_id,
             "tok_per_s_median": logoff.iloc[0]["median"]}])
    return Outcome(None, tables,
                   figures=[Figure("time_breakdown", "time_breakdown", bd, f"Run `{bd['run_id']}`.")])


def run_breakdown(runs: pd.DataFrame, run_id: str) -> dict:
    """One configuration's median time per token split into pread, madvise, the mechanism's
    other work and compute (what is left), with each part's share."""
    ok = runs[(runs.run_id == run_id) & (runs.status == Status.OK.value)]
    wall = ok.wall_s_per_token.median()
    pread = ok.pread_s_per_token.median()
    madv = ok.madvise_s_per_token.median()
    other = ok.other_prefetch_s_per_token.median()
    compute = max(0.0, wall - pread - madv - other)
    return {"run_id": run_id, "wall_s": wall, "pread_s": pread, "madvise_s": madv,
            "other_prefetch_s": other, "compute_s": compute,
            "pread_share": pread / wall if wall else float("nan"),
            "compute_share": compute / wall if wall else float("nan"),
            "madvise_other_share": (madv + other) / wall if wall else float("nan")}
