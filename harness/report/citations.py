"""Numbers quoted in prose, each checked against the committed file it names.

A quoted number is a Markdown link whose text is the number with its unit and whose target is the
file it came from, with a fragment that picks one value:

    [0.1725 tok/s](reference/vm/results/final/tables/summary.csv#run_id=madvise&tok_per_s_median)
    [58%](reference/vm/results/ceilings/disk-box/cpu_quota.json#io_share.reached)

CSV: `column=value` pairs pick exactly one row, the last part names the column. JSON or YAML: a
dotted path (list items by index). The column's unit comes from its name (`UNIT_OF_COLUMN`), the
quoted unit must be one that unit can be written in, and the quoted value must be the file's value
rounded to the digits quoted. Prose numbers with a measured unit that are not such links are
listed by `unlinked` (a number without a committed source does not belong in the README).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pandas as pd
import yaml

# how each quoted unit converts from the column's unit: {column unit: {quoted unit: factor}}
CONVERSIONS = {
    "tok/s": {"tok/s": 1.0},
    "s": {"s": 1.0, "ms": 1e3, "min": 1 / 60, "h": 1 / 3600},
    "bytes": {"bytes": 1.0, "KB": 1e-3, "MB": 1e-6, "GB": 1e-9, "GiB": 1 / 2**30},
    "MB/s": {"MB/s": 1.0},
    "MB": {"MB": 1.0, "GB": 1e-3},
    "bytes/s": {"MB/s": 1e-6},
    "fraction": {"%": 100.0, "": 1.0},
    "ratio": {"x": 1.0, "": 1.0},
    "CPUs": {"CPUs": 1.0},
    "count": {"": 1.0, "runs": 1.0, "tokens": 1.0, "repeats": 1.0, "configurations": 1.0},
}
# a column's unit from its name: the first pattern that matches (re.search) wins
UNIT_OF_COLUMN = [
    (r"tok_per_s|tok_s|_ts$", "tok/s"),
    (r"mb_per_s|mb_s", "MB/s"),
    (r"(^|_)mb(_|$)", "MB"),  # a size already in MB (replay_mb_per_window_token, capacity_mb)
    (r"_bps$|^read_bps|^write_bps", "bytes/s"),
    (r"bytes", "bytes"),
    (r"share|fraction|_frac|residency|precision|recall|rate|effect", "fraction"),
    (r"ratio|speedup|_vs_|_over_|^x_|times", "ratio"),
    (r"cpu_quota|quota_cpus|^quota$|^cpus$", "CPUs"),
    (r"(^|_)s$|_s_|_seconds|^seconds", "s"),
    (r"^n$|^n_|count|runs|tokens|repeats|configurations|_n$", "count"),
]
# keys of a JSON or YAML tree that summarize the key above them, in its unit
STATISTIC_KEYS = frozenset({"median", "mean", "min", "max", "low", "high", "geomean", "ci_low",
                            "ci_high"})
QUOTE = re.compile(r"\[(?P<text>[^\]]*?\d[^\]]*)\]\((?P<target>[^)#\s]+)#(?P<frag>[^)\s]+)\)")
NUMBER = re.compile(r"^\s*(?P<num>-?\d+(?:\.\d+)?)\s*(?P<unit>[A-Za-z/%]*)\s*$")
# a measured number in prose: what a reader would take as a result
MEASURED = re.compile(r"(?<![\w.\[])(\d+(?:\.\d+)?)\s?(tok/s|MB/s|GB/s|ms\b|%|x\b)")


class CitationError(ValueError):
    pass


@dataclass(frozen=True)
class Quote:
    text: str
    value: float
    digits: int  # decimals quoted
    unit: str
    target: str
    fragment: str


def quotes(markdown: str) -> list[Quote]:
    out = []
    for m in QUOTE.finditer(markdown):
        num = NUMBER.match(m["text"])
        if not num:
            continue  # a link whose text is not one number with a unit: not a quote
        digits = len(num["num"].split(".")[1]) if "." in num["num"] else 0
        out.append(Quote(m["text"], float(num["num"]), digits, num["unit"], m["target"],
                         unquote(m["frag"])))
    return out


def unit_of(column: str) -> str:
    for pattern, unit in UNIT_OF_COLUMN:
        if re.search(pattern, column):
            return unit
    raise CitationError(f"column {column!r} has no known unit (harness.report.citations.UNIT_OF_COLUMN)")


def _csv_value(path: Path, fragment: str) -> tuple[float, str]:
    *conds, column = fragment.split("&")
    df = pd.read_csv(path)
    if column not in df:
        raise CitationError(f"{path}: no column {column!r}")
    sel = df
    for cond in conds:
        key, _, want = cond.partition("=")
        if key not in sel:
            raise CitationError(f"{path}: no column {key!r} to select on")
        sel = sel[sel[key].astype(str) == want]
    if len(sel) != 1:
        raise CitationError(f"{path}#{fragment}: {len(sel)} rows match, not one")
    return float(sel[column].iloc[0]), column


def _tree_value(path: Path, fragment: str) -> tuple[float, str]:
    data = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
    node = data
    for key in fragment.split("."):
        if isinstance(node, list):
            node = node[int(key)]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            raise CitationError(f"{path}: no {fragment!r} (stopped at {key!r})")
    if isinstance(node, bool) or not isinstance(node, int | float):
        raise CitationError(f"{path}#{fragment} is {node!r}, not a number")
    # a statistic or a list item is in the unit of what it summarizes: `on_over_off.median`
    # is a ratio, `steps.0` a step of the key above
    keys = fragment.split(".")
    while len(keys) > 1 and (keys[-1] in STATISTIC_KEYS or keys[-1].isdigit()):
        keys.pop()
    return float(node), keys[-1]


def source_value(root: Path, q: Quote) -> tuple[float, str]:
    """The value the quote names and the unit of its column."""
    path = root / q.target
    if not path.is_file():
        raise CitationError(f"{q.target} is not a committed file")
    if path.suffix == ".csv":
        value, column = _csv_value(path, q.fragment)
    elif path.suffix in (".json", ".yaml", ".yml"):
        value, column = _tree_value(path, q.fragment)
    else:
        raise CitationError(f"{q.target}: quotes come from CSV, JSON or YAML files")
    return value, unit_of(column)


def check(root: Path, q: Quote) -> str | None:
    """None when the quote is its source's value in a unit the source's column can be written in,
    rounded to the digits quoted; else what is wrong."""
    try:
        value, unit = source_value(root, q)
    except CitationError as e:
        return f"[{q.text}]: {e}"
    factor = CONVERSIONS[unit].get(q.unit)
    if factor is None:
        return (f"[{q.text}]: quoted in {q.unit or 'no unit'!r}, but {q.target}#{q.fragment} is "
                f"in {unit} (write it as one of {sorted(CONVERSIONS[unit])})")
    expected = value * factor
    if abs(expected - q.value) > 0.5 * 10 ** -q.digits * (1 + 1e-9):
        return (f"[{q.text}]: {q.target}#{q.fragment} is {expected:.{q.digits + 3}g} {q.unit}, "
                f"which rounds to {expected:.{q.digits}f}")
    return None


def unlinked(markdown: str, allowed: tuple | list = ()) -> list[str]:
    """Measured-looking numbers (tok/s, MB/s, ms, %, x) outside quote links and code; `allowed`
    phrases (a method's own constants, such as "90% confidence") are taken out first."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    text = " ".join(QUOTE.sub("", text).split())  # a phrase may wrap across lines
    for phrase in allowed:
        text = text.replace(phrase, "")
    return [m.group(0) for m in MEASURED.finditer(text)]


def rebase(markdown: str, root: Path, old: str, new: str) -> tuple[str, list[str]]:
    """The text with every quote of a file under `old` (a reference's folder) pointed at the same
    file and row under `new` and its number rewritten to the new file's value, in the quoted
    unit at the quoted digits; and the quotes that could not follow (the row or the file is not
    in the new reference), left as they were. The prose around a number is not touched: a
    sentence that judged the old number must be read again."""
    problems: list[str] = []
    old, new = old.rstrip("/") + "/", new.rstrip("/") + "/"

    def one(m: re.Match) -> str:
        if not m["target"].startswith(old):
            return m.group(0)
        num = NUMBER.match(m["text"])
        if not num:
            return m.group(0)
        digits = len(num["num"].split(".")[1]) if "." in num["num"] else 0
        target = new + m["target"][len(old):]
        q = Quote(m["text"], float(num["num"]), digits, num["unit"], target, unquote(m["frag"]))
        try:
            value, unit = source_value(root, q)
        except CitationError as e:
            problems.append(f"[{m['text']}]({m['target']}#{m['frag']}): {e}")
            return m.group(0)
        factor = CONVERSIONS[unit].get(q.unit)
        if factor is None:
            problems.append(f"[{m['text']}]: {unit} cannot be written in {q.unit!r}")
            return m.group(0)
        spacer = " " if " " in m["text"].strip() else ""
        text = f"{value * factor:.{digits}f}{spacer}{q.unit}".strip()
        return f"[{text}]({target}#{m['frag']})"

    return QUOTE.sub(one, markdown), problems


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Point a document's quotes of one reference at "
                                 "another, with the new reference's values (rebase).")
    ap.add_argument("document", help="a Markdown file whose quotes to rebase, in place")
    ap.add_argument("old", help="the reference folder its quotes name, e.g. reference/vm-2026-12-06")
    ap.add_argument("new", help="the reference folder they should name")
    ap.add_argument("--lines", help="only these lines, FIRST-LAST (1-based, inclusive)")
    a = ap.parse_args(argv)
    path = Path(a.document)
    lines = path.read_text().splitlines(keepends=True)
    first, last = (int(x) for x in a.lines.split("-")) if a.lines else (1, len(lines))
    part, problems = rebase("".join(lines[first - 1:last]), path.parent, a.old, a.new)
    path.write_text("".join(lines[:first - 1]) + part + "".join(lines[last:]))
    for p in problems:
        print(f"not rebased: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
