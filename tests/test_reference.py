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


def method_phrases() -> list[str]:
    """Numbers the READMEs may state without a source: the method's own constants, each
    written from the code that holds it (so a changed constant fails here too)."""
    from harness.analysis import flags, stats, steady
    from harness.analysis import attribution
    from harness.box import counters
    from harness.box.limits import CPU_PERIOD_US

    return [f"{CPU_PERIOD_US / 1000:.0f} ms period", f"{stats.LEVEL:.0%} confidence", f"{stats.MIN_EFFECT:.0%} minimum effect",
            f"{stats.POWER:.0%} power", f"within {counters.IDENTITY_TOLERANCE:.0%}",
            f"at least {attribution.BOUND_SHARE:.0%}",
            f"more than {flags.STEAL_BOUND:.0%}", f"by more than {flags.MEAN_MEDIAN_GAP:.0%}",
            f"beyond {steady.DRIFT_BOUND:.0%}", f"within {steady.LATER_TOLERANCE:.0%}"]


@pytest.mark.parametrize("doc", ["README.md", "config/README.md"])
def test_every_number_a_readme_quotes_is_the_committed_value_it_links(doc):
    from harness.report import citations

    text = (ROOT / doc).read_text()
    quotes = citations.quotes(text)
    if doc == "README.md":
        assert len(quotes) >= 10, "the README quotes the reference run through source links"
        assert any(q.target.startswith("reference/") for q in quotes)
    # a link resolves from the document's own folder, as a Markdown viewer resolves it
    wrong = [e for e in (citations.check((ROOT / doc).parent, q) for q in quotes) if e]
    assert not wrong, wrong
    bare = citations.unlinked(text, allowed=method_phrases())
    assert not bare, f"{doc}: numbers with a measured unit and no source link: {bare}"


def test_the_main_jobs_time_report_gives_its_wall_time_in_seconds():
    from harness.report.reference import parse_time_v

    text = ('\tCommand being timed: ".venv/bin/snakemake --cores 2 results/final"\n'
            "\tUser time (seconds): 540.30\n\tElapsed (wall clock) time (h:mm:ss or m:ss): 2:08:20\n"
            "\tMaximum resident set size (kbytes): 1800172\n\tExit status: 0\n")
    t = parse_time_v(text)
    assert t["elapsed_s"] == 2 * 3600 + 8 * 60 + 20 and t["user_s"] == 540.3
    assert t["command"].endswith("results/final") and t["exit_status"] == 0
    assert parse_time_v("\tElapsed (wall clock) time (h:mm:ss or m:ss): 3:05.5\n")["elapsed_s"] == 185.5
    with pytest.raises(SystemExit, match="not the output"):
        parse_time_v("nothing here")
