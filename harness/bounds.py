"""What the box allows a run, known before any job: memory beside a cache of the run's own, and
the lengths of the paths a run id becomes.

harness.config checks every run against these in its one validation pass, so that a value the
box cannot hold is refused by `snakemake -n` naming its key and the bound, not hours into a study
by the OOM killer or by mkdir's ENAMETOOLONG.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

# The fewest bits per weight llama-quantize gives a non-expert tensor under each quant: the
# quant's own block type (a mixed quant such as Q4_K_M raises some tensors, never lowers one;
# norms stay F32). A lower bound, so a check built on it never refuses a value that fits. The
# reference's synthetic OLMoE files measure 5.15 (Q4_K_M: 306.8 MB) and 3.77 (Q2_K: 224.8 MB).
QUANT_MIN_BITS = {"Q2_K": 2.625, "Q4_0": 4.5, "Q4_K_M": 4.5, "Q5_K_M": 5.5, "Q6_K": 6.5625,
                  "Q8_0": 8.5, "F16": 16.0}

# What a run holds beside its own cache and the non-expert tensors: llama.cpp's context and
# compute buffers and the worker's interpreter. Measured in reference/vm-2026-12-06's
# odirect-cache@disk-box: RSS 1,679 MB with a 1,200 MiB (1,258 MB) cache and 307 MB of mlocked
# non-expert tensors leaves 114 MB; rounded up.
RUN_MARGIN_BYTES = 128 * 2**20

# bytes of a parameter value by its declared unit (harness.parameters): the mechanisms take
# their budgets in MiB
MEMORY_UNITS = {"MiB": 2**20}


def non_expert_bytes_at_least(model: dict) -> int:
    """The fewest bytes the model's non-expert tensors can take, from its config entry: a
    synthetic model's shape and quant; 0 where the file is not known before it is fetched."""
    if model.get("source") != "synthetic":
        return 0
    from harness.models.layout import is_expert_tensor
    from harness.models.synthetic import SHAPES, tensor_plan

    shape = SHAPES.get(model.get("shape"))
    if shape is None:
        return 0
    weights = sum(int(math.prod(s)) for n, s, _ in tensor_plan(shape) if not is_expert_tensor(n))
    return int(weights * QUANT_MIN_BITS.get(model.get("quant"), min(QUANT_MIN_BITS.values())) / 8)


def memory_left(ram_budget: int, model: dict) -> int:
    """Bytes a run's own cache may take under `ram_budget`: the budget less the model's
    non-expert tensors (at least) and RUN_MARGIN_BYTES."""
    return ram_budget - non_expert_bytes_at_least(model) - RUN_MARGIN_BYTES


# The longest paths a run id becomes, relative to the pipeline's working directory: its record
# directory (workflow/rules/runs.smk: rep<k>/ and rerun<k>/, k up to the repeats' bound of 20),
# the supervisor's work directory inside it (harness.run.supervise: .work-<pid>-<host>-<8>/,
# whose longest file is mechanism.csv.part), an atomic write's temporary beside the record
# (harness.util.atomic_path), and the run's log (logs/harness_run/<run id>/rerun<k>.log). A pid
# has at most 7 digits (pid_max is at most 2^22).
RUN_PATHS = (
    "results/runs/{run_id}/rerun20/.work-4194304-ffffffff-xxxxxxxx/mechanism.csv.part",
    "results/runs/{run_id}/rerun20/.tmp-4194304-ffffffff-run.incomplete.json.xxxxxxxx.tmp",
    "logs/harness_run/{run_id}/rerun20.log",
)


def name_limits(directory: Path) -> tuple[int, int]:
    """(longest file name, longest path) in bytes on the file system of `directory` (or of its
    nearest existing parent)."""
    d = Path(directory).absolute()
    while not d.exists():
        d = d.parent
    try:
        return os.pathconf(d, "PC_NAME_MAX"), os.pathconf(d, "PC_PATH_MAX")
    except (OSError, ValueError):
        return 255, 4096


def path_problem(run_id: str, workdir: Path, limits: tuple[int, int] | None = None) -> str:
    """Why `run_id` cannot become the paths a run makes under `workdir` ("" when it can)."""
    name_max, path_max = limits or name_limits(workdir)
    n = len(run_id.encode())
    if n > name_max:
        return (f"run id {run_id[:40]!r}... is {n} bytes; a directory name on this file system "
                f"is at most {name_max}")
    for template in RUN_PATHS:
        full = len(os.fsencode(Path(workdir).absolute() / template.format(run_id=run_id)))
        if full >= path_max:
            return (f"run id {run_id[:40]!r}... makes a path of {full} bytes under {workdir}; "
                    f"a path on this file system is under {path_max}")
    return ""
