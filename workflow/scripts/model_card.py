"""`script:` entry of rule `model_card`: hand the job to the package (see ckpteval.steps.model_card)."""

from ckpteval.steps import model_card, run_step

run_step(model_card, snakemake)  # noqa: F821 - injected by Snakemake
