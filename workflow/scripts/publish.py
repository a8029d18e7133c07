"""`script:` entry of the publish rule: hand the job to the package (see ckpteval.steps.publish)."""

from ckpteval.steps import publish, run_step

run_step(publish, snakemake)  # noqa: F821 - injected by Snakemake
