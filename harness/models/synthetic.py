"""Synthetic GGUF models with the exact shapes, tensor names, layout and tokenizer of the originals.

No weights can be downloaded here, so the default models are written with gguf's GGUFWriter as
F16 from seeded random weights, one tensor at a time (peak memory stays at one tensor), and then
quantized by the pipeline's own llama-quantize. Every byte count, I/O pattern and FLOP is the real
model's; only the weight values are random. Each file carries `moe_offload_bench.synthetic` and
`moe_offload_bench.seed` so that no number made from it can be passed off as the original's.

The merged expert tensors (95% of OLMoE's 6.9B weights) are made differently, because quantizing
6.4B random weights is what made a full-size model take 14.5 minutes here (llama-quantize on
2 cores: Q2_K 271 s, Q4_K_M 395 s). The F16 file leaves them as sparse holes (zeros, which
llama-quantize passes through in seconds), so llama-quantize still decides every tensor's type and
writes the file's layout. Then each expert tensor is filled, block by block, from a pool of
EXPERT_POOL_BLOCKS blocks per (type, row length): seeded normal weights at the tensor's scale,
quantized by the same build's ggml_quantize_chunk (the function llama-quantize calls), drawn
with a seeded generator. Every expert block is therefore a real quantization of random weights of
the right scale; a block recurs about twice per tensor, at unrelated positions.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from harness.models.layout import (EXPERT_WEIGHTS_KEY, SCALES_KEY, SEED_KEY, SHAPE_KEY, SYNTHETIC_KEY,
                            is_expert_tensor)
from harness.build.bindings import ggml_base
from harness.util import atomic_path, atomic_write_text

log = logging.getLogger(__name__)

# Weight scales (times 1/sqrt(fan_in)). With smaller matrices (0.5) a random model's residual
# stream hardly changes from token to token, greedy decoding loops, and routing becomes sticky
# (measured: 89% of experts shared by adjacent tokens, 9 of 64 covering 80%), so nearly every
# expert read hits the page cache and the I/O pattern is nothing like the original's. These were
# chosen on a 4-layer 64-expert model (benchmarks/routing_calibration.py) so that the routing statistics
# resemble the study's (80% coverage ~26 of 64, ~60 distinct, ~30% shared at d=1); RMS norms keep
# activations finite. The routing is still a random model's, never OLMoE's.
MATRIX_SCALE = 1.5
ROUTER_SCALE = 4.0
# Temporal structure. With the scales alone, a random model's attention has no notion of recency:
# every token's router input carries the same slowly drifting context mix, and sharing hardly falls
# with distance (full-size Q4_K_M: d1 0.301, d8 0.281; the study's OLMoE 0.357, 0.208). A real model attends
# mostly to recent tokens; these give the random model that, with the original's own RoPE. Every
# token embedding shares a direction c (EMBED_SHARED of its norm; the routers are made blind to
# it), and Q and K both map c onto the head dims of RoPE's RECENCY_PAIRS fastest frequencies
# (times RECENCY), so q.k gains a term that is largest for the same position and falls within a
# few tokens; QK_NORM_GAIN (the q/k RMS-norm weights) sharpens all scores. Applied where K has
# as many heads as Q (OLMoE). Chosen with benchmarks/routing_calibration.py on the full shape's
# depth and attention (--deep), checked on the full shape (--full): 80% of routings on 29 of 64
# experts, 59 distinct, d1 0.306, d8 0.225.
EMBED_SHARED = 0.3
RECENCY = 6.0
RECENCY_PAIRS = 64
QK_NORM_GAIN = 1.5
# 2^18 blocks of 256 weights: a few seconds of quantizing per pool; ~2 uses per block per tensor
EXPERT_POOL_BLOCKS = 1 << 18


@dataclass(frozen=True)
class Shape:
    """Hyperparameters of a model family; the presets below are the originals' (and tiny ones)."""

    arch: str  # "olmoe" or "qwen2"
    name: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_vocab: int
    vocab_file: str  # relative to the llama.cpp source tree
    context_length: int
    rms_eps: float
    rope_freq_base: float
    n_expert: int = 0
    n_expert_used: int = 0
    tied_embeddings: bool = False
    # ffn_norm weights drawn from 1 +- this (0: all ones, the full-size presets, whose routing
    # was calibrated so): non-unit norms are what tells a predictor that applies the wrong
    # layer's norm from one that applies the right one
    ffn_norm_spread: float = 0.0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


