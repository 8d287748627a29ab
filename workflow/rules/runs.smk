# Stage 4: every harness configuration, each repeat a fresh process after a cold start, inside a
# fresh cgroup with the profile's limits. Repeats are interleaved across configurations.


rule harness_run:
    output:
        record="results/runs/{run_id}/rep{rep}/run.json",
        tokens="results/runs/{run_id}/rep{rep}/tokens.csv",
        experts="results/runs/{run_id}/rep{rep}/experts.csv",
    input:
        manifest=MANIFEST,
        model=run_model_file,
        info=run_model_info,
        layout=run_model_layout,
        order=previous_round,
    params:
        spec=run_spec,
        config=config,
    log:
        "logs/harness_run/{run_id}/rep{rep}.log",
    threads: workflow.cores
    script:
        "../scripts/harness_run.py"
