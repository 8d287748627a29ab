"""Copy one finished main-job run's outputs into a folder of the repository, as they are: RESULTS.md,
runs.csv, tables, plots, the ceilings and baselines, the models' metadata and layouts, and every
per-run record the tables cite, and the rules' logs. No model files. Nothing is edited: RESULTS.md's links and
runs.csv's record paths resolve inside the copy as they did in the run.

    python -m harness.report.reference <the run's project dir> reference/<machine>-<date> [time.log]

With the output of `/usr/bin/time -v` around the main job, its wall time, CPU times and peak RSS
go into `main_job.json` beside the copy (what the README quotes as the main job's duration), and
where that time went, per phase of the runs and outside them, into `cost.csv`.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

RUN_FILES = ("run.json", "tokens.csv", "experts.csv", "mechanism.csv", "worker.log")


def export(run_root: Path, dest: Path) -> list[Path]:
    res = Path(run_root) / "results"
    if not (res / "final" / "RESULTS.md").exists():
        raise SystemExit(f"{res}/final/RESULTS.md does not exist: the run has not finished")
    if dest.exists():
        raise SystemExit(f"{dest} exists; a reference run is never overwritten")
    out = dest / "results"
    copied = []
    shutil.copytree(res / "final", out / "final")
    for sub in ("ceilings", "baselines", "build"):
        if (res / sub).is_dir():
            shutil.copytree(res / sub, out / sub)
    (out / "models").mkdir(parents=True)
    for f in sorted((res / "models").glob("*.json")):  # metadata and layouts, never the GGUFs
        shutil.copy2(f, out / "models" / f.name)
    # every repeat, and the re-run of each disturbed one (rerun<k>/)
    for rec in sorted((res / "runs").glob("*/re*/run.json")):
        d = out / "runs" / rec.parent.parent.name / rec.parent.name
        d.mkdir(parents=True)
        for name in RUN_FILES:
            if (rec.parent / name).exists():
                shutil.copy2(rec.parent / name, d / name)
                copied.append(d / name)
    # the rules' logs: the run counter with the time left, the calibrations' steps
    if (Path(run_root) / "logs").is_dir():
        shutil.copytree(Path(run_root) / "logs", dest / "logs")
    for cfg in ("config/experiments.yaml",):
        (dest / "config").mkdir(exist_ok=True)
        shutil.copy2(Path(run_root) / cfg, dest / cfg)
    return copied


TIME_FIELDS = {"Command being timed": "command", "User time (seconds)": "user_s",
               "System time (seconds)": "system_s", "Elapsed (wall clock) time (h:mm:ss or m:ss)":
               "elapsed_s", "Maximum resident set size (kbytes)": "max_rss_kbytes",
               "Exit status": "exit_status"}


def parse_time_v(text: str) -> dict:
    """The fields of GNU time's -v report that describe a main job; the wall time in seconds."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.strip().rpartition(": ")
        if not sep or key not in TIME_FIELDS:
            continue
        name = TIME_FIELDS[key]
        if name == "elapsed_s":
            parts = [float(x) for x in value.split(":")]
            out[name] = sum(v * 60 ** i for i, v in enumerate(reversed(parts)))
        elif name == "command":
            out[name] = value.strip('"')
        else:
            out[name] = float(value) if re.fullmatch(r"[\d.]+", value) else value
    if "elapsed_s" not in out:
        raise SystemExit("not the output of /usr/bin/time -v: no elapsed wall clock time")
    return out


def write_cost(dest: Path, elapsed_s: float) -> Path:
    """`cost.csv` beside the copy: the job's seconds and share per phase (harness.analysis.cost),
    what the README's cost table quotes."""
    from harness.analysis.cost import study_cost

    out = dest / "cost.csv"
    study_cost(dest / "results", elapsed_s).round({"seconds": 1, "share": 4}).to_csv(out, index=False)
    return out


if __name__ == "__main__":
    files = export(Path(sys.argv[1]), Path(sys.argv[2]))
    if len(sys.argv) > 3:
        timing = parse_time_v(Path(sys.argv[3]).read_text())
        (Path(sys.argv[2]) / "main_job.json").write_text(json.dumps(timing, indent=2) + "\n")
        write_cost(Path(sys.argv[2]), timing["elapsed_s"])
    print(f"{len(files)} run files copied to {sys.argv[2]}")
