"""A training run's own validation set and reward function as a task (ckpteval.checkers.reward),
the trainers' data formats (ckpteval.problems), and a checker from one file of one's own.

The problem files are written here as the trainers write them (a verl parquet with pyarrow);
the reward functions are real files run in the real sandbox, and every score is compared with
calling the function directly.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import REPO, run_snakemake, small_config, write_config

from ckpteval.checkers import Job, get_checker
from ckpteval.cli_score import summary as score_line
from ckpteval.config import build_plan, validate_config
from ckpteval.contract import generation_identity, scoring_identity
from ckpteval.errored import errored_metrics
from ckpteval.errors import UserError
from ckpteval.evaluate import score_samples
from ckpteval.report.page import page_data
from ckpteval.tasks import resolve_task

SYSTEM = "Answer with the number only, after ####."

#: A verl-style reward function: a few behaviours chosen by the completion, else GSM8K's rule.
REWARD = """
import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    print("checking", solution_str[:20])  # reward functions print; it must not matter
    if solution_str == "raise":
        raise ValueError("cannot parse")
    if solution_str == "hang":
        while True:
            pass
    if solution_str == "string":
        return "oops"
    if solution_str == "dict":
        return {"score": 0.5, "acc": True, "pred": "7"}
    if solution_str == "bool":
        return solution_str == ground_truth
    if solution_str == "flood":  # more than a sample may print (32 MiB)
        print("x" * (33 << 20))
        return 1.0
    match = re.search(r"(?:#### )?(-?\\d+)\\s*$", solution_str)
    return (1.0 if match and match.group(1) == str(ground_truth) else 0.0) + bonus


# another function of the same file, chosen by `name:` (verl's custom_reward_function.name)
def half_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs) / 2
"""


def verl_rows(n: int = 4) -> list[dict[str, Any]]:
    """Rows as verl's gsm8k preprocessing writes them."""
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"What is {i} + {i}?"},
            ],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": "test", "index": 100 + i},
        }
        for i in range(n)
    ]


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def reward_file(tmp_path: Path) -> Path:
    path = tmp_path / "reward.py"
    path.write_text(REWARD)
    return path


def direct(path: Path, function: str = "compute_score", **call: Any) -> Any:
    """The reward function called directly, as verl calls it."""
    spec = importlib.util.spec_from_file_location("direct_reward", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, function)(**call)


def direct_row(
    path: Path, row: dict[str, Any], completion: str, function: str = "compute_score", **kwargs: Any
) -> Any:
    """The reward function called directly on a verl row's fields and a completion."""
    return direct(
        path,
        function,
        data_source=row["data_source"],
        solution_str=completion,
        ground_truth=row["reward_model"]["ground_truth"],
        extra_info=row["extra_info"],
        **kwargs,
    )


def checker_option(reward_file: Path, **more: Any) -> dict[str, Any]:
    return {"reward_function": str(reward_file), "self_test": "ground_truth", **more}


# ------------------------------------------------------------------ trainer data formats


def test_a_verl_parquet_is_a_task_with_its_ids_chat_messages_and_ground_truths(
    tmp_path: Path, reward_file: Path
) -> None:
    rows = verl_rows()
    rows[3]["extra_info"] = {"split": "test"}  # no index: its row number is its id
    path = write_parquet(tmp_path / "test.parquet", rows)
    spec = resolve_task("gsm", {"problems": str(path), "checker": checker_option(reward_file)})
    problems = spec.problems()
    assert list(problems) == ["100", "101", "102", "3"]
    first = problems["100"]
    assert first["ground_truth"] == "0" and first["data_source"] == "openai/gsm8k"
    assert first["extra_info"] == {"split": "test", "index": 100}
    assert spec.checker == "reward_function"
    # The chat messages: the user's as the prompt, the system message and the chat template
    # as the task's (what infer renders through the run's chat template).
    assert spec.render(problems["101"]) == "What is 1 + 1?"
    assert spec.options["chat_template"] is True and spec.options["system_prompt"] == SYSTEM
    assert spec.builtin.stop == ()


def test_the_same_fields_in_jsonl_and_the_trl_prompt_answer_shape(
    tmp_path: Path, reward_file: Path
) -> None:
    verl = resolve_task(
        "v",
        {
            "problems": str(write_jsonl(tmp_path / "v.jsonl", verl_rows(2))),
            "checker": checker_option(reward_file),
        },
    )
    assert list(verl.problems()) == ["100", "101"]
    trl = write_jsonl(
        tmp_path / "trl.jsonl",
        [{"prompt": "What is 2 + 2?", "answer": "4"}, {"prompt": "3 + 3?", "answer": "6"}],
    )
    spec = resolve_task("t", {"problems": str(trl), "checker": checker_option(reward_file)})
    problems = spec.problems()
    assert list(problems) == ["0", "1"] and problems["1"]["ground_truth"] == "6"
    assert spec.render(problems["0"]) == "What is 2 + 2?"
    assert "chat_template" not in spec.options  # a text prompt is sent as it is
    # The math checker reads the same file: its ground truth is the answer it compares with.
    math = resolve_task("m", {"problems": str(trl), "checker": "math"})
    assert math.problems()["0"]["answer"] == "4"
    chat = write_jsonl(
        tmp_path / "openr1.jsonl",
        [{"prompt": [{"role": "user", "content": "1 + 1?"}], "solution": "2"}],
    )
    spec = resolve_task("o", {"problems": str(chat), "checker": checker_option(reward_file)})
    assert spec.options["chat_template"] is True and "system_prompt" not in spec.options


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            lambda r: r.update(reward_model={"style": "rule"}),
            r"test\.parquet: row 2: field reward_model\.ground_truth: missing or null",
        ),
        (
            lambda r: r.update(prompt=[{"role": "user"}]),
            r"test\.parquet: row 2: field prompt\[0\]: must be a \{role, content\} message",
        ),
        (
            lambda r: r.update(
                prompt=[
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": "b"},
                    {"role": "assistant", "content": "c"},
                ]
            ),
            r"test\.parquet: row 2: field prompt\[2\]\.role: 'assistant' where 'user' is due",
        ),
        (
            lambda r: r.update(extra_info={"index": 100}),
            r"test\.parquet: row 2: duplicate problem id '100' \(first at .*row 0\)",
        ),
    ],
)
def test_a_malformed_row_is_one_line_naming_file_row_and_field(
    tmp_path: Path, reward_file: Path, change: Any, expected: str
) -> None:
    rows = verl_rows()
    change(rows[2])
    path = write_parquet(tmp_path / "test.parquet", rows)
    with pytest.raises(UserError, match=expected) as caught:
        resolve_task("gsm", {"problems": str(path), "checker": checker_option(reward_file)})
    assert "\n" not in str(caught.value)


def test_rows_with_different_system_messages_need_the_tasks_own(
    tmp_path: Path, reward_file: Path
) -> None:
    rows = verl_rows(2)
    rows[1]["prompt"][0]["content"] = "Another system message."
    path = write_parquet(tmp_path / "test.parquet", rows)
    options = {"problems": str(path), "checker": checker_option(reward_file)}
    with pytest.raises(UserError, match=r"2 different system messages.*system_prompt"):
        resolve_task("gsm", options)
    spec = resolve_task("gsm", {**options, "system_prompt": "Be brief."})
    assert spec.options["system_prompt"] == "Be brief."


