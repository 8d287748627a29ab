"""How far a figure moves between jobs: matched configurations, their ratio and interval, and the
finding tables' ratios side by side, on constructed tables and on the committed references."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.analysis import reproducibility

ROOT = Path(__file__).resolve().parents[1]


def runs(rows):
    out = []
    for run_id, values, extra in rows:
        for k, v in enumerate(values, start=1):
            out.append({"run_id": run_id, "profile": "p", "repeat": k, "status": "ok",
                        "steady_tok_per_s": v, "disturbed": False, "model": "m",
                        "mechanism": "none", "threads": 2, "tokens": 36, **extra})
    return pd.DataFrame(out)


def test_a_configuration_is_compared_only_with_the_same_spec_and_its_move_has_an_interval():
    new = runs([("same", [1.10, 1.12, 1.08], {}), ("threads", [1.0, 1.0], {"threads": 1}),
                ("only-new", [1.0, 1.1], {}), ("steady", [1.0, 1.2, 0.9], {})])
    old = runs([("same", [1.0, 1.01, 0.99], {}), ("threads", [1.0, 1.0], {}),
                ("steady", [1.05, 0.95, 1.1], {})])
    # an older table wrote threads as 2.0 (a column with gaps is read as floats): still the same
    old["threads"] = old.threads.astype(float)
    t = reproducibility.configurations(new, old).set_index("run_id")
    same = t.loc["same"]
    want = math.exp(np.log([1.10, 1.12, 1.08]).mean() - np.log([1.0, 1.01, 0.99]).mean())
    assert same.comparable and same.ratio == pytest.approx(want)
    assert same.ratio_ci90_low > 1 and same.moved  # a 10% move the repeats cannot explain
    assert not t.loc["steady", "moved"]
    assert t.loc["steady", "ratio_ci90_low"] < 1 < t.loc["steady", "ratio_ci90_high"]
    assert not t.loc["threads", "comparable"] and "threads 2 -> 1" in t.loc["threads", "why"]
    assert not t.loc["only-new", "comparable"] and "not in the old" in t.loc["only-new", "why"]
    s = reproducibility.summary(t.reset_index()).set_index("profile")
    assert s.loc["all", "configurations"] == 2 and s.loc["all", "moved_configurations"] == 1
    assert s.loc["all", "largest_move_run_id"] == "same"


def test_a_parameter_an_older_table_lacks_is_compared_at_its_default():
    new = runs([("a", [1.0, 1.1], {"cache_fill_margin_mb": 64}),
                ("b", [1.0, 1.1], {"cache_fill_margin_mb": 128})])
    old = runs([("a", [1.0, 1.1], {}), ("b", [1.0, 1.1], {})])
    t = reproducibility.configurations(new, old).set_index("run_id")
    assert t.loc["a", "comparable"] and not t.loc["b", "comparable"]


def test_the_committed_references_compare_as_their_readme_says():
    new, old = (ROOT / f"reference/{r}" for r in ("vm-2026-12-06", "vm-2026-12-04c"))
    t = reproducibility.configurations(pd.read_csv(new / "results/final/runs.csv"),
                                       pd.read_csv(old / "results/final/runs.csv"))
    # the window changed between them (4 warm-up tokens, not 1): no configuration is the same
    assert len(t) > 10 and not t.comparable.any()
    assert t.why.str.contains("warmup_tokens").all()
    fr = reproducibility.finding_ratios(new / "results/final/tables", old / "results/final/tables")
    passive = fr[(fr.regime == "seed-box") & (fr.table == "finding12_wait_policy")
                 & fr.row.str.contains("omp_wait_policy=passive") & (fr.column == "ratio")]
    # README: 1.40x then, 1.49x now
    assert len(passive) == 1 and passive.new_over_old.iloc[0] == pytest.approx(1.49 / 1.40, rel=0.01)
