"""Cold starts: evict a file from the page cache and measure how much of it is resident.

drop_caches is not writable in this container, so eviction is per file with
posix_fadvise(POSIX_FADV_DONTNEED), and residency is checked with mincore().
"""

from __future__ import annotations

import ctypes
import os

from harness import libc


def residency(path: os.PathLike) -> float:
    """Fraction of the file's pages in the page cache (0..1)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    n = libc.pages(size)
    fd = os.open(path, os.O_RDONLY)
    try:
        # PROT_READ, MAP_SHARED: maps, reads nothing
        addr = libc.lib.mmap(None, size, libc.PROT_READ, libc.MAP_SHARED, fd, 0)
        if addr in (None, libc.MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            resident = libc.resident_pages(addr, n * libc.PAGE, (ctypes.c_ubyte * n)())
        finally:
            libc.lib.munmap(addr, size)
    finally:
        os.close(fd)
    return resident / n


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
