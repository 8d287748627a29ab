"""The measured process: loads the model through llama-cpp-python's low-level API against the
patched build, hooks the routing decision of every layer, and decodes greedily.

It runs inside the run's cgroup and streams its per-token and per-activation rows to append-only
`.part` files, flushed after every token, so that if the kernel kills it the supervisor still has
every token it finished. The supervisor (harness.run.supervise) turns those into the final records.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

from harness.build import bindings as hlib
from harness.box import counters
from harness import libc, record
from harness.box import pagecache
from harness.run import mechanisms as mech
from harness.run.hook import NativeRouting, RoutingHook, WorkerError
from harness.contract import GATE_WAIT_S, LOADED, THROTTLED, WorkerParams
from harness.models.layout import Layout
from harness.box.conditions import HeldFile, read_value
from harness.box.limits import read_io_bytes

# tokens.csv's columns, declared with their units in harness.record
TOKEN_FIELDS = record.TOKEN_FIELDS
EXPERT_FIELDS = ["token", "layer", "rank", "expert"]


log = logging.getLogger("harness.run.worker")


def find_mapping(path: str) -> tuple[int, int, int]:
    """(start, length, file offset) of the mapping of `path` that starts lowest in the file."""
    st = os.stat(path)
    best = None
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 6:
                continue
            dev_ino = int(parts[4])
            if dev_ino != st.st_ino or os.path.realpath(parts[5].strip()) != os.path.realpath(path):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            off = int(parts[2], 16)
            # adjacent vmas of one mapping (split by mprotect/mlock) merge into one range
            if best and best[0] + best[1] == lo and best[2] + best[1] == off:
                best = (best[0], best[1] + hi - lo, best[2])
            elif best is None or off < best[2]:
                best = (lo, hi - lo, off)
    if best is None:
        raise WorkerError(f"{path} is not mapped: was the model loaded with mmap?")
    return best


def read_proc_io(held: HeldFile | None = None) -> dict:
    """This process's /proc/self/io: read_bytes (block reads it caused) and write_bytes (page-cache
    pages it dirtied, written back later by whoever flushes them). `held`: the file held open for
    per-token reads."""
    out = {"read_bytes": 0, "write_bytes": 0}
    text = held.read() if held is not None else read_value(Path("/proc/self/io"))
    for line in (text or "").splitlines():
        k, _, v = line.partition(":")
        if k in out:
            out[k] = int(v)
    return out


def model_moment(model_path: str, io_stat: str | None) -> dict:
    """Residency of the model file and the cgroup's read bytes at one moment of the run."""
    io = read_io_bytes(io_stat)
    return {"residency": pagecache.residency(model_path), "cgroup_read_bytes": io["read"],
            "t_unix": time.time()}


def rss_bytes(held: HeldFile | None = None) -> int:
    text = held.read() if held is not None else read_value(Path("/proc/self/statm"))
    return int(text.split()[1]) * libc.PAGE


class ProcessCounters:
    """The process's and its cgroup's counters the worker reads around every decode, held open
    (conditions.HeldFile): /proc/self/io, the cgroup's io bytes, /proc/self/statm."""

    def __init__(self, cgroup_io_stat: str | None):
        self.proc_io = HeldFile("/proc/self/io")
        self.io_stat = HeldFile(cgroup_io_stat) if cgroup_io_stat else None
        self.statm = HeldFile("/proc/self/statm")

    def io(self) -> tuple[dict, dict]:
        """(/proc/self/io's bytes, the cgroup's read and write bytes)"""
        return read_proc_io(self.proc_io), read_io_bytes(self.io_stat)

    def rss(self) -> int:
        return rss_bytes(self.statm)


_TOKEN_KEYS = frozenset(TOKEN_FIELDS)


def token_line(row: dict) -> str:
    """A token's row as tokens.csv's line: exactly the declared columns (harness.record), a key
    missing or undeclared is an error, not a column silently lost."""
    if row.keys() != _TOKEN_KEYS:
        raise WorkerError(f"token row: undeclared {sorted(row.keys() - _TOKEN_KEYS)}, missing "
                          f"{sorted(_TOKEN_KEYS - row.keys())} (declare columns in harness.record)")
    return ",".join(str(row[f]) for f in TOKEN_FIELDS) + "\n"


