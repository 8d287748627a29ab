"""Router maths a mechanism predicts with: each layer's router and ffn_norm weights read from
the file, and the experts a layer's router would pick for a hidden state."""

from __future__ import annotations

import os

from harness.run.mechanisms.base import MappedModel


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
