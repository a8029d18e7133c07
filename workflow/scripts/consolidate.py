"""`script:` entry of the consolidate rule: hand the job to the package (see ckpteval.steps.consolidate)."""

from ckpteval.steps import consolidate, run_step

run_step(consolidate, snakemake)  # noqa: F821 - injected by Snakemake
