"""`ckpteval gate POLICY.yaml` on a results directory built here: a policy that passes, one that
fails (one line per failing task, exit 1), the reference choices, and bad policy files (one line,
exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_aggregate import write_solved
from test_best import write_errored_reward_run

from ckpteval.cli import main

N = 60
#: Problems solved (of N, one greedy sample each) per checkpoint and task: `code` drops by 20
#: points from step_100 to step_200; `qa` stays level.
SOLVED = {
    ("base", "code"): 36,
    ("step_100", "code"): 42,
    ("step_200", "code"): 30,
    ("base", "qa"): 30,
    ("step_100", "qa"): 33,
    ("step_200", "qa"): 33,
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_solved(tmp_path_factory.mktemp("results"), SOLVED, N)


def _gate(tmp_path: Path, results: Path, policy: str) -> int:
    path = tmp_path / "policy.yaml"
    path.write_text(f"outdir: {results}\n{policy}")
    return main(["gate", str(path)])


def test_a_drop_within_the_allowance_passes(
    tmp_path: Path, results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _gate(tmp_path, results, "checkpoint: r:latest\nreference: previous\nmax_drop: 0.3\n")
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines() == [
        "gate: r:step_200 vs r:step_100: 2 of 2 task(s) pass (Holm-corrected, alpha 0.05)"
    ]


def test_a_drop_beyond_the_allowance_fails_on_that_task_only(
    tmp_path: Path, results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _gate(tmp_path, results, "checkpoint: r:latest\nreference: previous\nmax_drop: 0.02\n")
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    assert len(lines) == 2 and lines[0].startswith("FAIL code (greedy): pass@1 0.500 vs 0.700")
    assert "change -0.200, allowed -0.020" in lines[0]
    assert lines[1].startswith("gate: r:step_200 vs r:step_100: 1 of 2 task(s) pass")


def test_per_task_allowance_and_other_references(
    tmp_path: Path, results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A per-task allowance larger than the drop lets `code` pass.
    policy = "checkpoint: r:step_200\nreference: previous\nmax_drop: 0.02\ntasks: {code: 0.25}\n"
    assert _gate(tmp_path, results, policy) == 0
    # Against the baseline (0.6 -> 0.5 on code) a 10-point drop is not shown, beyond noise at
    # 60 problems, to exceed a 5-point allowance: it passes; an explicit reference to step_100
    # fails as `previous` does.
    assert _gate(tmp_path, results, "checkpoint: r:latest\nmax_drop: 0.05\n") == 0
    explicit = "checkpoint: r:latest\nreference: r:step_100\nmax_drop: 0.02\n"
    assert _gate(tmp_path, results, explicit) == 1
    assert "FAIL code" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("checkpoint: [1\n", "not valid YAML"),
        ("- a list\n", "a policy is a mapping"),
        ("checkpoint: r:latest\nmaxdrop: 0.1\n", "unknown key 'maxdrop'"),
        ("checkpoint: step_200\n", "checkpoint: give RUN:CKPT or RUN:latest"),
        ("checkpoint: r:latest\nmax_drop: 5\n", "max_drop: 5 is not a number in [0, 1]"),
        ("checkpoint: r:latest\nreference: best\n", "reference: give baseline, previous"),
        ("checkpoint: r:step_9\n", "run 'r' has no checkpoint 'step_9'"),
        ("checkpoint: x:latest\n", "run 'x' is not in the summary"),
        ("checkpoint: r:base\nreference: previous\n", "has no earlier checkpoint"),
        ("checkpoint: r:latest\ntasks: {cod: 0.1}\n", "tasks: 'cod' is not a task"),
    ],
)
def test_a_bad_policy_is_one_line_and_exit_2(
    tmp_path: Path,
    results: Path,
    capsys: pytest.CaptureFixture[str],
    policy: str,
    message: str,
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policy)
    assert main(["gate", str(path), "--outdir", str(results)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err, err


def test_a_results_dir_without_a_summary_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("checkpoint: r:latest\n")
    assert main(["gate", str(path), "--outdir", str(tmp_path / "none")]) == 2
    assert "run the aggregate step first" in capsys.readouterr().err


def test_errored_reward_samples_are_said_to_count_as_0_in_the_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The change pairs the score lines, where a sample the reward function gave no score is 0:
    one line says so for the side that has such samples, beside what its cell's number does."""
    own = write_errored_reward_run(tmp_path / "results")
    code = _gate(
        tmp_path,
        tmp_path / "results",
        "checkpoint: r:step_200\nreference: r:step_100\nmax_drop: 0.5\n",
    )
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert lines[0] == (
        "gate: note: r:step_200 gsm: the reward function gave no score for 3 of 10 samples; the "
        f"gate's change counts them as 0; {own}"
    )
    assert lines[1].startswith("gate: r:step_200 vs r:step_100: 1 of 1 task(s) pass")
