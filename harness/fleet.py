"""Machines as a dimension of a study (config `machines:`).

Each machine named there runs the whole study in its own working directory, machines/<name>/,
with its own Snakemake profile (none: here, every core) and its own `cluster:` section (the node
or partition its measurements are pinned to, its node-local disk), so each gets its own results
tree and RESULTS.md. Then results/compare puts every machine side by side with the trees named
under `compare:` (this machine's `results`, copies brought back from elsewhere), which are read
and never re-run.

    python -m harness.fleet [--dry-run] [NAME ...]   # from the study's directory

Machines with a profile (cluster machines) run at the same time, each its own Snakemake; then the
machines without one, one at a time and alone, since they measure this very box; then the
comparison. Each machine's Snakemake log is machines/<name>/snakemake.log.
"""

from __future__ import annotations

import argparse
import copy
import logging
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MACHINES_DIR = "machines"
CONFIG_FILE = Path("config/experiments.yaml")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

log = logging.getLogger("harness.fleet")


class MachinesError(ValueError):
    pass


def machines_of(config: dict) -> dict[str, dict]:
    """The config's machines, checked: names usable as directories and distinct from the trees
    under `compare:` (which the comparison shows beside them)."""
    machines = {n: ({} if m is None else m) for n, m in (config.get("machines") or {}).items()}
    compared = set(config.get("compare") or {})
    for name, m in machines.items():
        if not NAME.match(name):
            raise MachinesError(f"machines: {name!r} is not a usable name (letters, digits, . _ -)")
        if name in compared:
            raise MachinesError(f"machines: {name!r} is also a tree under compare:; one name, one "
                                "column")
        if not isinstance(m, dict):
            raise MachinesError(f"machines: {name}: expected a mapping (profile, cluster, args)")
    return machines


def tree_of(name: str) -> str:
    """Where a machine's results tree is, relative to the study's directory."""
    return f"{MACHINES_DIR}/{name}/results"


def compare_trees(config: dict) -> dict[str, str]:
    """Every column of results/compare: the `compare:` trees, then each machine's."""
    return {**(config.get("compare") or {}), **{n: tree_of(n) for n in machines_of(config)}}


def machine_config(config: dict, name: str) -> dict:
    """The study's config as machine `name` runs it: its own cluster section, no machines of its
    own and nothing to compare (the comparison is the study directory's)."""
    m = machines_of(config)[name]
    out = copy.deepcopy({k: v for k, v in config.items() if k not in ("machines", "compare")})
    out["cluster"] = dict(m.get("cluster") or {})
    return out


def profile_path(workdir: Path, profile: str | None) -> Path | None:
    """A profile named in the config: relative to the study's directory, else to this checkout
    (profiles/slurm)."""
    if profile is None:
        return None
    for base in (workdir, ROOT):
        p = (base / profile).resolve()
        if (p / "config.yaml").exists():
            return p
    raise MachinesError(f"machines: profile {profile!r}: no config.yaml there (looked in "
                        f"{workdir} and {ROOT})")


def _snakemake(directory: Path) -> list[str]:
    """This checkout's workflow, run in `directory`."""
    return [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
            str(directory)]


def snakemake_argv(workdir: Path, config: dict, name: str, target: str, dry_run: bool) -> list[str]:
    m = machines_of(config)[name]
    profile = profile_path(workdir, m.get("profile"))
    argv = _snakemake(workdir / MACHINES_DIR / name)
    argv += ["--profile", str(profile)] if profile else ["--cores", "all"]
    return argv + [str(a) for a in m.get("args") or []] + (["-n"] if dry_run else []) + [target]


def prepare(workdir: Path, config: dict, name: str) -> Path:
    """machines/<name>/config/experiments.yaml, rewritten only when it changes (Snakemake's params
    provenance would otherwise see nothing new, but the file's mtime would)."""
    path = workdir / MACHINES_DIR / name / CONFIG_FILE
    text = ("# written by python -m harness.fleet from the study's config/experiments.yaml: "
            "edit that one\n" + yaml.safe_dump(machine_config(config, name), sort_keys=False))
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def _run(argv: list[str], cwd: Path, log_path: Path, label: str, failures: dict) -> None:
    """One Snakemake, its output into log_path; a failure is noted under `label`."""
    t0 = time.time()
    log.info("%s: started (%s)", label, log_path)
    with open(log_path, "w") as f:
        rc = subprocess.run(argv, cwd=cwd, stdout=f, stderr=subprocess.STDOUT).returncode
    took = time.time() - t0
    if rc != 0:
        failures[label] = f"exit {rc} after {took:.0f} s, see {log_path}"
        log.error("%s: FAILED (exit %d after %.0f s), see %s", label, rc, took, log_path)
    else:
        log.info("%s: done in %.0f s", label, took)


def run(workdir: Path, names: list[str] | None = None, dry_run: bool = False) -> dict[str, str]:
    """Run the named machines (all by default), then results/compare; returns the failures
    (machine -> why), empty when everything finished."""
    workdir = Path(workdir).resolve()
    config = yaml.safe_load((workdir / CONFIG_FILE).read_text())
    from harness.config import ConfigError, validate_config

    try:  # the whole config, before any machine starts: a typo must not run for hours
        validate_config(config)
    except ConfigError as exc:
        raise MachinesError(f"{workdir / CONFIG_FILE}: {exc}") from None
    machines = machines_of(config)
    if not machines:
        raise MachinesError(f"{workdir / CONFIG_FILE}: no machines: to run")
    names = list(machines) if not names else names
    unknown = [n for n in names if n not in machines]
    if unknown:
        raise MachinesError(f"machines: no machine named {', '.join(unknown)} (the config has "
                            f"{', '.join(machines)})")
    jobs = {}
    for name in names:
        prepare(workdir, config, name)
        jobs[name] = snakemake_argv(workdir, config, name, "results/final", dry_run)
    failures: dict[str, str] = {}
    clustered = [n for n in names if machines[n].get("profile")]
    here = [n for n in names if not machines[n].get("profile")]

    def machine(n):
        _run(jobs[n], workdir, workdir / MACHINES_DIR / n / "snakemake.log", n, failures)

    threads = [threading.Thread(target=machine, args=(n,)) for n in clustered]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in here:  # they measure this box: nothing else of the study may run beside them
        machine(n)
    if failures:
        log.error("not compared: %s", "; ".join(f"{k}: {v}" for k, v in failures.items()))
        return failures
    if dry_run:  # the machines' trees do not exist yet: there is nothing to compare
        return failures
    compare = _snakemake(workdir) + ["--cores", "all", "results/compare"]
    _run(compare, workdir, workdir / MACHINES_DIR / "compare.log", "compare", failures)
    if not failures:
        log.info("results/compare/COMPARE.md: %s", ", ".join(compare_trees(config)))
    return failures


def main(argv=None) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    ap = argparse.ArgumentParser(prog="python -m harness.fleet", description=__doc__.split("\n\n")[1])
    ap.add_argument("names", nargs="*", help="machines to run (default: every one in machines:)")
    ap.add_argument("--directory", default=".", help="the study's directory (holds config/)")
    ap.add_argument("-n", "--dry-run", action="store_true", help="each Snakemake's dry run only")
    a = ap.parse_args(argv)
    try:
        failures = run(Path(a.directory), a.names, a.dry_run)
    except MachinesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
