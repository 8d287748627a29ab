# Stage 3: the machine's I/O and compute ceilings and the stock llama-bench baselines, each under
# the profile's kernel limits. Every measurement takes all cores so nothing runs beside it.


rule cpu_quota:
    input:
        unpack(calibration_inputs),
        manifest=ancient(MANIFEST),
    output:
        CPU_QUOTA,
    params:
        build=BUILD_IDENTITY,
        tokens=config["ceilings"]["bench_tokens"],
        config=profile_params,
        dense_model=config["ceilings"]["dense_model"],
        moe_model=config["ceilings"]["moe_model"],
        prompt=config["defaults"]["prompt"],
    log:
        "logs/cpu_quota/{profile}.log",
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
        # the random reads are one expert slab of the MoE model each
        moe_layout=f"results/models/{config['ceilings']['moe_model']}.layout.json",
        quota=CPU_QUOTA,
    output:
        report(
            IO_CEILING,
            caption="../report/io_ceiling.rst",
            category="4. Ceilings",
            labels={"ceiling": "I/O", "profile": "{profile}"},
        ),
    params:
        samples=config["ceilings"]["io_samples_mib"],
        random_mib=config["ceilings"]["random_read_mib"],
        queue_depths=config["ceilings"]["random_queue_depths"],
        config=profile_params,
    log:
        "logs/io_ceiling/{profile}.log",
    conda:
        "../../envs/pipeline.yaml"
    threads: all_cores
    resources:
        **MEASUREMENT_RESOURCES,
    script:
        "../scripts/io_ceiling.py"


rule compute_ceiling:
    input:
        manifest=ancient(MANIFEST),
        quota=CPU_QUOTA,
        dense="results/models/{}.gguf".format(config["ceilings"]["dense_model"]),
        moe="results/models/{}.gguf".format(config["ceilings"]["moe_model"]),
        other_moe=expand("results/models/{model}.gguf", model=OTHER_MOE_MODELS),
    output:
        COMPUTE_CEILING,
    params:
        build=BUILD_IDENTITY,
        tokens=config["ceilings"]["bench_tokens"],
        config=profile_params,
        dense_model=config["ceilings"]["dense_model"],
        moe_model=config["ceilings"]["moe_model"],
        other_moe_models=OTHER_MOE_MODELS,
        wait_policies=moe_wait_policies,
        repetitions=config["ceilings"].get("bench_repetitions", 1),
    log:
        "logs/compute_ceiling/{profile}.log",
    conda:
        "../../envs/pipeline.yaml"
    threads: all_cores
    resources:
        **MEASUREMENT_RESOURCES,
    script:
        "../scripts/compute_ceiling.py"


rule stock_baseline:
    input:
        manifest=ancient(MANIFEST),
        quota=CPU_QUOTA,
        gguf="results/models/{model}.gguf",
    output:
        BASELINE,
    params:
        build=BUILD_IDENTITY,
        # as many tokens as the harness runs decode, so the stock tool is compared like for like
        tokens=lambda wildcards: baseline_tokens(wildcards.profile),
        config=profile_params,
    log:
        "logs/stock_baseline/{profile}/{model}.log",
    conda:
        "../../envs/pipeline.yaml"
    threads: all_cores
    resources:
        **MEASUREMENT_RESOURCES,
    script:
        "../scripts/stock_baseline.py"
