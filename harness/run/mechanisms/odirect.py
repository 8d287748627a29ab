"""The O_DIRECT family: expert slabs read around the page cache into memory of the run's own,
a userspace LRU copied into private weights (the study's first design) and an expert cache
whose slabs are the weights themselves."""

from __future__ import annotations

import bisect
import collections
import ctypes
import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor

from harness.box.limits import anonymous_rss, own_memory_limit
from harness.run.mechanisms.base import Mechanism, Residency, max_slab, register
from harness.run.mechanisms.routing import predict_experts, read_ffn_norms, read_routers
from harness.libc import (MADV_DONTNEED, MAP_ANONYMOUS, MAP_PRIVATE, PAGE, PROT_READ, PROT_WRITE,
                          check, mmap_fixed)
from harness.libc import lib as _libc


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
        self.buf = mmap.mmap(-1, max_slab(self.layout) + 2 * PAGE)  # page-aligned for O_DIRECT
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
    computed; with `cache_policy: lfu` the slabs routed least often since the start go first
    (counts kept for slabs not cached too, as harness.analysis.policies replays it). With
    `cache_fill` the budget is what the run's memory limit leaves at the first decode, when
    llama.cpp's context exists: the limit less the non-expert tensors, the process's anonymous
    memory and `cache_fill_margin_mb`. The bytes at a tensor's ends that share a page with its neighbours stay
    file-backed and are served by the page cache. With `warm_start` the slabs the model's load
    left wholly in the page cache are copied into the cache (a buffered read that hits the page
    cache: no disk) before the remap would discard them; otherwise the cache starts empty.
    Prediction costs disk time for every predicted slab that is not then routed
    (benchmarks/results/odirect_cache_sweep-2026-12-04.txt)."""

    name = "odirect-cache"

    def __init__(self, model, *, cache_budget_mb: int, io_depth: int, predict_experts: int,
                 warm_start: bool, cache_policy: str, cache_fill: bool,
                 cache_fill_margin_mb: int, **options):
        super().__init__(model, **options)
        if cache_policy not in ("lru", "lfu"):
            raise ValueError(f"cache_policy: {cache_policy!r} is not lru or lfu")
        self.policy = cache_policy
        self.fill = bool(cache_fill)
        self.fill_margin = int(cache_fill_margin_mb) * 2**20
        self.budget = int(cache_budget_mb) * 1024 * 1024
        self.routed_count: collections.Counter = collections.Counter()  # lfu: every slab routed
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
        # with cache_fill the budget, and so the warm start, wait for the first decode
        self._resident = resident if self.fill else None
        self.bytes_warm_start = 0 if self.fill else self._warm(resident)
        if self.k > 0:
            self.observes = b"ffn_norm-"
            self.routers = read_routers(model)
            self.norms = read_ffn_norms(model)

    def begin_decode(self, first_token: int, n_tokens: int) -> None:
        if self._resident is not None:  # cache_fill: the first decode, the context exists
            filled = fill_budget(own_memory_limit(), self.layout.data["non_expert_bytes"],
                                 anonymous_rss(), self.fill_margin)
            if filled is not None:  # no memory limit: cache_budget_mb stands
                self.budget = filled
            self.bytes_warm_start = self._warm(self._resident)
            self._resident = None

    @property
    def cache_capacity_bytes(self) -> int:
        return self.budget

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
        """Evict slabs by the policy until nbytes fit the budget; False if they cannot."""
        t0 = time.perf_counter()
        if self.loaded_bytes + nbytes > self.budget:
            # loaded is in recency order (least recent first); lfu takes the least often routed
            # first, ties by recency (a stable sort keeps that order)
            order = list(self.loaded)
            if self.policy == "lfu":
                order.sort(key=self.routed_count.__getitem__)
            for key in order:
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
        self.routed_count.update(keys)
        self.pinned = set(keys)  # the previous layer's matmuls have run: its slabs may go
        missing = []
        for key in keys:
            if key in self.loaded:
                self.loaded.move_to_end(key)
                self.c.cache_hits += 1
                self.c.bytes_from_cache += key[1]
            else:
                missing.append(key)
        if missing:  # room for all of them at once (over budget only by this layer's own slabs)
            self._make_room(sum(key[1] for key in missing))
        for key in missing:  # issued together: io_depth of them in flight
            self._start(key)
            self.c.cache_misses += 1
            self.c.bytes_read += key[1]
        for key in keys:
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


def fill_budget(limit: int | None, non_expert_bytes: int, anonymous: int, margin: int) -> int | None:
    """The bytes a cache may fill under a memory limit: the limit less the non-expert tensors
    (resident every token, mlocked or not), the process's anonymous memory and a margin; None
    with no limit (nothing to fill: the run keeps its cache_budget_mb)."""
    if limit is None:
        return None
    return max(0, limit - non_expert_bytes - anonymous - margin)
