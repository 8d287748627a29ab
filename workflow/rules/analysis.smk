# Stage 5: one table of every run, the analyses of the findings, plots and RESULTS.md.


rule runs_table:
    input:
        records=records_with_reruns,
    output:
        report(
            "results/analysis/runs.csv",
            caption="../report/runs.rst",
            category="3. Tables",
            labels={"table": "runs"},
        ),
    log:
        "logs/runs_table.log",
    conda:
        "../../envs/pipeline.yaml"
    script:
        "../scripts/runs_table.py"


rule findings:
    input:
        runs="results/analysis/runs.csv",
        records=records_with_reruns,
        io=all_io_ceilings,
        compute=all_compute_ceilings,
        quota=all_cpu_quotas,
        baselines=all_baselines,
        layouts=expand("results/models/{model}.layout.json", model=LAYOUT_MODELS),
        infos=expand("results/models/{model}.json", model=LAYOUT_MODELS),
    output:
        results="results/analysis/RESULTS.md",
        tables=directory("results/analysis/tables"),
        plots=report(
            directory("results/analysis/plots"),
            patterns=["{name}.png"],
            caption="../report/plots.rst",
            category=plot_captions.report_category,
            labels={"plot": "{name}"},
        ),
    params:
        config=config,
        captions=plot_captions.PLOTS,
    log:
        "logs/findings.log",
    conda:
        "../../envs/pipeline.yaml"
    script:
        "../scripts/findings.py"


rule verify_models:
    input:
        # after the study's last run: runs check a model's identity, this reads its bytes
        records=records_with_reruns,
        infos=expand("results/models/{model}.json", model=RUN_MODELS),
    output:
        "results/analysis/models_verified.json",
    log:
        "logs/verify_models.log",
    conda:
        "../../envs/pipeline.yaml"
    script:
        "../scripts/verify_models.py"


rule final:
    input:
        verified=rules.verify_models.output[0],
        results=rules.findings.output.results,
        tables=rules.findings.output.tables,
        plots=rules.findings.output.plots,
        runs=rules.runs_table.output[0],
    output:
        directory("results/final"),
    log:
        "logs/final.log",
    conda:
        "../../envs/pipeline.yaml"
    script:
        "../scripts/final.py"


rule compare:
    input:
        compare_inputs,
    output:
        directory("results/compare"),
    params:
        machines=COMPARE_TREES,
    log:
        "logs/compare.log",
    conda:
        "../../envs/pipeline.yaml"
    script:
        "../scripts/compare.py"
