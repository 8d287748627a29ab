"""The study's design from a finished study's variances: how many repeats each configuration needs
so that its comparison with the configuration the findings compare it against resolves a minimum
effect at stats.POWER, what that costs in run time at a given run length, and so the smallest
minimum effect each regime can afford. The main job's repeats and each profile's `min_effect`
(config/experiments.yaml) come from this, run on the reference study:

    python -m harness.analysis.design RUNS_CSV [--tokens N] [--fixed-s S] [--config YAML]

"Resolves" is the rule as applied (harness.analysis.stats.faster): a true difference of the
effect is called `holds` (the 90% interval above no change and reaching the effect) with
stats.POWER. The second clause is passed 95% of the time at a true effect of exactly the minimum,
so the first decides: the interval's low end above 0 with stats.POWER. tests/test_design.py
simulates studies at the designed repeats and checks that the effect holds that often.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
import pandas as pd

from harness.analysis import stats

# the configurations most findings compare the others against (findings 1a, 7, 8: the study's
# surviving design; 9, 11, 12: the study's best); a configuration is designed against whichever
# of them is the noisier, both sides with the same number of runs
COMPARATORS = ("pread-madvise", "pread-madvise-mlock")
EFFECTS = (0.10, 0.15, 0.20, 0.25, 0.30)
MOST_RUNS = 12  # more than this per configuration: "cannot", not a number to configure


def runs_needed(var_a: float, var_b: float, effect: float, most: int = MOST_RUNS,
                prior_df_a: float = 0.0, prior_df_b: float = 0.0) -> int | None:
    """Runs per side (the same on both) for two configurations of variances var_a and var_b (of
    log tok/s between runs) to resolve `effect` at stats.POWER with a 90% interval whose df is
    Welch-Satterthwaite's over each side's df: its runs less one plus the df its variance
    borrows from the others (`prior_df_*`, what stats.Pool.moderated adds); None past `most`."""
    target = math.log1p(effect)
    from scipy import stats as sps

    for n in range(2, most + 1):
        sa, sb = var_a / n, var_b / n
        da, db = prior_df_a + n - 1, prior_df_b + n - 1
        se = math.sqrt(sa + sb)
        df = stats.welch_df(sa, sb, da, db)
        if (sps.t.ppf(1 - stats.ALPHA, df) + sps.t.ppf(stats.POWER, df)) * se <= target:
            return n
    return None


def regime_design(runs: pd.DataFrame, value: str = "steady_tok_per_s", by: str = "configuration",
                  effects=EFFECTS) -> pd.DataFrame:
    """One regime's ok runs -> per configuration: runs it has, its variance (moderated as the
    verdicts moderate it), the comparator it is designed against and the runs each side needs at
    each effect (column `runs_at_<pct>`; NaN past MOST_RUNS)."""
    runs = runs[runs[value] > 0]
    pool = stats.Pool.of(runs, value, by=by)
    mod = {c: pool.moderated(c) for c in pool.per_config}
    var = {c: v for c, (v, _) in mod.items()}
    # the df a configuration's variance borrows from the others, which more runs keep
    borrowed = {c: max(0.0, df - (pool.per_config[c][0] - 1)) for c, (_, df) in mod.items()}
    comparators = [c for c in var if c.split("@")[0] in COMPARATORS]
    rows = []
    for c in sorted(var):
        if c in comparators:
            against = max((k for k in comparators if k != c), key=var.get, default=c)
        else:
            against = max(comparators, key=var.get) if comparators else c
        row = {"configuration": c, "runs": pool.per_config[c][0], "sd": math.sqrt(var[c]),
               "against": against}
        for e in effects:
            n = runs_needed(var[c], var[against], e, prior_df_a=borrowed[c],
                            prior_df_b=borrowed[against])
            row[f"runs_at_{round(100 * e)}"] = n if n is not None else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def cost_minutes(design: pd.DataFrame, runs: pd.DataFrame, tokens: int, fixed_s: float,
                 effect: float, value: str = "steady_tok_per_s", by: str = "configuration",
                 least: int = 2) -> float:
    """Minutes of run time the design at `effect` costs: per configuration, its runs (at least
    `least`; a configuration that cannot be resolved keeps `least`) times `fixed_s` plus
    `tokens` at its median rate. The comparators take the most any configuration needs."""
    col = f"runs_at_{round(100 * effect)}"
    need = design.set_index("configuration")[col].fillna(least).clip(lower=least)
    top = int(need.max()) if len(need) else least
    for c in need.index:
        if c.split("@")[0] in COMPARATORS:
            need[c] = top
    rate = runs[runs[value] > 0].groupby(by)[value].median()
    return float(sum(n * (fixed_s + tokens / rate[c]) for c, n in need.items() if c in rate)) / 60


def planned_minutes(config: dict, runs: pd.DataFrame, fixed_s: float,
                    value: str = "steady_tok_per_s") -> pd.DataFrame:
    """Per profile, the run minutes a config's runs would take and the share of them in measured
    tokens, estimated from a finished study's runs: each run `fixed_s` plus its generated tokens
    at the median rate its run id had there (a run id it did not measure: the profile's median
    rate), capped at its time limit. An estimate for planning, not a measurement."""
    from harness.config import expand

    rate = runs[runs[value] > 0].groupby("run_id")[value].median()
    by_profile = runs[runs[value] > 0].groupby("profile")[value].median()
    rows = []
    for spec in expand(config):
        r = rate.get(spec.run_id, by_profile.get(spec.profile, float("nan")))
        run_s = min(fixed_s + spec.tokens / r, spec.time_limit_s)
        window_s = max(0, spec.tokens - spec.warmup_tokens) / r if run_s < spec.time_limit_s else 0
        rows.append({"profile": spec.profile, "runs": spec.repeats,
                     "run_s": spec.repeats * run_s, "window_s": spec.repeats * window_s})
    t = pd.DataFrame(rows).groupby("profile").sum()
    return pd.DataFrame({"runs": t.runs, "minutes": t.run_s / 60,
                         "measured_share": t.window_s / t.run_s}).reset_index()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs_csv", help="a finished study's results/final/runs.csv")
    ap.add_argument("--tokens", type=int, default=36, help="generated tokens per run")
    ap.add_argument("--fixed-s", type=float, default=40.0,
                    help="seconds a run spends outside its generated tokens")
    ap.add_argument("--config", help="also estimate this experiments config's run minutes "
                    "(its own tokens and repeats) from the runs' rates")
    a = ap.parse_args(argv)
    from harness.analysis import configurations

    runs = pd.read_csv(a.runs_csv)
    disturbed = runs["disturbed"].fillna(False).astype(bool) if "disturbed" in runs else False
    runs = runs[(runs.status == "ok") & ~disturbed]
    if "configuration" not in runs:
        runs = runs.assign(configuration=configurations.configuration_ids(runs))
    for profile, g in runs.groupby("profile"):
        d = regime_design(g)
        print(f"## {profile}\n")
        print(d.to_markdown(index=False, floatfmt=".3f"))
        costs = {f"{e:.0%}": round(cost_minutes(d, g, a.tokens, a.fixed_s, e)) for e in EFFECTS}
        print(f"\nrun minutes at {a.tokens} tokens and {a.fixed_s:g} s fixed per run: {costs}\n")
    if a.config:
        import yaml

        plan = planned_minutes(yaml.safe_load(open(a.config)), runs, a.fixed_s)
        print(f"## {a.config}, estimated (not measured)\n")
        print(plan.to_markdown(index=False, floatfmt=".2f"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
