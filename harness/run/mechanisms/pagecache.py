"""The page-cache family: the kernel's cache is the only cache. Demand paging (the baseline),
advice (MADV_WILLNEED, MADV_POPULATE_READ), buffered preads that warm the cache (inline or from
threads), and preads into a writable shared mapping."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from harness.run.mechanisms.base import Mechanism, max_slab, register
from harness.libc import (MADV_POPULATE_READ, MADV_WILLNEED, MAP_SHARED, SYNC_FILE_RANGE_WRITE,
                          PROT_READ, PROT_WRITE, check, madvise, mmap_fixed)
from harness.libc import lib as _libc


@register
class NoPrefetch(Mechanism):
    """Plain mmap demand paging: the baseline every other row is compared with."""

    name = "none"

    def on_route(self, layer, experts):
        pass


@register
class Madvise(Mechanism):
    name = "madvise"
    advice = MADV_WILLNEED

    def on_route(self, layer, experts):
        t0 = time.perf_counter()
        for e in experts:
            for s in self.layout.slabs(layer, e):
                madvise(self.model.base + s.offset, s.nbytes, self.advice)  # raises on failure
                self.c.bytes_advised += s.nbytes
        self.c.madvise_s += time.perf_counter() - t0


@register
class Populate(Madvise):
    """MADV_POPULATE_READ faults the pages in synchronously, with no copy."""

    name = "populate"
    advice = MADV_POPULATE_READ


@register
class PreadMadvise(Mechanism):
    """The study's surviving design: buffered pread of each routed slab into one reused scratch
    buffer (warms the page cache), then MADV_WILLNEED on the mapped range."""

    name = "pread+madvise"

    def __init__(self, model, *, willneed_after_pread: bool, **options):
        super().__init__(model, **options)
        self.scratch = bytearray(max_slab(self.layout))
        self.view = memoryview(self.scratch)
        self.advise = bool(willneed_after_pread)

    def on_route(self, layer, experts):
        for e in experts:
            for s in self.layout.slabs(layer, e):
                t0 = time.perf_counter()
                n = os.preadv(self.model.fd, [self.view[: s.nbytes]], s.offset)
                t1 = time.perf_counter()
                self.c.pread_s += t1 - t0
                if self.advise:
                    madvise(self.model.base + s.offset, s.nbytes, MADV_WILLNEED)
                    self.c.madvise_s += time.perf_counter() - t1
                self.c.bytes_read += n


@register
class ThreadPool(Mechanism):
    """The same preads issued from N background threads so compute can overlap I/O."""

    name = "threadpool"

    def __init__(self, model, *, prefetch_threads: int, **options):
        super().__init__(model, **options)
        self.pool = ThreadPoolExecutor(max_workers=prefetch_threads, thread_name_prefix="prefetch")
        self.local = threading.local()
        self.size = max_slab(self.layout)
        self.pending = []

    def _read(self, offset: int, nbytes: int) -> None:
        buf = getattr(self.local, "buf", None)
        if buf is None:
            buf = self.local.buf = memoryview(bytearray(self.size))
        t0 = time.perf_counter()
        n = os.preadv(self.model.fd, [buf[:nbytes]], offset)
        dt = time.perf_counter() - t0
        with self.lock:
            self.c.pread_s += dt
            self.c.bytes_read += n

    def on_route(self, layer, experts):
        t0 = time.perf_counter()
        for e in experts:
            for s in self.layout.slabs(layer, e):
                self.pending.append(self.pool.submit(self._read, s.offset, s.nbytes))
        self.c.other_s += time.perf_counter() - t0

    def drain(self):
        for f in self.pending:
            f.result()
        self.pending.clear()

    def close(self):
        self.drain()
        self.pool.shutdown(wait=True)


@register
class WriteInPlace(Mechanism):
    """pread straight into a shared, writable mapping of the weights. Runs on a scratch copy of
    the model (the runner loads the copy): every prefetched page comes back dirty and is written
    back to the copy, never to the model file.

    writeback "kernel" (the study's) leaves the dirty pages to the kernel's flusher threads, which
    on cgroup v1 write from the root cgroup, outside the run's throttle. "sync" starts their
    writeback itself after each layer (sync_file_range(SYNC_FILE_RANGE_WRITE)), so the writes are
    issued from the run's own cgroup and share its throttled disk with the reads, as on the
    study's box."""

    name = "write-in-place"

    def __init__(self, model, *, writeback: str, **options):
        super().__init__(model, **options)
        if writeback not in ("kernel", "sync"):
            raise ValueError(f"writeback: {writeback!r} is not kernel or sync")
        self.sync = writeback == "sync"
        self.rw_fd = os.open(model.path, os.O_RDWR)
        # Replace llama.cpp's shared read-only mapping (MAP_SHARED, PROT_READ) by a shared
        # writable one of the same file range at the same address: identical bytes, so the math
        # is unchanged.
        mmap_fixed(model.map_start, model.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, self.rw_fd,
                   model.map_offset, "write-in-place")

    def on_route(self, layer, experts):
        for e in experts:
            for s in self.layout.slabs(layer, e):
                t0 = time.perf_counter()
                n = _libc.pread(self.rw_fd, self.model.base + s.offset, s.nbytes, s.offset)
                if n < 0:
                    raise OSError(ctypes.get_errno(), f"write-in-place: pread returned {n}")
                self.c.pread_s += time.perf_counter() - t0
                self.c.bytes_read += n
        if self.sync:
            t0 = time.perf_counter()
            for e in experts:
                for s in self.layout.slabs(layer, e):
                    check(_libc.sync_file_range(self.rw_fd, s.offset, s.nbytes, SYNC_FILE_RANGE_WRITE),
                          "sync_file_range")
            self.c.other_s += time.perf_counter() - t0

    def close(self):
        os.close(self.rw_fd)
