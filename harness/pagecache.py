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


def residency(path: os.PathLike) -> float:
    """Fraction of the file's pages in the page cache (0..1)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            buf = (ctypes.c_char * 1).from_buffer(m)
            addr = ctypes.addressof(buf)
            rc = _libc.mincore(addr, size, vec)
            del buf
            if rc != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            resident = sum(v & 1 for v in bytes(vec))
        finally:
            m.close()
    return resident / pages


def evict(path: os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
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
