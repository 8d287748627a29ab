from harness.util import log_to

log_to(snakemake.log[0])

import sys

import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from harness.report.export import write_jsonl

# results/final is the user-facing copy of results/analysis; assembled aside, renamed into place
src = Path(snakemake.input.results).parent
dst = Path(snakemake.output[0])
tmp = Path(tempfile.mkdtemp(prefix=".final-", dir=dst.parent))
for name in ("RESULTS.md", "runs.csv", "tables", "plots"):
    (shutil.copytree if (src / name).is_dir() else shutil.copy2)(src / name, tmp / name)
# the same runs as llama-bench's JSON Lines records, for the tools that read those
n = write_jsonl(pd.read_csv(snakemake.input.runs), Path("."), tmp / "llama-bench.jsonl")
print(f"llama-bench.jsonl: {n} records", file=sys.stderr)
shutil.rmtree(dst, ignore_errors=True)
os.replace(tmp, dst)
print(f"results/final assembled from {src}", file=sys.stderr)
