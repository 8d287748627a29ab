# moe-offload-bench: build -> models -> ceilings -> runs -> analysis -> report.
# Usage: snakemake --cores 2 results/final   (README.md)
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/experiments.yaml"


# Validated before any rule exists: bad input fails here, naming the key.
validate(config, "workflow/schemas/config.schema.yaml")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/build.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/ceilings.smk"
include: "workflow/rules/runs.smk"
include: "workflow/rules/analysis.smk"


rule all:
    input:
        rules.final.output,
    default_target: True