def evict_experts(mapped: mech.MappedModel, fd: int) -> None:
    """Page every expert tensor out of memory: reclaim this mapping's pages (MADV_PAGEOUT), then
    drop the now unmapped page cache (FADV_DONTNEED)."""
    for x in mapped.layout.data["expert_tensors"]:
        nbytes = x["bytes_per_expert"] * x["n_expert"]
        libc.madvise(mapped.base + x["base_offset"], nbytes, libc.MADV_PAGEOUT)
        os.posix_fadvise(fd, x["base_offset"], nbytes, os.POSIX_FADV_DONTNEED)


def load_mmap_model(llama, model_path: str):
    """Load on the CPU with the file mmap'd and weights left in the mapping."""
    llama.llama_backend_init()
    mp = llama.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.load_mode = 1  # LLAMA_LOAD_MODE_MMAP: experts must be read from the file's mapping
    mp.lazy_mode = 0
    # otherwise the CPU backend may repack weights into anonymous memory and the experts are no
    # longer read from the file at all
    mp.use_extra_bufts = False
    model = llama.llama_model_load_from_file(model_path.encode(), mp)
    if not model:
        raise WorkerError(f"llama.cpp could not load {model_path}")
    return model


class Worker:
    """One measured configuration, in the steps a reader can name: load and verify the model,
    prepare the mechanism, make the context, decode one token into a row, summarize."""

    def __init__(self, p: WorkerParams):
        self.p = p
        self.out = Path(p.out_dir)
        self.layout = Layout.load(p.layout)
        self.b = hlib.load(p.lib_dir)
        self.llama = self.b.llama_cpp
        self.model = self.ctx = self.fd = None
        self.files: list = []
        self.moments: dict = {}
        self.generated: list[int] = []
        self.later: list[int] = []  # tokens past the measured window
        self.routed_total = self.prefetched_total = self.mismatches = 0
        self.clock = counters.TokenClock(counters.CounterFiles(**p.counters))
        self.counters = ProcessCounters(p.cgroup_io_stat)
        self.last_decode_end: float | None = None  # perf_counter at the end of the last decode

    # --- steps ------------------------------------------------------------------------------

    def load_and_verify(self) -> None:
        """Load mmap'd and refuse to run unless every expert tensor's data lies in the file's
        mapping at the layout file's offset (else the experts would not be read from the file)."""
        p, b = self.p, self.b
        self.moments["before_load"] = model_moment(p.model_path, p.cgroup_io_stat)
        t0 = time.time()
        self.model = load_mmap_model(self.llama, p.model_path)
        self.load_s = time.time() - t0
        self.moments["after_load"] = model_moment(p.model_path, p.cgroup_io_stat)
        self.mapping = start, length, moff = find_mapping(p.model_path)
        self.base = base = start - moff
        for x in self.layout.data["expert_tensors"]:
            t = b.llama_model_get_tensor(self.model, x["name"].encode())
            if not t:
                raise WorkerError(f"{x['name']}: not in the loaded model")
            data = t.contents.data
            if data != base + x["base_offset"]:
                raise WorkerError(f"{x['name']}: data at {data:#x}, expected the file mapping at "
                                  f"{base + x['base_offset']:#x} (offset {x['base_offset']}); weights "
                                  "were copied out of the mmap (repacked?) and the experts would not "
                                  "be read from the file")
            if b.ggml_nbytes(t) != x["bytes_per_expert"] * x["n_expert"]:
                raise WorkerError(f"{x['name']}: {b.ggml_nbytes(t)} bytes loaded, layout says otherwise")

    def prepare_mechanism(self) -> None:
        p = self.p
        self.fd = os.open(p.model_path, os.O_RDONLY)
        start, length, moff = self.mapping
        mapped = mech.MappedModel(p.model_path, self.fd, self.base, start, length, moff, self.layout)
        # evicted before the mechanism starts: one that copies what is resident (odirect-cache's
        # warm start) must find the run cold too
        if p.evict_after_load:
            evict_experts(mapped, self.fd)
        # the mechanism before the mlocks: some remap the weights, which would drop them
        self.mechanism = mech.make(p.mechanism, mapped, **p.mechanism_options)
        self.locked_bytes = self.locked_count = 0
        if p.mlock_non_expert:
            for t in self.layout.non_expert_tensors:
                libc.mlock(self.base + t["offset"], t["bytes"])
                self.locked_bytes += t["bytes"]
                self.locked_count += 1

    def _open(self, name: str, header, buffering: int):
        f = open(self.out / name, "w", buffering=buffering)
        self.files.append(f)
        f.write(",".join(header) + "\n")
        return f

    def make_context(self) -> None:
        p, llama = self.p, self.llama
        self.vocab = llama.llama_model_get_vocab(self.model)
        prompt = p.prompt.encode()
        buf = (llama.llama_token * (len(prompt) + 16))()
        n_prompt = llama.llama_tokenize(self.vocab, prompt, len(prompt), buf, len(buf), True, False)
        if n_prompt <= 0:
            raise WorkerError(f"tokenizing the prompt failed ({n_prompt})")
        self.prompt_tokens = list(buf[:n_prompt])
        cp = llama.llama_context_default_params()
        cp.n_ctx = n_prompt + p.tokens + p.later_tokens + 8
        cp.n_batch = cp.n_ubatch = max(n_prompt, 32)
        cp.n_threads = cp.n_threads_batch = p.threads
        self.experts_part = self._open("experts.csv.part", EXPERT_FIELDS, 1 << 16)
        self.hook = RoutingHook(self.mechanism, p.log_experts, self.experts_part)
        self._install_hook(cp)
        self.ctx = llama.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise WorkerError("llama_init_from_model failed")
        self.n_vocab = llama.llama_vocab_n_tokens(self.vocab)
        self.tokens_part = self._open("tokens.csv.part", TOKEN_FIELDS, 1)
        self.mech_part = (self._open("mechanism.csv.part", self.mechanism.row_fields, 1 << 16)
                          if self.mechanism.row_fields else None)
        if p.throttle_gate:
            self.wait_for_throttle()
        # what the first decode sees: llama.cpp's load maps the file with MAP_POPULATE and
        # POSIX_MADV_WILLNEED, so part of the model is cached before any token
        self.moments["before_first_decode"] = model_moment(p.model_path, p.cgroup_io_stat)

    def wait_for_throttle(self) -> None:
        """Tell the supervisor the load is done and wait until it has applied the disk throttle
        (contract.WorkerParams.throttle_gate)."""
        (self.out / LOADED).write_text(str(self.load_s))
        deadline = time.monotonic() + GATE_WAIT_S
        while not (self.out / THROTTLED).exists():
            if time.monotonic() > deadline:
                raise WorkerError(f"the supervisor did not apply the disk throttle within "
                                  f"{GATE_WAIT_S:.0f} s of the load")
            time.sleep(0.002)

    def _install_hook(self, cp) -> None:
        """Point the context's eval callback at the hook, as WorkerParams.hook says."""
        llama, mode = self.llama, self.p.hook
        if mode == "off":
            cp.cb_eval = llama.ggml_backend_sched_eval_callback()  # NULL: no graph splits
            self.native = None
            return
        self.cb = llama.ggml_backend_sched_eval_callback(self.hook)  # kept alive as long as ctx
        if mode == "python" or not self.p.hook_lib:
            cp.cb_eval, cp.cb_eval_user_data, self.native = self.cb, None, None
            return
        # ids of one decode: every token of the largest batch, every layer, every rank
        n_rows_max = cp.n_batch * max(1, self.layout.n_layer) * max(1, self.layout.n_expert_used)
        self.native = NativeRouting(self.hook, self.p.hook_lib, self.cb, n_rows_max)
        cp.cb_eval = llama.ggml_backend_sched_eval_callback(self.native.eval_fn)
        cp.cb_eval_user_data = self.native.user_data

    def decode_one(self, index: int, batch_tokens: list[int], pos: int) -> dict:
        """One llama_decode of `batch_tokens` at position `pos`: the token's row, by field name."""
        llama, hook, m = self.llama, self.hook, self.mechanism
        n = len(batch_tokens)
        arr = (llama.llama_token * n)(*batch_tokens)
        # with hook_ab every other generated token runs with the hook switched off, in the same
        # process and context: the in-process A/B of what the hook costs a token
        hook_on = self.p.hook != "off" and not (self.p.hook_ab and index >= 0 and index % 2)
        # residency is measured on the prompt and the warm-up tokens only: its syscalls are
        # instrumentation, kept out of the window the run's figure is measured over
        measure = index < self.p.warmup_tokens
        hook.token, hook.batch_n, hook.enabled, hook.measure = pos, n, hook_on, measure
        hook.routed = []
        hook.missing = hook.missing_after = 0
        hook.hook_s = hook.mechanism_s = 0.0
        if self.native:
            self.native.begin(pos, n, hook_on, measure)
        m.begin_decode(pos, n)
        c0, ru0 = m.counters(), resource.getrusage(resource.RUSAGE_SELF)
        io0, cg0 = self.counters.io()
        # the thread's counters are read right next to the decode's clock (TokenClock.read)
        snap0 = self.clock.read()
        t0 = time.perf_counter()
        harness_s = t0 - self.last_decode_end if self.last_decode_end is not None else 0.0
        rc = llama.llama_decode(self.ctx, llama.llama_batch_get_one(arr, n))
        m.drain()
        t1 = self.last_decode_end = time.perf_counter()
        snap1 = self.clock.read(before=False)
        wall = t1 - t0
        ru1, c1 = resource.getrusage(resource.RUSAGE_SELF), m.counters()
        io1, cg1 = self.counters.io()
        if hook.error is not None:
            raise WorkerError(f"routing hook failed: {hook.error!r}") from hook.error
        if self.native:
            self.native.collect()
        if rc != 0:
            raise WorkerError(f"llama_decode returned {rc} at token {index}")
        lay = self.layout
        if hook_on and len(hook.routed) != lay.n_layer and lay.n_layer and lay.n_expert:
            raise WorkerError(f"token {index}: the hook saw {len(hook.routed)} routing decisions, "
                              f"the model has {lay.n_layer} MoE layers")
        logits = np.ctypeslib.as_array(llama.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,))
        if not np.isfinite(logits).all():
            raise WorkerError(f"non-finite logits at token {index}")
        routed = sum(len(ex) * lay.slab_bytes(layer) for layer, ex in hook.routed)
        prefetched = c1["bytes_prefetched"] - c0["bytes_prefetched"]
        self.routed_total += routed
        self.prefetched_total += prefetched
        self.mismatches += int(m.prefetches and prefetched != routed)

        def since(a, b, key):
            return (b[key] - a[key]) if a[key] >= 0 else -1

        return {
            "index": index, "n_tokens": n,
            # past the measured window (the first repeat's later_tokens): outside every figure
            "phase": "prompt" if index < 0 else "gen" if index < self.p.tokens else "later",
            "token_id": int(logits.argmax()),  # greedy
            "wall_s": f"{wall:.6f}", "majflt": ru1.ru_majflt - ru0.ru_majflt,
            "minflt": ru1.ru_minflt - ru0.ru_minflt,
            "pread_s": f"{c1['pread_s'] - c0['pread_s']:.6f}",
            "madvise_s": f"{c1['madvise_s'] - c0['madvise_s']:.6f}",
            "other_prefetch_s": f"{c1['other_s'] - c0['other_s']:.6f}",
            "bytes_prefetched": prefetched, "bytes_routed": routed,
            "disk_read_bytes": io1["read_bytes"] - io0["read_bytes"],
            "cgroup_read_bytes": since(cg0, cg1, "read"), "rss_bytes": self.counters.rss(),
            "t_unix": f"{time.time():.3f}", "dirtied_bytes": io1["write_bytes"] - io0["write_bytes"],
            "cgroup_write_bytes": since(cg0, cg1, "write"),
            # -1: not measured (a token of the measured window)
            "bytes_missing": hook.missing if measure else -1,
            "bytes_missing_after": hook.missing_after if measure else -1,
            "bytes_read": c1["bytes_read"] - c0["bytes_read"], "hook_s": f"{hook.hook_s:.6f}",
            "mechanism_s": f"{hook.mechanism_s:.6f}", "hook_on": int(hook_on), "harness_s": f"{harness_s:.6f}",
            **{k: (f"{v:.6f}" if isinstance(v, float) else v)
               for k, v in counters.parts(snap0, snap1, wall).items()}}

    def write_row(self, row: dict) -> None:
        # the decode's expert rows first, flushed with its token row: a run its limits kill is a
        # result, and keeps every expert row of every token it recorded (one write a token; the
        # rows are buffered within the token)
        self.experts_part.flush()
        self.tokens_part.write(token_line(row))
        if self.mech_part is not None:
            for r in self.mechanism.take_rows():
                self.mech_part.write(",".join(map(str, r)) + "\n")
            self.mech_part.flush()

    def decode_all(self) -> None:
        """Prompt processing is its own row (index -1); then one row per generated token, and
        one per token decoded past the window (`later_tokens`, phase `later`)."""
        total = self.p.tokens + self.p.later_tokens
        batch, pos = self.prompt_tokens, 0
        t_start = time.time()
        for index in range(-1, total):
            row = self.decode_one(index, batch, pos)
            self.write_row(row)
            if index >= self.p.tokens:
                self.later.append(row["token_id"])
            elif index >= 0:
                self.generated.append(row["token_id"])
                done = index + 1
                if done % max(1, total // 8) == 0 or done == total:
                    log.info("progress: %d/%d tokens, %.3f tok/s so far, rss %d MiB", done, total,
                             done / (time.time() - t_start), self.counters.rss() >> 20)
            pos += len(batch)
            batch = [row["token_id"]]
        self.mechanism.close()

    def summarize(self) -> dict:
        llama, m = self.llama, self.mechanism
        text_buf = ctypes.create_string_buffer(16 * (len(self.generated) + 1) * 8)
        pieces = []
        for tok in self.generated:
            n = llama.llama_token_to_piece(self.vocab, tok, text_buf, len(text_buf), 0, False)
            pieces.append(text_buf.raw[: max(n, 0)])
        start, length, moff = self.mapping
        return {
            "tokens_completed": len(self.generated), "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated, "later_tokens_completed": len(self.later),
            "generated_text": b"".join(pieces).decode("utf-8", "replace"),
            "load_s": self.load_s, "model_moments": self.moments,
            "mlocked_bytes": self.locked_bytes, "mlocked_tensors": self.locked_count,
            "hook": self.p.hook if self.p.hook != "native" or self.native else "python",
            "hook_nodes_asked": self.native.h.asked if self.native else None,
            # how the C path measured residency (cachestat falls back to mincore on old kernels)
            "hook_residency": (("cachestat" if self.native.h.cache_fd >= 0 else "mincore")
                               if self.native else None),
            "hook_residency_calls": self.native.h.residency_calls if self.native else None,
            "hook_nodes_passed": self.native.h.passed if self.native else None,
            "hook_calls": self.hook.calls, "bytes_routed": self.routed_total,
            "bytes_prefetched": self.prefetched_total,
            "byte_accounting_ok": (self.mismatches == 0) if m.prefetches else None,
            "bytes_read_ahead": getattr(m, "bytes_read_ahead", 0),
            "bytes_warm_start": getattr(m, "bytes_warm_start", 0),
            "cache_capacity_bytes": getattr(m, "cache_capacity_bytes", None),
            "cache_hits": m.c.cache_hits, "cache_misses": m.c.cache_misses,
            "mapping": {"start": start, "length": length, "file_offset": moff}}

    def close(self) -> None:
        for f in self.files:
            f.close()
        if self.ctx:
            self.llama.llama_free(self.ctx)
        if self.model:
            self.llama.llama_model_free(self.model)
        if self.fd is not None:
            os.close(self.fd)


def run(params: WorkerParams) -> dict:
    """Run one configuration; returns the worker summary."""
    w = Worker(params)
    try:
        w.load_and_verify()
        w.prepare_mechanism()
        w.make_context()
        w.decode_all()
        return w.summarize()
    finally:
        w.close()


def main(argv=None) -> int:
    argv = argv if argv is not None else sys.argv[1:]
    # progress lines go to stderr, which the supervisor relays to the rule's log
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
    params = WorkerParams.read(Path(argv[0]))
    summary = run(params)
    Path(params.out_dir, "worker.json").write_text(json.dumps(summary, indent=2))
    return 0


def tensor_offsets(model_path: str, names: list[str], lib_dir: str | None = None) -> dict[str, int]:
    """File offsets of the named tensors' data as llama.cpp itself reports them (through the patch's
    accessor on an mmap'd load): the independent check of a layout file."""
    b = hlib.load(lib_dir)
    llama = b.llama_cpp
    model = load_mmap_model(llama, model_path)
    try:
        start, _, moff = find_mapping(model_path)
        out = {}
        for n in names:
            t = b.llama_model_get_tensor(model, n.encode())
            out[n] = (t.contents.data - (start - moff)) if t else None
        return out
    finally:
        llama.llama_model_free(model)


if __name__ == "__main__":
    sys.exit(main())