SHAPES = {
    # allenai/OLMoE-1B-7B-0924 (its config.json; GGUF layout as convert_hf_to_gguf writes it)
    "olmoe-1b-7b": Shape("olmoe", "OLMoE-1B-7B-0924 (synthetic)", n_layer=16, n_embd=2048, n_ff=1024,
                         n_head=16, n_head_kv=16, n_vocab=50304,
                         vocab_file="models/ggml-vocab-gpt-neox.gguf", context_length=4096,
                         rms_eps=1e-5, rope_freq_base=10000.0, n_expert=64, n_expert_used=8),
    # Qwen/Qwen2.5-0.5B-Instruct. The model ties its embeddings, but the study's Q8_0 file
    # (638.74 MiB, "630M params" in llama-bench) also stores output.weight: 494M + 136M weights.
    # We write it the same way, so the file and the compute per token are the study's.
    "qwen2.5-0.5b": Shape("qwen2", "Qwen2.5-0.5B-Instruct (synthetic)", n_layer=24, n_embd=896,
                          n_ff=4864, n_head=14, n_head_kv=2, n_vocab=151936,
                          vocab_file="models/ggml-vocab-qwen2.gguf", context_length=32768,
                          rms_eps=1e-6, rope_freq_base=1000000.0, tied_embeddings=False),
    # tiny variants for tests and .test/config: same architectures and tokenizers, small dims
    # (multiples of 256 so that the k-quants apply to every matrix, as in the full model)
    "olmoe-tiny": Shape("olmoe", "OLMoE-tiny (synthetic)", n_layer=4, n_embd=256, n_ff=256,
                        n_head=4, n_head_kv=4, n_vocab=50304,
                        vocab_file="models/ggml-vocab-gpt-neox.gguf", context_length=4096,
                        rms_eps=1e-5, rope_freq_base=10000.0, n_expert=8, n_expert_used=2,
                        ffn_norm_spread=0.5),
    "qwen2-tiny": Shape("qwen2", "Qwen2-tiny (synthetic)", n_layer=2, n_embd=128, n_ff=256,
                        n_head=4, n_head_kv=2, n_vocab=151936, vocab_file="models/ggml-vocab-qwen2.gguf",
                        context_length=4096, rms_eps=1e-6, rope_freq_base=1000000.0,
                        tied_embeddings=True),
}


def tensor_plan(shape: Shape) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape (outermost first), role) of every tensor, in the original file's order.

    numpy shape is the reverse of ggml's ne[]: an expert tensor of ne [n_embd, n_ff, n_expert] is
    (n_expert, n_ff, n_embd), so each expert is one contiguous slab.
    """
    e, f, v, L = shape.n_embd, shape.n_ff, shape.n_vocab, shape.n_layer
    kv = shape.head_dim * shape.n_head_kv
    plan = [("token_embd.weight", (v, e), "matrix")]
    for i in range(L):
        b = f"blk.{i}."
        plan += [
            (b + "attn_norm.weight", (e,), "norm"),
            (b + "attn_q.weight", (e, e), "matrix"),
            (b + "attn_k.weight", (kv, e), "matrix"),
            (b + "attn_v.weight", (kv, e), "matrix"),
            (b + "attn_output.weight", (e, e), "matrix"),
        ]
        if shape.arch == "olmoe":
            plan += [
                (b + "attn_q_norm.weight", (e,), "norm"),
                (b + "attn_k_norm.weight", (kv,), "norm"),
                (b + "ffn_norm.weight", (e,), "norm"),
                (b + "ffn_gate_inp.weight", (shape.n_expert, e), "router"),
                (b + "ffn_gate_exps.weight", (shape.n_expert, f, e), "matrix"),
                (b + "ffn_down_exps.weight", (shape.n_expert, e, f), "matrix"),
                (b + "ffn_up_exps.weight", (shape.n_expert, f, e), "matrix"),
            ]
        else:
            plan += [
                (b + "attn_q.bias", (e,), "bias"),
                (b + "attn_k.bias", (kv,), "bias"),
                (b + "attn_v.bias", (kv,), "bias"),
                (b + "ffn_norm.weight", (e,), "norm"),
                (b + "ffn_gate.weight", (f, e), "matrix"),
                (b + "ffn_up.weight", (f, e), "matrix"),
                (b + "ffn_down.weight", (e, f), "matrix"),
            ]
    plan.append(("output_norm.weight", (e,), "norm"))
    if not shape.tied_embeddings:
        plan.append(("output.weight", (v, e), "matrix"))
    return plan


def weight_recipe() -> str:
    """The generator's knobs as written into every synthetic file (SCALES_KEY)."""
    return (f"matrix={MATRIX_SCALE}/sqrt(fan_in) router={ROUTER_SCALE}/sqrt(fan_in) "
            f"embed_shared={EMBED_SHARED} recency={RECENCY}x{RECENCY_PAIRS} "
            f"qk_norm_gain={QK_NORM_GAIN}")


