# Stage 4: every harness configuration, each repeat a fresh process after a cold start, inside a
# fresh cgroup with the profile's limits.
#
# Repeats are interleaved across configurations (A B C A B C) through scheduling priority, not
# through data dependencies: one rule per repeat round, earlier rounds first. (An order-only input
# would make adding an entry re-run every later round.) Models and layouts have a higher priority
# still, so every run's inputs exist before the first measurement starts.

for _round in range(1, MAX_REPEATS + 1):

    rule:
        name:
            f"harness_run_rep{_round}"
        input:
            manifest=ancient(MANIFEST),
            quota=run_cpu_quota,
            model=run_model_file,
            info=run_model_info,
            layout=run_model_layout,
        output:
            record=f"results/runs/{{run_id}}/rep{_round}/run.json",
            tokens=f"results/runs/{{run_id}}/rep{_round}/tokens.csv",
            experts=f"results/runs/{{run_id}}/rep{_round}/experts.csv",
        params:
            build=BUILD_IDENTITY,
            spec=run_spec,
            repeat=_round,
            config=run_profile_params,
        log:
            f"logs/harness_run/{{run_id}}/rep{_round}.log",
        conda:
            "../../envs/pipeline.yaml"
        priority: MAX_REPEATS - _round + 1
        threads: all_cores
        resources:
            **MEASUREMENT_RESOURCES,
        script:
            "../scripts/harness_run.py"


# A repeat the machine disturbed (harness.analysis.flags.flag_reason) is measured once more, after every
# round: the re-run replaces it in the verdicts unless it is disturbed too (then neither counts).
checkpoint flag_repeats:
    input:
        records=all_run_records,
    output:
        "results/analysis/disturbed.json",
    params:
        rerun=config.get("rerun_disturbed", True),
    log:
        "logs/flag_repeats.log",
    conda:
        "../../envs/pipeline.yaml"
    script:
        "../scripts/flag_repeats.py"


rule harness_rerun:
    input:
        manifest=ancient(MANIFEST),
        quota=run_cpu_quota,
        model=run_model_file,
        info=run_model_info,
        layout=run_model_layout,
        # ancient: a new record rewrites disturbed.json, which must not re-measure finished
        # re-runs; each re-run is keyed by the repeat it replaces (its {k})
        flagged=ancient("results/analysis/disturbed.json"),
    output:
        record="results/runs/{run_id}/rerun{k}/run.json",
        tokens="results/runs/{run_id}/rerun{k}/tokens.csv",
        experts="results/runs/{run_id}/rerun{k}/experts.csv",
    params:
        build=BUILD_IDENTITY,
        spec=run_spec,
        repeat=lambda wildcards: int(wildcards.k),
        config=run_profile_params,
        rerun=True,
    log:
        "logs/harness_run/{run_id}/rerun{k}.log",
    conda:
        "../../envs/pipeline.yaml"
    priority: 0
    threads: all_cores
    resources:
        **MEASUREMENT_RESOURCES,
    script:
        "../scripts/harness_run.py"
