"""The routing hook: where the worker sees each layer's routing decision (the `ffn_moe_topk-<L>`
node, strictly before that layer's expert matmuls) and hands it to the mechanism. Two paths
fill the same rows: the C hook (harness/build/hook.c) and, for what it cannot do, the eval
callback in Python."""

from __future__ import annotations

import ctypes
import time

import numpy as np

from harness import libc
from harness.build import bindings as hlib
from harness.run import mechanisms as mech

TOPK_PREFIX = b"ffn_moe_topk-"


class WorkerError(RuntimeError):
    """What stops the measured process: the model, the hook or a decode went wrong."""


GGML_TYPE_F32, GGML_TYPE_I32 = 0, 26


MOE_MAX_SLABS = 4  # harness/build/hook.c


class NativeHook(ctypes.Structure):
    """struct moe_hook of harness/build/hook.c."""

    _fields_ = [("observe", ctypes.c_void_p), ("route", ctypes.c_void_p),
                ("off_type", ctypes.c_size_t), ("off_ne", ctypes.c_size_t),
                ("off_nb", ctypes.c_size_t), ("off_data", ctypes.c_size_t),
                ("off_name", ctypes.c_size_t), ("type_i32", ctypes.c_int32),
                ("prefix", (ctypes.c_char * 32) * 2), ("prefix_len", ctypes.c_size_t * 2),
                ("n_layer", ctypes.c_int32), ("n_expert", ctypes.c_int32),
                ("n_expert_used", ctypes.c_int32),
                ("layer_is_moe", ctypes.POINTER(ctypes.c_uint8)),
                ("slab_off", ctypes.POINTER(ctypes.c_uint64)),
                ("slab_len", ctypes.POINTER(ctypes.c_uint64)),
                ("base", ctypes.c_size_t), ("vec", ctypes.POINTER(ctypes.c_ubyte)),
                ("vec_len", ctypes.c_size_t), ("page", ctypes.c_size_t),
                ("cache_fd", ctypes.c_int32),
                ("enabled", ctypes.c_int32), ("token0", ctypes.c_int32),
                ("batch_n", ctypes.c_int32), ("measure_residency", ctypes.c_int32),
                ("rows", ctypes.POINTER(ctypes.c_int32)), ("rows_cap", ctypes.c_int32),
                ("unique", ctypes.POINTER(ctypes.c_int32)),
                ("unique_n", ctypes.POINTER(ctypes.c_int32)),
                ("routed_layer", ctypes.POINTER(ctypes.c_int32)),
                ("n_rows", ctypes.c_int32), ("n_routed", ctypes.c_int32),
                ("missing", ctypes.c_uint64), ("missing_after", ctypes.c_uint64),
                ("hook_ns", ctypes.c_uint64), ("python_ns", ctypes.c_uint64),
                ("asked", ctypes.c_ulonglong), ("passed", ctypes.c_ulonglong),
                ("residency_calls", ctypes.c_ulonglong),
                ("error", ctypes.c_char * 256)]


ROUTE_FN = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32),
                            ctypes.c_int32)