def _recency_direction(shape: Shape) -> np.ndarray:
    """Unit vector over Q's (and K's) output dims: in every head, the dims of RoPE's fastest
    RECENCY_PAIRS frequency pairs (NEOX layout: dim i pairs with i + head_dim / 2)."""
    hd = shape.head_dim
    u = np.zeros(shape.n_embd, dtype=np.float32)
    for h in range(shape.n_head):
        for i in range(min(RECENCY_PAIRS, hd // 2)):
            u[h * hd + i] = u[h * hd + hd // 2 + i] = 1.0
    return u / np.linalg.norm(u)


def hash_name(name: str) -> int:
    """A stable seed from a tensor's name (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def _tensor(rng: np.random.Generator, shape: Shape, name: str, np_shape: tuple[int, ...], role: str,
            shared: np.ndarray) -> np.ndarray:
    """One non-expert tensor's weights, with the temporal-structure knobs applied."""
    if name.endswith(("attn_q_norm.weight", "attn_k_norm.weight")):
        return np.full(np_shape, QK_NORM_GAIN, dtype=np.float32)
    if name.endswith("ffn_norm.weight") and shape.ffn_norm_spread:
        # its own generator: the other tensors' draws stay what they were
        own = np.random.default_rng([hash_name(name), 1])
        return (1.0 + own.uniform(-shape.ffn_norm_spread, shape.ffn_norm_spread, np_shape)
                ).astype(np.float32)
    w = _weights(rng, np_shape, role)
    if not EMBED_SHARED:
        return w
    w32 = w.astype(np.float32)
    if name == "token_embd.weight":
        # each row: sqrt(1 - s^2) of its own direction plus s of the shared one, same norm
        norms = np.linalg.norm(w32, axis=1, keepdims=True)
        w32 *= np.sqrt(1 - EMBED_SHARED ** 2)
        w32 += EMBED_SHARED * norms * shared[None, :]
    elif role == "router":
        w32 -= np.outer(w32 @ shared, shared)  # routing must not see the shared direction
    elif (RECENCY and name.endswith(("attn_q.weight", "attn_k.weight"))
          and shape.n_head_kv == shape.n_head):
        w32 += RECENCY * MATRIX_SCALE * np.outer(_recency_direction(shape), shared)
    else:
        return w
    return w32.astype(np.float16)


def _weights(rng: np.random.Generator, np_shape: tuple[int, ...], role: str) -> np.ndarray:
    """Small-scale random weights so activations stay finite over a long generation."""
    if role == "norm":
        return np.ones(np_shape, dtype=np.float32)
    if role == "bias":
        return np.zeros(np_shape, dtype=np.float32)
    fan_in = np_shape[-1]
    scale = (ROUTER_SCALE if role == "router" else MATRIX_SCALE) / np.sqrt(fan_in)
    w = rng.standard_normal(np_shape, dtype=np.float32)
    w *= scale
    return w.astype(np.float16)


def tokenizer_fields(vocab_path: Path) -> list[tuple[str, int, int | None, object]]:
    """The tokenizer.* key/values of a vocab GGUF as (key, type, sub_type, value).

    GGUFReader takes tens of seconds on a 150k-entry vocabulary, so the fields are cached as JSON
    beside the vocab file (which lives in the build cache, not the checkout)."""
    cache = vocab_path.with_name(vocab_path.name + ".tokenizer.json")
    if cache.exists() and cache.stat().st_mtime >= vocab_path.stat().st_mtime:
        return [tuple(x) for x in json.loads(cache.read_text())]
    reader = gguf.GGUFReader(vocab_path)
    fields = []
    for key, fld in reader.fields.items():
        if key.startswith("tokenizer."):
            sub = int(fld.types[-1]) if fld.types[0] == gguf.GGUFValueType.ARRAY else None
            val = fld.contents()
            fields.append((key, int(fld.types[0]), sub, val))
    with contextlib.suppress(OSError):  # a read-only cache only costs time
        atomic_write_text(cache, json.dumps(fields))
    return fields


def _copy_tokenizer(writer: gguf.GGUFWriter, vocab_path: Path, n_vocab: int) -> None:
    for key, vtype, sub, val in tokenizer_fields(vocab_path):
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            val = val[:n_vocab]
        writer.add_key_value(key, val, gguf.GGUFValueType(vtype),
                             sub_type=gguf.GGUFValueType(sub) if sub is not None else None)


def write_f16(shape: Shape, seed: int, vocab_path: Path, out: Path) -> None:
    """Write the F16 model tensor by tensor; atomic."""
    plan = tensor_plan(shape)
    with atomic_path(out) as tmp:
        w = gguf.GGUFWriter(tmp, shape.arch)
        a = shape.arch
        w.add_name(shape.name)
        w.add_context_length(shape.context_length)
        w.add_embedding_length(shape.n_embd)
        w.add_block_count(shape.n_layer)
        w.add_feed_forward_length(shape.n_ff)
        w.add_head_count(shape.n_head)
        w.add_head_count_kv(shape.n_head_kv)
        w.add_layer_norm_rms_eps(shape.rms_eps)
        w.add_rope_freq_base(shape.rope_freq_base)
        w.add_rope_dimension_count(shape.head_dim)
        if shape.n_expert:
            w.add_expert_count(shape.n_expert)
            w.add_expert_used_count(shape.n_expert_used)
            w.add_uint32(f"{a}.expert_feed_forward_length", shape.n_ff)
        w.add_vocab_size(shape.n_vocab)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        w.add_bool(SYNTHETIC_KEY, True)
        w.add_uint32(SEED_KEY, seed)
        w.add_string(SCALES_KEY, weight_recipe())
        w.add_string(SHAPE_KEY, next(k for k, v in SHAPES.items() if v == shape))
        if shape.n_expert:
            w.add_string(EXPERT_WEIGHTS_KEY, f"blocks drawn from pools of {EXPERT_POOL_BLOCKS} "
                         "ggml_quantize_chunk-quantized random blocks per (type, row length)")
        _copy_tokenizer(w, vocab_path, shape.n_vocab)
        if shape.arch == "olmoe":
            # the original OLMoE GGUF's pre-tokenizer (llama.cpp's "olmo")
            w.add_string("tokenizer.ggml.pre", "olmo")
        sizes = []
        for name, np_shape, role in plan:
            dtype = np.dtype(np.float32 if role in ("norm", "bias") else np.float16)
            sizes.append(int(np.prod(np_shape)) * dtype.itemsize)
            w.add_tensor_info(name, np_shape, dtype, sizes[-1])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        rng = np.random.default_rng(seed)
        # the embeddings' shared direction comes from its own stream, so the other tensors'
        # weights for a seed do not depend on whether EMBED_SHARED is set
        shared = np.random.default_rng([seed, 1]).standard_normal(shape.n_embd).astype(np.float32)
        shared /= np.linalg.norm(shared)
        for i, ((name, np_shape, role), nbytes) in enumerate(zip(plan, sizes, strict=True)):
            if is_expert_tensor(name):
                w.write_tensor_data(_Hole(nbytes))  # filled after quantizing
            else:
                w.write_tensor_data(_tensor(rng, shape, name, np_shape, role, shared))
            if i % 25 == 0:
                log.info(f"models: wrote {i + 1}/{len(plan)} tensors of {out.name}")
        w.close()


class _Hole:
    """Stands in for a tensor's data in GGUFWriter.write_tensor_data: seeks past it, leaving a
    sparse run of zeros that costs neither disk writes nor, when read back, disk reads."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes

    def tofile(self, f) -> None:
        f.seek(self.nbytes - 1, os.SEEK_CUR)
        f.write(b"\0")  # the file's size must cover the tensor even if it is the last one


def quantize(manifest: dict, src: Path, dst: Path, quant: str, threads: int, log_file=None) -> None:
    """llama-quantize the synthetic F16 src -> dst, then fill its expert tensors from seeded
    quantized block pools (see the module's docstring). Atomic: a failure never leaves dst."""
    with atomic_path(dst) as tmp:
        res = subprocess.run([manifest["llama_quantize"], str(src), str(tmp), quant, str(threads)],
                             timeout=3 * 3600,
                             stdout=log_file or sys.stderr, stderr=subprocess.STDOUT)
        if res.returncode != 0:
            raise RuntimeError(f"llama-quantize {src.name} -> {quant} failed (exit {res.returncode})")
        fill_expert_tensors(tmp, Path(manifest["lib_dir"]))


class GgmlQuantizer:
    """ggml_quantize_chunk of the pipeline's own build (libggml-base), the function through which
    llama-quantize quantizes every tensor; no importance matrix, as in llama-quantize without one."""

    def __init__(self, lib_dir: Path):
        self._chunk = ggml_base(lib_dir).ggml_quantize_chunk
        self._chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        self._chunk.restype = ctypes.c_size_t

    def __call__(self, qtype: gguf.GGMLQuantizationType, rows: np.ndarray) -> np.ndarray:
        """Quantize float32 rows (n_rows, n_per_row); returns (n_rows, row bytes) uint8."""
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        n_rows, n_per_row = rows.shape
        block_elems, type_size = gguf.GGML_QUANT_SIZES[qtype]
        out = np.empty((n_rows, n_per_row // block_elems * type_size), dtype=np.uint8)
        n = self._chunk(int(qtype), rows.ctypes.data, out.ctypes.data, 0, n_rows, n_per_row, None)
        if n != out.nbytes:
            raise RuntimeError(f"ggml_quantize_chunk wrote {n} bytes, expected {out.nbytes}")
        return out


def block_pool(quantizer: GgmlQuantizer, qtype: gguf.GGMLQuantizationType, n_per_row: int,
               seed: int, n_blocks: int = EXPERT_POOL_BLOCKS) -> np.ndarray:
    """(n, type_size) uint8: quantized blocks of seeded N(0, (MATRIX_SCALE/sqrt(n_per_row))^2)
    weights, quantized in rows of the tensor's own length."""
    block_elems, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n_rows = -(-n_blocks * block_elems // n_per_row)
    rng = np.random.default_rng([seed, int(qtype), n_per_row])
    w = rng.standard_normal((n_rows, n_per_row), dtype=np.float32)
    w *= MATRIX_SCALE / np.sqrt(n_per_row)
    return quantizer(qtype, w).reshape(-1, type_size)


def fill_expert_tensors(path: Path, lib_dir: Path) -> int:
    """Fill every merged expert tensor of a synthetic quantized file with blocks drawn from
    seeded pools; returns the number of tensors filled. Deterministic in the file's seed."""
    reader = gguf.GGUFReader(path)
    seed_field = reader.fields.get(SEED_KEY)
    if seed_field is None or reader.fields.get(SYNTHETIC_KEY) is None:
        raise ValueError(f"{path}: not a synthetic model of this pipeline (no {SEED_KEY})")
    seed = int(seed_field.contents())
    targets = [(t.name, t.tensor_type, int(t.shape[0]), int(t.data_offset), int(t.n_bytes))
               for t in reader.tensors if is_expert_tensor(t.name)]
    del reader  # its memmap is read-only; the file is written through a plain descriptor
    if not targets:
        return 0
    quantizer, pools = GgmlQuantizer(lib_dir), {}
    chunk_blocks = 1 << 18
    fd = os.open(path, os.O_WRONLY)
    try:
        for i, (name, qtype, n_per_row, offset, nbytes) in enumerate(targets):
            type_size = gguf.GGML_QUANT_SIZES[qtype][1]
            n_blocks = nbytes // type_size
            key = (qtype, n_per_row)
            if key not in pools:  # no bigger than one tensor: tiny models stay quick
                pools[key] = block_pool(quantizer, qtype, n_per_row, seed,
                                        min(EXPERT_POOL_BLOCKS, n_blocks))
                log.info(f"models: pool of {len(pools[key])} {qtype.name} blocks for rows of {n_per_row}")
            pool = pools[key]
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            for start in range(0, n_blocks, chunk_blocks):
                idx = rng.integers(0, len(pool), min(chunk_blocks, n_blocks - start))
                data = pool[idx].tobytes()
                if os.pwrite(fd, data, offset + start * type_size) != len(data):
                    raise OSError(f"{path}: short write filling {name}")
            if i % 12 == 0:
                log.info(f"models: filled {i + 1}/{len(targets)} expert tensors of {path.name}")
    finally:
        os.close(fd)
    return len(targets)
