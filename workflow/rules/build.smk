# Stage 1: the pinned llama.cpp source, patched, built once per (commit, patch, flags) into a
# cache outside results/; the manifest names the libraries and tools.


rule build_llama:
    input:
        patch=os.path.join(workflow.basedir, "harness", "build", "llama.cpp.patch"),
        # the routing hook's source: a new one is built (cached by its sha256) into the manifest
        hook=os.path.join(workflow.basedir, "harness", "build", "hook.c"),
    output:
        manifest=MANIFEST,
    params:
        # the build's identity, and where its cache is (a move rewrites the manifest; what
        # depends on the build takes it as ancient() and re-runs only on a new identity)
        identity=BUILD_IDENTITY,
        cache_dir=config["build"].get("cache_dir"),
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
