"""The environment's pins: exact, and the same in the pip and conda descriptions."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def pins_of(lines):
    out = {}
    for line in lines:
        m = re.match(r"^\s*([A-Za-z0-9_.-]+)==([^\s;]+)", line)
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def test_requirements_pin_every_package_exactly():
    lines = [ln for ln in (ROOT / "envs/requirements.txt").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    pins = pins_of(lines)
    assert len(pins) == len(lines)  # nothing unpinned
    for pkg in ("snakemake", "llama-cpp-python", "gguf", "pandas", "pyyaml", "psutil", "matplotlib",
                "pytest", "huggingface-hub"):
        assert pkg in pins, pkg


def test_conda_env_describes_the_same_pins():
    env = yaml.safe_load((ROOT / "envs/pipeline.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pins_of(pip) == pins_of((ROOT / "envs/requirements.txt").read_text().splitlines())
    assert any("LLAMA_BUILD=OFF" in p for p in pip if p.startswith("llama-cpp-python"))


def test_installed_llama_cpp_python_has_no_library_of_its_own():
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    pkg = Path(spec.origin).parent
    assert not list(pkg.glob("lib/libllama*")), "llama-cpp-python compiled its own llama.cpp"
