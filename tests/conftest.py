"""Fixtures: the real patched llama.cpp build (cached) and tiny synthetic models of both
architectures, built once per test session by the project's own code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.build.llama import ensure_build
from harness.models.layout import read_layout
from harness.models.synthetic import SHAPES, quantize, write_f16
from harness.util import atomic_write_json, sha256_file


# The quick suite (`pytest -m quick`, README): config, records, the analysis on committed
# references, the layering. None of it builds llama.cpp or measures anything.
QUICK_MODULES = {"test_config", "test_parameters", "test_record", "test_analysis",
                 "test_findings", "test_steady", "test_stats", "test_design", "test_cost",
                 "test_export", "test_compare", "test_citations", "test_reference",
                 "test_layering", "test_attribution", "test_machines", "test_reproducibility"}
BUILT = {"manifest", "tiny_models"}


def pytest_collection_modifyitems(items):
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in QUICK_MODULES and not BUILT & set(item.fixturenames):
            item.add_marker(pytest.mark.quick)


@pytest.fixture(scope="session")
def test_config() -> dict:
    return yaml.safe_load((ROOT / ".test/config/experiments.yaml").read_text())


@pytest.fixture(scope="session")
def manifest(test_config) -> dict:
    return ensure_build(test_config["build"], jobs=2)


@pytest.fixture(scope="session")
def tiny_models(manifest, tmp_path_factory) -> dict:
    """name -> {gguf, layout, info} for olmoe-tiny Q4_K_M / Q2_K and qwen2-tiny Q8_0."""
    d = tmp_path_factory.mktemp("models")
    out = {}
    for shape_name, quants in (("olmoe-tiny", ("Q4_K_M", "Q2_K")), ("qwen2-tiny", ("Q8_0",))):
        shape = SHAPES[shape_name]
        f16 = d / f"{shape_name}-f16.gguf"
        write_f16(shape, 7, Path(manifest["source_tree"]) / shape.vocab_file, f16)
        for q in quants:
            name = f"{shape_name}-{q}"
            gguf = d / f"{name}.gguf"
            quantize(manifest, f16, gguf, q, 2, log_file=subprocess.DEVNULL)
            layout = read_layout(gguf)
            lp = d / f"{name}.layout.json"
            atomic_write_json(lp, layout)
            info = {"name": name, "path": str(gguf), "sha256": sha256_file(gguf), "synthetic": True,
                    "seed": 7, "quant": q, "source": "synthetic"}
            out[name] = {"gguf": str(gguf), "layout": str(lp), "info": info, "data": layout}
        f16.unlink()
    return out


def run_in_subprocess(code: str, lib_dir: str) -> dict:
    """llama_cpp binds one library per process: checks that load it run in a fresh one."""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"LLAMA_CPP_LIB_PATH": lib_dir, "PATH": "/usr/bin:/bin",
                              "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])
