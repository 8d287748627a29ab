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
    assert t.seconds.sum() == pytest.approx(elapsed)


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
    assert t.seconds.sum() == pytest.approx(elapsed)
    # the table the README quotes is this one, as harness.report.reference wrote it
    quoted = pd.read_csv(ref / "cost.csv").set_index("phase")
    assert list(quoted.index) == list(t.index)
    assert quoted.share.to_numpy() == pytest.approx(t.share.to_numpy(), abs=1e-4)
