"""Lookahead on a tiny model: its predictions checked against the real routing in experts.csv."""

import pandas as pd
import pytest

from harness.run import supervise
from harness.config import adhoc_spec
from harness.box.limits import Limits


@pytest.fixture(scope="module", params=["ffn_norm", "l_out"])
def lookahead_run(request, manifest, tiny_models, tmp_path_factory):
    model = tiny_models["olmoe-tiny-Q4_K_M"]
    d = tmp_path_factory.mktemp("lookahead-" + request.param)
    spec = adhoc_spec("t-lookahead", model["info"]["name"], "lookahead", tokens=8,
                      lookahead_source=request.param, lookahead_experts=3, lookahead_layers=2,
                      lookahead_call="fadvise", lookahead_base="pread+madvise")
    rec = supervise.run(spec, d, lib_dir=manifest["lib_dir"], build=manifest,
                        model_info=model["info"], layout_path=model["layout"], limits=Limits(),
                        time_limit_s=120)
    return rec, d, model["data"]


def test_predictions_match_what_the_real_routing_says(lookahead_run):
    rec, d, lay = lookahead_run
    assert rec.status == "ok" and rec.summary.byte_accounting_ok is True
    pred = pd.read_csv(d / "mechanism.csv", dtype={"predicted": str, "routed": str})
    ex = pd.read_csv(d / "experts.csv")
    slab = {int(k): v for k, v in lay["slab_bytes_per_layer"].items()}
    n_prompt = len(rec.summary.prompt_tokens)
    gen = pred[pred.token >= 0]
    # every generated token: layers 1.. predicted (from layer L-1 or L-2, whichever came first)
    assert len(gen) == 8 * (lay["n_layer"] - 1)
    assert set(gen.token) == set(range(n_prompt, n_prompt + 8))
    for r in gen.itertuples():
        routed = set(ex[(ex.token == r.token) & (ex.layer == r.layer)].expert)
        predicted = {int(x) for x in r.predicted.split()}
        assert {int(x) for x in r.routed.split()} == routed
        assert r.source_layer == r.layer - 1  # the nearest layer has the last word
        assert len(predicted) == r.n_predicted <= 2 * 3  # two layers ahead, 3 experts each
        hits = len(predicted & routed)
        assert r.hits == hits
        assert r.precision == pytest.approx(hits / len(predicted))
        assert r.recall == pytest.approx(hits / len(routed))
        assert r.wasted_bytes == len(predicted - routed) * slab[r.layer]
        assert 0 <= r.predicted_resident_bytes <= r.predicted_bytes == len(predicted) * slab[r.layer]
    # the next layer's router on this layer's hidden state predicts better than chance: a random
    # pick of experts would be right n_expert_used / n_expert of the time
    assert gen.precision.mean() > lay["n_expert_used"] / lay["n_expert"]
    assert rec.summary.bytes_read_ahead == int(pred.predicted_bytes.sum())


def test_lookahead_base_still_reads_every_routed_slab(lookahead_run):
    rec, d, _ = lookahead_run
    tok = pd.read_csv(d / "tokens.csv")
    assert (tok.bytes_read == tok.bytes_routed).all()  # pread+madvise still reads every routed slab


def test_the_prediction_uses_the_next_layers_norm_on_the_residual_it_will_see():
    """Computed independently from the residual x: router L+1 sees rmsnorm(x) * gamma_{L+1}. The
    mechanism sees only what llama.cpp hands it (layer L's ffn_norm output, rmsnorm(x) * gamma_L,
    or l_out, x itself) and must get the same top-k; applying router L+1 to layer L's ffn_norm
    output (the old rule) gets another one when the two layers' norm weights differ."""
    import numpy as np

    from harness.run.mechanisms import predict_experts

    rng = np.random.default_rng(3)
    n_embd, n_expert, k = 64, 16, 4
    router = rng.standard_normal((n_expert, n_embd)).astype(np.float32)
    gamma_l = rng.uniform(0.1, 1.9, n_embd).astype(np.float32)
    gamma_next = rng.uniform(0.1, 1.9, n_embd).astype(np.float32)
    differs = 0
    for _ in range(20):
        x = rng.standard_normal((1, n_embd)).astype(np.float32) * 3.0
        normed = x / np.sqrt(np.mean(x * x) + 1e-6)
        want = set(np.argsort(-(normed * gamma_next) @ router.T)[0, :k].tolist())
        assert predict_experts(normed * gamma_l, "ffn_norm", gamma_l, gamma_next, router, k) == want
        assert predict_experts(x, "l_out", None, gamma_next, router, k) == want
        old = set(np.argsort(-(normed * gamma_l) @ router.T)[0, :k].tolist())
        differs += old != want
    assert differs >= 10  # the test tells the two rules apart


def test_the_tiny_models_ffn_norms_differ_by_layer_so_the_runs_exercise_the_norm(tiny_models):
    """With every norm weight 1 (the full-size presets) dividing out layer L's and applying layer
    L+1's changes nothing: the tiny model's non-unit norms are what make the real runs above
    depend on the prediction using the right layer's."""
    import numpy as np
    from gguf import GGUFReader

    r = GGUFReader(tiny_models["olmoe-tiny-Q4_K_M"]["gguf"])
    norms = {t.name: np.array(t.data, dtype=np.float32) for t in r.tensors
             if t.name.endswith("ffn_norm.weight")}
    assert len(norms) == 4
    for w in norms.values():
        assert 0.5 <= w.min() < 0.9 and 1.1 < w.max() <= 1.5  # 1 +- 0.5, not all ones
    assert not np.allclose(norms["blk.0.ffn_norm.weight"], norms["blk.1.ffn_norm.weight"])
