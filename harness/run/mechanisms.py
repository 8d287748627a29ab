"""Prefetch mechanisms: each acts on the routing decision of one layer, before its expert matmuls.

All share one interface: `on_route(layer, experts)` is called from the eval callback with the
unique expert ids the layer just routed to (the matmuls run right after it returns), and counters
say how long each kind of call took and how many bytes it prefetched. They never change the math:
every mechanism leaves the weights' values exactly as they are in the file.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from harness import catalog, parameters
from harness.models.layout import Layout
from harness.libc import (
    MADV_DONTNEED,
    MADV_POPULATE_READ,
    MADV_WILLNEED,
    MAP_ANONYMOUS,
    MAP_PRIVATE,
    MAP_SHARED,
    SYNC_FILE_RANGE_WRITE,
    PAGE,
    POSIX_FADV_WILLNEED,
    PROT_READ,
    PROT_WRITE,
    check,
    madvise,
    mmap_fixed,
    page_span,
    resident_pages,
)
from harness.libc import lib as _libc


@dataclass
class MappedModel:
    """Where the model file lies in this process: file offset x is at address base + x."""

    path: str
    fd: int  # O_RDONLY descriptor of the file llama.cpp mapped
    base: int
    map_start: int
    map_len: int
    map_offset: int
    layout: Layout


class Residency:
    """mincore() over ranges of the mapped model: which bytes are in the page cache right now."""

    def __init__(self, model: MappedModel):
        self.base = model.base
        self.vec = (ctypes.c_ubyte * (_max_slab(model.layout) // PAGE + 2))()

    def missing_bytes(self, offset: int, nbytes: int) -> int:
        """Bytes of [offset, offset + nbytes) of the file whose pages are not resident."""
        start, length = page_span(self.base + offset, nbytes)
        missing = length // PAGE - resident_pages(start, length, self.vec)
        return min(nbytes, missing * PAGE)


@dataclass
class Counters:
    pread_s: float = 0.0
    madvise_s: float = 0.0
    other_s: float = 0.0
    # what the mechanism's calls really returned: bytes read into memory by pread/preadv/O_DIRECT
    bytes_read: int = 0
    # bytes asked of the kernel without a byte count back (madvise WILLNEED / POPULATE_READ)
    bytes_advised: int = 0
    bytes_from_cache: int = 0  # served from a userspace cache (lru-odirect hits)
    cache_hits: int = 0
    cache_misses: int = 0

    @property
    def bytes_prefetched(self) -> int:
        return self.bytes_read + self.bytes_advised + self.bytes_from_cache


class Mechanism:
    name = "?"
    # its static traits (read_path, prefetches, needs_scratch_copy, weights_in_page_cache) are
    # the catalog's (harness.catalog), given by `register`; its options (the run-spec keys its
    # constructor takes) are the parameters declared as read by it (harness.parameters)
    info: catalog.MechanismInfo
    read_path: str
    prefetches: bool
    needs_scratch_copy: bool
    weights_in_page_cache: bool
    options: tuple[str, ...] = ()
    observes: bytes | None = None  # a graph-node name prefix whose output it wants (on_hidden)
    row_fields: tuple[str, ...] = ()  # columns of the per-layer rows it records (take_rows)

    def __init__(self, model: MappedModel, **options):
        self.model = model
        self.layout = model.layout
        self.c = Counters()
        self.lock = threading.Lock()

    def begin_decode(self, first_token: int, n_tokens: int) -> None:
        """Called before each llama_decode with the batch's first token index and size."""

    def on_route(self, layer: int, experts: list[int]) -> None:
        raise NotImplementedError

    def on_hidden(self, layer: int, rows) -> None:
        """The output of the node named `observes` + layer: float32 rows, one per token."""

    def take_rows(self) -> list[tuple]:
        """The per-layer rows recorded since the last call (see row_fields)."""
        return []

    def counters(self) -> dict:
        """A snapshot of the counters, with the derived bytes_prefetched."""
        with self.lock:
            return dict(self.c.__dict__, bytes_prefetched=self.c.bytes_prefetched)

    def drain(self) -> None:
        """Wait for any asynchronous work issued so far (called after each llama_decode)."""

    def close(self) -> None:
        pass


