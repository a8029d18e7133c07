"""ckpteval: evaluate every checkpoint of LLM training runs with one Snakemake workflow."""

__version__ = "0.1.0"
