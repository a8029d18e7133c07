"""`script:` entry of the aggregate rule: hand the job to the package (see ckpteval.steps.aggregate)."""

from ckpteval.steps import aggregate, run_step

run_step(aggregate, snakemake)  # noqa: F821 - injected by Snakemake
