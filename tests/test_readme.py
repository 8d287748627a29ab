"""The README's commands, run exactly as written (issue: the commands users type must work).

Each line of a ```sh block is run from the project root with the venv's bin on PATH. Snakemake
commands get `--directory <copy of .test>` appended, so the main job, the dry run, the report and
the unlock run on the small configuration; a command that already names `--directory .test` gets
the copy instead. The test command itself (.ci/run, which runs pytest) is what is running this, so
it is not re-run.
"""

import json
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


@pytest.fixture(scope="module")
def ran(workdir):
    """Every README command, run as written on the small configuration; the commands run."""
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
    return ran


def test_every_readme_command_runs_as_written(workdir, ran):
    assert any("--report" in c for c in ran) and (workdir / "report.html").stat().st_size > 100_000
    assert (workdir / "results" / "final" / "RESULTS.md").exists()


def _report_data(html: str, var: str):
    m = re.search(rf'<script id="{var}">\s*var {var} = (.*?);\s*</script>', html, re.S)
    assert m, f"report.html has no {var}"
    return json.loads(m.group(1))


def _words(s: str) -> str:
    return " ".join(re.sub(r"&[#\w]+;|[^a-z0-9 ]", " ", s.lower()).split())


def test_the_report_captions_every_result_and_puts_the_attribution_first(workdir, ran):
    from harness.report.captions import PLOTS

    html = (workdir / "report.html").read_text()
    results = _report_data(html, "results")
    assert len(results) >= 8
    for path, res in results.items():
        text = re.sub(r"<[^>]+>", " ", res["caption"])
        assert len(text.split()) >= 15, (path, text)  # says what it measures and how to read it
        if path.endswith(".png"):
            name = Path(path).stem
            assert _words(PLOTS[name].split(":")[0]) in _words(text), path
    categories = sorted(_report_data(html, "categories"))
    assert categories[0].startswith("1. Where a token's time goes"), categories
    attribution = [p for p, r in results.items() if p.endswith("attribution.png")]
    assert attribution, "the attribution figure is not in the report"


def _chromium(tmp_path, *args) -> subprocess.CompletedProcess:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is not installed: .ci/run installs Debian's chromium package"
    # as root, in a closed network: no sandbox, no background connections, a fresh profile
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars",
         "--virtual-time-budget=20000", *args],
        capture_output=True, text=True, timeout=300)


def test_the_report_opens_in_headless_chromium(workdir, ran, tmp_path):
    """The report renders in a browser: its script draws the report into the page, and a
    screenshot of it is not one flat colour."""
    url = (workdir / "report.html").as_uri()
    dom = _chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # the static page holds an empty <div id="app">; only the report's script fills it
    start = dom.stdout.index('id="app"')
    drawn = re.sub(r"<[^>]+>", " ", dom.stdout[start:dom.stdout.find("<script", start)])
    assert len(drawn.split()) > 10, drawn[:2000]
    shot = tmp_path / "report.png"
    res = _chromium(tmp_path, "--window-size=1280,900", f"--screenshot={shot}", url)
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)
    assert img.shape[0] == 900 and img.shape[1] == 1280
    assert img[..., :3].std() > 0.02, "the screenshot is one flat colour"
    shutil.copy(shot, workdir / "report.png")
