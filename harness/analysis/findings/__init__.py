"""The study's findings, one unit each: its claim in the study's words, the runs it needs, the
tables it rests on, its rule and its verdict. Nothing here renders; harness.report.results prints the
outcomes. Every comparison is a ratio of steady tok/s with a 90% confidence interval from the
runs, against the regime's minimum effect (a profile's `min_effect`, 10% unless set:
harness.analysis.stats.MIN_EFFECT); a finding made of several comparisons holds
only when every part holds and is refuted after Holm's correction across its parts.

The Study and the Finding are in `study`; the study's claims in `study_claims`; the findings
beyond them in `beyond_study`. A new finding is a `Finding` subclass and its declaration in one
of those two modules.
"""

from __future__ import annotations

from harness.analysis.findings import beyond_study, study_claims
from harness.analysis.findings.study import CONFIG, Finding, Study


def _order(f: Finding) -> tuple[int, str]:
    return int(f.number.rstrip("abcdefghijklmnopqrstuvwxyz")), f.number


FINDINGS: list[Finding] = sorted(study_claims.FINDINGS + beyond_study.FINDINGS, key=_order)

__all__ = ["CONFIG", "FINDINGS", "Finding", "Study"]
