"""Run a driver script in a child process of its own and read back what it found.

Tests that start a vLLM engine do it in a child: the engine's process state (CUDA or OpenMP
threads, its environment) stays out of the pytest worker, and each child is a fresh engine. A
driver prints one `RESULT <json>` line; anything else it prints is only shown when it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

#: The prefix of the one line a driver reports on.
RESULT = "RESULT "
#: An engine in the test's own process, so a driver's engine dies with it.
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONUNBUFFERED": "1"}


def run_driver(
    work: Path, source: str, name: str, spec: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """Write `source` as work/driver.py and `spec` as work/<name>.json, run the driver on it and
    return its RESULT; a failed driver fails the test with the tail of its output."""
    (work / "driver.py").write_text(source)
    (work / f"{name}.json").write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, str(work / "driver.py"), str(work / f"{name}.json")],
        capture_output=True,
        text=True,
        env={**os.environ, **ENGINE_ENV},
        cwd=work,
        timeout=timeout,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith(RESULT))
    return json.loads(line.removeprefix(RESULT))
