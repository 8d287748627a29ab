"""The committed reference run: its links resolve inside the repository, every record runs.csv
cites is there, and every number the README quotes from it appears in it."""

import re
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
REFS = sorted(p for p in (ROOT / "reference").glob("*") if (p / "results/final/RESULTS.md").exists())

pytestmark = pytest.mark.skipif(not REFS, reason="no reference run committed yet")


@pytest.mark.parametrize("ref", REFS, ids=lambda p: p.name)
def test_results_md_links_resolve_inside_the_repository(ref):
    final = ref / "results" / "final"
    links = re.findall(r"\]\(([^)]+)\)", (final / "RESULTS.md").read_text())
    assert links
    for link in links:
        target = (final / link).resolve()
        assert target.is_relative_to(ROOT) and target.exists(), link


@pytest.mark.parametrize("ref", REFS, ids=lambda p: p.name)
def test_every_cited_record_is_committed(ref):
    runs = pd.read_csv(ref / "results/final/runs.csv")
    for rec in runs.record:
        assert (ref / rec).exists(), rec
        assert (ref / rec).with_name("tokens.csv").exists(), rec
    assert not list(ref.rglob("*.gguf"))


def test_readme_quotes_only_numbers_of_the_reference_run():
    text = (ROOT / "README.md").read_text()
    m = re.search(r"^## What the main job measured here.*?\n(.*?)^## ", text, re.M | re.S)
    assert m, "README has no section quoting the reference run"
    section = m.group(1)
    named = [p for p in REFS if f"reference/{p.name}/" in section]
    ref = min(named, key=lambda p: section.index(f"reference/{p.name}/"))  # the first it names
    corpus = (ref / "results/final/RESULTS.md").read_text()
    corpus += "".join(f.read_text() for f in (ref / "results/final/tables").glob("*.csv"))
    corpus += (ref / "results/ceilings/cpu_quota.json").read_text()
    corpus += (ref / "config/experiments.yaml").read_text()  # the profile the run was measured under
    quoted = re.findall(r"(?<![\w.-])\d+\.\d+(?![\w.])", section)
    assert len(quoted) >= 10
    missing = [q for q in quoted if q not in corpus]
    assert not missing, missing
