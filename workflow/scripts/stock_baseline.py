from harness.util import log_to

log_to(snakemake.log[0])

import sys

import json
from pathlib import Path

from harness.box import pagecache
from harness.stages.ceilings import llama_bench
from harness.profiles import cpu_quota_of, profile_limits
from harness.models.staging import staged_model
from harness.util import atomic_write_json

cfg = snakemake.params.config
manifest = json.loads(Path(snakemake.input.manifest).read_text())
threads = cfg["profiles"][cfg["profile"]]["threads"]
gguf = staged_model(snakemake.input.gguf, snakemake.config)
limits = profile_limits(cfg, gguf, cpu_quota=cpu_quota_of(snakemake.input.quota))
records = []
# What a user would run instead of the harness. By default llama-bench repacks Q4_K weights into
# anonymous memory, which a RAM budget under the model cannot hold (measured: OOM-killed at 1.7 GiB
# with Q4_K_M, 986 MB peak with --repack 0), so the repack-off run is the fair stock baseline.
for mode, extra in (("mmap", ()), ("mmap", ("--repack", "0")), ("dio", ())):
    before, after = pagecache.cold_start(gguf)
    rec = llama_bench(manifest["llama_bench"], gguf, threads, snakemake.params.tokens,
                      mode, limits, manifest["lib_dir"], sys.stderr, extra)
    rec.update(residency_before=before, residency_at_start=after, model=snakemake.wildcards.model)
    records.append(rec)
atomic_write_json(snakemake.output[0], {"model": snakemake.wildcards.model, "runs": records})
