# Stage 1: the pinned llama.cpp source, patched, built once per (commit, patch, flags) into a
# cache outside results/; the manifest names the libraries and tools.


rule build_llama:
    input:
        patch=os.path.join(workflow.basedir, "harness", "build", "llama.cpp.patch"),
    output:
        manifest=MANIFEST,
    params:
        build=config["build"],
    priority: 100
    log:
        "logs/build_llama.log",
    conda:
        "../../envs/pipeline.yaml"
    threads: all_cores
    resources:
        **MEASUREMENT_RESOURCES,
    script:
        "../scripts/build_llama.py"
