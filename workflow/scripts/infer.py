"""`script:` entry of the engine rules `infer*` and `endpoint*` (see ckpteval.steps.infer)."""

from ckpteval.steps import infer, run_step

run_step(infer, snakemake)  # noqa: F821 - injected by Snakemake
