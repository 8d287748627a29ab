import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from harness.models import synthetic
from harness.models.synthetic import SHAPES, tensor_plan
from harness.util import sha256_file


def test_full_size_olmoe_plan_has_the_originals_shapes():
    plan = {n: s for n, s, _ in tensor_plan(SHAPES["olmoe-1b-7b"])}
    assert plan["blk.0.ffn_gate_exps.weight"] == (64, 1024, 2048)  # expert outermost
    assert plan["blk.15.ffn_down_exps.weight"] == (64, 2048, 1024)
    assert plan["token_embd.weight"] == (50304, 2048)
    assert "output.weight" in plan and "blk.16.attn_q.weight" not in plan
    n_params = sum(int(__import__("numpy").prod(s)) for s in plan.values())
    assert 6.8e9 < n_params < 7.0e9  # OLMoE-1B-7B: 6.92B parameters


def test_full_size_qwen_plan_is_dense_with_the_studys_630m_weights():
    plan = {n: s for n, s, _ in tensor_plan(SHAPES["qwen2.5-0.5b"])}
    assert plan["output.weight"] == (151936, 896) and plan["blk.23.ffn_up.weight"] == (4864, 896)
    n = sum(int(__import__("numpy").prod(s)) for s in plan.values())
    assert 625e6 < n < 635e6
    assert "_exps" not in " ".join(plan)
    assert plan["blk.0.attn_k.weight"] == (128, 896)  # 2 KV heads of 64


def test_tiny_models_are_marked_synthetic_with_seed(tiny_models):
    for m in tiny_models.values():
        r = gguf.GGUFReader(m["gguf"])
        assert r.fields["moe_offload_bench.synthetic"].contents() is True
        assert r.fields["moe_offload_bench.seed"].contents() == 7
        assert m["data"]["synthetic"] is True and m["data"]["seed"] == 7


def test_layout_byte_accounting(tiny_models):
    lay = tiny_models["olmoe-tiny-Q4_K_M"]["data"]
    shape = SHAPES["olmoe-tiny"]
    assert len(lay["expert_tensors"]) == 3 * shape.n_layer
    for x in lay["expert_tensors"]:
        t = next(t for t in lay["tensors"] if t["name"] == x["name"])
        assert x["bytes_per_expert"] * shape.n_expert == t["bytes"]
        assert x["formula"] == f"{t['offset']} + expert_id * {x['bytes_per_expert']}"
    # Q4_K_M keeps some layers' down projections at Q6_K: slabs differ per layer, so sum them all
    all_slabs = sum(x["bytes_per_expert"] for x in lay["expert_tensors"])
    assert lay["bytes_per_token"] == shape.n_expert_used * all_slabs
    total = sum(t["bytes"] for t in lay["tensors"])
    assert lay["non_expert_bytes"] + lay["expert_bytes"] == total < lay["file_size"]


def test_q4_carries_more_bytes_per_token_than_q2(tiny_models):
    q4 = tiny_models["olmoe-tiny-Q4_K_M"]["data"]["bytes_per_token"]
    q2 = tiny_models["olmoe-tiny-Q2_K"]["data"]["bytes_per_token"]
    assert 1.4 < q4 / q2 < 2.0


@pytest.mark.parametrize("name", ["olmoe-tiny-Q4_K_M", "qwen2-tiny-Q8_0"])
def test_tokenizer_is_the_originals(tiny_models, name):
    r = gguf.GGUFReader(tiny_models[name]["gguf"])
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    assert len(toks) == (50304 if "olmoe" in name else 151936)


def _expert_tensors(path):
    return [t for t in gguf.GGUFReader(path).tensors if t.name.endswith("_exps.weight")]


