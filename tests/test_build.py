import io
import tarfile

import pytest

from harness.build import llama
from tests.conftest import run_in_subprocess


def test_build_key_depends_on_commit_patch_and_flags():
    k = llama.build_key("a" * 40, "p1", ("-DX=1",))
    assert k != llama.build_key("b" * 40, "p1", ("-DX=1",))
    assert k != llama.build_key("a" * 40, "p2", ("-DX=1",))
    assert k != llama.build_key("a" * 40, "p1", ("-DX=2",))
    assert k == llama.build_key("a" * 40, "p1", ("-DX=1",))
    assert k != llama.build_key("a" * 40, "p1", ("-DX=1",), "another CPU")


def test_a_native_build_is_keyed_by_the_cpu_it_targets(monkeypatch):
    """-DGGML_NATIVE=ON compiles for this CPU: a node with another CPU sharing the cache must not
    reuse it; a portable build may."""
    native = ("-DGGML_NATIVE=ON",)
    here = llama.native_target(native)
    assert "|" in here and llama.identity.cpu_flags() in here and len(llama.identity.cpu_flags()) > 10
    assert llama.native_target(("-DGGML_NATIVE=ON", "-DGGML_NATIVE=OFF")) == ""  # the last wins
    assert llama.native_target(("-DX=1",)) == ""
    monkeypatch.setattr(llama.identity, "cpu_flags", lambda: "fpu sse2")  # a CPU without AVX
    assert llama.native_target(native) != here
    assert llama.native_target(("-DGGML_NATIVE=OFF",)) == ""


def _tar(tmp_path, members):
    p = tmp_path / "evil.tar.gz"
    with tarfile.open(p, "w:gz") as t:
        for name, kind in members:
            ti = tarfile.TarInfo(name)
            if kind == "sym":
                ti.type, ti.linkname = tarfile.SYMTYPE, "/etc/passwd"
                t.addfile(ti)
            else:
                data = b"x"
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
    return p


def test_safe_extract_refuses_path_escape(tmp_path):
    p = _tar(tmp_path, [("top/vendor/llama.cpp/../../../../escape.txt", "file")])
    with pytest.raises(llama.BuildError, match="escapes"):
        llama.safe_extract(p, "top/vendor/llama.cpp/", tmp_path / "out")
    assert not (tmp_path / "escape.txt").exists()


def test_safe_extract_refuses_symlink_out(tmp_path):
    p = _tar(tmp_path, [("top/vendor/llama.cpp/link", "sym")])
    with pytest.raises(llama.BuildError, match="escapes"):
        llama.safe_extract(p, "top/vendor/llama.cpp/", tmp_path / "out")


def test_patch_that_does_not_apply_fails_clearly(manifest, tmp_path):
    bad = tmp_path / "bad.patch"
    bad.write_text("--- a/include/llama.h\n+++ b/include/llama.h\n@@ -1,3 +1,4 @@\n-no such line\n"
                   "+replacement\n context\n context\n")
    with pytest.raises(llama.BuildError, match="does not apply"):
        llama.apply_patch(llama.Path(manifest["source_tree"]), bad, tmp_path / "tree")


def test_manifest_records_pinned_commit_and_patch(manifest, test_config):
    assert manifest["commit"] == test_config["build"]["source"]["commit"]
    assert manifest["patch_sha256"] == llama.sha256_file(llama.PATCH)
    for tool in ("llama_bench", "llama_quantize"):
        assert llama.Path(manifest[tool]).exists()
    # a second ensure_build reuses the cache instead of rebuilding
    again = llama.ensure_build(test_config["build"], jobs=2)
    assert again["key"] == manifest["key"]


def test_llama_cpp_loads_patched_library_and_accessor_works(manifest, tiny_models):
    m = tiny_models["olmoe-tiny-Q4_K_M"]
    names = [x["name"] for x in m["data"]["expert_tensors"]] + ["no.such.tensor"]
    code = (
        "import json, llama_cpp, os\n"
        "from harness.run.worker import tensor_offsets\n"
        "lib = llama_cpp.llama_cpp._lib._name\n"
        f"offs = tensor_offsets({m['gguf']!r}, {names!r})\n"
        "print(json.dumps({'lib': lib, 'offs': offs}))\n")
    out = run_in_subprocess(code, manifest["lib_dir"])
    assert out["lib"].startswith(manifest["lib_dir"])
    assert out["offs"]["no.such.tensor"] is None
    for x in m["data"]["expert_tensors"]:  # llama.cpp's own offsets equal the layout file's
        assert out["offs"][x["name"]] == x["base_offset"]
    assert len(out["offs"]) == len(names)


def test_manifest_names_the_advice_llama_cpp_gives_the_model_file(manifest):
    adv = manifest["file_advice"]
    # the pinned llama.cpp calls posix_fadvise(POSIX_FADV_SEQUENTIAL) and populates on load
    assert adv["posix_fadvise"] == ["SEQUENTIAL"] and adv["read_ahead_multiplier"] == 2
    assert adv["map_populate_on_load"] is True


def test_file_advice_reads_the_source_it_is_given(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "llama-mmap.cpp").write_text("posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM)\n")
    adv = llama.file_advice(tmp_path)
    assert adv["posix_fadvise"] == ["RANDOM"] and adv["read_ahead_multiplier"] == 1
    assert adv["map_populate_on_load"] is False