class NativeRouting:
    """The C routing path (harness/build/hook.c) and the buffers it fills, owned here so they live as
    long as the context. After each decode, `collect` moves what C recorded into the RoutingHook,
    so the token row is built the same way whichever path observed the routing."""

    def __init__(self, hook: "RoutingHook", lib_path: str, observe_cb, n_rows_max: int):
        lay, mapped = hook.layout, hook.mechanism.model
        self.hook, self.lib = hook, ctypes.CDLL(lib_path)
        self.lib.moe_hook_struct_size.restype = ctypes.c_size_t
        if self.lib.moe_hook_struct_size() != ctypes.sizeof(NativeHook):
            raise WorkerError(f"{lib_path} was built from another hook.c (struct moe_hook of "
                              f"{self.lib.moe_hook_struct_size()} bytes, this worker's "
                              f"{ctypes.sizeof(NativeHook)}): rebuild it (snakemake --forcerun "
                              "build_llama)")
        n_layer, n_expert = lay.n_layer, lay.n_expert
        self.is_moe = (ctypes.c_uint8 * n_layer)(*(int(i in lay.by_layer) for i in range(n_layer)))
        size = n_layer * n_expert * MOE_MAX_SLABS
        self.slab_off, self.slab_len = (ctypes.c_uint64 * size)(), (ctypes.c_uint64 * size)()
        for layer in lay.by_layer:
            for e in range(n_expert):
                slabs = lay.slabs(layer, e)
                if len(slabs) > MOE_MAX_SLABS:
                    raise WorkerError(f"layer {layer}: {len(slabs)} expert tensors, the C hook "
                                      f"takes {MOE_MAX_SLABS}")
                for k, sl in enumerate(slabs):
                    at = (layer * n_expert + e) * MOE_MAX_SLABS + k
                    self.slab_off[at], self.slab_len[at] = sl.offset, sl.nbytes
        self.vec = hook.residency.vec  # the Python path's mincore buffer, sized for any slab
        vec_len = len(self.vec)
        self.rows = (ctypes.c_int32 * (4 * n_rows_max))()
        self.unique = (ctypes.c_int32 * max(1, n_layer * n_expert))()
        self.unique_n, self.routed_layer = (ctypes.c_int32 * n_layer)(), (ctypes.c_int32 * n_layer)()
        mechanism = hook.mechanism
        # demand paging has no per-layer work: C does not call Python at all for it
        self.route_cb = ROUTE_FN(self._route) if mechanism.prefetches else None
        T = hlib.GgmlTensor
        self.h = NativeHook(
            observe=ctypes.cast(observe_cb, ctypes.c_void_p),
            route=ctypes.cast(self.route_cb, ctypes.c_void_p) if self.route_cb else None,
            off_type=T.type.offset, off_ne=T.ne.offset, off_nb=T.nb.offset, off_data=T.data.offset,
            off_name=T.name.offset, type_i32=GGML_TYPE_I32, n_layer=n_layer, n_expert=n_expert,
            n_expert_used=lay.n_expert_used, layer_is_moe=self.is_moe, slab_off=self.slab_off,
            slab_len=self.slab_len, base=mapped.base, vec=self.vec, vec_len=vec_len, page=libc.PAGE,
            cache_fd=mapped.fd if mechanism.weights_in_page_cache else -1,
            rows=self.rows, rows_cap=n_rows_max, unique=self.unique, unique_n=self.unique_n,
            routed_layer=self.routed_layer)
        for i, prefix in enumerate((TOPK_PREFIX, mechanism.observes or b"")):
            self.h.prefix[i].value = prefix
            self.h.prefix_len[i] = len(prefix)
        self.eval_fn = ctypes.cast(self.lib.moe_hook_eval, ctypes.c_void_p).value
        self.user_data = ctypes.cast(ctypes.pointer(self.h), ctypes.c_void_p)

    def _route(self, layer, experts, n) -> bool:
        try:
            self.hook.mechanism.on_route(layer, experts[:n])
            return True
        except BaseException as exc:  # an exception must not unwind through C; stop the decode
            self.hook.error = exc
            return False

    def begin(self, token0: int, batch_n: int, enabled: bool, measure: bool = True) -> None:
        h = self.h
        h.enabled, h.token0, h.batch_n = int(enabled), token0, batch_n
        h.measure_residency = int(measure)
        h.n_rows = h.n_routed = 0
        h.missing = h.missing_after = h.hook_ns = h.python_ns = 0
        h.error = b""

    def collect(self) -> None:
        """What C recorded during the decode, into the RoutingHook (and the experts sink)."""
        h, hook = self.h, self.hook
        if h.error:
            raise WorkerError(f"routing hook failed: {h.error.decode(errors='replace')}")
        n_expert = hook.layout.n_expert
        hook.routed = [(self.routed_layer[i], self.unique[i * n_expert: i * n_expert + self.unique_n[i]])
                       for i in range(h.n_routed)]
        hook.calls += h.n_routed
        hook.missing, hook.missing_after = h.missing, h.missing_after
        hook.hook_s = h.hook_ns / 1e9
        hook.mechanism_s = h.python_ns / 1e9  # C calls Python only for the mechanism's work
        if hook.log_experts and h.n_rows:
            ids = np.ctypeslib.as_array(self.rows).reshape(-1, 4)[: h.n_rows]
            hook.sink.write("".join(f"{t},{la},{r},{e}\n" for t, la, r, e in ids.tolist()))


