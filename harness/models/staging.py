"""Node-local model staging: on a cluster the measurement reads the model from the node's own disk.

The results tree (and the models in it) usually lives on a shared network filesystem, whose
throughput and caching are not the node's disk. When the config names `cluster.local_dir`, each
measurement first copies the model there (once per node: a marker beside the copy records the
source's size and mtime, and the copy's sha256 must equal the model's recorded one) and measures
the copy. Without `cluster.local_dir` the model is measured where it is.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from harness.util import atomic_path, atomic_write_json, sha256_file

log = logging.getLogger(__name__)


class StagingError(RuntimeError):
    pass


def local_dir(config: dict) -> str | None:
    """The node-local directory the config names, or None (measure the models in place)."""
    return ((config or {}).get("cluster") or {}).get("local_dir")


def _source_id(src: Path) -> dict:
    st = src.stat()
    return {"source": str(src.resolve()), "source_bytes": st.st_size,
            "source_mtime_ns": st.st_mtime_ns}


def stage(model_path: os.PathLike, into: os.PathLike | None, sha256: str | None = None) -> str:
    """The path to measure: model_path itself when `into` is None, else its verified copy in
    `into`. sha256: the model's recorded digest (its info JSON); without one, the source's."""
    src = Path(model_path)
    if into is None:
        return str(src)
    dst, marker = Path(into) / src.name, Path(into) / (src.name + ".staged.json")
    want = _source_id(src)
    if dst.exists() and marker.exists():
        m = json.loads(marker.read_text())
        st = dst.stat()
        # reused only as the very copy of this source that was verified against this digest
        # (the run then checks it again: harness.run.supervise._check_model_unchanged)
        if ({k: m.get(k) for k in want} == want and m.get("bytes") == st.st_size
                and m.get("mtime_ns") == st.st_mtime_ns and m.get("ino") == st.st_ino
                and (sha256 is None or m.get("sha256") == sha256)):
            return str(dst)
    Path(into).mkdir(parents=True, exist_ok=True)
    expected = sha256 or sha256_file(src)
    log.info("staging %s -> %s", src, dst)
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)
        got = sha256_file(tmp)
        if got != expected:
            raise StagingError(f"staged copy of {src} in {into} has sha256 {got[:16]}..., "
                               f"expected {expected[:16]}...: the copy or the source is damaged")
    st = dst.stat()
    atomic_write_json(marker, {**want, "sha256": expected, "bytes": st.st_size,
                               "mtime_ns": st.st_mtime_ns, "ino": st.st_ino})
    return str(dst)


def staged_info(info: dict, config: dict) -> dict:
    """A model info dict whose path is the file to measure (staged when the config says so),
    keeping where it was staged from."""
    into = local_dir(config)
    if into is None:
        return info
    return {**info, "path": stage(info["path"], into, info.get("sha256")), "staged_from": info["path"]}


def staged_model(gguf_path: os.PathLike, config: dict) -> str:
    """The file to measure for a pipeline model (results/models/<name>.gguf, its info JSON beside
    it): staged when the config names cluster.local_dir."""
    into = local_dir(config)
    if into is None:
        return str(gguf_path)
    info = Path(gguf_path).with_suffix(".json")
    sha = json.loads(info.read_text()).get("sha256") if info.exists() else None
    return stage(gguf_path, into, sha)
