"""The figures of RESULTS.md, drawn from the same tables the findings rest on."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd


def summary_plots(w, summ: pd.DataFrame, any_synth: bool) -> None:
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(summ) + 1.5))
    y = np.arange(len(summ))
    ax.barh(y, summ["median"], xerr=[summ["median"] - summ["min"], summ["max"] - summ["median"]],
            color="tab:blue", alpha=0.8)
    ax.set_yticks(y, summ.run_id, fontsize=7)
    for yi, (med, st) in enumerate(zip(summ["median"], summ.statuses, strict=True)):
        if pd.isna(med):  # no ok repeat: say why instead of drawing nothing
            ax.text(0, yi, f" {st}", va="center", fontsize=7, color="tab:red")
    ax.set_xlabel("tok/s (median, min-max)" + (" - synthetic models" if any_synth else ""))
    w.plot("tok_per_s", fig)
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(summ) + 1.5))
    ax.barh(y, summ.majflt_per_token, color="tab:red", alpha=0.8)
    ax.set_yticks(y, summ.run_id, fontsize=7)
    ax.set_xlabel("major faults per token (median)")
    w.plot("majflt_per_token", fig)


COLORS = {"io_wait": "tab:blue", "kernel": "tab:orange", "user": "tab:green", "hook": "tab:purple",
          "throttled": "tab:red", "runqueue": "tab:pink", "sync": "tab:brown",
          "unexplained": "lightgray", "between": "white"}


def attribution_plot(w, t: pd.DataFrame) -> None:
    """Per configuration, the mean steady token's wall time stacked by its parts."""
    from harness.analysis.attribution import BETWEEN, PARTS

    fig, ax = plt.subplots(figsize=(9, 0.35 * len(t) + 1.8))
    y = np.arange(len(t))
    left = np.zeros(len(t))
    for part in PARTS:
        vals = t[f"{part}_s"].clip(lower=0).to_numpy(float)
        ax.barh(y, vals, left=left, color=COLORS[part], label=part.replace("_", " "))
        left += vals
    # beyond the decode's wall time, outlined: the harness's work until the next decode, which
    # no tok/s counts (runs recorded before it was measured draw nothing)
    vals = t[f"{BETWEEN}_s"].fillna(0).clip(lower=0).to_numpy(float) if f"{BETWEEN}_s" in t \
        else np.zeros(len(t))
    ax.barh(y, vals, left=left, color=COLORS[BETWEEN], edgecolor="black", hatch="//",
            linewidth=0.5, label="harness, between decodes")
    labels = [f"{r} [{g}]" for r, g in zip(t.run_id, t.regime, strict=True)]
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xlabel("seconds per steady token (mean token, median of repeats)")
    ax.legend(fontsize=7, ncol=4, loc="lower right")
    w.plot("attribution", fig)


def routing_heatmap(matrix: np.ndarray):
    """Activations per layer (rows) and expert (columns) of a routing trace (finding 2)."""
    fig, ax = plt.subplots(figsize=(8, 3))
    im = ax.imshow(matrix, aspect="auto", cmap="viridis")
    ax.set_xlabel("expert")
    ax.set_ylabel("layer")
    fig.colorbar(im, ax=ax, label="activations")
    return fig


def locality(loc: pd.DataFrame):
    """Share of routed experts tokens t and t+d have in common, per d (finding 3)."""
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(loc.distance, loc.shared_fraction, marker="o")
    ax.set_xlabel("token distance d")
    ax.set_ylabel("shared routed experts")
    return fig


def cache_simulation(cs: pd.DataFrame):
    """Hit rate per cache size of each simulated policy (finding 3)."""
    fig, ax = plt.subplots(figsize=(6, 3))
    for pol, g in cs.groupby("policy"):
        ax.plot(g.cache_experts_per_layer, g.hit_rate, marker="o", label=pol)
    ax.set_xlabel("cache size (experts per layer)")
    ax.set_ylabel("hit rate")
    ax.legend()
    return fig


def policy_study(t: pd.DataFrame):
    """MB per window token each cache policy reads, per model (harness.analysis.policies)."""
    fig, ax = plt.subplots(figsize=(6, 3))
    models = list(dict.fromkeys(t.model))
    width = 0.8 / max(1, len(models))
    pols = list(dict.fromkeys(t.policy))
    for i, (model, g) in enumerate(t.groupby("model", sort=False)):
        g = g.set_index("policy").reindex(pols)
        ax.bar([j + i * width for j in range(len(pols))], g.mb_per_window_token, width, label=model)
    ax.set_xticks([j + width * (len(models) - 1) / 2 for j in range(len(pols))], pols)
    ax.set_ylabel("MB read per window token")
    ax.legend(fontsize=7)
    return fig


def time_breakdown(bd: dict):
    """The time breakdown's one bar (harness.analysis.breakdown)."""
    fig, ax = plt.subplots(figsize=(6, 2.2))
    left = 0.0
    for part, color in (("pread_s", "tab:orange"), ("compute_s", "tab:blue"),
                        ("madvise_s", "tab:green"), ("other_prefetch_s", "tab:gray")):
        val = float(bd[part])
        ax.barh([0], [val], left=left, color=color, label=part)
        left += val
    ax.set_yticks([])
    ax.set_xlabel("seconds per token (median)")
    ax.legend(fontsize=7, ncol=4)
    return fig
