# Stage 2: the GGUF quants (synthetic, downloaded or local) and their byte layouts.


rule synthetic_f16:
    input:
        manifest=MANIFEST,
    output:
        temp("results/models/f16/{shape}-seed{seed}.gguf"),
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
        manifest=MANIFEST,
        f16=synthetic_f16_input,
    output:
        gguf="results/models/{model}.gguf",
        info="results/models/{model}.json",
    params:
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
