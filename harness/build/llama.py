"""The pinned llama.cpp source and its patched build.

Two source kinds: the llama-cpp-python sdist from PyPI (offline-friendly: it vendors the full
llama.cpp tree under vendor/llama.cpp) and a git clone at a pinned commit. The build is keyed by
(commit, patch hash, CMake flags) and kept in a cache directory outside results/, so CI and
repeated runs reuse it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.box import identity
from harness.util import atomic_write_text, sha256_file

log = logging.getLogger(__name__)

PATCH = Path(__file__).with_name("llama.cpp.patch")
SDIST_VENDOR = "vendor/llama.cpp"

# Release, shared libraries, no CURL, no tests/examples/server; only the two tools we use.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DGGML_NATIVE=ON",
    # the libraries and tools are copied out of the build tree into the cache: find each other there
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN:$ORIGIN/../lib",
)
BUILD_TARGETS = ("llama", "llama-bench", "llama-quantize")


class BuildError(RuntimeError):
    pass


# no external step may hang a pipeline: a download and a build each have a bound (about 6 min here)
DOWNLOAD_TIMEOUT_S = 1800
BUILD_TIMEOUT_S = 3 * 3600


def default_cache_dir() -> Path:
    env = os.environ.get("MOE_BENCH_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moe-offload-bench"


def resolve_cache_dir(configured: str | None) -> Path:
    """The config's build.cache_dir wins, then $MOE_BENCH_CACHE, then ~/.cache."""
    return Path(configured).expanduser() if configured else default_cache_dir()


# --- source -----------------------------------------------------------------------------------


def fetch_sdist(package: str, version: str, sha256: str, cache_dir: Path) -> Path:
    """The sdist tarball, downloaded once with pip into the cache and verified by sha256."""
    dest_dir = cache_dir / "sdist"
    dest_dir.mkdir(parents=True, exist_ok=True)
    name = f"{package.replace('-', '_')}-{version}.tar.gz"
    tarball = dest_dir / name
    if tarball.exists() and sha256_file(tarball) == sha256:
        log.info(f"source: reusing {tarball}")
        return tarball
    with tempfile.TemporaryDirectory(dir=dest_dir) as tmp:
        log.info(f"source: pip download {package}=={version} (sdist)")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--no-build-isolation", "--disable-pip-version-check", "-d", tmp, f"{package}=={version}"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        got = Path(tmp) / name
        if not got.exists():
            # pip may refuse to prepare metadata without build isolation; the file is what we want.
            res = subprocess.run([c for c in cmd if c != "--no-build-isolation"], timeout=DOWNLOAD_TIMEOUT_S,
                                 capture_output=True,
                                 text=True)
        if not got.exists():
            raise BuildError(f"pip download of {package}=={version} failed:\n{res.stdout}\n{res.stderr}")
        actual = sha256_file(got)
        if actual != sha256:
            raise BuildError(f"{name}: sha256 {actual} does not match the pinned {sha256} "
                             "(config: build.source.sha256)")
        os.replace(got, tarball)
    return tarball


def safe_extract(tarball: Path, member_prefix: str, dest: Path) -> None:
    """Extract only members under member_prefix, refusing links or paths that escape dest."""
    dest = dest.resolve()
    with tarfile.open(tarball) as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(member_prefix):
                continue
            target = (dest / m.name).resolve()
            if dest not in target.parents and target != dest:
                raise BuildError(f"{tarball.name}: member {m.name!r} escapes the extraction directory")
            if m.issym() or m.islnk():
                link = (target.parent / m.linkname).resolve()
                if dest not in link.parents:
                    raise BuildError(f"{tarball.name}: link {m.name!r} -> {m.linkname!r} escapes")
            if m.isdev():
                raise BuildError(f"{tarball.name}: device member {m.name!r} refused")
            members.append(m)
        if not members:
            raise BuildError(f"{tarball.name}: no members under {member_prefix!r}")
        tar.extractall(dest, members=members, filter="data")


def sdist_commit(tarball: Path, top: str) -> str:
    """The vendored llama.cpp commit, from the sdist's git metadata for the submodule."""
    name = f"{top}/.git/modules/vendor/llama.cpp/HEAD"
    with tarfile.open(tarball) as tar:
        try:
            f = tar.extractfile(name)
        except KeyError:
            f = None
        if f is None:
            raise BuildError(f"{tarball.name}: no {name}: cannot tell the vendored llama.cpp commit")
        return f.read().decode().strip()


@dataclass
class Source:
    path: Path  # the llama.cpp tree
    commit: str
    kind: str


