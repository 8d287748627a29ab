# Stage 3: the machine's I/O and compute ceilings and the stock llama-bench baselines, each under
# the profile's kernel limits. Every measurement takes all cores so nothing runs beside it.


rule cpu_quota:
    input:
        manifest=MANIFEST,
        dense="results/models/{}.gguf".format(config["ceilings"]["dense_model"]),
    output:
        CPU_QUOTA,
    params:
        tokens=config["ceilings"]["bench_tokens"],
        config=PROFILE_CONFIG,
        dense_model=config["ceilings"]["dense_model"],
    log:
        "logs/cpu_quota.log",
    conda:
        "../../envs/pipeline.yaml"
    threads: all_cores
    resources:
        **MEASUREMENT_RESOURCES,
    script:
        "../scripts/cpu_quota.py"


rule io_ceiling:
    input:
        models=expand("results/models/{model}.json", model=LAYOUT_MODELS),
        quota=CPU_QUOTA,
    output:
        report(
            "results/ceilings/io.csv",
            caption="../report/io_ceiling.rst",
            category="Ceilings",
            labels={"ceiling": "I/O"},
        ),
    params:
        samples=config["ceilings"]["io_samples_mib"],
        config=PROFILE_CONFIG,
    log:
        "logs/io_ceiling.log",
    conda:
        "../../envs/pipeline.yaml"
    threads: all_cores
    resources:
        **MEASUREMENT_RESOURCES,
    script:
        "../scripts/io_ceiling.py"


rule compute_ceiling:
    input:
        manifest=MANIFEST,
        quota=CPU_QUOTA,
        dense="results/models/{}.gguf".format(config["ceilings"]["dense_model"]),
        moe="results/models/{}.gguf".format(config["ceilings"]["moe_model"]),
    output:
        "results/ceilings/compute.json",
    params:
        tokens=config["ceilings"]["bench_tokens"],
        config=PROFILE_CONFIG,
        dense_model=config["ceilings"]["dense_model"],
        moe_model=config["ceilings"]["moe_model"],
    log:
        "logs/compute_ceiling.log",
    conda:
        "../../envs/pipeline.yaml"
    threads: all_cores
    resources:
        **MEASUREMENT_RESOURCES,
    script:
        "../scripts/compute_ceiling.py"


rule stock_baseline:
    input:
        manifest=MANIFEST,
        quota=CPU_QUOTA,
        gguf="results/models/{model}.gguf",
    output:
        "results/baselines/{model}.json",
    params:
        # as many tokens as the harness runs decode, so the stock tool is compared like for like
        tokens=config["ceilings"].get("baseline_tokens") or config["defaults"]["tokens"],
        config=PROFILE_CONFIG,
    log:
        "logs/stock_baseline/{model}.log",
    conda:
        "../../envs/pipeline.yaml"
    threads: all_cores
    resources:
        **MEASUREMENT_RESOURCES,
    script:
        "../scripts/stock_baseline.py"
