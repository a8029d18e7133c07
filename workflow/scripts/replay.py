"""`script:` entry of rule `replay`: hand the job to the package (see ckpteval.steps.replay)."""

from ckpteval.steps import replay, run_step

run_step(replay, snakemake)  # noqa: F821 - injected by Snakemake
