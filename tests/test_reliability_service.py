"""A Piston endpoint that is down, slow, failing or talking nonsense: bounded retries with
backoff, then one clear error; never a wrong verdict, never a traceback.

The endpoint is tests/piston_standin.py's PistonStandin, Piston's request validation and replies
on 127.0.0.1 (Piston itself cannot run here): it runs our own trusted programs for real, and
misbehaves on demand through its `execute` hook. tests/test_checkers_stdio.py covers the working
client (verdicts, limits, bounded concurrency, a couple of 503s); this module covers the faults.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from fakes import down_url
from piston_standin import PistonStandin

from ckpteval.checkers import Job, get_checker
from ckpteval.checkers.stdio import PistonError
from ckpteval.cli import main
from ckpteval.evaluate import score_samples

APLUSB = {
    "task_id": "aplusb",
    "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4\n", "output": "6\n"}],
    "time_limit": 2,
    "canonical_solution": "a, b = map(int, input().split())\nprint(a + b)\n",
    "language": "python",
}
RIGHT = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
WRONG = "```python\nprint(4)\n```"


@pytest.fixture()
def serve() -> Iterator[Callable[..., PistonStandin]]:
    """Start fake endpoints for a test; all are shut down after it."""
    with ExitStack() as stack:
        yield lambda *args, **kwargs: stack.enter_context(PistonStandin(*args, **kwargs))


def _check(
    url: str, completions: list[str], *, retries: int = 3, concurrency: int = 2, workers: int = 2
) -> list[Any]:
    checker = get_checker(
        "stdio", endpoint=url, piston_retries=retries, piston_concurrency=concurrency
    )
    try:
        return checker.check([Job("aplusb", APLUSB, c) for c in completions], workers=workers)
    finally:
        checker.close()


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]


def test_endpoint_down_fails_with_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = down_url()
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"task_id": "aplusb", "completion": RIGHT}) + "\n")
    problems = tmp_path / "problems.jsonl"
    problems.write_text(json.dumps(APLUSB) + "\n")
    start = time.monotonic()
    status = main(
        [
            "score",
            "stdio",
            "--problems",
            str(problems),
            "--samples",
            str(samples),
            "--out",
            str(tmp_path / "out.jsonl"),
            "--endpoint",
            url,
        ]
    )
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err
    assert status == 1
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert (
        lines[0].startswith(f"ckpteval: error: piston at {url}")
        and "failed after 4 attempts" in lines[0]
    )
    assert "refused" in lines[0].lower()
    assert elapsed < 30  # 3 retries (0.5 + 1 + 2 s of backoff) per sample that had started
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "out.json").exists()


def test_a_server_with_lower_limits_is_one_line_until_they_are_configured(
    serve: Callable[..., PistonStandin], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Piston configured with PISTON_RUN_TIMEOUT=2000 refuses Piston's default 3000: one line
    naming the key; `--piston-limit run_timeout=2000` (evaluate.piston_limits) makes it work."""
    server = serve(limits={"run_timeout": 2000})
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"task_id": "aplusb", "completion": RIGHT}) + "\n")
    problems = tmp_path / "problems.jsonl"
    problems.write_text(json.dumps(APLUSB) + "\n")
    argv = [
        "score",
        "stdio",
        "--problems",
        str(problems),
        "--samples",
        str(samples),
        "--out",
        str(tmp_path / "out.jsonl"),
        "--endpoint",
        server.url,
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        (
            f"ckpteval: error: piston at {server.url} refused run_timeout=3000: cannot exceed the "
            "configured limit of 2000; set evaluate.piston_limits.run_timeout to at most 2000 (or "
            "raise PISTON_RUN_TIMEOUT on the server)"
        )
    ], err
    assert (
        len(server.requests) <= 3
    )  # at most one per self-test job (1 reference, 2 wrong): no retry
    assert main([*argv, "--piston-limit", "run_timeout=2000"]) == 0
    assert json.loads((tmp_path / "out.jsonl").read_text())["passed"] is True
    assert {r["run_timeout"] for r in server.requests} == {3000, 2000}


def test_a_down_endpoint_costs_retries_per_worker_not_per_sample(
    serve: Callable[..., PistonStandin],
) -> None:
    server = serve(runtimes_body=b"503")
    start = time.monotonic()
    with pytest.raises(PistonError, match="failed after 2 attempts: HTTP 503"):
        _check(server.url, [RIGHT] * 30, retries=1, workers=2)
    # Bounded by the workers, not by the 30 samples: a sample that has not started is cancelled,
    # at most the two running ones and one waiting for the runtimes lock finish their retry cycle.
    assert server.runtime_requests <= (2 + 1) * 2, server.runtime_requests
    assert time.monotonic() - start < 10


