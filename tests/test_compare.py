"""results/compare on two machines' trees: the committed reference run and a copy of it as
"another machine" (different host, slower, one configuration not run, one verdict changed)."""

import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from harness.report.compare import CompareError, compare

REF = Path(__file__).resolve().parents[1] / "reference" / "vm-2026-12-04c" / "results"
_REF_VERDICTS = pd.read_csv(REF / "final/tables/verdicts.csv").set_index("finding")
REF_6_SEED, REF_6_DISK = (_REF_VERDICTS.loc["6", p] for p in ("seed-box", "disk-box"))
OTHER = {"holds": "does not hold", "does not hold": "holds", "inconclusive": "holds"}


@pytest.fixture
def two_trees(tmp_path):
    a = tmp_path / "a" / "results"
    b = tmp_path / "b" / "results"
    for dst in (a, b):
        shutil.copytree(REF / "final", dst / "final")
        shutil.copytree(REF / "ceilings", dst / "ceilings")
        shutil.copytree(REF / "runs", dst / "runs")
    t = b / "final" / "tables"
    m = pd.read_csv(t / "machine.csv")
    m["hostname"] = "node-b"
    m.to_csv(t / "machine.csv", index=False)
    s = pd.read_csv(t / "summary.csv")
    s = s[s.run_id != "madvise@seed-box"]
    s.loc[s.run_id == "threadpool@seed-box", ["tok_per_s_median", "tok_per_s_min",
                                              "tok_per_s_max"]] = [0.5, 0.4, 0.6]
    s.to_csv(t / "summary.csv", index=False)
    v = pd.read_csv(t / "verdicts.csv")
    # a study of two regimes: node-b's finding 6 comes out otherwise than the reference's
    v.loc[v.finding.astype(str) == "6", "seed-box"] = OTHER[REF_6_SEED]
    v.to_csv(t / "verdicts.csv", index=False)
    return {"vm": str(a), "node-b": str(b)}


def test_two_machines_side_by_side_every_number_linked(two_trees, tmp_path):
    out = tmp_path / "compare"
    tables = compare(two_trees, out)
    md = (out / "COMPARE.md").read_text()
    conf = tables["configurations"].set_index("run_id")
    assert conf.loc["threadpool@seed-box", "node-b tok/s"].startswith("0.5 (0.4-0.6, n=2)")
    assert not conf.loc["threadpool@seed-box", "vm tok/s"].startswith("0.5 ")
    assert conf.loc["madvise@seed-box", "node-b tok/s"] == "not run"
    assert "n=2" in conf.loc["madvise@seed-box", "vm tok/s"]
    assert tables["machines"].set_index("fact").loc["hostname"].tolist() == ["vm", "node-b"]
    verdicts = tables["verdicts"].set_index("finding")
    assert verdicts.loc["6 [seed-box]", "node-b"].startswith(OTHER[REF_6_SEED])
    assert verdicts.loc["6 [seed-box]", "vm"].startswith(REF_6_SEED)
    assert verdicts.loc["6 [disk-box]", "node-b"].startswith(REF_6_DISK)
    # every link in the comparison resolves to a file of the tree it names
    links = re.findall(r"\]\(([^)]+)\)", md)
    assert len(links) > 50
    for link in links:
        assert (out / link).exists(), link
    assert any("/b/results/runs/threadpool@seed-box/rep1/run.json" in str((out / x).resolve())
               for x in links)
    assert (out / "configurations.csv").exists() and "Synthetic models" in md


def test_a_tree_that_is_not_finished_is_refused_by_name(two_trees, tmp_path):
    (Path(two_trees["node-b"]) / "final" / "tables" / "verdicts.csv").unlink()
    with pytest.raises(CompareError, match="machine 'node-b'.*not a finished results tree"):
        compare(two_trees, tmp_path / "compare")


def test_a_study_of_two_regimes_compares_each_regimes_verdict():
    from harness.report.compare import regime_verdicts

    two = pd.DataFrame({"finding": ["6", "8"], "claim": ["gap", "mechanism"],
                        "seed-box": ["holds", "inconclusive"], "why (seed-box)": ["a", "b"],
                        "disk-box": ["does not hold", "holds"], "why (disk-box)": ["c", "d"],
                        "same_in_every_regime": [False, False]})
    got = regime_verdicts(two)
    assert ("6 [seed-box]", "gap", "holds") in got and ("8 [disk-box]", "mechanism", "holds") in got
    assert len(got) == 4
    one = pd.DataFrame({"finding": [6], "claim": ["gap"], "verdict": ["holds"], "why": ["a"]})
    assert regime_verdicts(one) == [("6", "gap", "holds")]
