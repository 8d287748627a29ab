"""How per-token time and bytes read settle over a long decode, per regime: the data the steady
window (warm-up tokens, measured tokens) is chosen from (docs/benchmarks.md, "Settling").

    .venv/bin/python benchmarks/settling.py OUT [--tokens 96] [--repeats 2] [--warmup W]
        [--only ID@PROFILE,...]
    .venv/bin/python benchmarks/settling.py OUT --analyse   # the curves, the window, its table

Runs, with the pipeline's own supervisor and worker, each configuration named in CONFIGS under
each regime of config/experiments.yaml, cold, in a fresh cgroup with the profile's limits and
the CPU quota the pipeline calibrated (results/ceilings/<profile>/cpu_quota.json), for `--tokens`
generated tokens. Every repeat round runs all configurations of both regimes before the next
round starts, so a session cut short still has one repeat of each. A finished run (its run.json)
is not measured again: the script resumes where it stopped. Each run keeps run.json, tokens.csv,
experts.csv (the routing trace a window's floor is computed from) and worker.log under
OUT/<run_id>/rep<k>/.

Needs what `snakemake --cores 2 results/ceilings/<profile>/cpu_quota.json` makes for every
profile (the build, the models and their layouts, the calibrated quotas); measure on a quiet box.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml
from fullsize import build_manifest

from harness.config import expand
from harness.profiles import cpu_quota_of, profile_limits
from harness.run import supervise

# run ids of config/experiments.yaml (before `@<profile>`): the study's best (pread+madvise with
# the non-expert tensors mlocked), demand paging, odirect-cache, the expert cache and the LRU at
# its largest swept budget; and per regime its own best of the reference run where that is
# another one
CONFIGS = {"seed-box": ["pread-madvise-mlock", "baseline", "odirect-cache", "expert-cache",
                        "lru--lru-budget-mb-900"],
           "disk-box": ["pread-madvise-mlock", "baseline", "odirect-cache", "expert-cache",
                        "lru--lru-budget-mb-900", "madvise"]}


def specs(config: dict, tokens: int, warmup: int | None = None, only: list | None = None) -> list:
    """(profile, RunSpec) of every configuration measured (or of the run ids `only`), in run
    order within a round; `warmup` sets their warm-up tokens (default: the config's)."""
    by_id = {r.run_id: r for r in expand(config)}
    out = []
    for profile, ids in CONFIGS.items():
        for rid in ids:
            if only and f"{rid}@{profile}" not in only:
                continue
            r = by_id[f"{rid}@{profile}"]
            # long runs: the reference's 1800 s limit would stop the slowest
            r = dataclasses.replace(r, tokens=tokens, time_limit_s=3 * 3600)
            out.append((profile, r if warmup is None else
                        dataclasses.replace(r, warmup_tokens=warmup)))
    return out


def load(out: Path) -> dict:
    """(profile, configuration) -> list of each finished repeat's generated-token rows."""
    import pandas as pd

    curves: dict = {}
    for rec in sorted(out.glob("*/rep*/run.json")):
        tok = pd.read_csv(rec.parent / "tokens.csv")
        gen = tok[tok.phase == "gen"].reset_index(drop=True)
        rid = rec.parent.parent.name
        config, profile = rid.split("@")
        curves.setdefault((profile, config), []).append(gen)
    return curves


def analyse(out: Path, proposed: tuple[int, int] | None = None) -> None:
    """The settling curves (a plot beside the runs), the window chosen per regime and for both,
    and each configuration's figure over it: printed as Markdown for docs/benchmarks.md."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from harness.analysis import steady

    curves = load(out)
    profiles = sorted({p for p, _ in curves})
    fig, axes = plt.subplots(2, len(profiles), figsize=(6 * len(profiles), 7), squeeze=False)
    for j, profile in enumerate(profiles):
        for (p, config), gens in sorted(curves.items()):
            if p != profile:
                continue
            for k, g in enumerate(gens):
                kw = {"label": config if k == 0 else None, "alpha": 0.8}
                line = axes[0][j].plot(g["index"], g.wall_s, lw=1, **kw)[0]
                axes[1][j].plot(g["index"], g.cgroup_read_bytes / 1e6, lw=1,
                                color=line.get_color(), alpha=0.8)
        axes[0][j].set_title(f"{profile}: wall time per generated token")
        axes[0][j].set_ylabel("s")
        axes[1][j].set_title(f"{profile}: bytes the run's cgroup read per token")
        axes[1][j].set_ylabel("MB")
        axes[1][j].set_xlabel("generated token (0: the first)")
        axes[0][j].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "settling.png", dpi=100)
    print(f"![settling curves]({out.name}/settling.png)\n")
    max_tokens = min(len(g) for gens in curves.values() for g in gens)
    chosen = {}
    for scope in [*profiles, "both"]:
        sel = {f"{c}@{p}": [g.wall_s.to_numpy() for g in gens] for (p, c), gens in curves.items()
               if scope in ("both", p)}
        window, table = steady.choose_window(sel, max_tokens)
        chosen[scope] = window
        print(f"- {scope}: " + (f"warm-up {window.warmup} tokens (the first among them), measure "
                                f"{window.length} (a run decodes {window.tokens})"
                                if window else "no window of these runs' length moves by less "
                                f"than {steady.DOUBLING_TOLERANCE:.0%} when doubled"))
        judged = table[table.warmup <= steady.STARTS_JUDGED]
        for length in (8, 16, 24, 28, 32, 40):
            sub = judged[judged.length == length]
            if len(sub):
                print(f"  - measuring {length}: passes from {sub.passes.mean():.0%} of the "
                      f"warm-ups 1-{steady.STARTS_JUDGED}; worst change, median "
                      f"{sub.worst_change.median():.1%}, 90th percentile "
                      f"{sub.worst_change.quantile(0.9):.1%}")
    window = steady.Window(*proposed) if proposed else chosen.get("both")
    if proposed:
        print(f"\nThe window evaluated below: warm-up {window.warmup}, measure {window.length}.")
    print("\n| regime | configuration | repeat | tokens 1-5 tok/s | "
          + (f"window tok/s ({window.warmup + 1}-{window.tokens}) | doubled | drift |"
             if window else "") + " MB read/token in window |")
    print("|---|---|---|---|" + ("---|---|---|" if window else "") + "---|")
    for (p, c), gens in sorted(curves.items()):
        for k, g in enumerate(gens, 1):
            w = g.wall_s.to_numpy()
            row = f"| {p} | {c} | {k} | {steady.window_rate(w, 1, 5):.3f} |"
            if window:
                d = steady.drift(w[window.warmup:window.tokens])
                row += (f" {steady.window_rate(w, window.warmup, window.length):.3f} | "
                        f"{steady.doubling_change(w, window.warmup, window.length):.1%} | "
                        f"{d.change:+.0%} ({d.low:+.0%} to {d.high:+.0%}) |")
                mb = g.cgroup_read_bytes.to_numpy()[window.warmup:window.tokens]
            else:
                mb = g.cgroup_read_bytes.to_numpy()[1:]
            print(row + f" {np.mean(mb) / 1e6:.1f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--config", type=Path, default=ROOT / "config/experiments.yaml")
    ap.add_argument("--analyse", action="store_true", help="analyse the finished runs in OUT")
    ap.add_argument("--window", help="WARMUP,LENGTH: evaluate this window in the table")
    ap.add_argument("--warmup", type=int, help="the runs' warm-up tokens (default: the config's)")
    ap.add_argument("--only", help="comma-separated run ids (<id>@<profile>) of CONFIGS to run")
    a = ap.parse_args()
    if a.analyse:
        analyse(a.out, tuple(int(x) for x in a.window.split(",")) if a.window else None)
        return 0
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s")
    config = yaml.safe_load(a.config.read_text())
    manifest = build_manifest()
    plan = specs(config, a.tokens, a.warmup, a.only.split(",") if a.only else None)
    total, done = a.repeats * len(plan), 0
    t_start = time.monotonic()
    for k in range(1, a.repeats + 1):
        for profile, r in plan:
            out = a.out / r.run_id / f"rep{k}"
            done += 1
            if (out / "run.json").exists():
                continue
            model = ROOT / "results/models" / f"{r.model}.gguf"
            info = json.loads(model.with_suffix(".json").read_text())
            quota = cpu_quota_of(str(ROOT / f"results/ceilings/{profile}/cpu_quota.json"))
            limits = profile_limits(config, info["path"], cpu_quota=quota, profile=profile)
            spec = {**r.as_dict(), "repeat": k}
            logging.info(f"settling: run {done} of {total}: {r.run_id} rep {k} "
                         f"({a.tokens} tokens, quota {quota}), {time.monotonic() - t_start:.0f} s in")
            supervise.run(spec, out, lib_dir=manifest["lib_dir"], build=manifest, model_info=info,
                          layout_path=str(model.with_name(model.stem + ".layout.json")),
                          limits=limits, time_limit_s=spec["time_limit_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