@pytest.mark.parametrize("name", ["olmoe-tiny-Q4_K_M", "olmoe-tiny-Q2_K"])
def test_expert_tensors_hold_quantized_random_weights_of_the_right_scale(tiny_models, name):
    """The F16 leaves experts as zero holes; the fill must reach every block, at the scale the
    other matrices have, and give every expert its own weights."""
    tensors = _expert_tensors(tiny_models[name]["gguf"])
    assert len(tensors) == 3 * SHAPES["olmoe-tiny"].n_layer
    for t in tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).reshape(t.shape[2], -1)
        expected = synthetic.MATRIX_SCALE / np.sqrt(int(t.shape[0]))
        assert 0.8 < w.std() / expected < 1.2, (t.name, t.tensor_type.name, w.std(), expected)
        block_elems = gguf.GGML_QUANT_SIZES[t.tensor_type][0]
        blocks = w.reshape(-1, block_elems)
        assert (np.abs(blocks).max(axis=1) > 0).all(), f"{t.name}: a block was left empty"
        assert len({e.tobytes() for e in w}) == w.shape[0], f"{t.name}: two experts are identical"


def test_expert_fill_is_deterministic_in_the_seed(tiny_models, manifest, tmp_path):
    src = tiny_models["olmoe-tiny-Q4_K_M"]["gguf"]
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(src, copy)
    assert synthetic.fill_expert_tensors(copy, Path(manifest["lib_dir"])) == 12
    assert sha256_file(copy) == sha256_file(src)


def test_f16_leaves_expert_tensors_as_sparse_holes(manifest, tmp_path):
    shape = SHAPES["olmoe-tiny"]
    f16 = tmp_path / "f16.gguf"
    synthetic.write_f16(shape, 3, Path(manifest["source_tree"]) / shape.vocab_file, f16)
    experts = _expert_tensors(f16)
    expert_bytes = sum(int(t.n_bytes) for t in experts)
    assert all(not t.data.any() for t in experts)
    assert f16.stat().st_blocks * 512 < f16.stat().st_size - 0.9 * expert_bytes


def _f16_tensors(manifest, tmp_path, name="f16.gguf"):
    shape = SHAPES["olmoe-tiny"]
    f16 = tmp_path / name
    synthetic.write_f16(shape, 3, Path(manifest["source_tree"]) / shape.vocab_file, f16)
    return {t.name: np.array(t.data, dtype=np.float32) for t in gguf.GGUFReader(f16).tensors}


def test_recency_knobs_are_in_the_weights_and_off_when_zero(manifest, tmp_path, monkeypatch):
    """Token embeddings share one direction (pairwise cosine ~ EMBED_SHARED^2), the routers are
    blind to it, Q and K both map it onto the same RoPE dims, and the q/k norms carry the gain;
    with EMBED_SHARED 0 none of it is there."""
    shape = SHAPES["olmoe-tiny"]
    on = _f16_tensors(manifest, tmp_path, "on.gguf")
    emb = on["token_embd.weight"][:2000]
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    shared = unit.mean(axis=0)
    shared /= np.linalg.norm(shared)
    cos = unit @ unit.T
    mean_cos = (cos.sum() - len(cos)) / (len(cos) * (len(cos) - 1))
    assert abs(mean_cos - synthetic.EMBED_SHARED ** 2) < 0.02, mean_cos
    router = on["blk.0.ffn_gate_inp.weight"]
    assert np.abs(router @ shared).max() < 0.05 * np.abs(router).sum(axis=1).max()
    q, k = on["blk.0.attn_q.weight"] @ shared, on["blk.0.attn_k.weight"] @ shared
    assert q @ k / np.linalg.norm(q) / np.linalg.norm(k) > 0.8  # q.k of the shared part is > 0
    assert np.allclose(on["blk.0.attn_q_norm.weight"], synthetic.QK_NORM_GAIN)
    assert shape.n_head_kv == shape.n_head

    monkeypatch.setattr(synthetic, "EMBED_SHARED", 0.0)
    monkeypatch.setattr(synthetic, "QK_NORM_GAIN", 1.0)
    off = _f16_tensors(manifest, tmp_path, "off.gguf")
    unit = off["token_embd.weight"][:2000]
    unit = unit / np.linalg.norm(unit, axis=1, keepdims=True)
    cos = unit @ unit.T
    assert abs((cos.sum() - len(cos)) / (len(cos) * (len(cos) - 1))) < 0.01
    q, k = off["blk.0.attn_q.weight"] @ shared, off["blk.0.attn_k.weight"] @ shared
    assert abs(q @ k / np.linalg.norm(q) / np.linalg.norm(k)) < 0.5
    assert np.allclose(off["blk.0.attn_q_norm.weight"], 1.0)
