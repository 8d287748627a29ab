"""Bad model files are refused with a clear error naming the file, before llama.cpp loads them;
real-model downloads go through huggingface_hub against a hub served on loopback."""

import hashlib
import http.server
import os
import shutil
import threading
from pathlib import Path

import pytest

from harness.models import fetch
from harness.models.make import make_model
from harness.models.checks import BadModelFile, check_gguf


def test_truncated_gguf_is_refused(tiny_models, tmp_path):
    src = Path(tiny_models["olmoe-tiny-Q2_K"]["gguf"])
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    with pytest.raises(BadModelFile, match=r"truncated\.gguf.*(truncated|corrupted)"):
        check_gguf(bad)


def test_non_gguf_file_is_refused(tmp_path):
    bad = tmp_path / "weights.bin"
    bad.write_bytes(b"PK\x03\x04" + os.urandom(4096))
    with pytest.raises(BadModelFile, match=r"weights\.bin: not a GGUF file"):
        check_gguf(bad)


def test_corrupted_header_is_refused(tiny_models, tmp_path):
    data = bytearray(Path(tiny_models["olmoe-tiny-Q2_K"]["gguf"]).read_bytes())
    data[8:16] = (10**9).to_bytes(8, "little")  # absurd tensor count
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(BadModelFile, match=r"corrupt\.gguf"):
        check_gguf(bad)


def test_wrong_sha256_is_refused(tiny_models):
    with pytest.raises(BadModelFile, match="does not match the expected"):
        check_gguf(tiny_models["olmoe-tiny-Q2_K"]["gguf"], expected_sha256="0" * 64)


class FakeHub(http.server.BaseHTTPRequestHandler):
    """Just enough of the hub's resolve endpoint for hf_hub_download (HEAD + ranged GET)."""

    files: dict = {}

    def log_message(self, *a):
        pass

    def _lookup(self):
        # /{repo}/resolve/{revision}/{file}
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            return self.files.get((f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:])))
        return None

    def _headers(self, data, status=200, start=0):
        self.send_response(status)
        etag = hashlib.sha256(data).hexdigest()
        self.send_header("ETag", f'"{etag}"')
        self.send_header("X-Repo-Commit", "0" * 40)
        self.send_header("X-Linked-Etag", f'"{etag}"')
        self.send_header("X-Linked-Size", str(len(data)))
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_HEAD(self):
        data = self._lookup()
        if data is None:
            self.send_error(404)
            return
        self._headers(data)

    def do_GET(self):
        data = self._lookup()
        if data is None:
            self.send_error(404)
            return
        start = 0
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            start = int(rng[6:].split("-")[0])
        self._headers(data, 206 if start else 200, start)
        self.wfile.write(data[start:])


