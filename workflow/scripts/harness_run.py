from harness.util import log_to

log_to(snakemake.log[0])

import logging
import json
from pathlib import Path

from harness.box import measurelock
from harness.run import progress, supervise
from harness.config import check
from harness.profiles import cpu_quota_of, profile_limits
from harness.models.staging import staged_info

manifest = json.loads(Path(snakemake.input.manifest).read_text())
# on a cluster, the copy on the node's own disk (cluster.local_dir) is what is measured
with measurelock.interruptible():  # a copy to the node's disk dies with Snakemake too
    info = staged_info(json.loads(Path(snakemake.input.info).read_text()), snakemake.config)
rerun = bool(snakemake.params.get("rerun", False))
runs = check(snakemake.config)
# the whole spec from the config: the rule's param spec (what re-runs a repeat when it changes)
# leaves out what does not change the measurement, repeats and the time limit
configured = next(r for r in runs if r.run_id == snakemake.wildcards.run_id).as_dict()
spec = {**configured, "repeat": snakemake.params.repeat,
        "profile": snakemake.params.config["profile"], "rerun": rerun}
if rerun:
    logging.info(f"re-run of disturbed repeat {snakemake.params.repeat} of "
                 f"{snakemake.wildcards.run_id} (results/analysis/disturbed.json says why)")
else:
    # which run of how many, and the time the study's runs have left (read from the config, not
    # passed as params: adding an entry must not re-run finished runs)
    run_dirs = [f"results/runs/{r.run_id}/rep{k}" for r in runs for k in range(1, r.repeats + 1)]
    logging.info(progress.line(run_dirs, str(Path(snakemake.output.record).parent)))
supervise.run(spec, Path(snakemake.output.record).parent, lib_dir=manifest["lib_dir"], build=manifest,
              model_info=info, layout_path=snakemake.input.layout,
              limits=profile_limits(snakemake.params.config, info["path"],
                                   cpu_quota=cpu_quota_of(snakemake.input.quota)),
              time_limit_s=spec["time_limit_s"])
