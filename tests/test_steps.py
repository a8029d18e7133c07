"""The workflow steps' own decisions (ckpteval.steps), without Snakemake."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpteval.errors import UserError
from ckpteval.steps import oom_only_retries


def test_an_infer_job_is_retried_after_out_of_memory_and_not_after_anything_else(
    tmp_path: Path,
) -> None:
    log = tmp_path / "logs" / "infer" / "run" / "step_1.log"
    log.parent.mkdir(parents=True)
    # Attempt 1 fails with a bug: attempt 2 stops at once with that failure's own line.
    with pytest.raises(KeyError), oom_only_retries(log, 1):
        raise KeyError("problem 7 has no test")
    ran = []
    with pytest.raises(UserError, match=r"not retried \(attempt 2\).*KeyError|problem 7"):
        with oom_only_retries(log, 2):
            ran.append(True)
    assert ran == []
    # Attempt 1 runs out of GPU memory: attempt 2 runs.
    with pytest.raises(RuntimeError), oom_only_retries(log, 1):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with oom_only_retries(log, 2):
        ran.append(True)
    assert ran == [True]
    # A fresh first attempt forgets an old failure.
    with pytest.raises(ValueError), oom_only_retries(log, 1):
        raise ValueError("bad")
    with oom_only_retries(log, 1):
        ran.append(True)
    assert ran == [True, True]
