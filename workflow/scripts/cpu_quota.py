from harness.util import log_to

log_to(snakemake.log[0])

import sys

import json
from pathlib import Path

from harness.box import pagecache
from harness.stages.calibrate import calibrate
from harness.stages.ceilings import io_share_calibration
from harness.stages.ceilings import llama_bench
from harness.profiles import profile_limits
from harness.models.staging import staged_model
from harness.util import utcnow
from harness.util import atomic_write_json

cfg = snakemake.params.config
prof = cfg["profiles"][cfg["profile"]]
manifest = json.loads(Path(snakemake.input.manifest).read_text())
out = {"profile": cfg["profile"], "start_utc": utcnow()}
if prof.get("cpu_quota") is not None:
    out.update(cpu_quota=prof["cpu_quota"], how="fixed by the profile")
elif prof.get("compute_target_tok_s") is None and prof.get("io_share_target") is not None:
    moe = staged_model(snakemake.input.moe, snakemake.config)
    out.update(io_share_calibration(
        cfg, manifest, moe, json.loads(Path(snakemake.input.moe_info).read_text()),
        snakemake.input.moe_layout, prof["io_share_target"], prompt=snakemake.params.prompt),
        moe_model=snakemake.params.moe_model, measured_from=moe,
        how="calibrated: I/O-wait share of pread+madvise+mlock on the MoE model, cold, under the "
            "profile (harness.analysis.attribution)")
    if out.get("cpu_quota") is not None and not out["within_tolerance"]:
        sys.exit(f"cpu_quota: no quota brings the I/O share within {out['tolerance']} of "
                 f"{out['io_share_target']} (closest {out['io_share_at_quota']:.3f} at "
                 f"{out['cpu_quota']:.4f} CPUs; steps in {snakemake.log[0]}); set cpu_quota in "
                 "the profile to fix one by hand")
elif prof.get("compute_target_tok_s") is None:
    out.update(cpu_quota=None, how="no CPU limit in the profile")
else:
    dense = staged_model(snakemake.input.dense, snakemake.config)
    out.update(dense_model=snakemake.params.dense_model, measured_from=dense)
    pagecache.warm(dense)

    def measure(quota):
        rec = llama_bench(manifest["llama_bench"], dense, prof["threads"],
                          snakemake.params.tokens, "mmap",
                          profile_limits(cfg, dense, cpu_quota=quota),
                          manifest["lib_dir"], sys.stderr)
        return rec["tok_per_s"]

    out.update(calibrate(measure, prof["compute_target_tok_s"], cpus=prof["threads"]),
               how="calibrated: llama-bench decode of the dense model, warm, under the profile")
    if out.get("cpu_quota") is not None and not out["within_tolerance"]:
        # every measurement of the study would run under a quota that is not the profile's box
        sys.exit(f"cpu_quota: no quota brings the dense model within {out['tolerance']:.0%} of "
                 f"{out['target_tok_s']} tok/s (closest {out['tok_per_s_at_quota']:.3f} at "
                 f"{out['cpu_quota']:.4f} CPUs; steps in {snakemake.log[0]}); set cpu_quota in "
                 "the profile to fix one by hand")
out["end_utc"] = utcnow()
atomic_write_json(snakemake.output[0], out)
