# Stage 2: the GGUF quants (synthetic, downloaded or local) and their byte layouts.


rule synthetic_f16:
    input:
        manifest=ancient(MANIFEST),
    output:
        temp("results/models/f16/{shape}-seed{seed}.gguf"),
    params:
        build=BUILD_IDENTITY,
    priority: 100
    log:
        "logs/synthetic_f16/{shape}-seed{seed}.log",
    conda:
        "../../envs/pipeline.yaml"
    threads: all_cores
    script:
        "../scripts/synthetic_f16.py"


rule model:
    input:
        manifest=ancient(MANIFEST),
        f16=synthetic_f16_input,
    output:
        gguf="results/models/{model}.gguf",
        info="results/models/{model}.json",
    params:
        build=BUILD_IDENTITY,
        spec=model_spec,
    priority: 100
    log:
        "logs/model/{model}.log",
    conda:
        "../../envs/pipeline.yaml"
    threads: all_cores
    script:
        "../scripts/model.py"


rule layout:
    input:
        gguf="results/models/{model}.gguf",
    output:
        "results/models/{model}.layout.json",
    priority: 100
    log:
        "logs/layout/{model}.log",
    conda:
        "../../envs/pipeline.yaml"
    script:
        "../scripts/layout.py"