@pytest.fixture
def hub(tiny_models):
    good = Path(tiny_models["olmoe-tiny-Q2_K"]["gguf"]).read_bytes()
    corrupted = bytearray(good)
    corrupted[len(good) // 2] ^= 0xFF
    FakeHub.files = {("org/olmoe", "main", "good.gguf"): good,
                     ("org/olmoe", "main", "bad.gguf"): bytes(corrupted)}
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", hashlib.sha256(good).hexdigest()
    srv.shutdown()


def test_download_from_hub_verifies_sha256(hub, manifest, tmp_path, monkeypatch):
    endpoint, sha = hub
    monkeypatch.setenv("MOE_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    spec = {"source": "huggingface", "repo": "org/olmoe", "file": "good.gguf", "revision": "main",
            "sha256": sha, "endpoint": endpoint}
    mpath = tmp_path / "manifest.json"
    mpath.write_text(__import__("json").dumps(manifest))
    info = make_model("real", spec, str(mpath), None, str(tmp_path / "real.gguf"),
                      str(tmp_path / "real.json"), 2)
    assert info["sha256"] == sha and info["synthetic"] is True  # it is our tiny synthetic file
    assert (tmp_path / "real.gguf").exists()


def test_corrupted_download_is_rejected_and_leaves_no_output(hub, tmp_path, monkeypatch):
    endpoint, sha = hub
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    spec = {"source": "huggingface", "repo": "org/olmoe", "file": "bad.gguf", "revision": "main",
            "sha256": sha, "endpoint": endpoint}
    with pytest.raises(BadModelFile, match="bad.gguf@main: sha256"):
        fetch.download_hf(spec, tmp_path / "out.gguf", tmp_path / "cache")
    assert not (tmp_path / "out.gguf").exists()
    assert not list(tmp_path.glob(".tmp-*"))  # no partial copy left


def test_local_path_source(tiny_models, tmp_path):
    src = tmp_path / "mine.gguf"
    shutil.copyfile(tiny_models["olmoe-tiny-Q2_K"]["gguf"], src)
    fetch.link_local({"path": str(src), "sha256": tiny_models["olmoe-tiny-Q2_K"]["info"]["sha256"]},
                     tmp_path / "link.gguf")
    assert (tmp_path / "link.gguf").resolve() == src.resolve()
    with pytest.raises(BadModelFile, match="sha256"):
        fetch.link_local({"path": str(src), "sha256": "1" * 64}, tmp_path / "link2.gguf")


def test_a_dense_model_to_be_prefetched_is_refused_when_it_is_made(manifest, tiny_models,
                                                                   tmp_path):
    import json

    mpath = tmp_path / "manifest.json"
    mpath.write_text(json.dumps(manifest))
    dense = tiny_models["qwen2-tiny-Q8_0"]
    spec = {"source": "path", "path": dense["gguf"], "quant": "Q8_0"}
    with pytest.raises(BadModelFile, match=r"model mine .* is dense .* under madvise"):
        make_model("mine", spec, str(mpath), None, str(tmp_path / "mine.gguf"),
                   str(tmp_path / "mine.json"), 2, prefetched_by=("madvise",))
    # the same model under demand paging only is made
    info = make_model("mine", spec, str(mpath), None, str(tmp_path / "ok.gguf"),
                      str(tmp_path / "ok.json"), 2, prefetched_by=())
    assert info["sha256"] == dense["info"]["sha256"]


def _moe_gguf(path: Path, blocks: dict[int, str], n_expert: int = 4) -> Path:
    """A minimal MoE GGUF: per block, `merged` experts (blk.N.ffn_gate_exps), `per-expert` ones
    (blk.N.ffn_gate.E, older Mixtral files) or `dense` (an ordinary FFN, no experts)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "olmoe")
    w.add_block_count(len(blocks))
    w.add_expert_count(n_expert)
    w.add_expert_used_count(2)
    for b, kind in blocks.items():
        w.add_tensor(f"blk.{b}.attn_norm.weight", np.ones(8, np.float32))
        if kind == "merged":
            w.add_tensor(f"blk.{b}.ffn_gate_exps.weight", np.zeros((n_expert, 8, 8), np.float32))
        elif kind == "per-expert":
            for e in range(n_expert):
                w.add_tensor(f"blk.{b}.ffn_gate.{e}.weight", np.zeros((8, 8), np.float32))
        else:
            w.add_tensor(f"blk.{b}.ffn_gate.weight", np.zeros((8, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("name,blocks,why", [
    ("deepseek-like.gguf", {0: "dense", 1: "merged", 2: "merged"}, r"blocks \[0\] have no experts"),
    ("mixtral-old.gguf", {0: "per-expert", 1: "per-expert"}, r"experts stored one tensor each"),
    ("olmoe-00001-of-00003.gguf", {0: "merged", 1: "merged"}, r"one shard of a split GGUF"),
])
def test_layouts_the_harness_cannot_measure_are_refused_naming_why(tmp_path, name, blocks, why):
    path = _moe_gguf(tmp_path / name, blocks)
    with pytest.raises(BadModelFile, match=why):
        check_gguf(path)
    # the same model whole, with merged experts in every block, is measurable
    check_gguf(_moe_gguf(tmp_path / "fine.gguf", {0: "merged", 1: "merged"}))
