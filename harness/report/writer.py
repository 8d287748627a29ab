"""RESULTS.md's writer: its parts, and the tables (rounded once, so the text and the CSV hold the
same digits) and plots it links, each named with the CSV and the rule that made it."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from harness.analysis.outcome import Figure, Outcome
from harness.report import captions, plots
from harness.util import sig


def rounded(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    for c in out.columns:
        if pd.api.types.is_float_dtype(out[c]):
            out[c] = out[c].map(sig)
    return out


def md_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):  # itertuples keeps each column's own type
        lines.append("| " + " | ".join("" if (isinstance(v, float) and math.isnan(v)) else str(v)
                                       for v in r) + " |")
    return "\n".join(lines)


class Writer:
    """RESULTS.md's parts and the tables and plots it links. In a study of several regimes each
    regime's tables and plots go under `<profile>/` (a `regime` view of the writer), and the
    tables the comparison of machines reads (compare.TABLES) are also written whole, with a
    `profile` column."""

    def __init__(self, tables: Path, plots: Path, prefix: str = "", *, _shared=None):
        self.tables, self.plots = tables, plots
        tables.mkdir(parents=True, exist_ok=True)
        plots.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix  # "<profile>/" in a regime's view; fixed for the view's life
        if _shared is None:
            # RESULTS.md's parts, every regime's tables by name, and the run ids measured
            # without the profile's limits (every table naming one marks it): one set per report
            _shared = ([], {}, set())
        self._shared = _shared
        self.parts, self.by_regime, self.unenforced = _shared

    def regime(self, name: str) -> Writer:
        """The same report, writing this regime's tables and plots under `<name>/`."""
        return Writer(self.tables, self.plots, f"{name}/", _shared=self._shared)

    def table(self, name: str, df: pd.DataFrame, rule: str) -> pd.DataFrame:
        if self.unenforced and "run_id" in df and "limits_enforced" not in df:
            df = df.assign(limits_enforced=~df.run_id.isin(self.unenforced))
        df = rounded(df)
        path = self.tables / f"{self.prefix}{name}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(path, index=False)
        if self.prefix:
            self.by_regime.setdefault(name, []).append(
                df.assign(profile=self.prefix.rstrip("/")))
        self.parts.append(md_table(df))
        self.parts.append(f"\n*Source: [tables/{self.prefix}{name}.csv](tables/{self.prefix}{name}.csv), "
                          f"rule `{rule}`.*\n")
        return df

    def write_whole(self, names) -> None:
        """The regimes' tables of these names, concatenated, at the top of tables/."""
        for name in names:
            if name in self.by_regime and not (self.tables / f"{name}.csv").exists():
                pd.concat(self.by_regime[name], ignore_index=True).to_csv(
                    self.tables / f"{name}.csv", index=False)

    def text(self, s: str) -> None:
        self.parts.append(s)

    def plot(self, name: str, fig, detail: str = "") -> None:
        """Save the figure under plots/ with its caption (harness.report.captions) below it."""
        caption = " ".join(filter(None, (captions.PLOTS[name], detail)))
        fig.tight_layout()
        path = self.plots / f"{self.prefix}{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        self.parts.append(f"![{name}](plots/{self.prefix}{name}.png)\n\n*{caption}*\n")

    def outcome(self, out: Outcome, rule: str) -> None:
        """An analysis unit's tables, notes and figures, in that order."""
        for name, table in out.tables.items():
            if len(table):
                self.table(name, table, rule)
        for note in out.notes:
            self.text(note + "\n")
        for f in out.figures:
            self.figure(f)

    def figure(self, f: Figure) -> None:
        """An analysis unit's figure, drawn by the plot function it names."""
        self.plot(f.name, getattr(plots, f.plot)(f.data), f.detail)
