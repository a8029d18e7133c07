"""Shared fixtures: the demo training run (built once, cached by its stamp), workflow runs, and a
look at the host's live processes (what tests of kills and sandboxes check afterwards).

End-to-end tests run real Snakemake in a subprocess (`python -m snakemake`) on a temporary working
directory holding a small config, against the repository's Snakefile and profiles.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def demo_dir(request: pytest.FixtureRequest) -> Path:
    """The demo training run (`run/step_*`, `base/`), built once and reused while its stamp holds."""
    from ckpteval.demo import build

    out = Path(request.config.cache.mkdir("ckpteval-demo"))
    build(out, echo=lambda line: None)
    return out


def write_config(workdir: Path, config: dict[str, Any]) -> Path:
    """Write `config` as the working directory's config/config.yaml (what the Snakefile reads)."""
    path = workdir / "config" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def small_config(run_dir: Path, **overrides: Any) -> dict[str, Any]:
    """A config that exercises every kind of task on the tiny model in little time."""
    config: dict[str, Any] = {
        "runs": {"demo": {"path": str(run_dir)}},
        "tasks": {
            "arith": {},
            "arith_harness": {"limit": 10},
            "pyfunc": {"limit": 3},
            "rustfunc": {"limit": 2},
        },
        "sampling": {"greedy": {"temperature": 0.0, "max_new_tokens": 48}},
        "engine": {"gpu_memory_utilization": 0.15, "enforce_eager": True},
        "consolidate": {"smoke": "transformers"},
        "evaluate": {"workers": 2, "timeout": 10},
    }
    config.update(overrides)
    return config


def run_snakemake(
    workdir: Path, *args: str, timeout: float = 1800, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m snakemake` on the repository's workflow in `workdir`, with the local profile
    (and `env` for its environment, the test's own by default)."""
    env = {**(env or os.environ), "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--profile",
        str(REPO / "profiles" / "local"),
        *args,
    ]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def processes_with(marker: str) -> dict[str, bytes]:
    """Live processes whose command line contains `marker`: pid -> command line (arguments
    separated by NUL). A process that exits during the scan is left out."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found[pid] = cmdline
    return found
