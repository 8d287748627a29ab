"""What every mechanism shares: the model as mapped in this process, residency checks, the
counters, the interface, and the registry that makes a mechanism by name (its traits from
harness.catalog, its options from harness.parameters)."""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

from harness import catalog, parameters
from harness.models.layout import Layout
from harness.libc import (PAGE, page_span, resident_pages)


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
        self.vec = (ctypes.c_ubyte * (max_slab(model.layout) // PAGE + 2))()

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
    the run parameters declared as read by it. A class the catalog does not name is refused,
    unless it states its own traits (`info`: a test's probe, which no config can name)."""
    info = catalog.BY_NAME.get(cls.name) or cls.__dict__.get("info")
    if info is None or info.name != cls.name:
        raise TypeError(f"mechanism {cls.name!r} ({cls.__name__}) is not in harness.catalog: "
                        "declare it there first")
    cls.info = info
    for trait in ("read_path", "prefetches", "needs_scratch_copy", "weights_in_page_cache"):
        setattr(cls, trait, getattr(info, trait))
    cls.options = parameters.options_of(cls.name)
    REGISTRY[cls.name] = cls
    return cls


def max_slab(layout: Layout) -> int:
    return max((per for rows in layout.by_layer.values() for _, per, _ in rows), default=PAGE)


def make(name: str, model: MappedModel, **options) -> Mechanism:
    """The mechanism `name` over `model`, its options not given taking their declared defaults
    (harness.parameters): no constructor has a default of its own."""
    if name not in REGISTRY:
        raise KeyError(f"unknown mechanism {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name](model, **{**parameters.option_defaults(name), **options})
