"""`script:` entry of the selftest rule: hand the job to the package (see ckpteval.steps.selftest)."""

from ckpteval.steps import run_step, selftest

run_step(selftest, snakemake)  # noqa: F821 - injected by Snakemake