@pytest.mark.parametrize(
    "checker, expected",
    [
        (
            {"reward_function": "REWARD", "self_test": True},
            r"tasks\.gsm\.checker\.self_test: runs \(the default\), ground_truth, off or off:",
        ),
        (
            {"reward_function": "REWARD", "self_test": "sometimes"},
            r"tasks\.gsm\.checker\.self_test: 'sometimes' does not match",
        ),
        (
            {"custom_reward_function": {"path": "REWARD", "fn": "f"}},
            r"tasks\.gsm\.checker\.custom_reward_function: unknown key\(s\) fn; verl's are path",
        ),
        (
            {"custom_reward_function": {"path": None, "name": "compute_score"}},
            r"tasks\.gsm\.checker\.custom_reward_function\.path: the reward function's file",
        ),
        (
            {"custom_reward_function": {"path": "REWARD", "name": "a"}, "name": "b"},
            r"tasks\.gsm\.checker: custom_reward_function\.name and name say different things",
        ),
        (
            {"custom_reward_function": {"path": "REWARD", "name": "score_fn"}},
            r"tasks\.gsm\.checker\.name: .*reward\.py defines no 'score_fn'",
        ),
        (
            {"reward_function": "REWARD", "self_test": "ground_truth", "nme": "f"},
            r"tasks\.gsm\.checker: Additional properties are not allowed \('nme'",
        ),
        (
            {"reward_function": "missing.py", "self_test": "ground_truth"},
            r"tasks\.gsm\.checker\.reward_function: no file .*missing\.py",
        ),
        (
            {"reward_function": "REWARD", "self_test": "ground_truth", "name": "score_fn"},
            r"tasks\.gsm\.checker\.name: .*reward\.py defines no 'score_fn'",
        ),
        ({"reward": "REWARD"}, r"tasks\.gsm\.checker: a `checker:` mapping names its checker"),
        ({"math": True}, r"tasks\.gsm\.checker: checker math takes no options"),
    ],
)
def test_checker_mistakes_are_one_line_naming_the_key(
    tmp_path: Path, reward_file: Path, checker: dict[str, Any], expected: str
) -> None:
    path = write_parquet(tmp_path / "test.parquet", verl_rows(2))
    checker = {k: str(reward_file) if v == "REWARD" else v for k, v in checker.items()}
    block = checker.get("custom_reward_function")
    if isinstance(block, dict) and block.get("path") == "REWARD":
        checker["custom_reward_function"] = {**block, "path": str(reward_file)}
    with pytest.raises(UserError, match=expected):
        resolve_task("gsm", {"problems": str(path), "checker": checker})


# ------------------------------------------------------------------ the reward function checker

BEHAVIOURS = {
    "float right": "#### 4",
    "float wrong": "#### 5",
    "bool": "bool",
    "dict": "dict",
    "raises": "raise",
    "hangs": "hang",
    "string": "string",
    "floods": "flood",
}


def _jobs(problem: dict[str, Any]) -> list[Job]:
    return [Job("2", problem, completion) for completion in BEHAVIOURS.values()]


def test_each_sample_scores_as_calling_the_function_directly_and_a_broken_one_fails_alone(
    reward_file: Path,
) -> None:
    problem = {
        "task_id": "2",
        "data_source": "openai/gsm8k",
        "ground_truth": "4",
        "extra_info": {"index": 2},
        "question": "2 + 2?",
    }
    checker = get_checker("reward_function", reward_function=str(reward_file), kwargs={})
    try:
        verdicts = checker.check(_jobs(problem), workers=2, timeout=1.0)
    finally:
        checker.close()
    by = dict(zip(BEHAVIOURS, verdicts))
    for name in ("float right", "float wrong", "bool"):
        expected = direct(
            reward_file,
            data_source="openai/gsm8k",
            solution_str=BEHAVIOURS[name],
            ground_truth="4",
            extra_info={"index": 2},
        )
        assert by[name].score == float(expected), name
        assert by[name].stderr_tail == ""  # its prints went to the log
    assert by["float right"].passed and by["float right"].extras["reward"] == 1.0
    assert (by["float wrong"].passed, by["float wrong"].error_type) == (False, "wrong_answer")
    assert by["dict"].score == 0.5 and by["dict"].extras["reward_info"] == {
        "acc": True,
        "pred": "7",
    }
    assert (by["raises"].error_type, by["raises"].stderr_tail) == (
        "reward_error",
        "ValueError: cannot parse",
    )
    # The configured timeout, and the wall clock (bwrap: twice the CPU budget) it also had.
    assert (by["hangs"].error_type, by["hangs"].stderr_tail) == (
        "timeout",
        "the function timed out (evaluate.timeout 1 s; wall limit 2 s)",
    )
    assert by["string"].error_type == "reward_error"
    assert by["string"].stderr_tail == "returned str 'oops', not a number"
    assert (by["floods"].error_type, by["floods"].stderr_tail) == (
        "reward_error",
        "the function printed 32 MiB, its limit",
    )
    assert all("\n" not in v.stderr_tail for v in verdicts)


def test_kwargs_are_merged_into_every_call(reward_file: Path) -> None:
    problem = {"task_id": "1", "ground_truth": "2", "question": "1 + 1?"}
    checker = get_checker(
        "reward_function",
        reward_function=str(reward_file),
        kwargs={"bonus": 0.25},
        pass_threshold=1.25,
    )
    try:
        right, wrong = checker.check(
            [Job("1", problem, "#### 2"), Job("1", problem, "#### 3")], workers=1, timeout=5.0
        )
    finally:
        checker.close()
    assert (right.score, right.passed) == (1.25, True)
    assert (wrong.score, wrong.passed) == (0.25, False)


def test_a_cell_reports_reward_mean_acc_the_distribution_and_pass_at_k(
    tmp_path: Path, reward_file: Path
) -> None:
    problems = {
        str(i): {"task_id": str(i), "ground_truth": str(2 * i), "question": f"{i} + {i}?"}
        for i in range(3)
    }
    samples = [
        {"task_id": "0", "sample_idx": 0, "completion": "#### 0"},
        {"task_id": "0", "sample_idx": 1, "completion": "dict"},
        {"task_id": "1", "sample_idx": 0, "completion": "#### 3"},
        {"task_id": "1", "sample_idx": 1, "completion": "raise"},
        {"task_id": "2", "sample_idx": 0, "completion": "#### 4"},
        {"task_id": "2", "sample_idx": 1, "completion": "#### 4"},
    ]
    cell = score_samples(
        "reward_function",
        problems,
        samples,
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        workers=2,
        timeout=5.0,
        ks=[1, 2],
        checker_options=checker_option(reward_file),
    )
    metrics = cell["metrics"]
    # five scored samples (1, 0.5, 0, 1, 1) and one that raised: the scores' range is unknown,
    # so the mean is over the five and says it leaves one out; the error rate is over all six
    assert metrics["reward_mean"]["n"] == 5 and metrics["reward_mean"]["excludes_errors"] == 1
    assert metrics["reward_mean"]["value"] == pytest.approx(3.5 / 5)
    assert metrics["reward_error_rate"]["value"] == pytest.approx(1 / 6)
    assert metrics["reward_error_rate"]["n"] == 6
    # acc is a [0, 1] value: the errored sample counts, at 0, and the interval reaches 1
    assert (metrics["acc"]["value"], metrics["acc"]["n"]) == (0.5, 2)
    assert metrics["acc"]["interval"][1] >= 1.0
    assert metrics["pass@2"]["value"] == pytest.approx(2 / 3)  # problems 0 and 2
    # `ckpteval score`'s line says what each number does with the errored sample
    line = score_line(cell)
    assert "reward_mean 0.7000 ± 0.2000 (excludes 1 of 6 errored);" in line
    assert "acc 0.5000 ± 0.5000 (1 of 2 errored, counted as 0) [" in line
    assert "pass@1 " in line and line.count("(1 errored, counted as failures)") == 2
    assert "accuracy" not in metrics and cell["primary_metric"] == "reward_mean"
    assert cell["error_types"] == {"reward_error": 1, "wrong_answer": 2}
    assert cell["reward_distribution"]["counts"] == {"0.0": 1, "0.5": 1, "1.0": 3}
    assert cell["reward_distribution"]["min"] == 0.0 and cell["reward_distribution"]["max"] == 1.0
    assert cell["self_test"] == {
        "references_passed": 3,
        "known_wrong_failed": 1,
        "reused_verdicts": 0,
    }
    lines = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert lines[1]["reward"] == 0.5 and lines[1]["reward_info"] == {"acc": True, "pred": "7"}
    assert lines[3]["error_type"] == "reward_error" and "reward" not in lines[3]


