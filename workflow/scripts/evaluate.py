"""`script:` entry of the evaluate rule: hand the job to the package (see ckpteval.steps.evaluate)."""

from ckpteval.steps import evaluate, run_step

run_step(evaluate, snakemake)  # noqa: F821 - injected by Snakemake
