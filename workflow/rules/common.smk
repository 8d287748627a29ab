# Helpers and input functions shared by the rules. The logic lives in the harness package.
import json
import os
import re
import shlex
import sys
from pathlib import Path

sys.path.insert(0, workflow.basedir)

# This process starts every job (a job's script runs under it, through a shell), and on a
# cluster each job's own Snakemake parses this file again: every measurement watches this pid and
# stops when it is gone (harness.box.measurelock.interruptible)
from harness.box.measurelock import mark_pipeline

mark_pipeline()

from harness.report import captions as plot_captions
from harness.report.compare import TABLES as COMPARED_TABLES
from harness.build.llama import build_identity
from harness.parameters import NOT_MEASURED
from harness.config import ConfigError, check, check_config_file, profile_run_defaults, study_profiles
from harness.profiles import profile_config
from harness.util import canonical
from harness.fleet import MachinesError, compare_trees

try:
    for _configfile in workflow.configfiles:
        check_config_file(_configfile)
    RUNS = {r.run_id: r for r in check(config)}
    COMPARE_TREES = compare_trees(config)
except (ConfigError, MachinesError) as exc:
    raise WorkflowError(str(exc)) from None

MODELS = config["models"]
REPEATS = {rid: r.repeats for rid, r in RUNS.items()}
MAX_REPEATS = max(REPEATS.values(), default=0)
RUN_DIRS = [f"results/runs/{rid}/rep{k}" for rid, n in REPEATS.items() for k in range(1, n + 1)]
RUN_MODELS = sorted({r.model for r in RUNS.values()})
BASELINE_MODELS = list(config["ceilings"]["baseline_models"])
# every MoE model the runs use besides ceilings.moe_model: each gets its own compute ceiling (the
# Q2_K ceiling is not the Q4_K_M one)
OTHER_MOE_MODELS = sorted(
    m for m in RUN_MODELS
    if m != config["ceilings"]["moe_model"] and MODELS[m].get("source") == "synthetic"
    and MODELS[m].get("shape", "").startswith("olmoe")
)
LAYOUT_MODELS = sorted(set(RUN_MODELS) | set(BASELINE_MODELS)
                       | {config["ceilings"]["dense_model"], config["ceilings"]["moe_model"]})
MANIFEST = "results/build/llama.json"
# What every measurement depends on of the build: the manifest itself is an ancient() input (its
# rewrite after a cache move re-measures nothing), and this identity is each one's param (a new
# commit, patch source or flag measures again)
BUILD_IDENTITY = build_identity(config["build"])
# the study's regimes: every experiment, ceiling and baseline is measured under each profile
PROFILES = study_profiles(config)
CPU_QUOTA = "results/ceilings/{profile}/cpu_quota.json"
IO_CEILING = "results/ceilings/{profile}/io.csv"
COMPUTE_CEILING = "results/ceilings/{profile}/compute.json"
BASELINE = "results/baselines/{profile}/{model}.json"

# On a cluster (profiles/slurm): every measurement job has its node to itself (exclusive) and,
# when the config names one, runs on the study's one node, so its numbers and the ceilings they
# are compared with come from one machine. Its memory request is Snakemake's default (twice its
# inputs, the model included: the page cache it fills is charged to the job where the cluster
# constrains memory). A local run ignores these resources.
CLUSTER = config.get("cluster") or {}
MEASUREMENT_RESOURCES = {
    "slurm_extra": " ".join(
        # the node's name is checked (harness.config); quoted too, as the plugin runs a shell
        ["--exclusive"] + ([f"--nodelist={shlex.quote(CLUSTER['node'])}"] if CLUSTER.get("node")
                           else [])
    ),
    **({"slurm_partition": CLUSTER["partition"]} if CLUSTER.get("partition") else {}),
}


# Aggregation and reports are cheap: they run where Snakemake runs, never as cluster jobs.
localrules:
    all,
    layout,
    verify_models,
    runs_table,
    flag_repeats,
    findings,
    final,
    compare,


wildcard_constraints:
    profile="|".join(map(re.escape, PROFILES)),
    model="|".join(map(re.escape, MODELS)) or "NONE",
    run_id="|".join(map(re.escape, RUNS)) or "NONE",
    k=r"\d+",


def all_cores(wildcards):
    """Every measurement takes the whole machine. A function, so that commands which run no job
    (--report, --lint, --unlock) need no --cores. Where the count is unknown (a cluster executor
    submitting jobs) it is the profile's threads: the CPUs a measurement uses, which the job
    requests and then, inside its allocation, finds as its cores."""
    try:
        return workflow.cores
    except WorkflowError:
        return max(int(config["profiles"][p].get("threads") or 1) for p in PROFILES)


