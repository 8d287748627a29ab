"""What an analysis unit shows: its verdict, tables, notes and figures. The units (the findings,
the time breakdown, the distance to the limit, the cache policy study) return one; the report
only renders it."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from harness.analysis.stats import Verdict


@dataclass(frozen=True)
class Figure:
    """A figure an analysis unit shows: `plot` names the function of harness.report.plots that
    draws `data` (the report draws it; judging needs no matplotlib), `detail` adds to its
    caption."""

    name: str
    plot: str
    data: object
    detail: str = ""


@dataclass
class Outcome:
    """What an analysis unit shows: its verdict (None for a unit that only measures), its
    tables, notes, and its figures (drawn only when rendered)."""

    verdict: Verdict | None
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
