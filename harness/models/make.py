"""One model entry of the config made into a GGUF (synthesized, downloaded or linked) and its info
record (sha256, synthetic or not, source)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from harness.models import fetch, synthetic
from harness.build.llama import default_cache_dir
from harness.util import atomic_write_json, sha256_file
from harness.models.checks import BadModelFile, check_gguf

log = logging.getLogger(__name__)


def make_model(name: str, spec: dict, manifest_path: str, f16: str | None, out_gguf: str,
               out_info: str, threads: int, prefetched_by: tuple[str, ...] = ()) -> dict:
    """`prefetched_by`: the mechanisms that prefetch experts among the runs of this model; a
    dense model (no experts) under one of them is refused here, naming both."""
    manifest = json.loads(Path(manifest_path).read_text())
    t0 = time.time()
    src = spec["source"]
    if src == "synthetic":
        synthetic.quantize(manifest, Path(f16), Path(out_gguf), spec["quant"], threads)
    elif src == "huggingface":
        fetch.download_hf(spec, out_gguf, default_cache_dir() / "hf")
    else:
        fetch.link_local(spec, out_gguf)
    layout = check_gguf(out_gguf)
    if not layout.get("n_expert") and prefetched_by:
        raise BadModelFile(f"model {name} ({out_gguf}) is dense (no experts), and the config runs it "
                           f"under {', '.join(sorted(set(prefetched_by)))}, which prefetch experts: "
                           "run it with mechanism none, or name a MoE model")
    is_synthetic, seed = layout["synthetic"], layout["seed"]
    info = {"name": name, "path": str(Path(out_gguf).resolve()), "source": src,
            "quant": spec.get("quant"), "shape": spec.get("shape"), "synthetic": is_synthetic,
            "seed": seed, "sha256": sha256_file(out_gguf), "bytes": Path(out_gguf).stat().st_size,
            "seconds": round(time.time() - t0, 2)}
    if src == "huggingface":
        info.update(repo=spec["repo"], file=spec["file"], revision=spec["revision"])
    atomic_write_json(out_info, info)
    log.info(f"model {name}: {info['bytes']} bytes, synthetic={is_synthetic}, {info['seconds']} s")
    return info
