"""Loads llama-cpp-python's low-level bindings against the pipeline's patched llama.cpp build.

llama-cpp-python is installed with LLAMA_BUILD=OFF, so it has no library of its own: it loads
whatever `LLAMA_CPP_LIB_PATH` names. This module sets that variable from the build manifest
before the first import of `llama_cpp`, then adds the few symbols the bindings lack: the patch's
accessor `llama_model_get_tensor` and ggml's tensor accessors from libggml-base.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

GGML_MAX_DIMS = 4
GGML_MAX_OP_PARAMS = 64
GGML_MAX_SRC = 10
GGML_MAX_NAME = 64


class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor of the pinned ggml (ggml/include/ggml.h), up to and including name."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
    ]


GgmlTensorP = ctypes.POINTER(GgmlTensor)


class LibraryError(RuntimeError):
    pass


@dataclass
class Bindings:
    llama_cpp: object  # the llama_cpp.llama_cpp module
    lib_dir: Path
    llama_model_get_tensor: object
    ggml_nbytes: object
    ggml_get_name: object


_bindings: Bindings | None = None


def ggml_base(lib_dir: os.PathLike) -> ctypes.CDLL:
    """The build's libggml-base (tensor accessors, quantization); needs no llama_cpp import."""
    return ctypes.CDLL(str(Path(lib_dir) / "libggml-base.so"))


def load(lib_dir: os.PathLike | None = None) -> Bindings:
    """Import llama_cpp against lib_dir (or $LLAMA_CPP_LIB_PATH) and bind the extra symbols."""
    global _bindings
    if _bindings is not None:
        if lib_dir is not None and Path(lib_dir).resolve() != _bindings.lib_dir.resolve():
            raise LibraryError(f"llama_cpp already loaded from {_bindings.lib_dir}, not {lib_dir}")
        return _bindings
    if lib_dir is not None:
        os.environ["LLAMA_CPP_LIB_PATH"] = str(lib_dir)
    if not os.environ.get("LLAMA_CPP_LIB_PATH"):
        raise LibraryError("no patched llama.cpp build given: pass the build's lib dir or set "
                           "LLAMA_CPP_LIB_PATH (the build rule's manifest names it)")
    path = Path(os.environ["LLAMA_CPP_LIB_PATH"])
    if not (path / "libllama.so").exists():
        raise LibraryError(f"{path}/libllama.so does not exist (LLAMA_CPP_LIB_PATH)")
    import llama_cpp.llama_cpp as llama_cpp  # after LLAMA_CPP_LIB_PATH is set

    lib = llama_cpp._lib
    if not hasattr(lib, "llama_model_get_tensor"):
        raise LibraryError(f"{path}/libllama.so lacks llama_model_get_tensor: not the patched build")
    get_tensor = lib.llama_model_get_tensor
    get_tensor.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    get_tensor.restype = GgmlTensorP

    base = ggml_base(path)
    nbytes = base.ggml_nbytes
    nbytes.argtypes = [ctypes.c_void_p]
    nbytes.restype = ctypes.c_size_t
    get_name = base.ggml_get_name
    get_name.argtypes = [ctypes.c_void_p]
    get_name.restype = ctypes.c_char_p

    _bindings = Bindings(llama_cpp, path, get_tensor, nbytes, get_name)
    return _bindings
