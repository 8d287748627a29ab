"""Real models: a Hugging Face file at a pinned revision, or a plain local path.

Downloads go through huggingface_hub (which resumes an interrupted download from its
`.incomplete` file); the sha256 is verified before the file is renamed into place, so a failed,
partial or corrupted download never becomes the rule's output.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from harness.util import atomic_path, sha256_file
from harness.models.checks import BadModelFile, check_header


def download_hf(spec: dict, dest: os.PathLike, cache_dir: os.PathLike) -> None:
    from huggingface_hub import hf_hub_download

    dest = Path(dest)
    local = hf_hub_download(repo_id=spec["repo"], filename=spec["file"], revision=spec["revision"],
                            endpoint=spec.get("endpoint"), cache_dir=str(cache_dir))
    actual = sha256_file(local)
    if actual != spec["sha256"]:
        # drop the bad blob so that a retry downloads it again instead of trusting the cache
        real = Path(os.path.realpath(local))
        Path(local).unlink(missing_ok=True)
        real.unlink(missing_ok=True)
        raise BadModelFile(f"{spec['repo']}/{spec['file']}@{spec['revision']}: sha256 {actual} does "
                           f"not match the expected {spec['sha256']}")
    check_header(local)
    with atomic_path(dest) as tmp:
        shutil.copyfile(local, tmp)


def link_local(spec: dict, dest: os.PathLike) -> None:
    src = Path(spec["path"]).expanduser().resolve()
    check_header(src)
    if spec.get("sha256") and sha256_file(src) != spec["sha256"]:
        raise BadModelFile(f"{src}: sha256 does not match the expected {spec['sha256']}")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.link")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(src)
    os.replace(tmp, dest)