#: A reward of bools that raises on some samples: its range is known, [0, 1].
BOOL_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "raise":
        raise ValueError("cannot parse")
    if solution_str == "string":  # REWARD returns a string here: either is not a number
        return float("nan")
    return solution_str.strip() == str(ground_truth)
"""


@pytest.mark.parametrize(
    ("source", "options", "bounds"),
    [
        (BOOL_REWARD, {}, (0.0, 1.0)),
        (REWARD, {"reward_range": [-1, 2]}, (-1.0, 2.0)),
    ],
)
def test_errored_samples_count_in_n_at_both_ends_of_a_known_range(
    tmp_path: Path, source: str, options: dict[str, Any], bounds: tuple[float, float]
) -> None:
    """7 of 12 samples error (raised, non-finite): with the range known, the mean counts them at
    its bottom and the interval reaches the mean with them at its top; it never rises above the
    mean of all twelve with them at the bottom, as a mean over the survivors would."""
    reward = tmp_path / "reward.py"
    reward.write_text(source)
    problems = {
        str(i): {"task_id": str(i), "ground_truth": "4", "question": "2 + 2?"} for i in range(12)
    }
    completions = ["4", "4", "4", "5", "5"] + ["raise"] * 5 + ["string"] * 2
    samples = [{"task_id": str(i), "completion": c} for i, c in enumerate(completions)]
    cell = score_samples(
        "reward_function",
        problems,
        samples,
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        workers=2,
        checker_options={"reward_function": str(reward), **options},
    )
    lo, hi = bounds
    scores = [
        float(direct(reward, data_source="", solution_str=c, ground_truth="4"))
        for c in completions[:5]
    ]
    mean = cell["metrics"]["reward_mean"]
    assert mean["n"] == 12 and "excludes_errors" not in mean and mean["includes_errors"] == 7
    assert errored_metrics(cell["metrics"])["reward_mean"].words("reward_mean") == (
        f"reward_mean: 7 of 12 samples errored and count as {lo:g}, the bottom of the scores' range"
    )
    assert mean["value"] == pytest.approx((sum(scores) + 7 * lo) / 12)
    assert mean["value"] < sum(scores) / 5  # the survivors alone would flatter
    low, high = mean["interval"]
    assert low <= mean["value"] and high >= (sum(scores) + 7 * hi) / 12
    assert lo <= low and high <= hi  # within the range
    assert cell["metrics"]["reward_error_rate"]["value"] == pytest.approx(7 / 12)
    assert cell["error_types"]["reward_error"] == 7


#: A reward returning verl's dict: the score and other numbers (verl's reward_extra_info).
EXTRA_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    right = solution_str.strip() == str(ground_truth)
    extra = {"format": float(solution_str.startswith("#")), "length": len(solution_str)}
    if solution_str == "no extra":
        extra = {}
    return {"score": float(right), "acc": right, "pred": solution_str, **extra}
"""


def test_the_reward_is_a_reward_tasks_headline_and_the_dicts_numbers_are_averaged(
    tmp_path: Path,
) -> None:
    """reward_mean is the main metric of the task (overview, table, compare); the mean score
    (`accuracy`, the same number with another denominator) is not reported beside it; the dict's
    other numeric keys are averaged over the samples that return them, as verl averages
    reward_extra_info."""
    from ckpteval.summary import summarize

    reward = tmp_path / "reward.py"
    reward.write_text(EXTRA_REWARD)
    problems = {str(i): {"task_id": str(i), "ground_truth": "4", "question": "?"} for i in range(4)}
    completions = ["4", "#4", "#### 5", "no extra"]
    provenance = {"run": "r", "ckpt": "step_1", "step": 1, "task": "t", "variant": "greedy-s42"}
    cell = score_samples(
        "reward_function",
        problems,
        [{"task_id": str(i), "completion": c} for i, c in enumerate(completions)],
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        workers=1,
        checker_options={"reward_function": str(reward)},
        provenance={**provenance, "sampling": "greedy", "seed": 42},
    )
    metrics = cell["metrics"]
    assert cell["primary_metric"] == "reward_mean" and "accuracy" not in metrics
    assert metrics["reward_mean"]["value"] == 0.25
    assert metrics["reward_extra/format"] == pytest.approx(
        {"value": 2 / 3, "stderr": metrics["reward_extra/format"]["stderr"], "n": 3}
    )
    assert metrics["reward_extra/length"]["value"] == pytest.approx((1 + 2 + 6) / 3)
    assert not any(name.endswith("pred") for name in metrics)  # a string is not averaged
    assert summarize([tmp_path / "s.json"]).main_metrics == {"t": "reward_mean"}


