"""The prefetch mechanisms by name, with what is known of each without running it: how its
weights reach memory, whether it prefetches, whether it writes into the mapping, whether its
weights stay in the page cache, which mechanism it may wrap.

A leaf: it imports nothing of the package, so the config's checks, the parameters' allowed
values, the analysis and the docs read it without loading the runtime (ctypes, libc, gguf).
harness.run.mechanisms implements each entry; its `register` gives a class its traits from here
and refuses a class this catalog does not name (tests/test_layering.py checks both ways).
"""

from __future__ import annotations

from dataclasses import dataclass

READ_PATHS = ("fault", "buffered read", "O_DIRECT")


@dataclass(frozen=True)
class MechanismInfo:
    name: str
    doc: str
    # how the weights reach memory: "fault" (the kernel reads on a page fault or on advice into
    # the page cache), "buffered read" (read(2)/pread(2) through the page cache) or "O_DIRECT"
    # (around it); the distance-to-the-limit table charges kernel CPU per byte by it
    read_path: str = "fault"
    prefetches: bool = True  # False only for the baseline
    # it writes into the weights' mapping, so it runs on a scratch copy of the model
    needs_scratch_copy: bool = False
    # True: the matmuls read the file's page cache through a shared mapping, so residency is the
    # file's (cachestat); False: the weights are remapped private and residency is the mapping's
    weights_in_page_cache: bool = True
    # the run parameter naming the mechanism it wraps ("" for none): its read path and writes
    # are that base's
    wraps: str = ""


MECHANISMS: tuple[MechanismInfo, ...] = (
    MechanismInfo("none", "plain mmap demand paging: the baseline every other row is compared "
                  "with", prefetches=False),
    MechanismInfo("madvise", "MADV_WILLNEED on each routed slab's mapped range"),
    MechanismInfo("populate", "MADV_POPULATE_READ: faults the pages in synchronously, no copy"),
    MechanismInfo("pread+madvise", "the study's surviving design: buffered pread of each routed "
                  "slab into a reused buffer, then MADV_WILLNEED", read_path="buffered read"),
    MechanismInfo("threadpool", "the same preads from background threads",
                  read_path="buffered read"),
    MechanismInfo("write-in-place", "pread straight into a shared, writable mapping of a scratch "
                  "copy", read_path="buffered read", needs_scratch_copy=True),
    MechanismInfo("lru-odirect", "the study's first design: O_DIRECT into a userspace LRU, copied "
                  "into private writable weights", read_path="O_DIRECT",
                  weights_in_page_cache=False),
    MechanismInfo("odirect-cache", "an expert cache in its own anonymous memory, filled by "
                  "O_DIRECT reads", read_path="O_DIRECT", weights_in_page_cache=False),
    MechanismInfo("lookahead", "predicts the next layer's experts from this layer's hidden state "
                  "and reads them ahead through a base mechanism", wraps="lookahead_base"),
)
BY_NAME = {m.name: m for m in MECHANISMS}
NAMES = tuple(BY_NAME)


def base_mechanisms() -> tuple[str, ...]:
    """The mechanisms a wrapper can wrap: those that wrap none."""
    return tuple(m.name for m in MECHANISMS if not m.wraps)


def _base(name: str, options: dict | None) -> str | None:
    info = BY_NAME.get(name)
    base = (options or {}).get(info.wraps) if info and info.wraps else None
    return base if base and base != name else None


def read_path(name: str, options: dict | None = None) -> str:
    """A mechanism's read path, through the base it wraps as `options` name it (a wrapper given
    no base reads as its own entry says)."""
    base = _base(name, options)
    if base is not None:
        return read_path(base)
    return BY_NAME[name].read_path if name in BY_NAME else "fault"


def writes_model(name: str, options: dict | None = None) -> bool:
    """Whether a mechanism with these options writes into the weights' mapping, directly or
    through the base it wraps: such a run is given a scratch copy of the model."""
    if name not in BY_NAME:
        return False
    base = _base(name, options)
    return BY_NAME[name].needs_scratch_copy or (base is not None and writes_model(base))
