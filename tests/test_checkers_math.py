"""The math checker: answer extraction, exact numbers, math-verify equivalence, its timeout."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from ckpteval.checkers import Job, get_checker
from ckpteval.checkers.math import MathChecker, as_number, extract_answer, gold_answer
from ckpteval.io import iter_jsonl

ARITH = Path(__file__).resolve().parents[1] / "src" / "ckpteval" / "data" / "tasks" / "arith.jsonl"


@pytest.mark.parametrize(
    "completion,answer,how",
    [
        (" 3 + 4 = 7 #### 7\n", "7", "####"),
        ("#### 1,234\nQuestion: next", "1,234", "####"),
        ("so \\boxed{\\frac{1}{2}} and later \\boxed{\\sqrt{2}}", "\\sqrt{2}", "boxed"),
        ("\\boxed{\\frac{a}{b^{2}}}", "\\frac{a}{b^{2}}", "boxed"),
        ("Thus, the final answer is $42$.", "42", "answer_is"),
        ("The answer is 5. Then the answer is 6.", "6", "answer_is"),
        ("The answer is 3.5 apples.", "3.5 apples", "answer_is"),
        ("I cannot tell.", None, None),
    ],
)
def test_extract_answer(completion: str, answer: str | None, how: str | None) -> None:
    assert extract_answer(completion) == (answer, how)


def test_gold_and_numbers() -> None:
    assert gold_answer({"answer": "4 + 9 = 13 #### 13"}) == "13"
    assert gold_answer({"solution": "so it is \\boxed{\\frac{3}{4}}."}) == "\\frac{3}{4}"
    assert gold_answer({"answer": " 12 "}) == "12"
    assert as_number("$1,234.50") == Fraction(246900, 200)
    assert as_number("25%") == Fraction(1, 4)
    assert as_number("3/4") == Fraction(3, 4)
    assert as_number("x + 1") is None


@pytest.fixture(scope="module")
def checker() -> MathChecker:
    impl = get_checker("math")
    assert isinstance(impl, MathChecker)
    yield impl
    impl.close()


@pytest.mark.parametrize(
    "gold,completion,error",
    [
        ("4 + 9 = 13 #### 13", " 4 + 9 = 13 #### 13\n", None),
        ("#### 1234", "#### 1,234.00", None),
        ("#### 13", "#### 14", "wrong_answer"),
        ("#### 13", "13", "no_answer"),
        ("\\boxed{\\frac{1}{2}}", "The answer is \\boxed{0.5}", None),
        ("\\boxed{x^2 + 2x + 1}", "so \\boxed{(x+1)^2}", None),
        ("\\boxed{\\sqrt{2}/2}", "The answer is $\\frac{\\sqrt2}{2}$", None),
        ("\\boxed{x^2}", "\\boxed{x^3}", "wrong_answer"),
    ],
)
def test_verdicts(checker: MathChecker, gold: str, completion: str, error: str | None) -> None:
    verdict = checker.check([Job("t", {"answer": gold}, completion)], workers=1)[0]
    assert verdict.error_type == error, verdict
    assert verdict.score == (1.0 if error is None else 0.0)


def test_math_verify_runs_outside_the_main_thread_with_a_timeout(checker: MathChecker) -> None:
    jobs = [Job(str(i), {"answer": "\\boxed{x^2 + 2x + 1}"}, "\\boxed{(x+1)^2}") for i in range(6)]
    assert all(v.passed for v in checker.check(jobs, workers=3))  # threads, not the main one
    # A comparison sympy needs ~1.5 s for, under a 0.05 s limit: the helper is killed, the sample
    # is a timeout ... (A tiny limit on a fast comparison raced: a job thread preempted between
    # sending and waiting found the answer already there on a busy machine.)
    slow = checker.check(
        [Job("t", {"answer": "\\boxed{x^{40}}"}, "\\boxed{(x+y+z)^{40}}")], workers=1, timeout=0.05
    )[0]
    assert slow.error_type == "timeout" and slow.duration_s < 1.0
    # ... and the next call gets a fresh helper.
    assert checker.check(jobs[:1], workers=1)[0].passed


def test_arith_references_pass() -> None:
    problems = {row["task_id"]: row for row in iter_jsonl(ARITH)}
    impl = get_checker("gsm8k")
    try:
        verdicts = impl.check(impl.reference_jobs(problems), workers=2)
        wrong = impl.check(impl.known_wrong_jobs(problems), workers=2)
    finally:
        impl.close()
    assert len(verdicts) == len(problems) and all(v.passed for v in verdicts)
    assert not any(v.passed for v in wrong)
