"""The README's commands, run exactly as written (issue: the commands users type must work).

Each line of a ```sh block is run from the project root with the venv's bin on PATH. Snakemake
commands get `--directory <copy of .test>` appended, so the main job, the dry run, the report and
the unlock run on the small configuration; a command that already names `--directory .test` gets
the copy instead. The test command itself (.ci/run, which runs pytest) is what is running this, so
it is not re-run.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S)
    return [line.strip() for b in blocks for line in b.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def on_test_config(cmd: str, workdir: Path) -> str:
    parts = []
    for piece in cmd.split(" && "):
        if "snakemake" in piece:
            if "--directory .test" in piece:
                piece = piece.replace("--directory .test", f"--directory {shlex.quote(str(workdir))}")
            else:
                piece += f" --directory {shlex.quote(str(workdir))}"
        parts.append(piece)
    return " && ".join(parts)


def test_readme_shows_the_commands_a_user_needs():
    cmds = readme_commands()
    joined = "\n".join(cmds)
    for needed in ("--cores 2 results/final", "-n results/final", "--report report.html",
                   "--unlock", ".ci/run"):
        assert needed in joined, needed


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    wd = tmp_path_factory.mktemp("readme")
    shutil.copytree(ROOT / ".test" / "config", wd / "config")
    return wd


def test_every_readme_command_runs_as_written(workdir):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    ran = []
    for cmd in readme_commands():
        if "pytest" in cmd or cmd == ".ci/run":
            continue  # the command running this test
        full = on_test_config(cmd, workdir)
        res = subprocess.run(["bash", "-c", full], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=1800)
        assert res.returncode == 0, (full, (res.stdout + res.stderr)[-3000:])
        ran.append(cmd)
    assert any("--report" in c for c in ran) and (workdir / "report.html").stat().st_size > 100_000
    assert (workdir / "results" / "final" / "RESULTS.md").exists()
