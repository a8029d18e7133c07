# ckpteval: evaluate every checkpoint of LLM training runs.
#   consolidate -> infer (GPU) -> evaluate (CPU) -> aggregate
# Layout and file contracts: README.md; every config key: config/README.md.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/consolidate.smk"
include: "workflow/rules/infer.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/aggregate.smk"


localrules:
    all,
    aggregate,


rule all:
    input:
        get_final_outputs,
    default_target: True
