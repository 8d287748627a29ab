"""Several machines' results side by side (rule `compare`, results/compare/COMPARE.md).

Each machine is a finished results tree (`snakemake results/final` ran there, here or on a cluster
node, or a copy brought back from elsewhere): nothing is re-run. The comparison reads only what
each tree's aggregation wrote (final/runs.csv and final/tables/*.csv), so every number in it is one
that tree's RESULTS.md already shows, and each cell links to the records it came from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness.analysis.tables import MACHINE_LIMITS

TABLES = ("summary", "verdicts", "machine", "compute_ceiling", "io_ceiling")
MACHINE_FACTS = ("hostname", "cpu_model", "cores", "ram_bytes", "kernel", "profile",
                 *(column for column, _ in MACHINE_LIMITS), "slurm_job_id", "slurm_partition")


class CompareError(ValueError):
    pass


@dataclass
class Tree:
    """One machine's finished results tree."""

    name: str
    root: Path
    runs: pd.DataFrame
    tables: dict[str, pd.DataFrame]

    def link(self, rel: str, out_dir: Path) -> str:
        """A path to a file of this tree, relative to where the comparison is written."""
        return os.path.relpath(self.root / rel, out_dir)


def load_tree(name: str, root: str | Path) -> Tree:
    root = Path(root)
    final = root / "final"
    missing = [p for p in [final / "runs.csv", *(final / "tables" / f"{t}.csv" for t in TABLES)]
               if not p.exists()]
    if missing:
        raise CompareError(f"machine {name!r}: {root} is not a finished results tree (missing "
                           f"{', '.join(str(p) for p in missing[:3])}); run `snakemake "
                           "results/final` there first, or copy its whole results/ here")
    return Tree(name, root, pd.read_csv(final / "runs.csv"),
                {t: pd.read_csv(final / "tables" / f"{t}.csv") for t in TABLES})


def _records(tree: Tree, run_id: str, out_dir: Path) -> str:
    """Markdown links to a configuration's per-repeat records."""
    rows = tree.runs[tree.runs.run_id == run_id]
    links = []
    for _, r in rows.sort_values("repeat").iterrows():
        rec = r.get("record")
        if isinstance(rec, str) and rec:
            # records are named relative to the tree's parent ("results/runs/...")
            path = tree.root.parent / rec
            links.append(f"[{int(r['repeat'])}]({os.path.relpath(path, out_dir)})")
    return " ".join(links)


def machines_table(trees: list[Tree], out_dir: Path) -> pd.DataFrame:
    rows = []
    for fact in MACHINE_FACTS:
        row = {"fact": fact}
        for t in trees:
            m = t.tables["machine"]
            # numbers in numeric order (job ids 8, 9, 10), text in text order
            vals = sorted(set(m[fact].dropna().astype(str)),
                          key=lambda v: (0, int(v), "") if v.isdigit() else (1, 0, v)) if fact in m else []
            row[t.name] = ", ".join(vals)
        if any(row[t.name] for t in trees):
            rows.append(row)
    rows.append({"fact": "results", **{t.name: f"[RESULTS.md]({t.link('final/RESULTS.md', out_dir)})"
                                        for t in trees}})
    return pd.DataFrame(rows)


def ceilings_table(trees: list[Tree], out_dir: Path) -> pd.DataFrame:
    rows: dict[str, dict] = {}
    for t in trees:
        io = t.tables["io_ceiling"]
        key = "disk read, O_DIRECT (MB/s, median of samples)"
        rows.setdefault(key, {"ceiling": key})[t.name] = (
            f"{io.mb_per_s.median():.4g} ([io.csv]({t.link('final/tables/io_ceiling.csv', out_dir)}))")
        for _, c in t.tables["compute_ceiling"].iterrows():
            key = (f"{c.measurement}, {c.model} (tok/s)"
                   + (f" [{c.profile}]" if "profile" in c and c.profile == c.profile else ""))
            rows.setdefault(key, {"ceiling": key})[t.name] = (
                f"{c.tok_per_s:.4g} ([compute.json]({t.link('final/tables/compute_ceiling.csv', out_dir)}))")
    return pd.DataFrame(list(rows.values()))


