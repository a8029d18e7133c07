"""`script:` entry of the infer rule: hand the job to the package (see ckpteval.steps.infer)."""

from ckpteval.steps import infer, run_step

run_step(infer, snakemake)  # noqa: F821 - injected by Snakemake