@pytest.mark.parametrize("source", [BOOL_REWARD, REWARD], ids=["bool", "float"])
def test_each_data_source_has_its_reward_named_as_verl_logs_it(tmp_path: Path, source: str) -> None:
    """Rows of two data sources, two samples each: each source's reward beside the task's, as
    verl's `val-core/<data_source>/reward/mean@<N>`, over its own samples (its errored ones
    counted as in the task's reward_mean: for a bool reward at 0; for a float reward left out,
    so math_dapo's 1.0 is over 1 of its 2 samples), and the entry says how many errored, in the
    words every report of it uses; gsm8k's, without errors, says nothing of them."""
    reward = tmp_path / "reward.py"
    reward.write_text(source)
    problems = {
        str(i): {"task_id": str(i), "ground_truth": "4", "question": "?", "data_source": source}
        for i, source in enumerate(["openai/gsm8k", "openai/gsm8k", "math_dapo"])
    }
    problems["3"] = {"task_id": "3", "ground_truth": "4", "question": "?"}  # no source
    completions = {"0": ["4", "4"], "1": ["4", "5"], "2": ["4", "raise"], "3": ["5", "5"]}
    samples = [
        {"task_id": tid, "sample_idx": i, "completion": c}
        for tid, cs in completions.items()
        for i, c in enumerate(cs)
    ]
    cell = score_samples(
        "reward_function",
        problems,
        samples,
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        workers=1,
        checker_options={"reward_function": str(reward)},
    )
    metrics = cell["metrics"]
    gsm8k, dapo = "val-core/openai/gsm8k/reward/mean@2", "val-core/math_dapo/reward/mean@2"
    assert (metrics[gsm8k]["value"], metrics[gsm8k]["n"]) == (0.75, 4)
    assert len([m for m in metrics if m.startswith("val-core/")]) == 2
    words = {name: e.words(name) for name, e in errored_metrics(metrics).items()}
    assert gsm8k not in words and "excludes_errors" not in metrics[gsm8k]
    if source == BOOL_REWARD:
        assert (metrics[dapo]["value"], metrics[dapo]["n"]) == (0.5, 2)  # the error at 0
        assert metrics[dapo]["includes_errors"] == 1
        assert metrics["reward_mean"]["value"] == 4 / 8
        assert words[dapo] == (
            f"{dapo}: 1 of 2 samples errored and counts as 0, the bottom of the scores' range"
        )
    else:
        assert (metrics[dapo]["value"], metrics[dapo]["n"]) == (1.0, 1)
        assert metrics[dapo]["excludes_errors"] == 1
        assert metrics["reward_mean"]["value"] == pytest.approx(4 / 7)
        assert words[dapo] == (
            f"{dapo}: mean over the 1 sample that returned a score; 1 of 2 errored and is excluded"
        )


def test_the_self_test_can_be_off_with_a_reason_and_a_wrong_function_fails_it(
    tmp_path: Path,
) -> None:
    always = tmp_path / "always.py"
    always.write_text("def compute_score(**kwargs):\n    return 1.0\n")
    problems = {"0": {"task_id": "0", "ground_truth": "4", "question": "2 + 2?"}}
    samples = [{"task_id": "0", "completion": "anything"}]
    from ckpteval.evaluate import SelfTestError

    with pytest.raises(SelfTestError, match="known-wrong samples passed"):
        score_samples(
            "reward_function",
            problems,
            samples,
            tmp_path / "a.jsonl",
            tmp_path / "a.json",
            workers=1,
            checker_options={"reward_function": str(always), "self_test": "ground_truth"},
        )
    cell = score_samples(
        "reward_function",
        problems,
        samples,
        tmp_path / "b.jsonl",
        tmp_path / "b.json",
        workers=1,
        checker_options={"reward_function": str(always), "self_test": "off: a format reward"},
    )
    assert cell["self_test"]["off"] == "a format reward"
    assert cell["metrics"]["reward_mean"]["value"] == 1.0


class _Service(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"0.75")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def service() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Service)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def test_only_a_trusted_function_reaches_a_service(tmp_path: Path, service: str) -> None:
    """A reward-model server: the sandbox has no network, `trusted: true` runs outside it."""
    path = tmp_path / "remote.py"
    path.write_text(
        "import urllib.request\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info, url):\n"
        "    return float(urllib.request.urlopen(url, timeout=5).read())\n"
    )
    problem = {"task_id": "0", "ground_truth": "4", "question": "?"}
    verdicts = {}
    for trusted in (False, True):
        checker = get_checker(
            "reward_function", reward_function=str(path), kwargs={"url": service}, trusted=trusted
        )
        try:
            (verdicts[trusted],) = checker.check([Job("0", problem, "x")], workers=1, timeout=10)
        finally:
            checker.close()
    assert verdicts[False].error_type == "reward_error"
    assert "URLError" in verdicts[False].stderr_tail
    assert verdicts[True].score == 0.75


# ------------------------------------------------------------------ identity


def _project(root: Path, reward: Path, **checker: Any) -> dict[str, Any]:
    ckpt = root / "run" / "step_1"
    if not ckpt.exists():
        import numpy as np
        from safetensors.numpy import save_file

        ckpt.mkdir(parents=True)
        (ckpt / "config.json").write_text("{}")
        save_file({"w": np.zeros(2, dtype=np.float32)}, str(ckpt / "model.safetensors"))
        write_parquet(root / "test.parquet", verl_rows(3))
    config = {
        "outdir": str(root / "results"),
        "runs": {"r": {"path": str(root / "run")}},
        "tasks": {
            "gsm": {
                "problems": str(root / "test.parquet"),
                "checker": {
                    k: v for k, v in checker_option(reward, **checker).items() if v is not None
                },
            }
        },
    }
    validate_config(config)
    return config


def _ids(config: dict[str, Any]) -> tuple[str, str]:
    plan = build_plan(config)
    return (
        generation_identity(plan, "r", "gsm", "greedy-s42").text,
        scoring_identity(plan, "r", "gsm", "greedy-s42").text,
    )


def test_editing_the_function_rescores_and_moving_it_reruns_nothing(tmp_path: Path) -> None:
    reward = tmp_path / "a" / "reward.py"
    reward.parent.mkdir()
    reward.write_text(REWARD)
    generation, scoring = _ids(_project(tmp_path, reward))
    assert str(reward) not in generation + scoring
    moved = tmp_path / "b" / "renamed.py"
    moved.parent.mkdir()
    reward.rename(moved)
    assert _ids(_project(tmp_path, moved)) == (generation, scoring)
    moved.write_text(REWARD + "\n# edited\n")
    edited = _ids(_project(tmp_path, moved))
    assert edited[0] == generation and edited[1] != scoring
    for change in ({"kwargs": {"bonus": 1}}, {"pass_threshold": 0.5}, {"trusted": True}):
        changed = _ids(_project(tmp_path, moved, **change))
        assert changed[0] == edited[0] and changed[1] != edited[1], change


def documented_defaults() -> dict[str, Any]:
    """Every option of the reward checker but its file, at its documented default: each must
    have one (an option without a default is required)."""
    from ckpteval.checkers import checker_class

    cls = checker_class("reward_function")
    props = cls.task_options["properties"]
    required = set(cls.task_options["required"])
    assert all("default" in props[o] for o in set(props) - required), "an option without default"
    return {o: p["default"] for o, p in props.items() if o not in required}


DEFAULTS = documented_defaults()


@pytest.mark.parametrize("option", sorted(DEFAULTS))
def test_a_documented_default_written_out_is_the_same_setting(tmp_path: Path, option: str) -> None:
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    unset = _project(tmp_path, reward, self_test=None)
    assert "self_test" not in unset["tasks"]["gsm"]["checker"]
    base = _ids(unset)
    written = _project(tmp_path, reward, **{"self_test": None, option: DEFAULTS[option]})
    assert _ids(written) == base
    if option == "pass_threshold":  # an integer is the same number
        assert _ids(_project(tmp_path, reward, self_test=None, pass_threshold=1)) == base


def test_verls_block_is_the_same_setting_as_ckpteval_s_options_and_false_is_off(
    tmp_path: Path,
) -> None:
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    ours = _ids(_project(tmp_path, reward, self_test=None, name="half_score", kwargs={"bonus": 1}))
    verl = {"path": str(reward), "name": "half_score", "reward_kwargs": {"bonus": 1}}
    config = _project(tmp_path, reward, self_test=None)
    config["tasks"]["gsm"]["checker"] = {"custom_reward_function": verl}
    validate_config(config)
    assert _ids(config) == ours
    config["tasks"]["gsm"].pop("checker")
    config["tasks"]["gsm"]["custom_reward_function"] = verl  # pasted at the task's level
    validate_config(config)
    assert _ids(config) == ours
    assert _ids(_project(tmp_path, reward, self_test=False)) == _ids(
        _project(tmp_path, reward, self_test="off")
    )
    assert _ids(_project(tmp_path, reward, self_test="off")) != _ids(
        _project(tmp_path, reward, self_test=None)
    )


