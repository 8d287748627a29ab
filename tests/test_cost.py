"""Where a study's time goes, from its records: checked on the committed reference run against
the shares the steady-state issue measured from it by hand."""

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis import cost

REF = Path(__file__).resolve().parents[1] / "reference/vm-2026-12-04c"


def test_the_reference_runs_phases_add_up_to_what_was_measured_by_hand():
    elapsed = json.loads((REF / "main_job.json").read_text())["elapsed_s"]
    table = cost.study_cost(REF / "results", elapsed)
    assert table.attrs["runs"] == 74  # 72 runs and 2 re-runs of disturbed repeats
    t = table.set_index("phase")
    # steady tokens 1,320 s, the first token 332 s, the prompt 1,531 s, the load 1,970 s;
    # 18% of the job in measured tokens
    assert t.loc["measured window", "seconds"] == pytest.approx(1320, rel=0.05)
    assert t.loc["first token", "seconds"] == pytest.approx(332, rel=0.05)
    assert t.loc["prompt", "seconds"] == pytest.approx(1531, rel=0.05)
    assert t.loc["load", "seconds"] == pytest.approx(1970, rel=0.05)
    assert t.loc["measured window", "share"] == pytest.approx(0.18, abs=0.01)
    _named_phases_fit_each_run(REF / "results")


def test_the_new_reference_spends_most_of_its_job_in_measured_tokens():
    """vm-2026-12-06, the first main job with the settled window, the unthrottled load and the
    trimmed design: the README's cost table quotes these shares."""
    ref = REF.parent / "vm-2026-12-06"
    elapsed = json.loads((ref / "main_job.json").read_text())["elapsed_s"]
    table = cost.study_cost(ref / "results", elapsed)
    assert table.attrs["runs"] == 55  # 54 runs and the re-run of one whose window drifted
    t = table.set_index("phase")
    assert elapsed <= 2 * 3600 + 15 * 60
    assert t.loc["measured window", "share"] == pytest.approx(0.571, abs=0.002)
    assert t.loc["load", "share"] < 0.03  # 27% when the load read through the throttle
    _named_phases_fit_each_run(ref / "results")
    # the table the README quotes is this one, as harness.report.reference wrote it
    # (a phase added since, such as the tokens past the window, took no time then)
    quoted = pd.read_csv(ref / "cost.csv").set_index("phase")
    added = [p for p in t.index if p not in quoted.index]
    assert set(quoted.index) <= set(t.index) and t.loc[added, "seconds"].sum() == 0
    assert quoted.share.to_numpy() == pytest.approx(t.loc[quoted.index].share.to_numpy(), abs=1e-4)


def _named_phases_fit_each_run(results: Path) -> None:
    """Each run's measured phases (load, prompt, tokens) fit inside its own wall time: the rest
    of the run is what is left, never a phase counted twice or timed by another clock."""
    for rec in sorted(results.glob("runs/*/re*/run.json")):
        parts = cost.run_phases(rec)
        named = sum(v for k, v in parts.items() if k != "rest of the run")
        wall = json.loads(rec.read_text())["wall_s"]
        assert named <= wall * 1.001, (rec, named, wall)


def test_a_phase_counted_twice_does_not_fit_its_run(tmp_path, monkeypatch):
    """The check above can fail: a load time longer than the run it is part of."""
    import shutil

    src = next((REF.parent / "vm-2026-12-06/results/runs").glob("baseline@disk-box/rep1"))
    dst = tmp_path / "runs" / "x" / "rep1"
    shutil.copytree(src, dst)
    rec = json.loads((dst / "run.json").read_text())
    rec["summary"]["load_s"] = rec["wall_s"] * 2
    (dst / "run.json").write_text(json.dumps(rec))
    with pytest.raises(AssertionError):
        _named_phases_fit_each_run(tmp_path)
