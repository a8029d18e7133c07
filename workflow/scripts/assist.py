"""`script:` entry of the assist rule: hand the job to the package (see ckpteval.steps.assist)."""

from ckpteval.steps import assist, run_step

run_step(assist, snakemake)  # noqa: F821 - injected by Snakemake