REGISTRY: dict[str, type[Mechanism]] = {}


def register(cls):
    """Registers an implementation of a catalog entry: its traits from the catalog, its options
    the run parameters declared as read by it."""
    info = catalog.BY_NAME.get(cls.name)
    if info is None:
        raise TypeError(f"mechanism {cls.name!r} ({cls.__name__}) is not in harness.catalog: "
                        "declare it there first")
    cls.info = info
    for trait in ("read_path", "prefetches", "needs_scratch_copy", "weights_in_page_cache"):
        setattr(cls, trait, getattr(info, trait))
    cls.options = parameters.options_of(cls.name)
    REGISTRY[cls.name] = cls
    return cls


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


def _max_slab(layout: Layout) -> int:
    return max((per for rows in layout.by_layer.values() for _, per, _ in rows), default=PAGE)


@register
class PreadMadvise(Mechanism):
    """The study's surviving design: buffered pread of each routed slab into one reused scratch
    buffer (warms the page cache), then MADV_WILLNEED on the mapped range."""

    name = "pread+madvise"

    def __init__(self, model, *, willneed_after_pread: bool, **options):
        super().__init__(model, **options)
        self.scratch = bytearray(_max_slab(self.layout))
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
        self.size = _max_slab(self.layout)
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


@register
class LruODirect(Mechanism):
    """The study's first design: O_DIRECT reads into a userspace LRU slab cache of a fixed budget,
    hits and misses copied into the mapped weights, which are remapped private and writable so
    the copies are copy-on-write anonymous pages (unreclaimable, and with no swap, RSS).

    The study's RSS trail (1091 -> 1469 -> 1619 -> 1733 MiB over four tokens at 1200 MB, alive
    for 32 tokens at 0-800 MB) fits a design whose copies do not outlive their cache entry: RSS
    grows with the cache (the cache's bytes plus their copies in the mapping), not with every
    expert ever routed. So a slab's copy is dropped (MADV_DONTNEED on the private mapping, which
    returns the range to the file's pages) when it leaves the cache, and a slab not cached at all
    (budget 0, or the prompt's layers routing more than the budget) once the next layer routes.

    The cache's bytes are the copies themselves: a cached slab's copy-on-write pages hold exactly
    what the cache would, so a hit needs neither a second buffer nor a copy. RSS is then the
    non-expert working set plus the budget (plus the pages at slab edges, never dropped because a
    neighbour shares them), which lets 800 MB live under the 1.7 GiB box as in the study; keeping
    a separate buffer as well doubled it and killed the 800 MB run."""

    name = "lru-odirect"

    def __init__(self, model, *, lru_budget_mb: int, **options):
        super().__init__(model, **options)
        self.budget = int(lru_budget_mb) * 1024 * 1024
        # (offset, nbytes) of the slabs whose copies are live, least recently used first
        self.cache: collections.OrderedDict[tuple[int, int], None] = collections.OrderedDict()
        self.cached_bytes = 0
        self.uncached_copies: list[tuple[int, int]] = []
        self.dfd = os.open(model.path, os.O_RDONLY | os.O_DIRECT)
        # llama.cpp maps the file shared and read-only; remap the same range private and writable
        # at the same address (identical bytes) so the copies below are copy-on-write, as in the study
        mmap_fixed(model.map_start, model.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE, model.fd,
                   model.map_offset, "lru-odirect")
        self.buf = mmap.mmap(-1, _max_slab(self.layout) + 2 * PAGE)  # page-aligned for O_DIRECT
        self._buf_view = (ctypes.c_char * len(self.buf)).from_buffer(self.buf)
        self.buf_addr = ctypes.addressof(self._buf_view)

    def _read_and_copy(self, offset: int, nbytes: int) -> None:
        """O_DIRECT read of one slab into the bounce buffer, then copied into the mapping."""
        astart = offset & ~(PAGE - 1)
        aend = (offset + nbytes + PAGE - 1) & ~(PAGE - 1)
        view = memoryview(self.buf)[: aend - astart]
        t0 = time.perf_counter()
        got = os.preadv(self.dfd, [view], astart)
        if got < offset - astart + nbytes:
            raise OSError(f"lru-odirect: short O_DIRECT read at {astart}")
        self.c.bytes_read += nbytes
        t1 = time.perf_counter()
        self.c.pread_s += t1 - t0
        ctypes.memmove(self.model.base + offset, self.buf_addr + offset - astart, nbytes)  # copy-on-write
        self.c.other_s += time.perf_counter() - t1

    def _drop_copy(self, offset: int, nbytes: int) -> None:
        """Discard the copy-on-write pages of a range: later reads see the file's pages again.
        Only whole pages inside the slab, so a neighbouring slab's copy is never touched."""
        start = (self.model.base + offset + PAGE - 1) & ~(PAGE - 1)
        end = (self.model.base + offset + nbytes) & ~(PAGE - 1)
        if end > start:
            check(_libc.madvise(start, end - start, MADV_DONTNEED), "madvise(DONTNEED)")

    def on_route(self, layer, experts):
        t0 = time.perf_counter()
        for key in self.uncached_copies:  # the previous layer's matmuls have run
            self._drop_copy(*key)
        self.uncached_copies.clear()
        self.c.other_s += time.perf_counter() - t0
        for e in experts:
            for s in self.layout.slabs(layer, e):
                key = (s.offset, s.nbytes)
                if key in self.cache:  # its copy is in the mapping already
                    self.cache.move_to_end(key)
                    self.c.cache_hits += 1
                    self.c.bytes_from_cache += s.nbytes
                    continue
                self._read_and_copy(s.offset, s.nbytes)
                self.c.cache_misses += 1
                if self.budget and s.nbytes <= self.budget:
                    self.cache[key] = None
                    self.cached_bytes += s.nbytes
                    t0 = time.perf_counter()
                    while self.cached_bytes > self.budget:
                        old_key, _ = self.cache.popitem(last=False)
                        self.cached_bytes -= old_key[1]
                        self._drop_copy(*old_key)
                    self.c.other_s += time.perf_counter() - t0
                else:
                    self.uncached_copies.append(key)

    def close(self):
        os.close(self.dfd)
        del self._buf_view  # an exported buffer cannot be closed
        self.buf.close()


