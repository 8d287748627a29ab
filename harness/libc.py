"""Every libc call the harness makes that Python's os module lacks, bound once, with the page
arithmetic they share. Errors raise OSError naming the call."""

from __future__ import annotations

import ctypes
import mmap
import os

PAGE = mmap.PAGESIZE
PROT_READ, PROT_WRITE = 1, 2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 1, 2, 0x10, 0x20
MAP_FAILED = ctypes.c_void_p(-1).value
MADV_WILLNEED = 3
MADV_DONTNEED = 4
MADV_PAGEOUT = 21  # Linux >= 5.4: reclaim these pages now
MADV_POPULATE_READ = 22  # Linux >= 5.14
POSIX_FADV_WILLNEED = 3

lib = ctypes.CDLL(None, use_errno=True)
lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
lib.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
lib.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
lib.pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
lib.pread.restype = ctypes.c_ssize_t
lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                     ctypes.c_long]
lib.mmap.restype = ctypes.c_void_p
lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
lib.readahead.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_size_t]
lib.readahead.restype = ctypes.c_ssize_t
lib.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
SYNC_FILE_RANGE_WRITE = 2  # start writeback of the dirty pages in the range, from this process


lib.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int) -> None:
    """Ask the kernel to send `sig` to this process when the thread that started it exits (used
    in a child between fork and exec: a measured process never outlives its supervisor)."""
    check(lib.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def pages(nbytes: int) -> int:
    """Pages covering nbytes from a page boundary."""
    return (nbytes + PAGE - 1) // PAGE


def page_span(addr: int, nbytes: int) -> tuple[int, int]:
    """The page-aligned range covering [addr, addr + nbytes)."""
    start = addr & ~(PAGE - 1)
    end = (addr + nbytes + PAGE - 1) & ~(PAGE - 1)
    return start, end - start


def madvise(addr: int, nbytes: int, advice: int) -> None:
    start, length = page_span(addr, nbytes)
    check(lib.madvise(start, length, advice), f"madvise({advice})")


def mlock(addr: int, nbytes: int) -> None:
    start, length = page_span(addr, nbytes)
    check(lib.mlock(start, length), "mlock")


def mmap_fixed(addr: int, length: int, prot: int, flags: int, fd: int, offset: int, what: str) -> None:
    """Map over [addr, addr + length) exactly (MAP_FIXED), or raise."""
    got = lib.mmap(addr, length, prot, flags | MAP_FIXED, fd, offset)
    if got in (None, MAP_FAILED) or got != addr:
        raise OSError(ctypes.get_errno(), f"{what}: remapping the model failed")


_LOW_BIT = bytes(b & 1 for b in range(256))


def resident_pages(addr: int, length: int, vec) -> int:
    """How many of the pages of a page-aligned range are resident (mincore into `vec`)."""
    check(lib.mincore(addr, length, vec), "mincore")
    # bit 0 of each byte: resident (the others are reserved); counted in C, not byte by byte
    return ctypes.string_at(vec, length // PAGE).translate(_LOW_BIT).count(1)
