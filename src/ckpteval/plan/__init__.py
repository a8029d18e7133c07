"""The workflow's plan, apart from Snakemake: where each file lives (`layout`) and what a sweep
must run and why (`sweep`). The rules' input functions (workflow/rules/common.smk), `ckpteval
check`, `ckpteval status` and the report read the same answers, and unit tests ask them without
running Snakemake."""
