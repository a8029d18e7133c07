"""Running the repository's workflow from a bench script (bench/sweep.py, bench/gpu.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def snakemake(work: Path, *args: str) -> float:
    """Run the workflow in `work` with profiles/local; returns its wall seconds (exits on failure)."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]
    cmd += ["--directory", str(work), "--profile", str(REPO / "profiles" / "local"), *args]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"bench: snakemake {' '.join(args)} failed in {work}:\n{proc.stderr[-3000:]}")
    return seconds