def synthetic_f16_input(wildcards):
    """A synthetic model is quantized from its shape's F16; other sources have no input."""
    m = MODELS[wildcards.model]
    if m["source"] != "synthetic":
        return []
    return f"results/models/f16/{m['shape']}-seed{m.get('seed', 1)}.gguf"


def all_run_records(wildcards):
    return [f"{d}/run.json" for d in RUN_DIRS]


def records_with_reruns(wildcards):
    """Every run record, and the re-run of each disturbed repeat (checkpoint flag_repeats)."""
    flagged = json.loads(Path(checkpoints.flag_repeats.get().output[0]).read_text())
    return all_run_records(wildcards) + [
        f"results/runs/{f['run_id']}/rerun{f['repeat']}/run.json" for f in flagged["rerun"]
    ]


def model_spec(wildcards):
    return canonical(MODELS[wildcards.model])


def run_spec(wildcards):
    """The run's spec as a param, less what does not change what it measures (its entry's
    repeats and time limit, NOT_MEASURED): raising `repeats` plans only the new repeats. The
    script reads those two from the config."""
    return {k: v for k, v in RUNS[wildcards.run_id].as_dict().items() if k not in NOT_MEASURED}


def profile_params(wildcards):
    """Only the profile a measurement runs under goes into its params: editing experiments or
    another profile must not re-trigger its ceilings or finished runs (params provenance)."""
    return profile_config(config, wildcards.profile)


def moe_wait_policies(wildcards):
    """The OpenMP wait policies of the profile's runs, as written (`auto` is resolved against the
    calibrated quota by the script): every MoE quant's compute ceiling is measured under each,
    and the floor takes the fastest."""
    return sorted({r.omp_wait_policy for r in RUNS.values() if r.profile == wildcards.profile})


def baseline_tokens(profile):
    """The stock baseline's -n: ceilings.baseline_tokens, else what the profile's runs decode."""
    return (config["ceilings"].get("baseline_tokens")
            or profile_run_defaults(config, profile)["tokens"])


def run_profile_params(wildcards):
    return profile_config(config, RUNS[wildcards.run_id].profile)


def run_cpu_quota(wildcards):
    return CPU_QUOTA.format(profile=RUNS[wildcards.run_id].profile)


def calibration_inputs(wildcards):
    """What a profile's CPU calibration measures: the dense model for a compute target, the MoE
    model (file, layout, info) for an I/O-share target, nothing for a fixed or absent quota."""
    prof = config["profiles"][wildcards.profile]
    if prof.get("cpu_quota") is not None:
        return {}
    if prof.get("compute_target_tok_s") is not None:
        return {"dense": "results/models/{}.gguf".format(config["ceilings"]["dense_model"])}
    if prof.get("io_share_target") is not None:
        moe = config["ceilings"]["moe_model"]
        return {"moe": f"results/models/{moe}.gguf", "moe_info": f"results/models/{moe}.json",
                "moe_layout": f"results/models/{moe}.layout.json"}
    return {}


def all_io_ceilings(wildcards):
    return expand(IO_CEILING, profile=PROFILES)


def all_compute_ceilings(wildcards):
    return expand(COMPUTE_CEILING, profile=PROFILES)


def all_cpu_quotas(wildcards):
    return expand(CPU_QUOTA, profile=PROFILES)


def all_baselines(wildcards):
    return expand(BASELINE, profile=PROFILES, model=BASELINE_MODELS)


def run_model_file(wildcards):
    return f"results/models/{RUNS[wildcards.run_id].model}.gguf"


def run_model_info(wildcards):
    return f"results/models/{RUNS[wildcards.run_id].model}.json"


def run_model_layout(wildcards):
    return f"results/models/{RUNS[wildcards.run_id].model}.layout.json"


def compare_inputs(wildcards):
    """This machine's finished tree (built by rule final) and the files of every other tree, named
    under `compare:` or a machine's under `machines:` (finished elsewhere: never re-run here)."""
    out = []
    for root in COMPARE_TREES.values():
        if os.path.normpath(root) == "results":
            out.append(rules.final.output[0])
        else:
            out += [f"{root}/final/runs.csv"] + [
                f"{root}/final/tables/{t}.csv" for t in COMPARED_TABLES
            ]
    return out

