"""The workflow steps' own decisions (ckpteval.steps), without Snakemake."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpteval.engine.job import oom_only_retries
from ckpteval.errors import UserError


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


def test_a_step_in_snakemakes_process_fails_with_one_line_in_its_log(tmp_path: Path) -> None:
    """`generation` runs inside Snakemake's own process (`run_in_process`): a staged file that is
    not there fails the job with one line, the same line in its log, and no output written."""
    from types import SimpleNamespace

    from ckpteval.steps import StepFailed, generation, run_in_process

    done = tmp_path / "staging" / "r" / "step_1" / "main.r1.done"
    done.parent.mkdir(parents=True)
    done.write_text("{}")
    log = tmp_path / "logs" / "generation.log"
    out = tmp_path / "generations" / "arith.jsonl"
    with pytest.raises(StepFailed) as failed:
        run_in_process(
            generation,
            input=SimpleNamespace(done=str(done)),
            output=SimpleNamespace(generations=str(out), meta=str(out.with_suffix(".meta.json"))),
            params=SimpleNamespace(identity="{}"),
            wildcards=SimpleNamespace(task="arith", variant="greedy-s42"),
            log=[str(log)],
        )
    message = str(failed.value)
    assert message.startswith("ckpteval: error: ") and "\n" not in message
    assert "the engine job did not write this cell" in message
    assert log.read_text() == message + "\n"
    assert not out.exists()


def test_a_failpoint_in_snakemakes_process_crashes_and_never_kills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckpteval.steps import FAILPOINT_ENV, run_in_process

    ran = []
    monkeypatch.setenv(FAILPOINT_ENV, "step@r/step_1:kill")

    def step(smk: object) -> None:
        ran.append(smk)

    job = {"wildcards": {"run": "r", "ckpt": "step_1"}, "log": []}
    with pytest.raises(RuntimeError, match="failpoint step@r/step_1:kill"):
        run_in_process(step, **job)
    assert ran == []
    run_in_process(step, **{**job, "wildcards": {"run": "r", "ckpt": "step_2"}})
    assert len(ran) == 1