def prepare_source(source_cfg: dict, cache_dir: Path) -> Source:
    kind = source_cfg["kind"]
    if kind == "pypi-sdist":
        tarball = fetch_sdist(source_cfg["package"], source_cfg["version"], source_cfg["sha256"],
                              cache_dir)
        top = f"{source_cfg['package'].replace('-', '_')}-{source_cfg['version']}"
        commit = sdist_commit(tarball, top)
        if source_cfg.get("commit") and source_cfg["commit"] != commit:
            raise BuildError(f"sdist vendors llama.cpp {commit}, config says {source_cfg['commit']}")
        tree = cache_dir / "src" / f"llama.cpp-{commit}"
        if not (tree / "CMakeLists.txt").exists():
            with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
                log.info(f"source: extracting {top}/{SDIST_VENDOR}")
                safe_extract(tarball, f"{top}/{SDIST_VENDOR}/", Path(tmp))
                tree.parent.mkdir(parents=True, exist_ok=True)
                shutil.rmtree(tree, ignore_errors=True)
                os.replace(Path(tmp) / top / SDIST_VENDOR, tree)
        # the vendored tree carries a .git file pointing into the sdist; it must not confuse git apply
        gitfile = tree / ".git"
        if gitfile.is_file():
            gitfile.unlink()
        return Source(tree, commit, kind)
    if kind == "git":
        commit = source_cfg["commit"]
        tree = cache_dir / "src" / f"llama.cpp-{commit}"
        if not (tree / "CMakeLists.txt").exists():
            with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
                log.info(f"source: git clone {source_cfg['url']} @ {commit}")
                subprocess.run(["git", "clone", "--quiet", source_cfg["url"], tmp + "/t"], check=True,
                               timeout=DOWNLOAD_TIMEOUT_S)
                subprocess.run(["git", "-C", tmp + "/t", "checkout", "--quiet", commit], check=True)
                shutil.rmtree(Path(tmp) / "t" / ".git")
                tree.parent.mkdir(parents=True, exist_ok=True)
                os.replace(Path(tmp) / "t", tree)
        return Source(tree, commit, kind)
    raise BuildError(f"config: build.source.kind: {kind!r} is not one of pypi-sdist, git")


# --- build ------------------------------------------------------------------------------------


def native_target(flags: tuple[str, ...]) -> str:
    """What a -DGGML_NATIVE=ON build is compiled for: this CPU's model and instruction-set flags
    (its binaries may not run, or run other kernels, on another CPU); '' for a portable build."""
    native = [f.split("=", 1)[1].upper() for f in flags if f.startswith("-DGGML_NATIVE=")]
    if not native or native[-1] in ("OFF", "0", "FALSE", "NO"):
        return ""
    return f"{identity.cpu_model()}|{identity.cpu_flags()}"


def build_key(commit: str, patch_sha256: str, flags: tuple[str, ...], target: str = "") -> str:
    """The cache key: commit, patch, flags and, for a native build, the CPU it targets, so that
    nodes of different CPUs sharing one cache each get their own build."""
    h = hashlib.sha256("\n".join([commit, patch_sha256, *flags, *([target] if target else [])])
                       .encode()).hexdigest()
    return f"{commit[:12]}-{h[:16]}"


def apply_patch(tree: Path, patch: Path, dest: Path) -> None:
    """Copy the tree to dest and apply the patch there; a clean error if it does not apply."""
    shutil.copytree(tree, dest, symlinks=True)
    res = subprocess.run(["git", "apply", "--check", "-v", str(patch)], cwd=dest, capture_output=True,
                         text=True)
    if res.returncode != 0:
        raise BuildError(f"{patch} does not apply to llama.cpp at {tree}:\n{res.stderr.strip()}")
    subprocess.run(["git", "apply", str(patch)], cwd=dest, check=True)
    log.info(f"build: applied {patch.name}")


