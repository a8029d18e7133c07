"""Timeouts calibrated from reference solutions: a problem whose reference is slower than the
configured timeout still scores its correct samples, and an endless sample still ends, as
`timeout`, after about `timeout_factor` times the reference's run time of CPU (at most
`WALL_FACTOR` times that in wall time). Real sandbox, real checkers."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from ckpteval.checkers import Checker, Job, Verdict, get_checker
from ckpteval.evaluate import SelfTestError, calibrate_timeouts, score_samples
from ckpteval.sandbox import WALL_FACTOR

SLOW_PY = {  # the reference sleeps 1.2 s: over the configured 0.5 s
    "prompt": "def slow_inc(x):\n",
    "canonical_solution": "    import time\n    time.sleep(1.2)\n    return x + 1\n",
    "test": "def check(f):\n    assert f(1) == 2\n",
    "entry_point": "slow_inc",
}
SLOW_RS = {
    "prompt": "/// x + 1, slowly.\nfn slow_inc(x: i64) -> i64 {\n",
    "canonical_solution": "    std::thread::sleep(std::time::Duration::from_millis(1200));\n    x + 1\n}\n",
    "tests": "#[cfg(test)]\nmod tests {\n    use super::*;\n\n    #[test]\n    fn test_slow_inc() {\n"
    "        assert_eq!(slow_inc(1), 2);\n    }\n}\n",
    "entry_point": "slow_inc",
}
FACTOR = 5.0


def _lines(path: Path) -> dict[int, dict[str, Any]]:
    return {row["sample_idx"]: row for row in map(json.loads, path.read_text().splitlines())}


def _assert_calibrated(cell: dict[str, Any], lines: dict[int, dict[str, Any]]) -> None:
    timeouts = cell["timeouts"]
    assert (timeouts["configured"], timeouts["factor"], timeouts["calibrated_problems"]) == (
        0.5,
        FACTOR,
        1,
    )
    assert FACTOR * 1.2 <= timeouts["max_s"] < FACTOR * 2.5, timeouts  # 5 x the ~1.2 s reference
    assert timeouts["median_s"] == timeouts["max_s"]  # one problem
    assert lines[0]["passed"], lines[0]  # as slow as the reference: passes
    assert lines[1]["error_type"] == "timeout"
    # The endless sample was stopped by the calibrated timeout, not the configured 0.5 s: once it
    # used that much CPU, or at the latest after WALL_FACTOR times that on a loaded machine.
    longest = WALL_FACTOR * timeouts["max_s"] + 3
    assert timeouts["max_s"] - 0.1 <= lines[1]["duration_s"] <= longest, lines[1]
    # Its line names the configured timeout first, then the calibrated one and the wall clock.
    said = re.search(
        r"timed out \(evaluate\.timeout 0\.5 s, ([\d.]+) s for this problem; "
        r"wall limit ([\d.]+) s\)\Z",
        lines[1]["stderr_tail"],
    )
    assert said, lines[1]
    assert float(said[1]) == timeouts["max_s"], said[0]
    assert float(said[2]) == pytest.approx(WALL_FACTOR * timeouts["max_s"], abs=0.002), said[0]
    assert lines[2]["error_type"] == "wrong_answer"


def test_python_timeout_is_calibrated_from_the_reference(tmp_path: Path) -> None:
    problems = {"slow/0": SLOW_PY}
    samples = [
        {
            "task_id": "slow/0",
            "sample_idx": 0,
            "completion": "    import time\n    time.sleep(1.2)\n    return 1 + x\n",
        },
        {"task_id": "slow/0", "sample_idx": 1, "completion": "    while True:\n        pass\n"},
        {"task_id": "slow/0", "sample_idx": 2, "completion": "    return x\n"},
    ]
    cell = score_samples(
        "python",
        problems,
        samples,
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        workers=2,
        timeout=0.5,
        timeout_factor=FACTOR,
    )
    _assert_calibrated(cell, _lines(tmp_path / "s.jsonl"))
    assert json.loads((tmp_path / "s.json").read_text())["timeouts"] == cell["timeouts"]
    # Without calibration the reference itself times out: the checker cannot be trusted.
    with pytest.raises(
        SelfTestError,
        match=r"slow/0: timeout: .*timed out \(evaluate\.timeout 0\.5 s; wall limit 1 s\)",
    ):
        score_samples(
            "python",
            problems,
            samples,
            tmp_path / "u.jsonl",
            tmp_path / "u.json",
            workers=2,
            timeout=0.5,
            timeout_factor=0,
        )
    assert not (tmp_path / "u.jsonl").exists()


@pytest.mark.needs("rustc")
def test_rust_timeout_is_calibrated_from_the_reference_run_not_its_compile(tmp_path: Path) -> None:
    problems = {"slow/0": SLOW_RS}
    samples = [
        {
            "task_id": "slow/0",
            "sample_idx": 0,
            "completion": "    std::thread::sleep(std::time::Duration::from_millis(1200));\n    1 + x\n}\n",
        },
        {"task_id": "slow/0", "sample_idx": 1, "completion": "    loop {}\n}\n"},
        {"task_id": "slow/0", "sample_idx": 2, "completion": "    x\n}\n"},
    ]
    cell = score_samples(
        "rust",
        problems,
        samples,
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        workers=2,
        timeout=0.5,
        timeout_factor=FACTOR,
    )
    _assert_calibrated(cell, _lines(tmp_path / "s.jsonl"))


@pytest.mark.needs("rustc")
def test_rust_run_s_is_the_test_run_alone() -> None:
    checker = get_checker("rust")
    verdicts = checker.check(
        [
            Job("slow/0", SLOW_RS, SLOW_RS["canonical_solution"]),
            Job("slow/0", SLOW_RS, "    x + 1\n}\n"),
        ],
        workers=2,
        timeout=10,
    )
    slow, fast = verdicts
    assert slow.passed and fast.passed
    assert 1.2 <= slow.run_s < 2.5 and fast.run_s < 0.5, (slow, fast)
    assert slow.duration_s > slow.run_s  # the duration also counts its share of the compile


def test_stdio_calibrates_only_problems_without_their_own_time_limit() -> None:
    """A job's timeout replaces the configured one; a problem's own `time_limit` is what the
    problem asks (too slow is wrong) and stays. Either is a limit on CPU time."""
    test = [{"input": "1\n", "output": "1\n"}]
    free, judged = {"tests": test}, {"tests": test, "time_limit": 0.3}
    busy = "```python\nimport time\nwhile time.process_time() < 1.0:\n    pass\nprint(input())\n```"
    checker = get_checker("stdio")
    try:
        configured, calibrated, own = checker.check(
            [
                Job("t", free, busy),
                Job("t", free, busy, timeout=3.0),
                Job("t", judged, busy, timeout=3.0),
            ],
            workers=2,
            timeout=0.3,
        )
    finally:
        checker.close()
    assert configured.error_type == "timeout", configured  # 1 s of CPU > 0.3 s
    assert calibrated.passed and calibrated.run_s >= 1.0, calibrated  # the slowest test's run
    assert own.error_type == "timeout", own
    assert configured.stderr_tail.endswith("timed out (evaluate.timeout 0.3 s per test)")
    assert own.stderr_tail.endswith("timed out (the problem's time_limit 0.3 s per test)")
    assert checker.own_time_limit(judged) and not checker.own_time_limit(free)


class _Configured(Checker):
    """Only what `calibrate_timeouts` asks of a checker: its configured run timeout per problem."""

    name = "configured-test-double"
    default_timeout = 2.0

    def run_timeout(self, problem: Mapping[str, Any], timeout: float | None) -> float:
        return float(problem.get("time_limit") or timeout or self.default_timeout)

    def own_time_limit(self, problem: Mapping[str, Any]) -> bool:
        return "time_limit" in problem

    def reference_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        return []

    def known_wrong_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        return []


def test_calibration_raises_timeouts_never_lowers_them() -> None:
    problems = {
        "fast": {},
        "slow": {},
        "unmeasured": {},
        "own-limit": {"time_limit": 8.0},
        "compile-error-ref": {},
    }
    references = [Job(t, p, "ref") for t, p in problems.items()]
    verdicts = [
        Verdict(True, run_s=0.1),
        Verdict(True, run_s=1.0),
        Verdict(True),
        Verdict(True, run_s=2.0),
        Verdict(False, "compile_error"),
    ]
    timeouts = calibrate_timeouts(_Configured(), problems, None, 5.0, references, verdicts)
    assert timeouts.limits == {"slow": 5.0}  # 5 x 1.0 > 2; a problem's own 8 s limit stays
    assert timeouts.report == {
        "configured": 2.0,
        "factor": 5.0,
        "calibrated_problems": 1,
        "max_s": 8.0,
        "median_s": 2.0,
    }
    assert timeouts.apply(Job("slow", {}, "x")).timeout == 5.0
    assert timeouts.apply(Job("fast", {}, "x")).timeout is None
    off = calibrate_timeouts(_Configured(), problems, 3.0, 0.0, references, verdicts)
    assert off.limits == {} and off.report["configured"] == 3.0 and off.report["max_s"] == 8.0
