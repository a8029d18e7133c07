"""The math checker against the labelled fidelity set (tests/data/math_fidelity.jsonl, written by
tests/data/math_fidelity.py): every unambiguous row is scored as labelled, so no near miss passes
and no correct answer in any of the shapes and styles fails. bench/math_fidelity.py scores the
same rows with lm-eval's minerva_math for comparison."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpteval.checkers import Job, get_checker

DATA = Path(__file__).resolve().parent / "data"
ROWS = [json.loads(line) for line in (DATA / "math_fidelity.jsonl").read_text().splitlines()]


def problem(row: dict) -> dict:
    """The MATH-shaped problem record of a row: a solution that boxes the gold answer."""
    return {"solution": f"Working.\nSo the answer is $\\boxed{{{row['gold']}}}$."}


def test_the_fidelity_set_is_the_one_its_script_writes() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("math_fidelity", DATA / "math_fidelity.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    assert module.rows() == ROWS
    unambiguous = [r for r in ROWS if not r["ambiguous"]]
    assert len(unambiguous) >= 300
    assert {r["style"] for r in ROWS} >= {
        "boxed",
        "minerva",
        "gsm8k",
        "markdown_headings",
        "bold_line",
        "truncated",
        "self_correction",
    }


@pytest.mark.slow
def test_every_unambiguous_row_is_scored_as_labelled() -> None:
    checker = get_checker("math")
    try:
        jobs = [Job(row["id"], problem(row), row["completion"]) for row in ROWS]
        verdicts = checker.check(jobs, workers=2)
    finally:
        checker.close()
    wrong = [
        (
            row["id"],
            row["shape"],
            row["style"],
            row["note"],
            v.extras.get("extracted"),
            v.error_type,
            v.extras.get("equivalence"),
        )
        for row, v in zip(ROWS, verdicts, strict=True)
        if not row["ambiguous"] and v.passed != row["label"]
    ]
    assert not wrong, "\n".join(map(str, wrong))
    assert not any(v.error_type == "timeout" for v in verdicts)
