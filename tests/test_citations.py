"""harness.report.citations: a quoted number passes only when its named file holds it, in its unit."""

import json

import pytest

from harness.report import citations


@pytest.fixture
def root(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t/summary.csv").write_text(
        "run_id,tok_per_s_median,hook_s_per_token,io_wait_share,read_bytes\n"
        "none,0.1528,0.0042,0.61,193400000\n"
        "madvise,0.1725,0.0031,0.58,150000000\n")
    (tmp_path / "t/quota.json").write_text(json.dumps({"cpu_quota": 0.08466, "steps": [
        {"cpu_quota": 0.1, "io_share": 0.4}], "note": "text",
        "ab": {"on_over_off": {"median": 0.983}, "verdict": {"median": 1}}}))
    (tmp_path / "t/cfg.yaml").write_text("profiles:\n  disk-box:\n    io_share_target: 0.58\n")
    return tmp_path


def _one(md):
    (q,) = citations.quotes(md)
    return q


@pytest.mark.parametrize("md", [
    "[0.1725 tok/s](t/summary.csv#run_id=madvise&tok_per_s_median)",
    "[0.17 tok/s](t/summary.csv#run_id=madvise&tok_per_s_median)",  # fewer digits, rounded
    "[4.2 ms](t/summary.csv#run_id=none&hook_s_per_token)",  # seconds written in ms
    "[61%](t/summary.csv#run_id=none&io_wait_share)",
    "[193.4 MB](t/summary.csv#run_id=none&read_bytes)",
    "[0.08466 CPUs](t/quota.json#cpu_quota)",
    "[40%](t/quota.json#steps.0.io_share)",
    "[58%](t/cfg.yaml#profiles.disk-box.io_share_target)",
    "[0.983x](t/quota.json#ab.on_over_off.median)",  # a statistic is in its key's unit
])
def test_a_quote_its_file_holds_passes(root, md):
    assert citations.check(root, _one(md)) is None


@pytest.mark.parametrize("md, why", [
    ("[0.18 tok/s](t/summary.csv#run_id=madvise&tok_per_s_median)", "rounds to 0.17"),
    ("[0.1725 s](t/summary.csv#run_id=madvise&tok_per_s_median)", "is in tok/s"),
    ("[0.61 tok/s](t/summary.csv#run_id=none&io_wait_share)", "is in fraction"),
    ("[0.1725 tok/s](t/summary.csv#tok_per_s_median)", "2 rows match"),
    ("[0.1725 tok/s](t/summary.csv#run_id=lru&tok_per_s_median)", "0 rows match"),
    ("[0.1725 tok/s](t/summary.csv#run_id=madvise&nope)", "no column 'nope'"),
    ("[0.1725 tok/s](t/missing.csv#run_id=madvise&tok_per_s_median)", "not a committed file"),
    ("[1 x](t/quota.json#note)", "not a number"),
    ("[1 x](t/quota.json#steps.0.nope)", "no 'steps.0.nope'"),
    ("[1 x](t/quota.json#ab.verdict.median)", "no known unit"),  # ... and nothing else's
])
def test_a_quote_its_file_does_not_hold_fails_saying_why(root, md, why):
    err = citations.check(root, _one(md))
    assert err is not None and why in err, err


def test_numbers_outside_quote_links_are_listed_and_method_constants_can_be_allowed():
    md = ("Demand paging reaches 0.15 tok/s, [0.17 tok/s](t/s.csv#a=b&tok_per_s) with madvise, "
          "2.5x faster, `0.3 tok/s` in code, a 90% interval.")
    assert citations.unlinked(md) == ["0.15 tok/s", "2.5x", "90%"]
    assert citations.unlinked(md, allowed=["90% interval"]) == ["0.15 tok/s", "2.5x"]


def test_a_column_without_a_known_unit_is_an_error_not_a_guess():
    with pytest.raises(citations.CitationError, match="no known unit"):
        citations.unit_of("verdict")


def test_rebasing_points_quotes_at_the_new_reference_with_its_values(root):
    (root / "u").mkdir()
    (root / "u/summary.csv").write_text(
        "run_id,tok_per_s_median,hook_s_per_token,io_wait_share,read_bytes\n"
        "none,0.2049,0.0050,0.472,181000000\n")
    md = ("none runs [0.1528 tok/s](t/summary.csv#run_id=none&tok_per_s_median), waiting "
          "[61%](t/summary.csv#run_id=none&io_wait_share) and reading "
          "[193.4 MB](t/summary.csv#run_id=none&read_bytes); madvise "
          "[0.17 tok/s](t/summary.csv#run_id=madvise&tok_per_s_median); "
          "[0.08466 CPUs](t/quota.json#cpu_quota)")
    out, problems = citations.rebase(md, root, "t", "u")
    assert "[0.2049 tok/s](u/summary.csv#run_id=none&tok_per_s_median)" in out
    assert "[47%](u/summary.csv#run_id=none&io_wait_share)" in out  # at the quoted 0 digits
    assert "[181.0 MB](u/summary.csv#run_id=none&read_bytes)" in out
    # a row or a file the new reference lacks stays as it was, and is reported
    assert "[0.17 tok/s](t/summary.csv#run_id=madvise" in out and "[0.08466 CPUs](t/quota" in out
    assert len(problems) == 2 and "0 rows match" in problems[0]
    assert all(citations.check(root, q) is None for q in citations.quotes(out))


def test_a_column_already_in_megabytes_is_quoted_in_mb_and_a_rate_stays_a_rate():
    from harness.report import citations

    assert citations.unit_of("replay_mb_per_window_token") == "MB"
    assert citations.unit_of("capacity_mb") == "MB"
    assert citations.unit_of("io_mb_per_s") == "MB/s"