def test_server_errors_are_retried_with_growing_backoff_then_fail(
    serve: Callable[..., PistonStandin],
) -> None:
    server = serve(lambda n, request, piston: (500, b'{"message": "internal error"}'))
    with pytest.raises(PistonError, match=r"failed after 4 attempts: HTTP 500: .*internal error"):
        _check(server.url, [RIGHT], retries=3, workers=1)
    assert len(server.times) == 4  # bounded: the first try and 3 retries, no more
    gaps = _gaps(server.times)
    assert all(later > 1.5 * earlier for earlier, later in zip(gaps, gaps[1:])), gaps
    assert gaps[0] >= 0.4


def test_transient_server_errors_and_429_are_absorbed(serve: Callable[..., PistonStandin]) -> None:
    flaky = {1: 500, 2: 429, 5: 502}
    server = serve(lambda n, request, piston: (flaky[n], b"{}") if n in flaky else piston())
    verdicts = _check(server.url, [RIGHT, WRONG], concurrency=1, workers=1)
    assert [v.error_type for v in verdicts] == [None, "wrong_answer"]
    assert len(server.times) == 3 + len(flaky)  # 2 tests of RIGHT, 1 of WRONG, 3 retried


def test_client_errors_are_not_retried(serve: Callable[..., PistonStandin]) -> None:
    server = serve(
        lambda n, request, piston: (400, b'{"message": "python-3.12.0 runtime is unknown"}')
    )
    with pytest.raises(
        PistonError,
        match=r"refused the request \(HTTP 400\): python-3.12.0 runtime "
        "is unknown$",
    ):
        _check(server.url, [RIGHT], workers=1)
    assert len(server.times) == 1


def test_slow_endpoint_gives_the_same_verdicts_without_retries(
    serve: Callable[..., PistonStandin],
) -> None:
    fast = serve()
    slow = serve(delay_s=1.5)
    completions = [RIGHT, WRONG, "```python\nraise ValueError('x')\n```", RIGHT]
    reference = [v.error_type for v in _check(fast.url, completions)]
    start = time.monotonic()
    verdicts = _check(slow.url, completions, concurrency=2, workers=4)
    assert (
        [v.error_type for v in verdicts]
        == reference
        == [None, "wrong_answer", "runtime_error", None]
    )
    assert len(slow.times) == len(fast.times) == 2 + 1 + 1 + 2  # no request was sent twice
    assert slow.max_active <= 2  # the concurrency bound holds while requests pile up
    assert time.monotonic() - start >= 1.5 * len(slow.times) / 2


def test_malformed_json_is_retried_then_a_clear_error(serve: Callable[..., PistonStandin]) -> None:
    server = serve(lambda n, request, piston: (200, b"<html>502 Bad Gateway</html>"))
    with pytest.raises(
        PistonError, match=rf"piston at {server.url}/api/v2/execute failed after 2 attempts"
    ):
        _check(server.url, [RIGHT], retries=1, workers=1)
    assert len(server.times) == 2


@pytest.mark.parametrize(
    "body",
    [b"{}", b"[]", b'{"run": "killed"}', b'{"run": {}}'],
    ids=["empty-object", "list", "run-not-object", "run-empty"],
)
def test_reply_of_the_wrong_shape_is_a_clear_error_not_a_verdict(
    serve: Callable[..., PistonStandin], body: bytes
) -> None:
    server = serve(lambda n, request, piston: (200, body))
    with pytest.raises(PistonError, match="malformed"):
        _check(server.url, [RIGHT, WRONG], retries=1)


def test_runtimes_of_the_wrong_shape_are_a_clear_error(serve: Callable[..., PistonStandin]) -> None:
    server = serve(runtimes_body=b'{"runtimes": [{"language": "python", "version": "3.10.0"}]}')
    with pytest.raises(PistonError, match="malformed"):
        _check(server.url, [RIGHT], retries=1)


def test_partial_results_survive_an_endpoint_that_dies_midway(
    serve: Callable[..., PistonStandin], tmp_path: Path
) -> None:
    samples = [
        {"task_id": "aplusb", "sample_idx": i, "completion": RIGHT if i % 2 else WRONG}
        for i in range(12)
    ]
    alive = {"until": 20}  # the self-test's and most samples' requests succeed, then it dies

    def dying(n: int, request: dict[str, Any], piston: Any) -> tuple[int, bytes]:
        return piston() if n <= alive["until"] else (503, b'{"message": "gone"}')

    server = serve(dying)
    options = {"endpoint": server.url, "piston_retries": 1, "piston_concurrency": 1}
    with pytest.raises(PistonError):
        score_samples(
            "stdio",
            {"aplusb": APLUSB},
            samples,
            tmp_path / "s.jsonl",
            tmp_path / "s.json",
            workers=1,
            checker_options=options,
        )
    first = len(server.times)
    alive["until"] = 10**9
    cell = score_samples(
        "stdio",
        {"aplusb": APLUSB},
        samples,
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        workers=1,
        checker_options=options,
    )
    assert cell["metrics"]["pass@1"]["value"] == 0.5
    full = 2 + 2 + 6 * 2 + 6 * 1  # self-test (reference: 2 tests, 2 known-wrong: 1 each) + samples
    resent = len(server.times) - first
    assert resent < full, f"the rerun sent all {resent} requests again"