@register
class ODirectCache(Mechanism):
    """An expert cache in its own anonymous memory, filled by O_DIRECT reads, ahead of need.

    Designed from the attribution: under a CPU quota a token's time is mostly the kernel's
    page-cache work (copies, faults, reclaim) charged to the quota; on a slow disk it is waiting
    for reads issued one slab at a time. So: the page-aligned inside of every expert tensor is
    remapped anonymous (MAP_FIXED over llama.cpp's mapping, zero until read), and a slab is read
    with O_DIRECT straight into its place in that memory: no page-cache copy, no copy-on-write,
    no second read on a fault. Reads run on `io_depth` threads, so several slabs are in flight at
    once. With `predict_experts` > 0 the next layer's router is applied to this layer's
    `ffn_norm` output (as lookahead does) and the predicted slabs are read in the background
    while this layer computes; when a layer's routing arrives, each routed slab is waited for if
    in flight, read if missing, and the layer's slabs are held until the next layer routes. The
    cache keeps at most `cache_budget_mb` of slabs (least recently used out: MADV_DONTNEED gives
    the pages back and they read as zeros until read again), beyond the slabs of the layer being
    computed. The bytes at a tensor's ends that share a page with its neighbours stay
    file-backed and are served by the page cache. With `warm_start` the slabs the model's load
    left wholly in the page cache are copied into the cache (a buffered read that hits the page
    cache: no disk) before the remap would discard them; otherwise the cache starts empty.
    Prediction costs disk time for every predicted slab that is not then routed
    (benchmarks/results/odirect_cache_sweep-2026-12-04.txt)."""

    name = "odirect-cache"

    def __init__(self, model, *, cache_budget_mb: int, io_depth: int, predict_experts: int,
                 warm_start: bool, **options):
        super().__init__(model, **options)
        self.budget = int(cache_budget_mb) * 1024 * 1024
        self.k = int(predict_experts)
        self.dfd = os.open(model.path, os.O_RDONLY | os.O_DIRECT)
        # before the remap below discards them: the slabs wholly in the page cache, as keys
        resident = self._resident_slabs() if warm_start else []
        # the anonymous inside of each expert tensor: [start, end) file offsets, page-aligned
        self.regions: list[tuple[int, int]] = []
        for t in model.layout.data["tensors"]:
            if not t["expert"]:
                continue
            start = -(-(model.base + t["offset"]) // PAGE) * PAGE - model.base
            end = ((model.base + t["offset"] + t["bytes"]) // PAGE) * PAGE - model.base
            if end > start:
                mmap_fixed(model.base + start, end - start, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, "odirect-cache")
                self.regions.append((start, end))
        self.regions.sort()
        self.region_starts = [start for start, _ in self.regions]
        self.pool = ThreadPoolExecutor(max_workers=max(1, int(io_depth)),
                                       thread_name_prefix="odirect")
        self.loaded: collections.OrderedDict[tuple[int, int], None] = collections.OrderedDict()
        self.loaded_bytes = 0
        self.inflight: dict[tuple[int, int], object] = {}  # slab -> Future of its read
        self.pinned: set[tuple[int, int]] = set()  # the slabs of the layer being computed
        self.bytes_read_ahead = 0
        self.bytes_warm_start = self._warm(resident)
        if self.k > 0:
            self.observes = b"ffn_norm-"
            self.routers = read_routers(model)
            self.norms = read_ffn_norms(model)

    def _resident_slabs(self) -> list[tuple[int, int]]:
        """Every expert slab whose pages are all in the page cache now, in file order."""
        res, lay = Residency(self.model), self.layout
        return sorted((s.offset, s.nbytes) for layer in lay.by_layer for e in range(lay.n_expert)
                      for s in lay.slabs(layer, e) if res.missing_bytes(s.offset, s.nbytes) == 0)

    def _warm(self, resident: list[tuple[int, int]]) -> int:
        """Copy resident slabs into their anonymous pages, up to the budget, with buffered reads
        that the page cache serves; they enter the cache as loaded. Returns the slab bytes copied."""
        copied = 0
        for key in resident:
            span = self._region(*key)
            if span is None or self.loaded_bytes + key[1] > self.budget:
                continue
            lo, hi = span
            view = (ctypes.c_char * (hi - lo)).from_address(self.model.base + lo)
            if os.preadv(self.model.fd, [memoryview(view).cast("B")], lo) != hi - lo:
                raise OSError(f"odirect-cache: short read at {lo} while warming the cache")
            self.loaded[key] = None
            self.loaded_bytes += key[1]
            copied += key[1]  # slab bytes, as the budget counts them
        return copied

    def _region(self, offset: int, nbytes: int) -> tuple[int, int] | None:
        """The page-aligned part of a slab's pages inside its tensor's anonymous region (the
        regions are sorted and disjoint: the last one starting before the slab's end)."""
        astart = (offset // PAGE) * PAGE
        aend = -(-(offset + nbytes) // PAGE) * PAGE
        i = bisect.bisect_left(self.region_starts, aend) - 1
        if i < 0:
            return None
        start, end = self.regions[i]
        lo, hi = max(astart, start), min(aend, end)
        return (lo, hi) if hi > lo else None

    def _read(self, key: tuple[int, int]) -> None:
        """O_DIRECT read of a slab's pages straight into their place in the anonymous region."""
        span = self._region(*key)
        if span is None:
            return
        lo, hi = span
        view = (ctypes.c_char * (hi - lo)).from_address(self.model.base + lo)
        t0 = time.perf_counter()
        got = os.preadv(self.dfd, [memoryview(view).cast("B")], lo)
        if got != hi - lo:
            raise OSError(f"odirect-cache: short O_DIRECT read at {lo}: {got} of {hi - lo} bytes")
        with self.lock:
            self.c.pread_s += time.perf_counter() - t0

    def _drop(self, key: tuple[int, int]) -> None:
        """Give back the pages wholly inside the slab (a neighbour's shared page is kept)."""
        offset, nbytes = key
        start = -(-(self.model.base + offset) // PAGE) * PAGE
        end = ((self.model.base + offset + nbytes) // PAGE) * PAGE
        if end > start and self._region(offset, nbytes) is not None:
            check(_libc.madvise(start, end - start, MADV_DONTNEED), "madvise(DONTNEED)")
        self.loaded_bytes -= nbytes

    def _make_room(self, nbytes: int) -> bool:
        """Evict least recently used slabs until nbytes fit the budget; False if they cannot."""
        t0 = time.perf_counter()
        for key in list(self.loaded):
            if self.loaded_bytes + nbytes <= self.budget:
                break
            if key in self.pinned or key in self.inflight:
                continue
            del self.loaded[key]
            self._drop(key)
        self.c.other_s += time.perf_counter() - t0
        return self.loaded_bytes + nbytes <= self.budget

    def _start(self, key: tuple[int, int]) -> None:
        self.loaded[key] = None
        self.loaded_bytes += key[1]
        self.inflight[key] = self.pool.submit(self._read, key)

    def _wait(self, key: tuple[int, int]) -> None:
        fut = self.inflight.pop(key, None)
        if fut is not None:
            t0 = time.perf_counter()
            fut.result()  # a failed read raises here, before its layer computes
            self.c.other_s += time.perf_counter() - t0

    def on_route(self, layer, experts):
        keys = [(s.offset, s.nbytes) for e in experts for s in self.layout.slabs(layer, e)]
        self.pinned = set(keys)  # the previous layer's matmuls have run: its slabs may go
        missing = []
        for key in keys:
            if key in self.loaded:
                self.loaded.move_to_end(key)
                self.c.cache_hits += 1
                self.c.bytes_from_cache += key[1]
            else:
                self._make_room(key[1])  # over budget only by this layer's own slabs
                self._start(key)
                missing.append(key)
                self.c.cache_misses += 1
                self.c.bytes_read += key[1]
        for key in keys:  # the misses were issued together: io_depth of them in flight
            self._wait(key)

    def on_hidden(self, layer, rows):
        target = layer + 1
        w = self.routers.get(target)
        if w is None:
            return
        t0 = time.perf_counter()
        predicted = predict_experts(rows, "ffn_norm", self.norms.get(layer), self.norms.get(target),
                                    w, self.k)
        self.c.other_s += time.perf_counter() - t0
        for e in sorted(predicted):
            for s in self.layout.slabs(target, e):
                key = (s.offset, s.nbytes)
                if key in self.loaded or not self._make_room(key[1]):
                    continue
                self._start(key)
                self.bytes_read_ahead += key[1]

    def drain(self):
        for key in list(self.inflight):
            self._wait(key)

    def close(self):
        self.drain()
        self.pool.shutdown(wait=True)
        os.close(self.dfd)


READ_AHEAD_CALLS = ("madvise", "fadvise", "readahead")


@register
class Lookahead(Mechanism):
    """Predict the next layer's experts and start reading them before they are routed.

    When layer L's router input is known (the output of `ffn_norm-L`, or the residual stream
    `l_out-L`), apply layer L+d's router weights (`ffn_gate_inp`, read from the file) to it for
    d = 1..lookahead_layers, take the top lookahead_experts, and issue asynchronous read-ahead for
    their slabs (MADV_WILLNEED, POSIX_FADV_WILLNEED or readahead(2): each starts the reads and
    returns). The reads then run while layer L's experts and L+1's attention compute. When L+1's
    real routing arrives, the base mechanism makes its routed slabs resident as it always does,
    completing what the prediction missed. Every layer's prediction is recorded against the real
    routing: hits, precision, recall, bytes read ahead that were never routed, and how many of the
    predicted slabs' bytes were resident when their layer ran."""

    name = "lookahead"
    row_fields = ("token", "layer", "source_layer", "predicted", "routed", "n_predicted", "n_routed",
                  "hits", "precision", "recall", "wasted_bytes", "predicted_resident_bytes",
                  "predicted_bytes")

    def __init__(self, model, *, lookahead_base: str, lookahead_experts: int,
                 lookahead_layers: int, lookahead_call: str, lookahead_source: str, **options):
        super().__init__(model, **options)
        if lookahead_base not in catalog.base_mechanisms():
            raise ValueError(f"lookahead_base: {lookahead_base!r} is not a base mechanism")
        if lookahead_call not in READ_AHEAD_CALLS:
            raise ValueError(f"lookahead_call: {lookahead_call!r} is not one of {READ_AHEAD_CALLS}")
        if lookahead_source not in ("ffn_norm", "l_out"):
            raise ValueError(f"lookahead_source: {lookahead_source!r} is not ffn_norm or l_out")
        self.base = make(lookahead_base, model)
        self.c = self.base.c  # the base's reads are this mechanism's accounted prefetch
        self.lock = self.base.lock
        self.k = int(lookahead_experts)
        self.depth = int(lookahead_layers)
        self.call = lookahead_call
        self.observes = f"{lookahead_source}-".encode()
        self.source = lookahead_source
        self.routers = read_routers(model)
        self.norms = read_ffn_norms(model)
        self.residency = Residency(model)
        self.token = 0
        self.predicted: dict[int, tuple[int, set[int]]] = {}  # layer -> (source layer, experts)
        self.rows: list[tuple] = []
        self.bytes_read_ahead = 0

    def begin_decode(self, first_token, n_tokens):
        self.token = first_token if n_tokens == 1 else -1  # -1: the prompt batch
        self.predicted.clear()
        self.base.begin_decode(first_token, n_tokens)

    def _advise(self, offset: int, nbytes: int) -> None:
        if self.call == "madvise":
            madvise(self.model.base + offset, nbytes, MADV_WILLNEED)
        elif self.call == "fadvise":
            os.posix_fadvise(self.model.fd, offset, nbytes, POSIX_FADV_WILLNEED)
        elif _libc.readahead(self.model.fd, offset, nbytes) < 0:
            raise OSError(ctypes.get_errno(), "readahead(2) failed")

    def on_hidden(self, layer, rows):
        t0 = time.perf_counter()
        for target in range(layer + 1, layer + 1 + self.depth):
            w = self.routers.get(target)
            if w is None:
                continue
            experts = predict_experts(rows, self.source, self.norms.get(layer),
                                      self.norms.get(target), w, self.k)
            # a nearer layer refines a prediction made further back: read ahead what it adds
            _, before = self.predicted.get(target, (layer, set()))
            self.predicted[target] = (layer, before | experts)
            for e in sorted(experts - before):
                for sl in self.layout.slabs(target, e):
                    self._advise(sl.offset, sl.nbytes)
                    self.bytes_read_ahead += sl.nbytes
        self.c.other_s += time.perf_counter() - t0

    def on_route(self, layer, experts):
        pred = self.predicted.get(layer)
        if pred is not None:
            source, predicted = pred
            routed = set(experts)
            hits = len(predicted & routed)
            slab = self.layout.slab_bytes(layer)  # one expert's gate+up+down bytes
            resident = sum(sl.nbytes - self.residency.missing_bytes(sl.offset, sl.nbytes)
                           for e in sorted(predicted) for sl in self.layout.slabs(layer, e))
            self.rows.append((self.token, layer, source, " ".join(map(str, sorted(predicted))),
                              " ".join(map(str, sorted(routed))), len(predicted), len(routed), hits,
                              hits / len(predicted) if predicted else float("nan"),
                              hits / len(routed) if routed else float("nan"),
                              len(predicted - routed) * slab, resident, len(predicted) * slab))
        self.base.on_route(layer, experts)

    def take_rows(self):
        rows, self.rows = self.rows, []
        return rows

    def drain(self):
        self.base.drain()

    def close(self):
        self.base.close()


def read_routers(model: MappedModel) -> dict:
    """Each MoE layer's router (ffn_gate_inp), read from the file: (n_expert, n_embd) float32."""
    import numpy as np

    routers = {}
    for t in model.layout.data["tensors"]:
        if not t["name"].endswith("ffn_gate_inp.weight"):
            continue
        layer = int(t["name"].split(".")[1])
        dtype = {"F32": np.float32, "F16": np.float16}.get(t["type"])
        if dtype is None:
            raise ValueError(f"{t['name']}: prediction reads F32 or F16 routers, not {t['type']}")
        raw = os.pread(model.fd, t["bytes"], t["offset"])
        n_embd, n_expert = t["shape"]
        routers[layer] = np.frombuffer(raw, dtype=dtype).reshape(n_expert, n_embd).astype(np.float32)
    if not routers:
        raise ValueError("the model has no ffn_gate_inp router tensors to predict with")
    return routers


def read_ffn_norms(model: MappedModel) -> dict:
    """Each layer's ffn_norm weight (gamma): what its router's input is scaled by."""
    import numpy as np

    norms = {}
    for t in model.layout.data["tensors"]:
        if t["name"].endswith(".ffn_norm.weight") and t["type"] == "F32":
            raw = os.pread(model.fd, t["bytes"], t["offset"])
            norms[int(t["name"].split(".")[1])] = np.frombuffer(raw, dtype=np.float32).copy()
    return norms


RMS_EPS = 1e-6  # the residual's RMS is far above it: its exact value does not move a top-k


def predict_experts(rows, source: str, gamma_source, gamma_target, router, k: int) -> set[int]:
    """The experts the target layer's router would pick for these hidden states (one row per
    token): the residual stream normalised as the target layer's ffn_norm would (RMS, then its
    own weight), then the top k of its router's logits. `ffn_norm` rows were already normalised
    and scaled by the source layer's weight, which is divided out; `l_out` rows are the raw
    residual. (The residual the target will really see adds its attention's output: that is what
    a prediction one layer ahead cannot know.)"""
    import numpy as np

    x = np.asarray(rows, dtype=np.float32)
    if source == "ffn_norm":
        if gamma_source is not None:
            g = np.where(gamma_source == 0, 1.0, gamma_source)
            x = x / g
    else:
        x = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + RMS_EPS)
    if gamma_target is not None:
        x = x * gamma_target
    logits = x @ router.T  # (tokens, n_expert)
    k = min(k, router.shape[0])
    top = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    return {int(e) for e in top.ravel()}


def make(name: str, model: MappedModel, **options) -> Mechanism:
    """The mechanism `name` over `model`, its options not given taking their declared defaults
    (harness.parameters): no constructor has a default of its own."""
    if name not in REGISTRY:
        raise KeyError(f"unknown mechanism {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name](model, **{**parameters.option_defaults(name), **options})