def test_a_tasks_main_metric_is_a_summary_setting_only(tmp_path: Path) -> None:
    from ckpteval.contract import summary_identity
    from ckpteval.jobs import SummaryJob

    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    plain = _project(tmp_path, reward)
    chosen = _project(tmp_path, reward)
    chosen["tasks"]["gsm"]["main_metric"] = "pass@1"
    validate_config(chosen)
    assert _ids(chosen) == _ids(plain)  # generations and scores stay
    text = summary_identity(chosen).text
    assert text != summary_identity(plain).text
    assert SummaryJob.decode(text).main_metric == {"gsm": "pass@1"}


def test_a_function_named_by_name_is_the_one_called(tmp_path: Path, reward_file: Path) -> None:
    """`name` is a checker option and a parameter name of the checker's builder: it reaches the
    function, never collides (once `get_checker() got multiple values for argument 'name'`)."""
    row = verl_rows(2)[1]
    problem = {"task_id": "0", "ground_truth": "2", "question": "1 + 1?", **row}
    cell = score_samples(
        "reward_function",
        {"0": problem},
        [{"task_id": "0", "completion": "#### 2"}],
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        workers=1,
        checker_options={"reward_function": str(reward_file), "name": "half_score"},
    )
    expected = direct_row(reward_file, row, "#### 2", "half_score")
    assert expected == 0.5 and cell["metrics"]["reward_mean"]["value"] == expected
    assert cell["self_test"]["references_passed"] == 1  # the default: the function runs


# ------------------------------------------------------------------ a checker of one's own

#: A checker in one file: a task passes when the completion contains the problem's `word`.
PLUGIN = """
from ckpteval.checkers import Checker, Job, Prompting, Verdict, register
from ckpteval.errors import UserError


class WordChecker(Checker):
    name = "word"
    version = "1"
    reads = ("evaluate.timeout",)

    @classmethod
    def normalise_problem(cls, row):
        return {**row, "word": str(row.get("word", "")).lower()}

    @classmethod
    def check_problem(cls, task_id, problem):
        if not problem["word"]:
            raise UserError(f"problem {task_id}: a word problem needs a `word`")

    @classmethod
    def default_prompt(cls, problems, language, task):
        return Prompting(lambda p: f"Say the word {p['word']}:", ("\\n",))

    def check_one(self, job, timeout):
        passed = job.problem["word"] in job.completion.lower()
        return Verdict(passed, None if passed else "wrong_answer")

    def reference_jobs(self, problems):
        return [Job(t, p, p["word"]) for t, p in problems.items()]

    def known_wrong_jobs(self, problems):
        t, p = next(iter(problems.items()))
        return [Job(t, p, "")]


register("word", WordChecker)
"""

PLUGIN_PROBE = """
import json
import math
from ckpteval.checkers import readers_of, problem_file_checkers
from ckpteval.contract import ROWS, CellScope
from ckpteval.tasks import resolve_task

spec = resolve_task("w", {"problems": PROBLEMS, "checker": "word"})
problems = spec.problems()
cell = CellScope("r", "w", "greedy", "vllm", "generate", "word")
print(json.dumps({
    "checkers": problem_file_checkers(),
    "timeout": "word" in readers_of("evaluate.timeout"),
    "sandbox": "word" in readers_of("evaluate.sandbox"),
    "rows": [key for key, row in ROWS.items() if row.effect == "scores" and cell.matches(row)],
    "prompt": spec.render(problems["a"]),
    "stop": list(spec.builtin.stop),
}))
"""


def test_a_checker_from_one_file_is_a_checker_everywhere(tmp_path: Path) -> None:
    plugin = tmp_path / "plugins" / "word.py"
    plugin.parent.mkdir()
    plugin.write_text(PLUGIN)
    problems = write_jsonl(tmp_path / "w.jsonl", [{"id": "a", "word": "Hello"}])
    env = {
        **os.environ,
        "CKPTEVAL_CHECKERS": str(plugin.parent),
        "PYTHONPATH": str(REPO / "src"),
    }
    probe = PLUGIN_PROBE.replace("PROBLEMS", repr(str(problems)))
    proc = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert "word" in seen["checkers"] and seen["timeout"] and not seen["sandbox"]
    assert seen["rows"] == ["evaluate.timeout", "evaluate.ks"]
    assert seen["prompt"] == "Say the word hello:" and seen["stop"] == ["\n"]


# ------------------------------------------------------------------ through the workflow


