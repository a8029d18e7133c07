"""Multi-turn chat prompts (few-shot turns in a trainer's `prompt`, ckpteval.problems and
ckpteval.engine.generate.render_prompts) and a reward function's own modules in its scoring identity
(ckpteval.checkers.reward.local_modules).

Prompts are rendered through the demo checkpoint's real tokenizer and compared with what a
trainer gets from `tokenizer.apply_chat_template(messages, tokenize=False,
add_generation_prompt=True)`; the workflow test runs the real workflow once on one demo
checkpoint and proves the reruns with dry-run plans of that finished run.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import small_config, write_config
from test_reward import REWARD, Sweep, _ids, _project, direct_row, verl_rows, write_parquet

from ckpteval.backends.openai import OpenAIBackend
from ckpteval.backends.vllm import VllmBackend
from ckpteval.chat_templates import TemplateUse
from ckpteval.checkers.reward import local_modules
from ckpteval.config import build_plan, build_tasks, validate_config
from ckpteval.engine.generate import Job, render_prompts
from ckpteval.errors import UserError
from ckpteval.problems import earlier_turns
from ckpteval.tasks import resolve_task

SYSTEM = "Answer with the number only."
ENGINE = {"dtype": "float32", "max_model_len": 512, "seed": 42, "tensor_parallel_size": 1}


def few_shot_rows(n: int = 3) -> list[dict[str, Any]]:
    """verl rows whose prompt carries two worked examples before the question."""
    rows = []
    for i in range(n):
        rows.append(
            {
                "data_source": "arith",
                "prompt": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "What is 1 + 1?"},
                    {"role": "assistant", "content": "2"},
                    {"role": "user", "content": "What is 3 + 4?"},
                    {"role": "assistant", "content": "7"},
                    {"role": "user", "content": f"What is {i} + {i + 1}?"},
                ],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(2 * i + 1)},
                "extra_info": {"split": "test", "index": 10 + i},
            }
        )
    return rows


def checker(reward: Path) -> dict[str, Any]:
    return {"reward_function": str(reward), "self_test": "ground_truth"}


@pytest.fixture
def reward_file(tmp_path: Path) -> Path:
    path = tmp_path / "reward.py"
    path.write_text(REWARD)
    return path


@pytest.fixture(scope="module")
def ckpt(demo_dir: Path) -> Path:
    return demo_dir / "run" / "step_300"


def job_of(spec: Any, use: TemplateUse) -> Job:
    config: dict[str, Any] = {"runs": {"r": {"path": "."}}, "tasks": {"arith": {}}}
    validate_config(config)
    _, variants, _ = build_tasks(config)
    return Job(spec, variants["greedy-s42"], Path("unused.jsonl"), chat=use)


# ------------------------------------------------------------------ rows


def test_a_few_shot_row_keeps_its_turns_and_asks_its_last_question(
    tmp_path: Path, reward_file: Path
) -> None:
    path = write_parquet(tmp_path / "fewshot.parquet", few_shot_rows())
    spec = resolve_task("fs", {"problems": str(path), "checker": checker(reward_file)})
    problem = spec.problems()["11"]
    assert problem["question"] == "What is 1 + 2?" and spec.render(problem) == "What is 1 + 2?"
    assert [m["content"] for m in earlier_turns(problem)] == [
        "What is 1 + 1?",
        "2",
        "What is 3 + 4?",
        "7",
    ]
    assert spec.options["system_prompt"] == SYSTEM and spec.options["chat_template"] is True


@pytest.mark.parametrize(
    ("roles", "expected"),
    [
        (["user", "user"], r"prompt\[1\]\.role: 'user' where 'assistant' is due"),
        (["assistant", "user"], r"prompt\[0\]\.role: 'assistant' where 'user' is due"),
        (["user", "system", "user"], r"prompt\[1\]\.role: 'system' where 'assistant'"),
        (["system", "user", "assistant"], r"prompt\[2\]\.role: the last message must be the user"),
    ],
)
def test_roles_out_of_turn_are_one_line_naming_file_row_and_field(
    tmp_path: Path, reward_file: Path, roles: list[str], expected: str
) -> None:
    rows = verl_rows(2)
    rows[1]["prompt"] = [{"role": role, "content": f"turn {i}"} for i, role in enumerate(roles)]
    path = write_parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(UserError, match=rf"bad\.parquet: row 1: field {expected}") as info:
        resolve_task("fs", {"problems": str(path), "checker": checker(reward_file)})
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------ rendering


def test_the_turns_render_as_the_trainers_apply_chat_template(
    tmp_path: Path, reward_file: Path, ckpt: Path
) -> None:
    path = write_parquet(tmp_path / "fewshot.parquet", few_shot_rows())
    spec = resolve_task("fs", {"problems": str(path), "checker": checker(reward_file)})
    backend = VllmBackend(ckpt, ENGINE)
    rendered = render_prompts(backend, job_of(spec, TemplateUse(True)), spec.problems())
    for row in few_shot_rows():
        expected = backend.tokenizer.apply_chat_template(
            row["prompt"], tokenize=False, add_generation_prompt=True
        )
        assert rendered[str(row["extra_info"]["index"])] == expected
    assert rendered["10"].count("What is 3 + 4?") == 1
    # An endpoint gets the same messages, its server applying its own template.
    endpoint = OpenAIBackend(
        {"base_url": "http://127.0.0.1:9/v1", "model": "m"}, ENGINE, where="runs.e"
    )
    sent = render_prompts(endpoint, job_of(spec, TemplateUse(True)), spec.problems())
    assert sent["12"] == few_shot_rows()[2]["prompt"]


def test_a_template_that_refuses_the_turns_is_one_line_naming_file_row_and_field(
    tmp_path: Path, reward_file: Path, ckpt: Path
) -> None:
    refusing = (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}"
        "{{ raise_exception('this template takes no assistant turns') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    path = write_parquet(tmp_path / "fewshot.parquet", few_shot_rows())
    spec = resolve_task("fs", {"problems": str(path), "checker": checker(reward_file)})
    use = TemplateUse(True, refusing, {"source": "file:/t/refusing.jinja", "sha256": "x"})
    with pytest.raises(UserError) as info:
        render_prompts(VllmBackend(ckpt, ENGINE), job_of(spec, use), spec.problems())
    message = str(info.value)
    assert message.startswith(f"{path}: problem 10: field prompt: the chat template")
    assert "file:/t/refusing.jinja" in message and "takes no assistant turns" in message
    assert "\n" not in message


def test_plain_prompts_refuse_a_few_shot_task_in_one_line(
    tmp_path: Path, reward_file: Path
) -> None:
    path = write_parquet(tmp_path / "fewshot.parquet", few_shot_rows())
    spec = resolve_task("fs", {"problems": str(path), "checker": checker(reward_file)})
    plain = TemplateUse(False, None, {"source": "none (checkpoint has no template)"})
    with pytest.raises(UserError, match=r"problem 10: field prompt: 4 earlier turns need a chat"):
        render_prompts(None, job_of(spec, plain), spec.problems())  # type: ignore[arg-type]
    # `chat_template: none` is known at parse time.
    config = _project(tmp_path / "p", reward_file)
    write_parquet(tmp_path / "p" / "test.parquet", few_shot_rows())
    config["runs"]["r"]["chat_template"] = "none"
    with pytest.raises(UserError, match=r"runs\.r\.chat_template: none, but task gsm's problem"):
        build_plan(config)
    config["runs"]["r"]["chat_template"] = "auto"
    assert build_plan(config).tasks["gsm"].checker == "reward_function"


# ------------------------------------------------------------------ a reward file's modules

HELPERS = "from rules.parse import last_number\n\n\ndef same(a, b):\n    return a == b\n"
RULES_INIT = "from .parse import last_number  # noqa\n"
PARSE = (
    "import re\n\n\ndef last_number(text):\n"
    "    found = re.findall(r'-?\\d+', text)\n    return found[-1] if found else None\n"
)
MODULAR_REWARD = """
import os  # this Python's: not followed
from helpers import same
import rules


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    import notes  # a lazy import counts too
    return 1.0 if same(rules.last_number(solution_str), str(ground_truth)) else 0.0