def build(source: Source, cache_dir: Path, jobs: int, extra_flags: tuple[str, ...] = ()) -> dict:
    """Build (or reuse) the patched llama.cpp; returns the manifest describing it."""
    flags = CMAKE_FLAGS + tuple(extra_flags)
    patch_sha = sha256_file(PATCH)
    target = native_target(flags)
    key = build_key(source.commit, patch_sha, flags, target)
    prefix = cache_dir / "build" / key
    manifest_path = prefix / "manifest.json"
    if manifest_path.exists():
        log.info(f"build: reusing cached build {prefix}")
        return json.loads(manifest_path.read_text())
    (cache_dir / "build").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=cache_dir / "build"))
    try:
        tree = work / "llama.cpp"
        apply_patch(source.path, PATCH, tree)
        bdir = tree / "build"
        log.info(f"build: cmake {' '.join(flags)}")
        subprocess.run(["cmake", "-S", str(tree), "-B", str(bdir), *flags], check=True, timeout=600,
                       stdout=sys.stderr)
        subprocess.run(["cmake", "--build", str(bdir), "-j", str(jobs), "--target", *BUILD_TARGETS],
                       timeout=BUILD_TIMEOUT_S,
                       check=True, stdout=sys.stderr)
        out = work / "out"
        (out / "lib").mkdir(parents=True)
        (out / "bin").mkdir()
        for so in bdir.rglob("*.so*"):
            if so.is_file() or so.is_symlink():
                shutil.copy2(so, out / "lib" / so.name, follow_symlinks=False)
        for tool in ("llama-bench", "llama-quantize"):
            shutil.copy2(bdir / "bin" / tool, out / "bin" / tool)
        manifest = {
            "key": key,
            "commit": source.commit,
            "source_kind": source.kind,
            "patch_sha256": patch_sha,
            "cmake_flags": list(flags),
            "native_target": target or None,  # "cpu model|flags" a native build is for
            "lib_dir": str(prefix / "lib"),
            "bin_dir": str(prefix / "bin"),
            "llama_bench": str(prefix / "bin" / "llama-bench"),
            "llama_quantize": str(prefix / "bin" / "llama-quantize"),
        }
        atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2))
        # rename last: a half-built tree never looks like a cached build
        try:
            os.replace(out, prefix)
        except OSError:
            if not manifest_path.exists():
                raise
            # a concurrent build of the same key finished first: the same inputs, so use it
            log.info(f"build: {prefix} was finished by another build meanwhile; using it")
            return json.loads(manifest_path.read_text())
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build_identity(build_cfg: dict) -> str:
    """What a build is, as a rule's param: its source and CMake flags, keys in sorted order, and
    not where its cache lives. Every measurement depends on it (a new one measures again);
    none on the cache's place or the order the config's keys were written in."""
    return json.dumps({"source": build_cfg["source"],
                       "extra_cmake_flags": list(build_cfg.get("extra_cmake_flags") or [])},
                      sort_keys=True)


def ensure_build(build_cfg: dict, jobs: int) -> dict:
    cache_dir = resolve_cache_dir(build_cfg.get("cache_dir"))
    cache_dir.mkdir(parents=True, exist_ok=True)
    source = prepare_source(build_cfg["source"], cache_dir)
    manifest = build(source, cache_dir, jobs, tuple(build_cfg.get("extra_cmake_flags", [])))
    manifest["source_tree"] = str(source.path)
    manifest["file_advice"] = file_advice(source.path)
    manifest["hook_lib"] = str(build_hook(cache_dir))
    return manifest


HOOK_SOURCE = Path(__file__).with_name("hook.c")


def build_hook(cache_dir: Path) -> Path:
    """The routing hook's C ask path (harness/build/hook.c) as a shared library, cached by its sha256;
    it needs no ggml header (the name offset is passed at run time)."""
    key = sha256_file(HOOK_SOURCE)[:16]
    lib = cache_dir / "hook" / key / "libmoehook.so"
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    tmp = lib.with_suffix(f".{os.getpid()}.tmp")
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(tmp),
                    str(HOOK_SOURCE)], check=True, stdout=sys.stderr)
    os.replace(tmp, lib)
    log.info("build: routing hook %s", lib)
    return lib


def file_advice(tree: Path) -> dict:
    """What this llama.cpp tells the kernel about a model file it maps, read from its source (the
    kernel offers no way to query a file's advice): POSIX_FADV_SEQUENTIAL doubles the device's
    read-ahead window for every fault on the mapping; MAP_POPULATE and POSIX_MADV_WILLNEED make
    the load read the whole file."""
    src = (Path(tree) / "src" / "llama-mmap.cpp").read_text(errors="replace")
    fadv = sorted(set(re.findall(r"posix_fadvise\(fd, 0, 0, POSIX_FADV_(\w+)\)", src)))
    return {"source": "src/llama-mmap.cpp", "posix_fadvise": fadv,
            "map_populate_on_load": "MAP_POPULATE" in src,
            "madv_willneed_on_load": "POSIX_MADV_WILLNEED" in src,
            "read_ahead_multiplier": 2 if "SEQUENTIAL" in fadv else 1}