def configurations_table(trees: list[Tree], out_dir: Path) -> pd.DataFrame:
    """Every configuration any machine ran: tok/s median (min-max, n) and read amplification."""
    ids: list[str] = []
    for t in trees:
        ids += [i for i in t.tables["summary"].run_id if i not in ids]
    rows = []
    for run_id in ids:
        row = {"run_id": run_id}
        for t in trees:
            s = t.tables["summary"].set_index("run_id")
            if run_id not in s.index:
                row[f"{t.name} tok/s"] = row[f"{t.name} read amp."] = "not run"
                continue
            r = s.loc[run_id]
            if pd.isna(r.tok_per_s_median):
                cell = str(r.statuses)
            else:
                cell = (f"{r.tok_per_s_median:.4g} ({r.tok_per_s_min:.4g}-{r.tok_per_s_max:.4g}, "
                        f"n={int(r.n)})")
            row[f"{t.name} tok/s"] = f"{cell} {_records(t, run_id, out_dir)}".strip()
            amp = r.get("read_amplification")
            row[f"{t.name} read amp."] = "" if pd.isna(amp) else f"{amp:.3g}"
        rows.append(row)
    return pd.DataFrame(rows)


def regime_verdicts(verdicts: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(finding, claim, verdict) of a tree's verdicts table; in a study of several regimes each
    regime has its own column, and a finding is then named `<finding> [<regime>]`."""
    if "verdict" in verdicts:
        return [(str(v.finding), v.claim, v.verdict) for v in verdicts.itertuples()]
    regimes = [c for c in verdicts.columns
               if c not in ("finding", "claim", "same_in_every_regime") and not c.startswith("why")]
    return [(f"{v['finding']} [{r}]", v["claim"], v[r]) for r in regimes
            for _, v in verdicts.iterrows()]


def verdicts_table(trees: list[Tree], out_dir: Path) -> pd.DataFrame:
    claims: dict[str, dict] = {}
    for t in trees:
        for finding, claim, verdict in regime_verdicts(t.tables["verdicts"]):
            row = claims.setdefault(finding, {"finding": finding, "claim": claim})
            row[t.name] = f"{verdict} ([why]({t.link('final/tables/verdicts.csv', out_dir)}))"
    return pd.DataFrame(list(claims.values()))


def _md(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join("" if pd.isna(r[c]) else str(r[c]).replace("|", "\\|")
                                       for c in cols) + " |")
    return "\n".join(lines)


def compare(machines: dict[str, str], out_dir: str | Path) -> dict[str, pd.DataFrame]:
    """Write COMPARE.md and one CSV per table into out_dir; returns the tables."""
    if len(machines) < 1:
        raise CompareError("compare: name at least one machine (name: results tree)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    trees = [load_tree(name, root) for name, root in machines.items()]
    tables = {"machines": machines_table(trees, out_dir), "ceilings": ceilings_table(trees, out_dir),
              "configurations": configurations_table(trees, out_dir),
              "verdicts": verdicts_table(trees, out_dir)}
    synthetic = {t.name for t in trees if t.runs.get("synthetic", pd.Series(dtype=bool)).any()}
    parts = ["# Machines compared", "",
             "Each column is one machine's own results tree, as its RESULTS.md reports it; nothing "
             "here was re-measured. tok/s: median of that machine's repeats (min-max, n ok), "
             "each repeat linked to its record. Medians from different machines were measured "
             "at different times on different hardware: compare their ranges, not single numbers.",
             ""]
    if synthetic:
        parts += [f"Synthetic models (random weights with the originals' shapes) on: "
                  f"{', '.join(sorted(synthetic))}. Their numbers are not the original models'.", ""]
    titles = {"machines": "Machine and limits", "ceilings": "Ceilings",
              "configurations": "Every configuration", "verdicts": "Verdicts"}
    for key, df in tables.items():
        df.to_csv(out_dir / f"{key}.csv", index=False)
        parts += [f"## {titles[key]}", "", _md(df), "",
                  f"*Source: [{key}.csv]({key}.csv), rule `compare`.*", ""]
    (out_dir / "COMPARE.md").write_text("\n".join(parts))
    return tables