class RoutingHook:
    """The cb_eval callback in Python (hook "python"; with "native", NativeRouting does the routing
    path in C and this class only observes a mechanism's hidden states and holds the per-decode
    results). It is asked about every graph node, so the `ask` path compares a 13-byte name prefix
    and nothing else.

    On each `ffn_moe_topk-<layer>` it checks the tensor is what the layout expects (int32 ids,
    contiguous rows of n_expert_used, ids in range), measures with mincore how many of the routed
    slabs' bytes are not resident, hands the layer's unique experts to the mechanism, and measures
    again: the bytes a mechanism could have needed to read, and what it left missing."""

    NAME_OFF = hlib.GgmlTensor.name.offset

    def __init__(self, mechanism: mech.Mechanism, log_experts: bool, expert_sink):
        self.mechanism = mechanism
        self.layout = mechanism.layout
        self.residency = mech.Residency(mechanism.model)
        self.log_experts = log_experts
        self.sink = expert_sink
        self.token = 0  # index of the first token of the batch being decoded
        self.batch_n = 1  # tokens in that batch
        self.enabled = True  # False: every ask is answered "no" (the bare decode, for an A/B)
        # False: no residency checks this decode (a token of the measured window)
        self.measure = True
        self.calls = 0
        self.layers_seen = 0
        self.routed = []  # (layer, unique experts) of the current decode
        self.missing = self.missing_after = 0  # bytes, this decode
        self.hook_s = 0.0  # time in this callback's observing path (mechanism excluded)
        self.mechanism_s = 0.0  # time in the mechanism's own calls (on_route, observe)
        self.error: BaseException | None = None

    def check(self, tensor, layer: int) -> None:
        lay = self.layout
        problems = []
        if tensor.type != GGML_TYPE_I32:
            problems.append(f"type {tensor.type}, expected I32 ({GGML_TYPE_I32})")
        if tensor.nb[0] != 4:
            problems.append(f"nb[0] = {tensor.nb[0]}, expected 4")
        if tensor.ne[0] != lay.n_expert_used:
            problems.append(f"ne[0] = {tensor.ne[0]}, expected n_expert_used = {lay.n_expert_used}")
        if tensor.nb[1] < 4 * tensor.ne[0]:
            problems.append(f"row stride nb[1] = {tensor.nb[1]} under a row of {tensor.ne[0]} ids")
        if not 1 <= tensor.ne[1] <= self.batch_n:
            problems.append(f"{tensor.ne[1]} rows for a batch of {self.batch_n} tokens")
        if layer not in lay.by_layer:
            problems.append(f"layer {layer} is not a MoE layer of the layout")
        if problems:
            raise ValueError(f"ffn_moe_topk-{layer}: " + "; ".join(problems))

    def observe(self, tensor, name: bytes) -> None:
        """Hand a hidden state (F32 rows of n_embd, one per token computed) to the mechanism."""
        suffix = name[len(self.mechanism.observes):]
        if not suffix.isdigit():  # views of it ("ffn_norm-0 (reshaped)") are not the layer's output
            return
        layer = int(suffix)
        if tensor.type != GGML_TYPE_F32 or tensor.nb[0] != 4:
            raise ValueError(f"{name.decode()}: type {tensor.type}, nb[0] {tensor.nb[0]}: expected "
                             "contiguous F32 rows")
        n_embd, n_rows, row = tensor.ne[0], tensor.ne[1], tensor.nb[1]
        buf = (ctypes.c_char * (row * (n_rows - 1) + 4 * n_embd)).from_address(tensor.data)
        rows = np.ndarray((n_rows, n_embd), dtype=np.float32, buffer=buf, strides=(row, 4))
        self.mechanism.on_hidden(layer, rows.copy())

    def missing_bytes(self, layer: int, experts: list[int]) -> int:
        return sum(self.residency.missing_bytes(sl.offset, sl.nbytes) for e in experts
                   for sl in self.layout.slabs(layer, e))

    def __call__(self, t, ask, _user_data):
        try:
            if ask:
                if not self.enabled:
                    return False
                if ctypes.string_at(t + self.NAME_OFF, 13) == TOPK_PREFIX:
                    return True
                obs = self.mechanism.observes
                return obs is not None and ctypes.string_at(t + self.NAME_OFF, len(obs)) == obs
            t0 = time.perf_counter()
            tensor = hlib.GgmlTensor.from_address(t)
            name = tensor.name
            if not name.startswith(TOPK_PREFIX):
                if self.mechanism.observes and name.startswith(self.mechanism.observes):
                    t1 = time.perf_counter()
                    self.observe(tensor, name)  # the mechanism's own work (lookahead's prediction)
                    self.mechanism_s += time.perf_counter() - t1
                    self.hook_s += t1 - t0
                return True
            layer = int(name[len(TOPK_PREFIX):])
            self.check(tensor, layer)
            n_used, n_tok, row = tensor.ne[0], tensor.ne[1], tensor.nb[1]
            n_expert = self.layout.n_expert
            unique = []
            seen = set()
            # the last layer computes only the rows whose logits are needed (the batch's last
            # token), so rows map onto the batch's final n_tok tokens
            first = self.token + self.batch_n - n_tok
            for r in range(n_tok):
                ids = (ctypes.c_int32 * n_used).from_address(tensor.data + r * row)
                for rank, e in enumerate(ids):
                    if not 0 <= e < n_expert:
                        raise ValueError(f"ffn_moe_topk-{layer}: token row {r} routes to expert "
                                         f"{e}, outside 0..{n_expert - 1}")
                    if self.log_experts:
                        self.sink.write(f"{first + r},{layer},{rank},{e}\n")
                    if e not in seen:
                        seen.add(e)
                        unique.append(e)
            self.calls += 1
            self.routed.append((layer, unique))
            if self.measure:
                self.missing += self.missing_bytes(layer, unique)
            t1 = time.perf_counter()
            self.mechanism.on_route(layer, unique)
            t2 = time.perf_counter()
            if self.measure:
                self.missing_after += self.missing_bytes(layer, unique)
            self.hook_s += (t1 - t0) + (time.perf_counter() - t2)
            self.mechanism_s += t2 - t1
            return True
        except BaseException as exc:  # an exception must not unwind through C; stop the decode
            self.error = exc
            return False
