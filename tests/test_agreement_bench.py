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
