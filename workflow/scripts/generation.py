"""`script:` entry of rule `generation`: hand the job to the package (see ckpteval.steps.generation)."""

from ckpteval.steps import generation, run_step

run_step(generation, snakemake)  # noqa: F821 - injected by Snakemake
