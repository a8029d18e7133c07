"""`ckpteval best` on a results directory built here: the rule's choice, its selection-aware
interval (wider than the winner's own), how often it wins, weights, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_aggregate import write_solved

from ckpteval.cli import main

N = 60
#: Problems solved (of N) per checkpoint and task: step_300 is clearly best on `code`, step_100
#: on `qa`.
SOLVED = {
    "code": {"base": 20, "step_100": 25, "step_200": 30, "step_300": 50, "step_400": 31},
    "qa": {"base": 20, "step_100": 55, "step_200": 30, "step_300": 28, "step_400": 30},
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    solved = {(ckpt, task): count for task, row in SOLVED.items() for ckpt, count in row.items()}
    return write_solved(tmp_path_factory.mktemp("results"), solved, N)


def test_best_by_one_task(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["best", "--outdir", str(results), "--task", "code", "--bootstrap", "300", "--json"]
    assert main(args) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert chosen["best"] == "r:step_300" and chosen["score"] == pytest.approx(50 / N)
    assert len(chosen["candidates"]) == 4  # trained checkpoints only: no baseline
    assert chosen["low"] < chosen["naive_low"] < chosen["score"] < chosen["naive_high"]
    assert chosen["high"] > chosen["naive_high"]
    assert chosen["wins"]["r:step_300"] > 0.95


def test_a_weighted_rule_moves_the_choice(
    results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # code + 3 x qa: step_100 scores (25 + 3 * 55) / 4 / 60 = 0.79, step_300 (50 + 84) / 240
    assert main(["best", "--outdir", str(results), "--task", "code", "--task", "qa=3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "best of 4 checkpoints by 1 x code + 3 x qa: r:step_100"
    assert "interval accounting for the choice" in out[1] and "resamples" in out[2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task", "nope"], "task 'nope' has no trained checkpoint scored"),
        (["--task", "code=-1"], "give TASK or TASK=WEIGHT with a weight > 0"),
        (["--run", "x"], "run 'x' has no trained checkpoint in the summary"),
    ],
)
def test_bad_rules_are_one_line(
    results: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["best", "--outdir", str(results), *args]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err, err
