"""Checks of model files before llama.cpp ever sees them: a clear error naming the file."""

from __future__ import annotations

import os
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
    return layout
