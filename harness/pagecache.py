"""Cold starts: evict a file from the page cache and measure how much of it is resident.

drop_caches is not writable in this container, so eviction is per file with
posix_fadvise(POSIX_FADV_DONTNEED), and residency is checked with mincore().
"""

from __future__ import annotations

import ctypes
import mmap
import os

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.mmap.restype = ctypes.c_void_p
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def residency(path: os.PathLike) -> float:
    """Fraction of the file's pages in the page cache (0..1)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED: maps, reads nothing
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(v & 1 for v in bytes(vec)) / pages


def evict(path: os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        # dirty pages (a freshly written scratch copy) are not dropped: write them back first
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cold_start(path: os.PathLike, tries: int = 3) -> tuple[float, float]:
    """Evict `path` and return (residency before, residency after)."""
    before = residency(path)
    after = before
    for _ in range(tries):
        evict(path)
        after = residency(path)
        if after < 0.01:
            break
    return before, after


def warm(path: os.PathLike) -> float:
    """Read the whole file once (fills the page cache); returns residency after."""
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass
    return residency(path)
