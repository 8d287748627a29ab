"""What every finding reads and is: the Study of one regime (its judged runs, routing trace,
layouts, ceilings and minimum effect), the Finding a claim is declared as, and the helpers the
findings share to build their tables."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from harness.analysis import configurations, stats, traces
from harness.analysis.outcome import Outcome
from harness.analysis.stats import Verdict
from harness.contract import Status


def value_range(s: pd.Series) -> str:
    s = s.dropna()
    return f"{s.min():.3g}-{s.max():.3g}" if len(s) else "-"


def interval_columns(iv: stats.Interval | None, name: str = "ratio") -> dict:
    """A comparison's table columns: its ratio under `name`, and the 90% interval's ends."""
    est_low_high = iv.ratio if iv is not None else (None, None, None)
    return {name: est_low_high[0], "ci90_low": est_low_high[1], "ci90_high": est_low_high[2]}


# a token's parts (harness.run.attribution), and what they cost the quota and the disk
ATTRIBUTION_COLUMNS = ["user_share", "kernel_share", "throttled_share", "runqueue_share",
                       "sync_share", "io_wait_share", "cg_sys_s_per_token",
                       "cgroup_read_bytes_per_token"]


def attribution_side_by_side(runs: list[pd.DataFrame], by: list[str],
                              extra: list[str]) -> pd.DataFrame:
    """Configurations compared by a finding, one row each (`by`), with the median over their
    repeats of their attribution and `extra` columns: which part of the token a faster one
    shrank. Columns older records lack are left out."""
    both = pd.concat(runs)
    cols = [c for c in by + ATTRIBUTION_COLUMNS + extra if c in both]
    # a configuration is named by the first of its run ids: the table says run_id
    return both[cols].groupby(by).median().reset_index().rename(columns={CONFIG: "run_id"})


def one_config(sel: pd.DataFrame) -> str:
    """The configuration a selection of runs is (runs of one resolved spec under several run ids
    are one: configurations.configuration_ids), the most frequent if several."""
    return sel[CONFIG].mode().iloc[0]


CONFIG = "configuration"  # the runs table's column the comparisons group by


@dataclass
class Study:
    """What the findings read: the runs of the default length, the longest routing trace, the
    layouts and ceilings."""

    runs: pd.DataFrame
    layouts: dict
    q4: str
    q2: str
    io_mb_s: float
    dense_ceiling: float
    moe_ceiling: float
    trace: pd.DataFrame | None = None
    trace_synthetic: bool = True
    trace_of: str = ""  # which run the trace is: "run `<id>` repeat <k>"
    n_expert: int = 0
    # the smallest difference a directional verdict claims here: the profile's `min_effect`,
    # raised where the regime's noise cannot resolve 10% with the runs the budget buys
    min_effect: float = stats.MIN_EFFECT
    # the dense ceiling's repetitions (tok/s): finding 6 compares with them, not with one figure
    dense_ceiling_samples: tuple = ()
    _pools: dict = field(default_factory=dict, repr=False)  # value -> stats.Pool, made once

    def __post_init__(self):
        if CONFIG not in self.runs:  # a table from before the column: each run id its own
            self.runs = self.runs.assign(**{CONFIG: configurations.configuration_ids(self.runs)})

    @classmethod
    def of(cls, runs: pd.DataFrame, all_runs: pd.DataFrame, layouts: dict, q4: str, q2: str,
           io_mb_s: float, dense_ceiling: float, moe_ceiling: float,
           min_effect: float | None = None, dense_ceiling_samples: tuple = ()) -> Study:
        """The study of one regime: `runs` the judged runs, the routing trace the longest
        logged one of `all_runs`."""
        tr = traces.trace_run(all_runs, q4)
        return cls(runs=runs, layouts=layouts, q4=q4, q2=q2, io_mb_s=io_mb_s,
                   dense_ceiling=dense_ceiling, moe_ceiling=moe_ceiling,
                   trace=traces.read_trace(tr) if tr is not None else None,
                   trace_synthetic=bool(tr.synthetic) if tr is not None else True,
                   trace_of=f"run `{tr.run_id}` repeat {tr['repeat']}" if tr is not None else "",
                   n_expert=layouts.get(q4, {}).get("n_expert", 0),
                   min_effect=stats.MIN_EFFECT if min_effect is None else float(min_effect),
                   dense_ceiling_samples=tuple(dense_ceiling_samples))

    @property
    def value(self) -> str:
        """The run's figure: steady tok/s (its measured window) where recorded, else tok/s."""
        r = self.runs
        return ("steady_tok_per_s" if "steady_tok_per_s" in r and r.steady_tok_per_s.notna().any()
                else "tok_per_s")

    def pool(self, value: str | None = None) -> stats.Pool:
        """The variance the ok runs of every configuration share, of `value` (default: the
        run's figure)."""
        key = value or self.value
        if key not in self._pools:
            ok = self.ok(any_wait_policy=True)
            self._pools[key] = stats.Pool.of(ok[ok[key] > 0], key, by=CONFIG)
        return self._pools[key]

    def compare(self, a: pd.DataFrame, b: pd.DataFrame, value: str | None = None) -> stats.Interval:
        return stats.compare(self.pool(value), one_config(a), one_config(b))

    def faster(self, iv: stats.Interval, what: str) -> Verdict:
        """'a is faster than b' by at least this regime's minimum effect."""
        return stats.faster(iv, self.min_effect, what)

    @property
    def effect(self) -> str:
        """The minimum effect as the verdicts' texts say it."""
        return f"{self.min_effect:.0%}"

    def ok(self, any_wait_policy: bool = False, **eq) -> pd.DataFrame:
        """The ok runs with these column values; of the study's OpenMP wait policy unless asked
        (a configuration that only changes how threads wait is finding 12's, no other's)."""
        r = self.runs[self.runs.status == Status.OK.value]
        if not any_wait_policy and "omp_wait_policy" not in eq:
            r = self.study_wait(r)
        for k, v in eq.items():
            r = r[r[k] == v]
        return r

    @property
    def wait_policy(self) -> str | None:
        """The study's OpenMP wait policy: the one most of its runs had (what `auto` chose for the
        regime; a reference run from before the parameter existed has `libgomp`)."""
        if "omp_wait_policy" not in self.runs or self.runs.omp_wait_policy.dropna().empty:
            return None
        return self.runs.omp_wait_policy.mode().iloc[0]

    def study_wait(self, r: pd.DataFrame) -> pd.DataFrame:
        """The runs with the study's OpenMP wait policy (records from before it was a parameter
        all had one: libgomp's)."""
        policy = self.wait_policy
        return r[r.omp_wait_policy == policy] if policy is not None else r

    def surviving_design(self, model: str) -> pd.DataFrame:
        """The study's pread+madvise: no mlock, logging on, the default run length."""
        r = self.ok(mechanism="pread+madvise", model=model, mlock_non_expert=False)
        return r[r.log_experts.astype(bool)]

    def quant_pairs(self):
        """(mechanism, Q4_K_M runs, Q2_K runs) for pread+madvise, then demand paging, where both
        quants have ok runs and both layouts are known."""
        if math.isnan(self.bytes_ratio()):
            return
        for mech in ("pread+madvise", "none"):
            if mech == "pread+madvise":
                a, b = self.surviving_design(self.q4), self.surviving_design(self.q2)
            else:
                a = self.ok(model=self.q4, mechanism=mech, mlock_non_expert=False)
                b = self.ok(model=self.q2, mechanism=mech, mlock_non_expert=False)
            if len(a) and len(b):
                yield mech, a, b

    def bytes_ratio(self) -> float:
        if self.q4 not in self.layouts or self.q2 not in self.layouts:
            return float("nan")
        return self.layouts[self.q4]["bytes_per_token"] / self.layouts[self.q2]["bytes_per_token"]


@dataclass(frozen=True)
class Finding:
    number: str
    title: str
    claim: str
    needs: str
    rule: str

    def evaluate(self, study: Study) -> Outcome:
        raise NotImplementedError
