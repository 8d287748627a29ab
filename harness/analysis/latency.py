"""Per configuration: time to first token, prompt processing and the measured window's
per-token latency percentiles over every ok repeat's tokens (RESULTS.md's latency table; the
llama-bench export uses the same pieces per run)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from harness import parameters
from harness.record import measured_window

PERCENTILES = (50, 90, 99)


def generated(record_path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A run's prompt row and generated-token rows (tokens.csv beside its record)."""
    tok = pd.read_csv(Path(record_path).parent / "tokens.csv")
    return tok[tok.phase == "prompt"], tok[tok.phase == "gen"]


def ttft(prompt: pd.DataFrame, gen: pd.DataFrame) -> float | None:
    """Time to first token: the prompt's decode and the first generated token's."""
    if gen.empty:
        return None
    return float(prompt.wall_s.sum() + gen.wall_s.iloc[0])


def latency_table(runs: pd.DataFrame, root: Path) -> pd.DataFrame:
    """Per configuration: time to first token, prompt tok/s and the measured window's latency
    percentiles over every ok repeat's tokens."""
    rows = []
    for run_id, g in runs[runs.status == "ok"].groupby("run_id", sort=False):
        lat, firsts, pp = [], [], []
        # a runs table older than the parameter: its runs took the declared default
        default = parameters.BY_NAME["warmup_tokens"].default
        warmup = g.warmup_tokens.fillna(default) if "warmup_tokens" in g else [default] * len(g)
        for rec, w in zip(g.record, warmup, strict=True):
            prompt, gen = generated(root / rec)
            lat += list(measured_window(gen, int(w)).wall_s)
            if (t := ttft(prompt, gen)) is not None:
                firsts.append(t)
            if len(prompt) and prompt.wall_s.sum() > 0:
                pp.append(prompt.n_tokens.sum() / prompt.wall_s.sum())
        lat = np.asarray(lat, float)
        rows.append({"run_id": run_id, "repeats": len(g), "tokens": len(lat),
                     "ttft_s_median": float(np.median(firsts)) if firsts else None,
                     "prompt_tok_per_s_median": float(np.median(pp)) if pp else None,
                     **{f"latency_p{p}_s": float(np.percentile(lat, p)) if len(lat) else None
                        for p in PERCENTILES}})
    return pd.DataFrame(rows)
