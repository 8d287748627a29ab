"""Checks of model files before llama.cpp ever sees them: a clear error naming the file."""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

from harness.util import sha256_file

GGUF_MAGIC = b"GGUF"


class BadModelFile(ValueError):
    pass


def check_header(path: os.PathLike, expected_size: int | None = None) -> None:
    """The cheap check before every run: GGUF magic and the size the layout file recorded."""
    path = Path(path)
    if not path.is_file():
        raise BadModelFile(f"{path}: model file does not exist")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise BadModelFile(f"{path}: not a GGUF file (magic {head!r}, expected {GGUF_MAGIC!r})")
    size = path.stat().st_size
    if expected_size is not None and size != expected_size:
        raise BadModelFile(f"{path}: {size} bytes, its layout file says {expected_size}: "
                           "the file changed or is truncated")


def check_gguf(path: os.PathLike, expected_sha256: str | None = None) -> dict:
    """Raise BadModelFile if `path` is missing, not GGUF, truncated, or has the wrong sha256;
    returns its layout."""
    path = Path(path)
    if not path.is_file():
        raise BadModelFile(f"{path}: model file does not exist")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:4] != GGUF_MAGIC:
        raise BadModelFile(f"{path}: not a GGUF file (magic {head[:4]!r}, expected {GGUF_MAGIC!r})")
    version, n_tensors = struct.unpack("<IQ", head[4:16])
    if version not in (2, 3):
        raise BadModelFile(f"{path}: GGUF version {version} is not supported (2 or 3)")
    if expected_sha256 is not None:
        actual = sha256_file(path)
        if actual != expected_sha256:
            raise BadModelFile(f"{path}: sha256 {actual} does not match the expected {expected_sha256}")
    # Truncation: the layout reader checks every tensor's extent against the file size.
    from harness.models.layout import LayoutError, read_layout

    try:
        layout = read_layout(path)
    except LayoutError as exc:
        raise BadModelFile(str(exc)) from exc
    except Exception as exc:  # gguf's reader fails in many ways on a corrupted header
        raise BadModelFile(f"{path}: corrupted GGUF ({type(exc).__name__}: {exc})") from exc
    if layout["n_tensors"] != n_tensors or size <= 0:
        raise BadModelFile(f"{path}: header says {n_tensors} tensors, found {layout['n_tensors']}")
    check_measurable(path, layout)
    return layout


SPLIT_RE = re.compile(r"-\d{5}-of-(\d{5})\.gguf$")
PER_EXPERT_RE = re.compile(r"^blk\.\d+\.ffn_(gate|up|down)\.\d+\.weight$")


def check_measurable(path: os.PathLike, layout: dict) -> None:
    """Refuse, naming the file and why, a layout the harness cannot measure exactly: one shard
    of a split GGUF (hashed, laid out and evicted as one file, it would be a fraction of the
    model), experts stored as one tensor each (older Mixtral files: their bytes would count as
    always-needed), or a MoE model with blocks that have no experts (leading dense layers, as in
    DeepSeek-2 or GLM-4-MoE: the harness matches one routing decision to every block)."""
    path = Path(path)
    m = SPLIT_RE.search(path.name)
    if m and int(m.group(1)) > 1:
        raise BadModelFile(f"{path}: one shard of a split GGUF ({m.group(1)} files); merge them "
                           "into one (llama-gguf-split --merge) and name the merged file")
    per_expert = [t["name"] for t in layout["tensors"] if PER_EXPERT_RE.match(t["name"])]
    if per_expert:
        raise BadModelFile(f"{path}: experts stored one tensor each ({per_expert[0]}, ...); the "
                           "harness reads merged expert tensors (blk.N.ffn_*_exps): convert the "
                           "model with a current llama.cpp")
    if layout.get("n_expert"):
        with_experts = {x["layer"] for x in layout["expert_tensors"]}
        dense = [b for b in range(layout["n_layer"]) if b not in with_experts]
        if dense:
            raise BadModelFile(f"{path}: blocks {dense[:8]}{'...' if len(dense) > 8 else ''} have "
                               "no experts (leading dense layers); the harness needs every block "
                               "of a MoE model to route (one routing decision per block)")


def verify_models(info_paths) -> list[dict]:
    """After the study's last run: each model's bytes read in full against the sha256 recorded
    when it was made (runs check only its identity once it was read in full). Raises
    BadModelFile naming a model that changed; returns what was checked."""
    import json

    out = []
    for p in info_paths:
        info = json.loads(Path(p).read_text())
        if not info.get("sha256"):
            continue
        got = sha256_file(info["path"])
        if got != info["sha256"]:
            raise BadModelFile(f"{info['path']}: sha256 {got} is not the {info['sha256']} it was "
                               "made with: it changed during the study, and the runs measured "
                               "after the change describe another model")
        out.append({"model": info.get("name"), "path": info["path"], "sha256": got})
    return out