class Sweep:
    """A finished sweep of the demo model: a verl task scored by its reward function, and a
    task of a checker from one file of its own (`CKPTEVAL_CHECKERS`)."""

    def __init__(self, work: Path, config: dict[str, Any], reward: Path) -> None:
        self.work, self.config, self.reward = work, config, reward

    def snakemake(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_snakemake(self.work, *args)

    def dry_run(self, config: dict[str, Any], name: str) -> dict[str, int]:
        """Jobs per rule that `snakemake -n` plans for `config`."""
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        proc = self.snakemake("-n", "--configfile", str(path))
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        if "Nothing to be done" in out:
            return {}
        table = out.split("Job stats:", 1)[1].split("total", 1)[0]
        return {
            rule: int(n)
            for rule, n in re.findall(r"^(\w+)\s+(\d+)\s*$", table, re.M)
            if rule not in ("all", "job")
        }

    def cell(self, step: str, task: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        base = self.work / "results" / "scores" / "demo" / step / task / "greedy-s42"
        lines = [json.loads(line) for line in base.with_suffix(".jsonl").read_text().splitlines()]
        return json.loads(base.with_suffix(".json").read_text()), lines


STEPS = ("step_300", "step_600")
#: What a changed reward function or setting of the gsm task plans: its self-test, then its cells.
CHANGED = {"selftest": 1, "evaluate": 2, "aggregate": 1, "summary": 1}


@pytest.fixture(scope="module")
def sweep(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sweep]:
    work = tmp_path_factory.mktemp("reward-sweep")
    run = work / "run"
    run.mkdir()
    for step in STEPS:
        (run / step).symlink_to(demo_dir / "run" / step)
    write_parquet(work / "test.parquet", verl_rows(4))
    reward = work / "reward.py"
    reward.write_text(REWARD)
    plugin = work / "checkers" / "word.py"
    plugin.parent.mkdir()
    plugin.write_text(PLUGIN)
    write_jsonl(work / "words.jsonl", [{"id": "a", "word": "one"}, {"id": "b", "word": "two"}])
    config = small_config(
        run,
        tasks={
            # another function of the file by `name:` (a default self-test: it runs)
            "gsm": {
                "problems": str(work / "test.parquet"),
                "checker": {"reward_function": str(reward), "name": "half_score"},
            },
            "words": {"problems": str(work / "words.jsonl"), "checker": "word"},
        },
        sampling={"greedy": {"temperature": 0.0, "max_new_tokens": 16}},
    )
    write_config(work, config)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CKPTEVAL_CHECKERS", str(plugin.parent))
        sweep = Sweep(work, config, reward)
        proc = sweep.snakemake()
        assert proc.returncode == 0, proc.stderr[-4000:]
        yield sweep


@pytest.mark.slow
def test_a_verl_task_is_scored_by_its_reward_function_at_every_checkpoint(sweep: Sweep) -> None:
    for step in STEPS:
        cell, lines = sweep.cell(step, "gsm")
        assert cell["checker"] == "reward_function" and cell["n_samples"] == 4
        assert cell["self_test"] == {
            "references_passed": 3,
            "known_wrong_failed": 0,
            "reused_verdicts": 0,
        }
        assert "reward_mean" in cell["metrics"] and "reward_distribution" in cell
        rows = {str(100 + i): row for i, row in enumerate(verl_rows(4))}
        generations = sweep.work / "results" / "generations" / "demo" / step / "gsm"
        completions = {
            g["task_id"]: g["completion"]
            for g in map(json.loads, (generations / "greedy-s42.jsonl").read_text().splitlines())
        }
        for line in lines:  # every score is what the function gives called directly
            row = rows[line["task_id"]]
            expected = direct_row(sweep.reward, row, completions[line["task_id"]], "half_score")
            assert line["score"] == float(expected)
        words, _ = sweep.cell(step, "words")
        assert words["checker"] == "word" and words["self_test"]["references_passed"] == 2
        assert cell["sandbox"] == "bwrap"
        first = json.loads((generations / "greedy-s42.jsonl").read_text().splitlines()[0])
        # the chat messages through the checkpoint's chat template, system message first
        assert first["prompt"].index(SYSTEM) < first["prompt"].index("What is 0 + 0?")
    metrics = pq.read_table(sweep.work / "results" / "summary" / "metrics.parquet").to_pylist()
    assert {r["step"] for r in metrics if r["metric"] == "reward_mean"} == {300, 600}


@pytest.mark.slow
def test_editing_the_reward_function_rescores_and_moving_it_reruns_nothing(sweep: Sweep) -> None:
    import copy

    original = sweep.reward.read_text()
    try:
        sweep.reward.write_text(original + "\n# a comment changes the file\n")
        assert sweep.dry_run(sweep.config, "edited") == CHANGED
    finally:
        sweep.reward.write_text(original)
    moved = sweep.work / "elsewhere" / "my_reward.py"
    moved.parent.mkdir(exist_ok=True)
    moved.write_text(original)
    config = copy.deepcopy(sweep.config)
    config["tasks"]["gsm"]["checker"]["reward_function"] = str(moved)
    assert sweep.dry_run(config, "moved") == {}
    config["tasks"]["gsm"]["checker"]["kwargs"] = {"bonus": 0.5}
    assert sweep.dry_run(config, "kwargs") == CHANGED


def score_files(sweep: Sweep) -> dict[str, tuple[bytes, int]]:
    root = sweep.work / "results" / "scores"
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*.json*")}


def status_of(sweep: Sweep) -> tuple[int, str]:
    """`ckpteval status` on the sweep's config, from its directory, in a process of its own (the
    sweep's checker plugin is found through CKPTEVAL_CHECKERS there): (exit status, output)."""
    proc = subprocess.run(
        [sys.executable, "-m", "ckpteval.cli", "status", "--configfile", "config/config.yaml"],
        cwd=sweep.work,
        capture_output=True,
        text=True,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_failing_self_test_costs_no_score_and_status_says_why(sweep: Sweep) -> None:
    """The function breaks so that its self-test fails, while its cells must be rescored: the
    self-test job fails alone, in one line naming the function, the rows and the setting; every
    score file keeps its bytes and time, and `status` shows the task's cells blocked and why.
    Fixed back, nothing is left to do; fixed otherwise, the self-test and the cells rerun."""
    original = sweep.reward.read_text()
    verdicts = sweep.work / "results" / "staging" / "selftest"
    assert [p.name.split(".")[0] for p in verdicts.glob("*.json")] == ["gsm"]  # words: in-job
    before = score_files(sweep)
    try:
        sweep.reward.write_text(
            original + "\n\ndef half_score(*args, **kwargs):\n    raise ValueError('on purpose')\n"
        )
        assert sweep.dry_run(sweep.config, "broken") == CHANGED
        proc = sweep.snakemake()
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-3000:]
        assert "Error in rule selftest" in out, out[-3000:]
        assert "ckpteval/steps.py" not in out, out[-3000:]  # no traceback of ours
        # one line, whatever the function's own traceback (its tail is in the line)
        line = next(x for x in out.splitlines() if x.startswith("ckpteval: error: reward"))
        for words in ("half_score", "reward.py", "self_test: runs", "on purpose", "100"):
            assert words in line, line
        assert score_files(sweep) == before, "a failed self-test cost a score file"
        code, text = status_of(sweep)
        assert code == 1
        assert "BLOCKED" in text and "2 blocked" in text, text
        blocked = [x for x in text.splitlines() if x.startswith("  demo/") and "/gsm/" in x]
        assert len(blocked) == 2 and all("self-test failed" in x for x in blocked), text
        assert all("scores kept from before" in x for x in blocked), text
    finally:
        sweep.reward.write_text(original)
    assert sweep.dry_run(sweep.config, "fixed") == {}
    code, text = status_of(sweep)
    assert code == 0 and "blocked" not in text, text
    assert score_files(sweep) == before


@pytest.mark.slow
def test_verls_block_pasted_and_every_default_written_out_plan_nothing(sweep: Sweep) -> None:
    """The sweep's own config in verl's words, at the task's level as verl's config has it, with
    every other option at its documented default: the same settings, nothing to do."""
    import copy

    config = copy.deepcopy(sweep.config)
    task = config["tasks"]["gsm"]
    mine = task.pop("checker")
    task["custom_reward_function"] = {
        "path": mine["reward_function"],
        "name": mine["name"],
        "reward_kwargs": {},
    }
    others = {k: v for k, v in DEFAULTS.items() if k not in ("name", "kwargs")}  # verl's say
    task["checker"] = {"reward_function": mine["reward_function"], **others}
    assert sweep.dry_run(config, "verl") == {}


@pytest.mark.slow
def test_the_trainers_logged_curve_is_put_beside_the_reward_by_step(sweep: Sweep) -> None:
    """The run's TensorBoard event files, as verl's Tracking writes them (torch's SummaryWriter),
    under the metric name verl gives the data source's validation reward: the summary puts each
    checkpoint's value beside the trainer's at its step, flags the step where the trainer's lies
    outside ckpteval's interval while the settings match, and none when they differ; adding the
    logs reruns only the aggregate step. The sweep's summary is rebuilt as it was afterwards."""
    import copy

    import pandas as pd

    tensorboard = pytest.importorskip("torch.utils.tensorboard")
    metric = "val-core/openai/gsm8k/reward/mean@1"
    ours = {int(s.split("_")[1]): sweep.cell(s, "gsm")[0]["metrics"][metric] for s in STEPS}
    logs = sweep.work / "tensorboard_log" / "proj" / "exp"
    writer = tensorboard.SummaryWriter(str(logs))
    writer.add_scalar(metric, 0.25, 100)  # a step without a checkpoint: left out
    writer.add_scalar(metric, ours[300]["value"], 300)  # agrees
    writer.add_scalar(metric, -5.0, 600)  # outside any interval of a [0, 1] reward
    writer.close()
    summary = sweep.work / "results" / "summary"
    config = copy.deepcopy(sweep.config)
    try:
        for val_kwargs, settings, flagged in (
            ({"n": 1, "do_sample": False}, "match", {300: False, 600: True}),
            (
                {"n": 4, "temperature": 1.0},
                "n: trainer 4, ckpteval 1; temperature: trainer 1.0,",
                {},
            ),
        ):
            config["runs"]["demo"]["train_logs"] = {
                "path": str(logs.parent.parent),
                "val_kwargs": val_kwargs,
                "response_length": 16,
            }
            assert sweep.dry_run(config, "train-logs") == {"aggregate": 1, "summary": 1}
            proc = sweep.snakemake("--configfile", str(sweep.work / "train-logs.yaml"))
            assert proc.returncode == 0, proc.stderr[-3000:]
            table = pd.read_csv(summary / "training_curve.csv")
            assert sorted(table["step"]) == [300, 600] and set(table["task"]) == {"gsm"}
            assert all(s.startswith(settings) for s in table["settings"]), table["settings"]
            by_step = dict(zip(table["step"], table["flagged"]))
            assert by_step == (flagged or {300: False, 600: False})
            assert (summary / "plots" / "training-demo-gsm.png").stat().st_size > 0
            page = page_data((summary / "report.html").read_text())  # the interactive panel
            drawn = {(r["series"].split()[0], r["step"]): r for r in page["training"]}
            assert sorted(drawn) == [(s, t) for s in ("ckpteval", "trainer") for t in (300, 600)]
            assert (
                drawn["trainer", 600]["mean"] == -5.0 and drawn["trainer", 600]["metric"] == metric
            )
            assert drawn["ckpteval", 300]["mean"] == pytest.approx(ours[300]["value"])
            assert drawn["trainer", 600]["flagged"] == (600 in flagged)
        # An output of the workflow like any other: deleted, it is published again (from the
        # aggregate job's build, which stays).
        curve = summary / "training_curve.csv"
        kept = curve.read_bytes()
        curve.unlink()
        assert sweep.dry_run(config, "train-logs") == {"summary": 1}
        proc = sweep.snakemake("--configfile", str(sweep.work / "train-logs.yaml"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert curve.read_bytes() == kept
    finally:
        proc = sweep.snakemake()
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (summary / "training_curve.csv").exists()
    assert not (summary / "plots" / "training-demo-gsm.png").exists()


def summary_files(summary: Path) -> dict[str, bytes]:
    """The bytes of every file of a summary directory, by path within it."""
    return {
        str(p.relative_to(summary)): p.read_bytes()
        for p in sorted(summary.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


@pytest.mark.slow
def test_a_failed_aggregate_keeps_the_previous_summary_until_a_new_one_is_complete(
    sweep: Sweep,
) -> None:
    """The disk fills up while the aggregate job writes its new summary (a file-size limit
    stands in for the full disk: the tables and plots fit, report.html does not): the job fails,
    and every file of summary/ keeps its bytes; the next run plans the build again and
    publishes the new summary whole."""
    import copy
    import resource

    from conftest import WORKFLOW_ENV, snakemake_cmd

    summary = sweep.work / "results" / "summary"
    before = summary_files(summary)
    limit = len(before["report.html"]) // 2
    assert max(len(v) for k, v in before.items() if k != "report.html") < limit
    config = copy.deepcopy(sweep.config)
    config["aggregate"] = {"title": "after a full disk"}
    path = sweep.work / "retitled.yaml"
    path.write_text(yaml.safe_dump(config))

    def full_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    try:
        failed = subprocess.run(
            snakemake_cmd(sweep.work, "--configfile", str(path)),
            cwd=REPO,
            env={**os.environ, **WORKFLOW_ENV},
            preexec_fn=full_disk,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert failed.returncode != 0, failed.stderr[-3000:]
        assert "Error in rule aggregate" in failed.stderr, failed.stderr[-3000:]
        log = (sweep.work / "logs" / "aggregate" / "aggregate.log").read_text()
        assert "File too large" in log, log[-3000:]
        assert summary_files(summary) == before
        assert sweep.dry_run(config, "retitled") == {"aggregate": 1, "summary": 1}
        proc = sweep.snakemake("--configfile", str(path))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "after a full disk" in (summary / "report.html").read_text()
        assert summary_files(summary).keys() == before.keys()
    finally:
        proc = sweep.snakemake()
        assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_a_failed_summary_job_keeps_the_previous_summary(sweep: Sweep) -> None:
    """The job that publishes a new build fails (a fault injected at its start): every file of
    summary/ keeps its bytes. Before, Snakemake removed the job's outputs before it ran and after
    it failed, and the previous report was gone; they are update() outputs now, restored from
    Snakemake's backup. The next run publishes the new summary."""
    import copy

    from conftest import WORKFLOW_ENV, snakemake_cmd

    from ckpteval.steps import FAILPOINT_ENV

    summary = sweep.work / "results" / "summary"
    before = summary_files(summary)
    config = copy.deepcopy(sweep.config)
    config["aggregate"] = {"title": "after a failed publication"}
    path = sweep.work / "republished.yaml"
    path.write_text(yaml.safe_dump(config))
    try:
        failed = subprocess.run(
            snakemake_cmd(sweep.work, "--configfile", str(path)),
            cwd=REPO,
            env={**os.environ, **WORKFLOW_ENV, FAILPOINT_ENV: "summary"},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert failed.returncode != 0, failed.stderr[-3000:]
        assert "Error in rule summary" in failed.stderr, failed.stderr[-3000:]
        assert summary_files(summary) == before
        assert sweep.dry_run(config, "republished") == {"summary": 1}
        proc = sweep.snakemake("--configfile", str(path))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "after a failed publication" in (summary / "report.html").read_text()
    finally:
        proc = sweep.snakemake()
        assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_a_checker_of_ones_own_is_rescored_when_a_setting_it_reads_changes(sweep: Sweep) -> None:
    import copy

    config = copy.deepcopy(sweep.config)
    config["evaluate"]["sandbox"] = "none"  # the word checker does not read it: gsm only
    assert sweep.dry_run(config, "sandbox") == CHANGED
    config = copy.deepcopy(sweep.config)
    config["evaluate"]["timeout"] = 7  # both read it (the word checker self-tests in its jobs)
    assert sweep.dry_run(config, "timeout") == {
        "selftest": 1,
        "evaluate": 4,
        "aggregate": 1,
        "summary": 1,
    }
    before = {s: sweep.cell(s, "words")[0]["scoring"]["evaluate.timeout"] for s in STEPS}
    assert before == {s: 10 for s in STEPS}
    path = sweep.work / "timeout.yaml"
    proc = sweep.snakemake("--configfile", str(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {s: sweep.cell(s, "words")[0]["scoring"]["evaluate.timeout"] for s in STEPS} == {
        s: 7 for s in STEPS
    }


def test_the_demos_verl_task_parses_and_its_reward_function_passes_its_self_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml as pyyaml

    demo = pyyaml.safe_load((REPO / "config" / "config.yaml").read_text())["tasks"]["arith_verl"]
    monkeypatch.chdir(REPO)  # the demo config's paths are relative to the repository
    spec = resolve_task("arith_verl", demo)
    problems = spec.problems()
    assert len(problems) == 12 and spec.options["chat_template"] is True
    cell = score_samples(
        "reward_function",
        problems,
        [
            {"task_id": "0", "completion": "4 + 9 = 13 #### 13"},
            {"task_id": "1", "completion": "#### 9"},
        ],
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        workers=1,
        checker_options={
            k: str(REPO / v) if k == "reward_function" else v for k, v in demo["checker"].items()
        },
    )
    assert cell["self_test"]["references_passed"] == 3
    assert cell["metrics"]["reward_mean"]["value"] == pytest.approx((1.0 + 0.1) / 2)
    assert cell["metrics"]["acc"]["value"] == 0.5


def test_the_reward_checker_without_its_function_is_one_line() -> None:
    with pytest.raises(
        UserError, match=r"checker reward_function: needs option\(s\) reward_function"
    ):
        get_checker("reward_function", sandbox="bwrap")


def test_an_evaluate_window_is_one_sandbox_per_worker_refilled_as_each_ends(
    reward_file: Path,
) -> None:
    """A batch's start (bubblewrap, imports, warm-up) costs tens of samples: a window of 1,024
    on 8 workers is 8 batches of 128, and each worker gets its next as soon as its last ends, so
    the whole stream runs in batches of 128 (no sandbox started here). The evaluate job widens
    the window to two batches of 1,024 per worker (`window_per_worker`): batches of 1,024."""
    from ckpteval.checkers import Verdict
    from ckpteval.evaluate import CHUNK_SIZE

    checker = get_checker("reward_function", reward_function=str(reward_file), self_test="off: x")
    sizes: list[int] = []
    lock = threading.Lock()

    def check_batch(jobs: list[Job], timeout: float) -> list[Verdict]:
        with lock:
            sizes.append(len(jobs))
        return [Verdict(True, None) for _ in jobs]

    checker.check_batch = check_batch  # type: ignore[method-assign]
    jobs = (Job(str(i), {"ground_truth": "1"}, "1") for i in range(3 * CHUNK_SIZE))
    verdicts = checker.check_stream(
        jobs, workers=8, window=CHUNK_SIZE, window_chars=1 << 30, buffer=8 * CHUNK_SIZE
    )
    assert sum(v.passed for v in verdicts) == 3 * CHUNK_SIZE
    # Full batches of 128 until the input ends; what is then read and not yet started (how much
    # depends on how fast the workers ran, so on the machine's load) is shared by the 8 workers:
    # equal shares, the last one maybe smaller, at most one per worker.
    ordered = sorted(sizes, reverse=True)
    full = ordered.count(128)
    shares = ordered[full:]
    assert CHUNK_SIZE == 1024 and sum(ordered) == 3 * CHUNK_SIZE and full >= 16, ordered
    assert len(shares) <= 8 and len(set(shares[:-1])) <= 1, ordered
    assert checker.batch_size_for(100, 1) == 100 and checker.batch_size_for(4096, 1) == 1024
    # The evaluate job's window (ckpteval.evaluate) holds two full batches per worker.
    for workers in (1, 2, 8, 16):
        window = max(CHUNK_SIZE, checker.window_per_worker * workers)
        assert window == 2048 * workers and checker.batch_size_for(window, workers) == 1024


def test_a_replay_runs_solutions_name_the_rows_ids(tmp_path: Path, reward_file: Path) -> None:
    """A replay run's solution lines name a verl row by `extra_info.index`, and are scored."""
    from ckpteval.backends.replay import replay_solutions

    path = write_parquet(tmp_path / "test.parquet", verl_rows(2))
    spec = resolve_task("gsm", {"problems": str(path), "checker": checker_option(reward_file)})
    solutions = write_jsonl(
        tmp_path / "gsm.jsonl",
        [{"task_id": "100", "completion": "#### 0"}, {"task_id": "101", "completion": "#### 3"}],
    )
    out = tmp_path / "gen" / "gsm.jsonl"
    out.parent.mkdir()
    replay_solutions(solutions, spec, "greedy-s42", out, where="runs.r.solutions")
    cell = score_samples(
        "reward_function",
        spec.problems(),
        map(json.loads, out.read_text().splitlines()),
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        workers=1,
        checker_options=checker_option(reward_file),
    )
    assert cell["metrics"]["reward_mean"]["value"] == 0.5 and cell["input_errors"] == []
    write_jsonl(solutions, [{"task_id": "0", "completion": "#### 0"}])
    with pytest.raises(UserError, match=r"'0'"):
        replay_solutions(solutions, spec, "greedy-s42", out, where="runs.r.solutions")


#: A reward function returning scores past any sane range, chosen by the completion.
OUT_OF_RANGE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str.startswith("#### "):
        return float(solution_str[5:] == ground_truth)
    return {
        "int400": 10 ** 400,
        "int5000": 10 ** 5000,
        "1e308": 1e308,
        "-1e308": -1e308,
        "inf": float("inf"),
        "nan": float("nan"),
        "acc": {"score": 1.0, "acc": 10 ** 400},
        "1e16": 1e16,
    }[solution_str]
"""


def test_a_score_out_of_range_fails_alone_and_the_cell_stays_finite(tmp_path: Path) -> None:
    """Scores no arithmetic of the cell survives (a 400-digit integer raised OverflowError, 1e308
    made the standard error overflow) are each a `reward_error` saying why, beside a right and a
    wrong sample that keep their verdicts, and every metric of the cell is a finite number."""
    path = tmp_path / "reward.py"
    path.write_text(OUT_OF_RANGE)
    problems = {"1": {"task_id": "1", "ground_truth": "2", "question": "1 + 1?"}}
    bad = ["int400", "int5000", "1e308", "-1e308", "inf", "nan", "acc", "1e16"]
    samples = [
        {"task_id": "1", "sample_idx": i, "completion": c}
        for i, c in enumerate(["#### 2", "#### 3", *bad])
    ]
    cell = score_samples(
        "reward_function",
        problems,
        samples,
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        workers=2,
        timeout=5.0,
        ks=[1],
        checker_options={"reward_function": str(path), "self_test": "off: no ground truths"},
    )
    lines = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [(x["passed"], x["error_type"]) for x in lines[:2]] == [
        (True, None),
        (False, "wrong_answer"),
    ]
    assert [x["error_type"] for x in lines[2:]] == ["reward_error"] * len(bad)
    why = {c: x["stderr_tail"] for c, x in zip(bad, lines[2:])}
    assert "integer of about 401 digits" in why["int400"] and "1e+15" in why["int400"], why
    assert "1e+308" in why["1e308"] and "`acc`" in why["acc"] and "1e+16" in why["1e16"], why
    assert why["int5000"] and all("\n" not in w for w in why.values()), why
    # No declared range: the mean is over the two scored samples and says what it leaves out.
    assert cell["metrics"]["reward_mean"] == {
        "value": 0.5,
        "stderr": 0.5,
        "n": 2,
        "excludes_errors": len(bad),
    }
    for name, metric in cell["metrics"].items():
        assert all(math.isfinite(metric[k]) for k in ("value", "stderr")), (name, metric)