"""


def modular(directory: Path) -> Path:
    """A reward function whose file imports a sibling module, a package (whose `__init__`
    imports its submodule relatively) and, lazily, another sibling."""
    (directory / "rules").mkdir(parents=True)
    (directory / "reward.py").write_text(MODULAR_REWARD)
    (directory / "helpers.py").write_text(HELPERS)
    (directory / "notes.py").write_text("NOTE = 1\n")
    (directory / "rules" / "__init__.py").write_text(RULES_INIT)
    (directory / "rules" / "parse.py").write_text(PARSE)
    (directory / "unused.py").write_text("X = 1\n")
    return directory / "reward.py"


def test_a_reward_files_own_modules_are_found_by_its_imports(tmp_path: Path) -> None:
    reward = modular(tmp_path / "fn")
    found = local_modules(reward)
    assert sorted(found) == ["helpers.py", "notes.py", "rules/__init__.py", "rules/parse.py"]
    assert found["rules/parse.py"] == tmp_path / "fn" / "rules" / "parse.py"
    assert local_modules(tmp_path / "fn" / "unused.py") == {}


def test_editing_an_own_module_rescores_and_moving_the_directory_reruns_nothing(
    tmp_path: Path,
) -> None:
    reward = modular(tmp_path / "fn")
    generation, scoring = _ids(_project(tmp_path, reward))
    moved = tmp_path / "elsewhere" / "renamed"
    moved.parent.mkdir()
    shutil.move(str(tmp_path / "fn"), str(moved))
    assert _ids(_project(tmp_path, moved / "reward.py")) == (generation, scoring)
    (moved / "unused.py").write_text("X = 2\n")  # not imported: nothing reruns
    assert _ids(_project(tmp_path, moved / "reward.py")) == (generation, scoring)
    (moved / "rules" / "parse.py").write_text(PARSE + "# edited\n")
    edited = _ids(_project(tmp_path, moved / "reward.py"))
    assert edited[0] == generation and edited[1] != scoring


def test_a_file_without_modules_of_its_own_keeps_the_id_of_its_bytes(
    tmp_path: Path, reward_file: Path
) -> None:
    from ckpteval.checkers.reward import RewardFunctionChecker
    from ckpteval.io import sha256_file

    assert RewardFunctionChecker.content_id("reward_function", reward_file) == sha256_file(
        reward_file
    )


# ------------------------------------------------------------------ through the workflow


@pytest.fixture(scope="module")
def fewshot(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sweep]:
    """One checkpoint of the demo run, a few-shot verl task scored by a reward function of
    several modules, run through the real workflow once."""
    work = tmp_path_factory.mktemp("fewshot-sweep")
    (work / "run").mkdir()
    (work / "run" / "step_300").symlink_to(demo_dir / "run" / "step_300")
    write_parquet(work / "fewshot.parquet", few_shot_rows())
    reward = modular(work / "fn")
    config = small_config(
        work / "run",
        tasks={"fs": {"problems": str(work / "fewshot.parquet"), "checker": checker(reward)}},
        sampling={"greedy": {"temperature": 0.0, "max_new_tokens": 8}},
    )
    write_config(work, config)
    sweep = Sweep(work, config, reward)
    proc = sweep.snakemake()
    assert proc.returncode == 0, proc.stderr[-4000:]
    yield sweep


@pytest.mark.slow
def test_a_few_shot_task_is_rendered_as_the_trainer_renders_it_and_scored(
    fewshot: Sweep, demo_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    monkeypatch.syspath_prepend(str(fewshot.reward.parent))  # as verl imports its modules
    tokenizer = AutoTokenizer.from_pretrained(str(demo_dir / "run" / "step_300"))
    generations = fewshot.work / "results" / "generations" / "demo" / "step_300" / "fs"
    lines = [json.loads(x) for x in (generations / "greedy-s42.jsonl").read_text().splitlines()]
    rows = {str(row["extra_info"]["index"]): row for row in few_shot_rows()}
    assert sorted(line["task_id"] for line in lines) == sorted(rows)
    for line in lines:
        expected = tokenizer.apply_chat_template(
            rows[line["task_id"]]["prompt"], tokenize=False, add_generation_prompt=True
        )
        assert line["prompt"] == expected
    cell, scores = fewshot.cell("step_300", "fs")
    assert cell["checker"] == "reward_function" and cell["self_test"]["references_passed"] == 3
    completions = {line["task_id"]: line["completion"] for line in lines}
    for score in scores:
        row = rows[score["task_id"]]
        expected = direct_row(fewshot.reward, row, completions[score["task_id"]])
        assert score["score"] == float(expected)


@pytest.mark.slow
def test_editing_an_earlier_turn_regenerates_and_an_own_module_rescores(fewshot: Sweep) -> None:
    assert fewshot.dry_run(fewshot.config, "same") == {}
    parquet = fewshot.work / "fewshot.parquet"
    original = parquet.read_bytes()
    rows = few_shot_rows()
    rows[1]["prompt"][2]["content"] = "2, since 1 + 1 = 2"  # one earlier turn of one row
    try:
        write_parquet(parquet, rows)
        planned = fewshot.dry_run(fewshot.config, "turn")
    finally:
        parquet.write_bytes(original)
    assert planned.pop("evaluate") == 1 and planned.pop("aggregate") == 1
    assert planned and "consolidate" not in planned, planned  # the cell's generation reruns
    parse = fewshot.work / "fn" / "rules" / "parse.py"
    try:
        parse.write_text(PARSE + "# edited\n")
        # another function: its self-test (a job of its own) runs once before the rescoring
        assert fewshot.dry_run(fewshot.config, "module") == {
            "selftest": 1,
            "evaluate": 1,
            "aggregate": 1,
            "summary": 1,
        }
    finally:
        parse.write_text(PARSE)
    moved = fewshot.work / "moved" / "reward-fn"
    shutil.copytree(fewshot.work / "fn", moved)
    config = copy.deepcopy(fewshot.config)
    config["tasks"]["fs"]["checker"]["reward_function"] = str(moved / "reward.py")
    assert fewshot.dry_run(config, "moved") == {}
