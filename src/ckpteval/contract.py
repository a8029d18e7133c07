"""The rerun contract: for every config key, which results a change of it invalidates.

A job's identity is exactly the settings that change its output, as a hash of their sorted JSON
(`Identity.digest`), declared as the job's one param: Snakemake's params trigger reruns it when a
setting it depends on changes, and a setting it does not depend on (a memory fraction, a worker
count, a chunk size, the order of keys in the file) never appears in it. The table `CONTRACT` is
the only place that says which key belongs to which identity; the rules, the parse-time plan and
the contract tests (tests/test_contract_walk.py walks every key of the schema) all read it.

Effects, from the narrowest to the widest:

| effect | a change reruns |
| --- | --- |
| `none` | nothing: how fast or where jobs run |
| `summary` | the aggregate step only |
| `scores` | the evaluate jobs of the cells whose checker reads the key, and the summary |
| `generations` | the generation files of the cells the key applies to, their scores, the summary |
| `model` | the run's consolidation, and so every result of its checkpoints |
| `plan` | nothing already computed: it adds, drops or renames cells or checkpoints |
| `publish` | only the `publish` target (`ckpteval publish`), which `all` never runs |

A key's `applies` says which cells a `generations`/`scores` key touches: `*` in a key stands for
the cell's run (`runs.*`), task (`tasks.*`) or sampling config (`sampling.*`), and `only` limits
a row to cells of some backends or checkers. The checkers themselves say which `evaluate.*` keys
they read (`Checker.reads`, rows with `read_by_checkers`) and which options a task's `checker:`
mapping gives them (`Checker.task_options`: a `tasks.*.checker.<option>` row each, `scores`, an
option holding a file by its content): a new checker file adds its own rows.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ckpteval.io import canonical_json

NONE, SUMMARY, SCORES, GENERATIONS, MODEL, PLAN, PUBLISH = (
    "none",
    "summary",
    "scores",
    "generations",
    "model",
    "plan",
    "publish",
)
EFFECTS = (NONE, SUMMARY, SCORES, GENERATIONS, MODEL, PLAN, PUBLISH)


@dataclass(frozen=True)
class Row:
    """One config key (schema path; `*` for a map's entries) and what changing it reruns."""

    key: str
    effect: str
    why: str
    #: For `generations`/`scores`: the cells it applies to, e.g. {"backend": ("vllm",)} or
    #: {"checker": ("stdio",)} or {"kind": ("harness",)}; empty: every cell the `*` selects.
    only: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Applies to the cells whose checker declares it reads this key (`Checker.reads`).
    read_by_checkers: bool = False


CONTRACT: tuple[Row, ...] = (
    Row("outdir", PLAN, "where results live; a new outdir starts empty"),
    Row("shard", PLAN, "which checkpoints this invocation scores"),
    Row("runs", PLAN, "a new run adds its cells; a removed run's results stay on disk"),
    Row("runs.*.backend", MODEL, "another backend is another model"),
    Row(
        "runs.*.path",
        PLAN,
        "where checkpoints are found; the same bytes elsewhere rerun nothing (identity by content)",
    ),
    Row("runs.*.patterns", PLAN, "which checkpoints are found"),
    Row("runs.*.final_names", PLAN, "which checkpoint is the final one"),
    Row("runs.*.format", MODEL, "how checkpoint files are read"),
    Row(
        "runs.*.base_model",
        MODEL,
        "config, tokenizer and adapter base of the consolidated model (by content: the same "
        "files elsewhere rerun nothing)",
    ),
    Row("runs.*.evaluate_base", PLAN, "adds or drops the base checkpoint's cells"),
    Row("runs.*.complete_marker", PLAN, "which checkpoints count as fully written"),
    Row("runs.*.settle_seconds", NONE, "when an unfinished-looking checkpoint is called broken"),
    Row("runs.*.endpoint", NONE, "the endpoint section as a whole (its keys below decide)"),
    Row("runs.*.endpoint.base_url", MODEL, "the served model"),
    Row("runs.*.endpoint.model", MODEL, "the served model"),
    Row("runs.*.endpoint.api_key_env", NONE, "credentials"),
    Row("runs.*.endpoint.concurrency", NONE, "requests in flight"),
    Row("runs.*.endpoint.retries", NONE, "retries of failed requests"),
    Row("runs.*.endpoint.timeout", NONE, "how long a request may take"),
    Row(
        "runs.*.solutions",
        GENERATIONS,
        "what a replay cell replays, by the content of its own files (the replay job's "
        "`solutions` param): a task added, or one task's new files, replays that task's cells "
        "alone; moved or copied files rerun nothing",
        {"backend": ("replay",)},
    ),
    Row("runs.*.step", PLAN, "the step a weightless run's checkpoint is named after"),
    Row("runs.*.train_logs", NONE, "the train_logs section as a whole (its keys below decide)"),
    Row("runs.*.train_logs.path", SUMMARY, "where the trainer's logs are"),
    Row(
        "runs.*.train_logs.val_kwargs", NONE, "the val_kwargs section as a whole (its keys decide)"
    ),
    Row("runs.*.train_logs.val_kwargs.n", SUMMARY, "the trainer's validation settings"),
    Row("runs.*.train_logs.val_kwargs.temperature", SUMMARY, "the trainer's validation settings"),
    Row("runs.*.train_logs.val_kwargs.top_p", SUMMARY, "the trainer's validation settings"),
    Row("runs.*.train_logs.val_kwargs.top_k", SUMMARY, "the trainer's validation settings"),
    Row("runs.*.train_logs.val_kwargs.do_sample", SUMMARY, "the trainer's validation settings"),
    Row("runs.*.train_logs.response_length", SUMMARY, "the trainer's validation settings"),
    Row("runs.*.train_logs.metrics", SUMMARY, "which trainer metric is which of ckpteval's"),
    Row(
        "reasoning",
        GENERATIONS,
        "every task's default reasoning: what is asked of the engine and how the answer is cut",
    ),
    Row("reasoning.start", GENERATIONS, "where reasoning is seen to open"),
    Row("reasoning.end", GENERATIONS, "where reasoning ends and the answer starts"),
    Row("reasoning.budget", GENERATIONS, "the token budget and what counts as truncated"),
    Row(
        "runs.*.chat_template",
        GENERATIONS,
        "the prompts of tasks asking for chat formatting (a file by its content: moving it "
        "reruns nothing; auto adds nothing: the checkpoint's files are its identity)",
        {"prompts": ("chat",)},
    ),
    Row("tasks", PLAN, "a new task adds its cells; a removed task's results stay on disk"),
    Row("tasks.*.harness", GENERATIONS, "which lm-eval task"),
    Row("tasks.*.limit", GENERATIONS, "which problems are asked"),
    Row("tasks.*.num_fewshot", GENERATIONS, "the prompts"),
    Row("tasks.*.sampling", PLAN, "which variants the task runs"),
    Row("tasks.*.chat_template", GENERATIONS, "the prompts"),
    Row("tasks.*.system_prompt", GENERATIONS, "the prompts"),
    Row("tasks.*.max_new_tokens", GENERATIONS, "the token budget"),
    Row(
        "tasks.*.checker",
        GENERATIONS,
        "how a harness task's samples, or a problem file's problems, are read, prompted and scored",
    ),
    Row(
        "tasks.*.problems",
        GENERATIONS,
        "which problems are asked (by content: the same file elsewhere reruns nothing)",
    ),
    Row("tasks.*.language", GENERATIONS, "the language the prompt asks for and the code taken"),
    Row("tasks.*.prompt", GENERATIONS, "the prompts"),
    Row(
        "tasks.*.max_generated_tests",
        SCORES,
        "the generated tests a solution must pass",
        {"checker": ("stdio",)},
    ),
    Row(
        "tasks.*.answer_last_line",
        SCORES,
        "whether a bare last line is read as a math answer",
        {"checker": ("math", "gsm8k")},
    ),
    Row("tasks.*.engine_group", NONE, "which engine job generates the task"),
    Row(
        "tasks.*.optional",
        PLAN,
        "whether the task is left out where a program its checker runs is not installed",
    ),
    Row(
        "tasks.*.reasoning",
        GENERATIONS,
        "what is asked of the engine (no stop strings, the budget) and how the answer is cut",
    ),
    Row("tasks.*.reasoning.start", GENERATIONS, "where reasoning is seen to open"),
    Row("tasks.*.reasoning.end", GENERATIONS, "where reasoning ends and the answer starts"),
    Row("tasks.*.reasoning.budget", GENERATIONS, "the token budget and what counts as truncated"),
    Row("lm_eval", NONE, "the lm_eval section as a whole (its keys below decide)"),
    Row(
        "lm_eval.include_paths",
        GENERATIONS,
        "the lm-eval task YAMLs found there (by content: the same files elsewhere rerun nothing)",
        {"kind": ("harness",)},
    ),
    Row("sampling", PLAN, "which sampling configs exist (a list names them from their values)"),
    Row("sampling.*.temperature", GENERATIONS, "the samples"),
    Row("sampling.*.top_p", GENERATIONS, "the samples"),
    Row("sampling.*.max_new_tokens", GENERATIONS, "the token budget"),
    Row("sampling.*.n", GENERATIONS, "samples per problem"),
    Row("seeds", PLAN, "which seeds sampled configs run (greedy configs run once)"),
    Row("engine", NONE, "the engine section as a whole (its keys below decide)"),
    Row("engine.dtype", GENERATIONS, "the engine's numerics", {"backend": ("vllm",)}),
    Row(
        "engine.max_model_len",
        GENERATIONS,
        "what fits in the context (an endpoint's lm-eval requests are cut to it too)",
        {"backend": ("vllm", "openai")},
    ),
    Row("engine.gpu_memory_utilization", NONE, "memory given to the engine"),
    Row(
        "engine.tensor_parallel_size",
        GENERATIONS,
        "how the model is split (changes numerics)",
        {"backend": ("vllm",)},
    ),
    Row("engine.allow_tensor_parallel", NONE, "a safety switch"),
    Row("engine.enforce_eager", NONE, "CUDA graphs or not"),
    Row("engine.seed", PLAN, "the label of greedy variants (greedy-s<engine.seed>)"),
    Row("engine.chunk_size", NONE, "requests per engine call"),
    Row(
        "engine.swap",
        NONE,
        "whether one engine serves its run's next checkpoints (weights checked)",
    ),
    Row("assist", NONE, "whether idle GPUs help at a sweep's end"),
    Row("gpus", NONE, "which GPUs this node leases"),
    Row("consolidate", NONE, "the consolidate section as a whole (its keys below decide)"),
    Row("consolidate.dtype", MODEL, "the consolidated weights' dtype"),
    Row("consolidate.smoke", NONE, "how a consolidated model is checked, not what it is"),
    Row("evaluate", NONE, "the evaluate section as a whole (its keys below decide)"),
    Row("evaluate.workers", NONE, "parallel checker processes"),
    Row("evaluate.timeout", SCORES, "when a slow sample times out", read_by_checkers=True),
    Row(
        "evaluate.timeout_factor",
        SCORES,
        "timeouts calibrated from reference solutions",
        read_by_checkers=True,
    ),
    Row("evaluate.sandbox", SCORES, "where code runs", read_by_checkers=True),
    Row(
        "evaluate.python_env",
        SCORES,
        "the packages sandboxed Python code may import",
        read_by_checkers=True,
    ),
    Row("evaluate.ks", SCORES, "which pass@k a cell reports"),
    Row(
        "evaluate.piston_url",
        SCORES,
        "where stdin/stdout programs run",
        read_by_checkers=True,
    ),
    Row("evaluate.piston_limits", NONE, "the piston_limits section as a whole (its keys decide)"),
    *(
        Row(
            f"evaluate.piston_limits.{name}",
            SCORES,
            "a limit the Piston server enforces",
            read_by_checkers=True,
        )
        for name in (
            "compile_timeout",
            "run_timeout",
            "compile_cpu_time",
            "run_cpu_time",
            "compile_memory_limit",
            "run_memory_limit",
            "output_max_size",
        )
    ),
    Row("tasks.*.main_metric", SUMMARY, "the metric the task is judged by in the summary"),
    Row("aggregate", NONE, "the aggregate section as a whole (its keys below decide)"),
    Row("aggregate.title", SUMMARY, "the report's title"),
    Row("aggregate.bootstrap", SUMMARY, "bootstrap resamples of the confidence intervals"),
    Row(
        "aggregate.truncation_threshold",
        SUMMARY,
        "which cells are flagged as truncated (their score a lower bound)",
    ),
    Row("publish", NONE, "the publish section as a whole (its keys below decide)"),
    Row("publish.prefix", PUBLISH, "the keys the points are sent under"),
    Row("publish.trainer_names", PUBLISH, "the keys the points are sent under, and where"),
    Row("publish.wandb", PUBLISH, "whether and where W&B gets the points"),
    Row("publish.wandb.project", PUBLISH, "where W&B gets the points"),
    Row("publish.wandb.entity", PUBLISH, "where W&B gets the points"),
    Row("publish.wandb.run_ids", PUBLISH, "which W&B runs get the points"),
    Row("publish.wandb.mode", PUBLISH, "whether W&B gets the points now or on `wandb sync`"),
    Row("publish.tensorboard", PUBLISH, "whether and where TensorBoard gets the points"),
    Row("publish.tensorboard.logdir", PUBLISH, "where TensorBoard gets the points"),
    Row("publish.mlflow", PUBLISH, "whether and where MLflow gets the points"),
    Row("publish.mlflow.tracking_uri", PUBLISH, "where MLflow gets the points"),
    Row("publish.mlflow.experiment", PUBLISH, "where MLflow gets the points"),
)


def checker_option_rows() -> tuple[Row, ...]:
    """A `scores` row per option a task's `checker:` mapping takes (`Checker.task_options`),
    scoped to the checkers that take it."""
    from ckpteval.checkers import available, checker_class

    takers: dict[str, list[str]] = {}
    why: dict[str, str] = {}
    for name in available():
        for option, schema in (
            (checker_class(name).task_options or {}).get("properties") or {}
        ).items():
            takers.setdefault(option, []).append(name)
            why.setdefault(option, schema.get("description") or f"an option of checker {name}")
    return tuple(
        Row(f"{CHECKER_KEY}.{option}", SCORES, why[option], {"checker": tuple(names)})
        for option, names in sorted(takers.items())
    )


def content_options(checker: str) -> tuple[str, ...]:
    """The options of `checker` that name a file, which count by its content (`x-content`)."""
    from ckpteval.checkers import available, checker_class

    if checker not in available():  # lm-eval's own metrics ("harness")
        return ()
    props = (checker_class(checker).task_options or {}).get("properties") or {}
    return tuple(option for option, schema in props.items() if schema.get("x-content"))


#: The config key of a task's checker; its options are keys below it.
CHECKER_KEY = "tasks.*.checker"
CONTRACT = (*CONTRACT, *checker_option_rows())
ROWS: dict[str, Row] = {row.key: row for row in CONTRACT}


@dataclass(frozen=True)
class CellScope:
    """What a `generations`/`scores` row needs to know about a cell to decide if it applies: the
    names its `*` stands for (run, task, sampling config) and the traits its `only` limits. Not
    a cell's key (no checkpoint, a sampling config for a variant): ckpteval.plan.layout.CellKey."""

    run: str
    task: str
    sampling: str
    backend: str
    kind: str
    checker: str
    #: "chat" when the task asks for a chat template (`tasks.*.chat_template`), else "plain".
    prompts: str = "plain"

    def star(self, key: str) -> str:
        """`key` with its `*` replaced by this cell's run, task or sampling name."""
        head = key.split(".", 1)[0]
        name = {"runs": self.run, "tasks": self.task, "sampling": self.sampling}.get(head)
        return key.replace("*", name, 1) if name is not None else key

    def matches(self, row: Row) -> bool:
        if row.read_by_checkers:
            from ckpteval.checkers import readers_of

            if self.checker not in readers_of(row.key):
                return False
        return all(getattr(self, attr) in values for attr, values in row.only.items())


@dataclass(frozen=True)
class Identity:
    """The settings a job's output depends on, flat `key -> value`; `digest` is its param."""

    settings: dict[str, Any]

    @functools.cached_property
    def digest(self) -> str:
        """Computed once per identity: the plan asks it of the same cached identity per cell
        (ckpteval.freshness), and `settings` is never changed after construction."""
        return hashlib.sha256(self.canonical.encode("utf-8")).hexdigest()[:16]

    @functools.cached_property
    def canonical(self) -> str:
        """The settings' canonical JSON, which `digest` hashes: a recorded identity with the
        same text has the same digest, a cheaper test than hashing it (ckpteval.freshness)."""
        return canonical_json(self.settings)

    @functools.cached_property
    def text(self) -> str:
        """The job's param: the settings as JSON with sorted keys, so a reordered config gives
        the same text and `snakemake -n` shows a changed setting by name, old and new. Computed
        once per identity, as `digest` is: every job of a run's task and variant asks for it."""
        return json.dumps(self.settings, sort_keys=True)

    @classmethod
    def from_text(cls, text: str) -> Identity:
        """The identity a job got as its param."""
        return cls(json.loads(text))

    def record(self) -> dict[str, Any]:
        """What an output records of its identity (read back by ckpteval.freshness)."""
        return {"identity": self.digest, "settings": self.settings}

    def changes(self, recorded: Mapping[str, Any] | None) -> list[str]:
        """`key: old -> new` for each setting that differs from `recorded` (a file's record)."""
        if recorded is None:
            return []
        keys = sorted(set(self.settings) | set(recorded))
        return [
            f"{key}: {_show(recorded.get(key, _ABSENT))} -> {_show(self.settings.get(key, _ABSENT))}"
            for key in keys
            if recorded.get(key, _ABSENT) != self.settings.get(key, _ABSENT)
        ]


_ABSENT = object()


def _show(value: Any) -> str:
    if value is _ABSENT:
        return "unset"
    text = "unset" if value is None else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def lookup(config: Mapping[str, Any], key: str) -> Any:
    """The value at a dotted `key` of a (validated, defaults-filled) config, or None."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def rows_with(effect: str) -> Iterator[Row]:
    return (row for row in CONTRACT if row.effect == effect)


def cell_settings(
    config: Mapping[str, Any],
    cell: CellScope,
    effect: str,
    extra: Mapping[str, Any] | None = None,
    sampling_values: Callable[[str], Any] | None = None,
) -> Identity:
    """The settings of `effect` rows that apply to `cell`, by their concrete keys. An unset key
    (None) is left out, so a new optional key does not change every existing identity."""
    settings: dict[str, Any] = dict(extra or {})
    for row in rows_with(effect):
        if not cell.matches(row):
            continue
        key = cell.star(row.key)
        if row.key.startswith("sampling.*.") and sampling_values is not None:
            settings[key] = sampling_values(row.key.rsplit(".", 1)[1])
        else:
            settings[key] = lookup(config, key)
    return Identity(_set(settings))


def _set(settings: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in settings.items() if value is not None}


def concrete_keys(schema: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """Every key path of the config schema, `*` for the entries of a map (the contract test
    asserts each has a row)."""
    props = schema.get("properties") or {}
    for name, sub in props.items():
        key = f"{prefix}{name}"
        yield key
        yield from concrete_keys(sub, key + ".")
        if sub.get("x-checker-options"):  # each checker declares its own (`task_options`)
            yield from (row.key for row in checker_option_rows())
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and (extra.get("properties") or extra.get("additionalProperties")):
        yield from concrete_keys(extra, prefix + "*.")
    if isinstance(schema.get("items"), dict) and schema["items"].get("properties"):
        yield from concrete_keys(schema["items"], prefix + "*.")


def uncovered(schema: Mapping[str, Any]) -> list[str]:
    """Schema keys with no contract row."""
    return sorted({k for k in concrete_keys(schema)} - set(ROWS))


def table_markdown() -> str:
    """The contract as the README shows it."""
    lines = ["| config key | a change reruns | why |", "| --- | --- | --- |"]
    from ckpteval.checkers import readers_of

    for row in CONTRACT:
        only = {**row.only, **({"checker": readers_of(row.key)} if row.read_by_checkers else {})}
        scope = ", ".join(f"{k} {'/'.join(v)}" for k, v in only.items())
        lines.append(f"| `{row.key}` | {row.effect}{f' ({scope})' if scope else ''} | {row.why} |")
    return "\n".join(lines)


# ---- the identities of the workflow's jobs, from a Plan (ckpteval.config)


def _cell(plan: Any, run: str, task: str, variant: str) -> CellScope:
    spec = plan.tasks[task]
    return CellScope(
        run,
        task,
        plan.variants[variant].sampling.name,
        plan.runs[run].backend,
        spec.kind,
        spec.checker,
        "chat" if spec.options.get("chat_template") else "plain",
    )


def generation_identity(plan: Any, run: str, task: str, variant: str) -> Identity:
    """What a generation file depends on besides its model: the task's definition (data, prompt,
    options), the sampling config and seed, and the engine settings that change numerics."""
    sampling = plan.variants[variant].sampling
    extra = {
        "task.definition": plan.tasks[task].config_hash()[:16],
        "variant.seed": plan.variants[variant].seed,
    }
    identity = cell_settings(
        plan.config,
        _cell(plan, run, task, variant),
        GENERATIONS,
        extra,
        sampling_values=lambda name: getattr(sampling, name),
    )
    # Settings that name files count by content, not by their configured path (or name).
    settings = dict(identity.settings)
    key = f"runs.{run}.chat_template"
    if key in settings:
        settings[key] = plan.runs[run].chat_template.identity
    # a replay cell's files count by content, per checkpoint: the replay job's own param
    settings.pop(f"runs.{run}.solutions", None)
    key = f"tasks.{task}.problems"
    if key in settings:
        settings[key] = f"sha256:{plan.tasks[task].problems_sha256()[:16]}"
    key = f"tasks.{task}.checker"
    if isinstance(settings.get(key), Mapping):  # its options are `scores` rows of their own
        settings[key] = plan.tasks[task].checker
    if "lm_eval.include_paths" in settings:
        settings["lm_eval.include_paths"] = plan.include_paths_id()
    return Identity(_set(settings))


def scoring_identity(plan: Any, run: str, task: str, variant: str) -> Identity:
    """What a cell's scores depend on besides its generation file: the checker, the evaluate
    settings it reads, and the task it scores against (its options and content, all of them
    `generations` keys, so they add no rerun; the evaluate job builds its task from these,
    ckpteval.jobs)."""
    from ckpteval.checkers import checker_version
    from ckpteval.evaluate import CELL_FORMAT

    spec = plan.tasks[task]
    extra = {
        "checker": spec.checker,
        "checker.version": checker_version(spec.checker),
        "cell.format": CELL_FORMAT,
        "task.definition": spec.config_hash()[:16],
        "task.options": spec.identity_options(),
    }
    identity = cell_settings(plan.config, _cell(plan, run, task, variant), SCORES, extra)
    settings = dict(identity.settings)
    for option in content_options(spec.checker):
        key = f"tasks.{task}.checker.{option}"
        if key in settings:  # a file by its content: moving it reruns nothing
            settings[key] = f"sha256:{spec.checker_file_sha256(option)[:16]}"
    if "evaluate.python_env" in settings:  # where it is, and what it holds
        settings["evaluate.python_env"] = dict(
            _python_env_identity(settings["evaluate.python_env"])
        )
    return Identity(settings)


@functools.lru_cache(maxsize=8)
def _python_env_identity(env: str) -> dict[str, str]:
    """Once per plan and environment (every python cell asks): ckpteval.checkers.python."""
    from ckpteval.checkers.python import python_env_identity

    return python_env_identity(env)


def model_identity(plan: Any, run: str, ckpt: str) -> Identity:
    """What a consolidated model (or a weightless run's model card) depends on besides the
    checkpoint's bytes. A setting that names files counts by their content (`by_content`)."""
    settings = {}
    checkpoint = plan.checkpoint(run, ckpt)
    for row in rows_with(MODEL):
        if row.key.startswith("runs.*"):
            key = row.key.replace("*", run, 1)
            if checkpoint.is_base and row.key == "runs.*.format":
                settings[key] = "auto"
            elif row.key in BY_CONTENT:
                settings[key] = BY_CONTENT[row.key](plan, run, checkpoint.step)
            else:
                settings[key] = lookup(plan.config, key)
        elif plan.runs[run].has_weights:
            settings[row.key] = lookup(plan.config, row.key)
    return Identity(_set(settings))


#: Model settings that name files, and their content id (ckpteval.content): the key's value in
#: an identity, so a project moved or copied elsewhere keeps every identity it had.
BY_CONTENT: dict[str, Callable[[Any, str, int], Any]] = {
    "runs.*.base_model": lambda plan, run, step: plan.base_model_id(run),
}


def summary_identity(config: Mapping[str, Any]) -> Identity:
    """The `summary` settings; a `tasks.*` row by each task's concrete key."""
    settings: dict[str, Any] = {}
    for row in rows_with(SUMMARY):
        keys = [row.key]
        if row.key.startswith("tasks.*."):
            keys = [row.key.replace("*", task, 1) for task in config.get("tasks") or {}]
        elif row.key.startswith("runs.*."):
            keys = [row.key.replace("*", run, 1) for run in config.get("runs") or {}]
        settings.update({key: lookup(config, key) for key in keys})
    return Identity(_set(settings))


def publish_identity(config: Mapping[str, Any]) -> Identity:
    """What the `publish` target's record depends on besides the tidy table: where and under
    which keys the points go (what was sent is the ledger's business, ckpteval.publish)."""
    settings = {row.key: lookup(config, row.key) for row in rows_with(PUBLISH)}
    # false is what unset means (no schema default: a new key must not change an identity)
    settings["publish.trainer_names"] = settings.get("publish.trainer_names") or None
    return Identity(_set(settings))


def engine_payload(plan: Any, run: str, tasks: list[str]) -> dict[str, Any]:
    """What an engine job's request file carries besides its cells' identities, written by the
    parse with them: each task's options (checked on decode against the definition the cell's
    identity holds), the run's chat template as resolved (checked against the identity's content
    id), the engine seed (a `plan` key: it names the greedy variants) and lm-eval's include
    paths (their content id is in harness cells' identities)."""
    from pathlib import Path

    from ckpteval.config import resolve_path

    out: dict[str, Any] = {"tasks": {}, "seed": plan.config["engine"]["seed"]}
    for name in tasks:
        spec = plan.tasks[name]
        problems = spec.options.get("problems")
        out["tasks"][name] = {
            "options": spec.identity_options(),
            "problems": None if problems is None else str(resolve_path(str(problems), Path.cwd())),
        }
    template = plan.runs[run].chat_template
    out["chat_template"] = template.label if template.mode in ("file", "builtin") else template.mode
    out["include_paths"] = [str(p) for p in plan.config["lm_eval"]["include_paths"]]
    return out
