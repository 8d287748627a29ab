"""Where a study's time goes, from its records: checked on the committed reference run against
the shares the steady-state issue measured from it by hand."""

import json
from pathlib import Path

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
    assert t.seconds.sum() == pytest.approx(elapsed)
