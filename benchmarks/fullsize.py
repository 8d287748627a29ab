"""What the full-size benchmarks share: their arguments, the pipeline's build and model files,
and one worker run of a spec with its generated-token rows."""

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd

from harness.build import llama
from harness.run import supervise


def arguments(default_rounds: int) -> tuple[Path, int, int]:
    """`model [rounds] [tokens]` from the command line (flags, `--...`, are the caller's)."""
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if not args:
        raise SystemExit(f"usage: python {sys.argv[0]} results/models/olmoe-q4.gguf [rounds] [tokens]")
    return (Path(args[0]).resolve(), int(args[1]) if len(args) > 1 else default_rounds,
            int(args[2]) if len(args) > 2 else 64)


def build_manifest() -> dict:
    """The pipeline's build manifest, with the routing hook of this checkout (built if need be),
    not the one the last pipeline build recorded."""
    manifest = json.loads((ROOT / "results/build/llama.json").read_text())
    manifest["hook_lib"] = str(llama.build_hook(Path(manifest["lib_dir"]).parents[2]))
    return manifest


def inputs(model: Path) -> tuple[dict, dict, str]:
    """The build manifest (build_manifest), the model's info and its layout file."""
    info = json.loads(model.with_suffix(".json").read_text())
    return build_manifest(), info, str(model.with_name(model.stem + ".layout.json"))


def worker_run(spec: dict, manifest: dict, info: dict, layout: str, limits) -> tuple[pd.DataFrame, dict]:
    """One supervised run of `spec`: its generated-token rows (tokens.csv) and its record."""
    with tempfile.TemporaryDirectory() as d:
        rec = supervise.run(spec, Path(d) / "run", lib_dir=manifest["lib_dir"], build=manifest,
                            model_info=info, layout_path=layout, limits=limits, time_limit_s=3600)
        if rec.status != "ok":
            raise SystemExit(f"{spec['run_id']}: {rec.status}")
        return pd.read_csv(Path(d) / "run" / "tokens.csv").query("phase == 'gen'"), rec
