"""`python -m harness`: one measured run by hand, like llama-bench.

    python -m harness -m results/models/olmoe-q4.gguf --mechanism pread+madvise -n 32 \
        --ram-budget 1.7GiB --read-bps 150MB -o /tmp/run1

Uses the pipeline's build (results/build/llama.json, or --manifest), reads or writes the model's
layout file beside it, runs the configuration in a fresh cgroup after a cold start, and prints the
run record as JSON on stdout (diagnostics on stderr). The exit code is 0 for status ok, 3 for a
run killed by its limits, 1 for a failure.
"""

from __future__ import annotations

import argparse
import logging
import json
import sys
from pathlib import Path

from harness import parameters, profile_keys, record
from harness.contract import Status
from harness.run import supervise
from harness.config import adhoc_spec
from harness.profiles import limit_value
from harness.models.layout import read_layout
from harness.box.limits import Limits
from harness.util import atomic_write_json, sha256_file
from harness.models.checks import check_gguf


def add_run_parameters(ap: argparse.ArgumentParser) -> None:
    """One flag per run parameter that has one (harness.parameters), with its default and
    allowed values; a boolean that is on by default is turned off by its flag."""
    for p in parameters.PARAMETERS:
        if not p.cli:
            continue
        helptext = p.doc.replace("%", "%%") + (f" [{p.unit}]" if p.unit else "")
        if p.type is bool:
            action = "store_false" if p.default else "store_true"
            ap.add_argument(*p.cli, dest=p.name, action=action, default=p.default, help=helptext)
            continue
        default = p.default if p.cli_default is None else p.cli_default
        ap.add_argument(*p.cli, dest=p.name, type=p.type, default=default,
                        choices=sorted(parameters.choices(p)) or None,
                        help=helptext + (f" (default: {default})" if default is not None else ""))


def add_limits(ap: argparse.ArgumentParser) -> None:
    """One flag per profile limit that has one (harness.profile_keys): the limits a run by hand
    is held to (none unless given; the device's read-ahead is left as it is)."""
    for k in profile_keys.LIMITS:
        if k.cli:
            kind = {profile_keys.INTEGER: int, profile_keys.NUMBER: float}.get(k.kind, str)
            ap.add_argument(k.flag, dest=k.name, type=kind,
                            help=k.doc.replace("%", "%%") + (f" [{k.unit}]" if k.unit else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness", description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True, help="GGUF file")
    add_run_parameters(ap)
    add_limits(ap)
    ap.add_argument("--manifest", default="results/build/llama.json")
    ap.add_argument("-o", "--out", required=True, help="output directory of the run's records")
    a = ap.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
    out = Path(a.out)
    if out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
        # the run writes several files there as root: never into something that holds others
        print(f"-o {a.out}: exists and is not an empty directory; name a new one", file=sys.stderr)
        return 2

    model = Path(a.model).resolve()
    layout_path = model.with_name(model.stem + ".layout.json")
    if not layout_path.exists():
        print(f"writing {layout_path}", file=sys.stderr)
        atomic_write_json(layout_path, check_gguf(model))
    layout = json.loads(layout_path.read_text())
    if layout["file_size"] != model.stat().st_size:
        atomic_write_json(layout_path, read_layout(model))
        layout = json.loads(layout_path.read_text())
    manifest = json.loads(Path(a.manifest).read_text())
    info = {"name": model.stem, "path": str(model), "sha256": sha256_file(model),
            "synthetic": layout["synthetic"], "seed": layout["seed"], "source": "path"}
    given = {p.name: getattr(a, p.name) for p in parameters.PARAMETERS
             if p.cli and getattr(a, p.name) is not None}
    spec = adhoc_spec(f"{model.stem}-{a.mechanism}", model.stem, a.mechanism, entry="cli",
                      **{k: v for k, v in given.items() if k != "mechanism"})
    limits = Limits(**{k.limit: limit_value(k, getattr(a, k.name), k.flag)
                       for k in profile_keys.LIMITS if k.cli}, device_path=str(model))
    try:
        rec = supervise.run(spec, a.out, lib_dir=manifest["lib_dir"], build=manifest, model_info=info,
                            layout_path=str(layout_path), limits=limits, time_limit_s=spec["time_limit_s"])
    except supervise.RunFailed as exc:
        print(exc, file=sys.stderr)
        return 1
    json.dump({**rec.as_dict(), "format": record.FORMAT_VERSION}, sys.stdout, indent=2, default=str)
    print()
    return 0 if rec.status == Status.OK.value else 3


if __name__ == "__main__":
    sys.exit(main())
