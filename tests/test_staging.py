"""Node-local staging (harness.models.staging): the copy is verified, reused, and refreshed."""

import json
import os

import pytest

from harness.models.staging import StagingError, stage, staged_info, staged_model
from harness.util import sha256_file


@pytest.fixture
def model(tmp_path):
    src = tmp_path / "shared" / "m.gguf"
    src.parent.mkdir()
    src.write_bytes(os.urandom(1 << 16))
    (src.with_suffix(".json")).write_text(json.dumps({"name": "m", "path": str(src),
                                                      "sha256": sha256_file(src)}))
    return src


def test_without_a_local_dir_the_model_is_measured_in_place(model):
    assert staged_model(model, {}) == str(model)
    assert staged_model(model, {"cluster": {"local_dir": None}}) == str(model)
    info = json.loads(model.with_suffix(".json").read_text())
    assert staged_info(info, {"cluster": None}) is info


def test_the_copy_is_the_same_bytes_and_is_reused(model, tmp_path):
    local = tmp_path / "node-local"
    path = staged_model(model, {"cluster": {"local_dir": str(local)}})
    assert path == str(local / "m.gguf") and sha256_file(path) == sha256_file(model)
    mtime = os.stat(path).st_mtime_ns
    assert stage(model, local) == path and os.stat(path).st_mtime_ns == mtime  # not copied again
    info = staged_info(json.loads(model.with_suffix(".json").read_text()),
                       {"cluster": {"local_dir": str(local)}})
    assert info["path"] == path and info["staged_from"] == str(model)


def test_a_changed_source_is_staged_again(model, tmp_path):
    local = tmp_path / "node-local"
    stage(model, local)
    model.write_bytes(b"new" * 100)
    assert open(stage(model, local), "rb").read() == b"new" * 100


def test_a_copy_that_does_not_match_the_recorded_digest_is_refused(model, tmp_path):
    with pytest.raises(StagingError, match="sha256"):
        stage(model, tmp_path / "node-local", sha256="0" * 64)
    assert not (tmp_path / "node-local" / "m.gguf").exists()  # nothing half-staged is left


def test_a_copy_verified_against_another_digest_is_not_reused(model, tmp_path):
    """The marker holds the digest the copy was verified against: asked for another model's
    digest, the copy is made (and checked) again, and refused."""
    local = tmp_path / "node-local"
    stage(model, local, sha256_file(model))
    with pytest.raises(StagingError, match="sha256"):
        stage(model, local, sha256="1" * 64)
