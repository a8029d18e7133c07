"""`ckpteval best` on a results directory built here: the rule's choice, its selection-aware
interval (wider than the winner's own), how often it wins, weights, and one-line errors."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest
from test_aggregate import write_cell, write_solved

from ckpteval.cli import main
from ckpteval.report.page import best_section
from ckpteval.summary import build_summary

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


def write_errored_reward_run(root: Path) -> str:
    """Two checkpoints of a float reward task `gsm` (10 problems, every score 0.5): step_200's
    reward function gave 3 samples no score (score 0 on their lines), which its reward_mean
    leaves out. Returns what the cell's main metric says of them."""
    for ckpt, errored in (("step_100", 0), ("step_200", 3)):
        samples = [
            {
                "task_id": f"p{i}",
                "sample_idx": 0,
                "passed": False,
                "score": 0.0 if i >= 10 - errored else 0.5,
                "error_type": "reward_error" if i >= 10 - errored else "wrong_answer",
            }
            for i in range(10)
        ]
        mean = {"value": 0.5, "stderr": 0.0, "n": 10 - errored}
        metrics = {
            "reward_error_rate": {"value": errored / 10, "stderr": 0.1, "n": 10},
            "reward_mean": {**mean, **({"excludes_errors": errored} if errored else {})},
        }
        step = int(ckpt.split("_")[1])
        path = write_cell(root, "r", ckpt, step, "gsm", "greedy-s42", metrics=metrics)
        path.write_text(
            json.dumps({**json.loads(path.read_text()), "primary_metric": "reward_mean"})
        )
        path.with_suffix(".jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    build_summary(sorted((root / "scores").glob("*/*/*/*.json")), root / "summary")
    return (
        "the cell's reward_mean: mean over the 7 samples that returned a score; 3 of 10 errored "
        "and are excluded"
    )


def test_a_reward_task_with_errored_samples_says_the_rule_counts_them_as_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`best` averages the score lines, where errored samples are 0, and says so beside the
    cell's own words (CLI, JSON and the report's best section); a checkpoint without errors
    gets no line."""
    own = write_errored_reward_run(tmp_path)
    line = (
        "r:step_200 gsm: the reward function gave no score for 3 of 10 samples; the rule's score "
        f"counts them as 0; {own}"
    )
    args = ["best", "--outdir", str(tmp_path), "--bootstrap", "50"]
    assert main(args) == 0
    assert capsys.readouterr().out.splitlines()[3:] == [f"  note: {line}"]
    assert main([*args, "--json"]) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert chosen["errored"] == [line]
    assert chosen["scores"] == pytest.approx([0.5, 0.35])  # step_200: (7 x 0.5 + 3 x 0) / 10
    assert f"<p class='note'>{html.escape(line)}.</p>" in best_section(chosen)
