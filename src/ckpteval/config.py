"""Load and validate the workflow config; expand it into the plan of jobs.

The Snakefile hands its `config` dict here at parse time. Validation fills schema defaults in place
(so the rules see one complete config) and turns the first schema error into one line naming the
key. `build_plan` then discovers checkpoints on disk and resolves task names, so every user mistake
surfaces before the DAG is built.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from ckpteval.chat_templates import ChatTemplate, check_plain_turns, resolve
from ckpteval.checkpoints import (
    Checkpoint,
    Unfinished,
    deleted_checkpoints,
    discover_checkpoints,
    discover_s3,
    unfinished_checkpoints,
)
from ckpteval.content import ContentIds, model_files, task_yaml_files
from ckpteval.errors import UserError
from ckpteval.plan.layout import CellKey, Layout
from ckpteval.reasoning import from_config
from ckpteval.s3 import is_s3, list_objects, local_path
from ckpteval.shard import Shard, parse_shard, select
from ckpteval.tasks import TaskSpec, resolve_task

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"


@dataclass(frozen=True)
class Sampling:
    """One named sampling config; `variant(seed)` is the `{variant}` wildcard value."""

    name: str
    temperature: float
    top_p: float
    max_new_tokens: int
    n: int

    def variant(self, seed: int) -> str:
        return f"{self.name}-s{seed}"


def parse_variant(variant: str) -> tuple[str, int]:
    """(sampling config name, seed) of a `{variant}` name (`Sampling.variant` reversed)."""
    name, _, seed = variant.rpartition("-s")
    return name, int(seed)


@dataclass(frozen=True)
class Variant:
    """A sampling config paired with a seed: the unit a generation file holds."""

    sampling: Sampling
    seed: int

    @property
    def name(self) -> str:
        return self.sampling.variant(self.seed)


BACKENDS = ("vllm", "openai", "replay")


@dataclass(frozen=True)
class Run:
    """A training run (backend `vllm`), a model behind an endpoint (`openai`), or generations that
    already exist (`replay`). Only `vllm` runs have weights to consolidate."""

    name: str
    path: Path | None
    format: str
    base_model: Path | None
    checkpoints: tuple[Checkpoint, ...]
    backend: str = "vllm"
    endpoint: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    solutions: str | None = None
    #: Replay runs whose `solutions` is a directory per checkpoint (a pattern with {step} and
    #: no {task}): a task's files are found in it (`solutions_files`).
    per_checkpoint_dirs: bool = False
    #: The run's only task, when it has one (its files are every JSONL file of the directory).
    only_task: str | None = None
    #: `runs.<name>.chat_template`, resolved (ckpteval.chat_templates).
    chat_template: ChatTemplate = ChatTemplate()

    @property
    def has_weights(self) -> bool:
        return self.backend == "vllm"

    def solutions_file(self, task: str, variant: str, step: int) -> Path:
        """The replay file holding `task`'s generations for `variant` at `step` (for a directory
        per checkpoint: that directory)."""
        assert self.solutions is not None, f"run {self.name} is not a replay run"
        return Path(
            self.solutions.replace("{task}", task)
            .replace("{variant}", variant)
            .replace("{step}", str(step))
        )

    def solutions_files(self, task: str, variant: str, step: int) -> list[Path]:
        """The replay files holding `task`'s generations at `step`. In a directory per
        checkpoint: every JSONL file under `<dir>/<task>/`, else `<dir>/<task>.jsonl`, else
        (a run of one task) every JSONL file under `<dir>`, found recursively, sorted."""
        path = self.solutions_file(task, variant, step)
        if not self.per_checkpoint_dirs:
            return [path]
        if (path / task).is_dir():
            return _jsonl_under(path / task)
        if (path / f"{task}.jsonl").is_file():
            return [path / f"{task}.jsonl"]
        return _jsonl_under(path) if self.only_task == task and path.is_dir() else []


@dataclass(frozen=True)
class Plan:
    """Everything the rules need, derived once from the validated config."""

    outdir: str
    runs: dict[str, Run]
    tasks: dict[str, TaskSpec]
    variants: dict[str, Variant]
    task_variants: dict[str, tuple[str, ...]]
    config: dict[str, Any] = field(repr=False)
    shard: Shard | None = None
    #: (run, checkpoint) entries that look broken: not completely written and unchanged for
    #: longer than the run's `settle_seconds`. They are reported, never silently skipped.
    broken: tuple[tuple[str, Unfinished], ...] = ()
    #: (run, checkpoint) entries being written: not complete yet, changed within `settle_seconds`.
    #: Shown by `check`, `status` and the report as waiting, never skipped without a word.
    waiting: tuple[tuple[str, Unfinished], ...] = ()
    #: Per run, checkpoints whose source is gone but whose results are on disk (kept, marked).
    deleted: dict[str, tuple[Checkpoint, ...]] = field(default_factory=dict)
    #: One line per task left out: marked `optional` and its checker's program not installed
    #: here (`left_out_tasks`). Said by the workflow's parse, `check` and `status`.
    left_out: tuple[str, ...] = ()
    #: Content hashes of the files settings name, memoized (ckpteval.content).
    content: ContentIds | None = field(default=None, repr=False, compare=False)

    def _content(self) -> ContentIds:
        if self.content is None:
            object.__setattr__(self, "content", ContentIds(self.outdir))
        assert self.content is not None
        return self.content

    def base_model_id(self, run: str) -> str | None:
        """`runs.<run>.base_model` by content (ckpteval.content.model_files), not by path: the
        same model elsewhere is the same identity, one changed byte another. None: unset."""
        base = self.runs[run].base_model
        if base is None:
            return None
        return self._content().of_files(f"runs.{run}.base_model", base, model_files(base))

    def solutions_id(self, cell: CellKey) -> str | None:
        """A replay cell's `runs.<run>.solutions` files by content (not by path): the replay
        job's `solutions` param, recorded in its generation meta. Per cell, so that a task added
        or one task's new files replay and rescore that task's cells alone. None: not a replay
        run, or a checkpoint whose files are gone (its results are kept as they are)."""
        spec = self.runs[cell.run]
        if spec.solutions is None:
            return None
        checkpoint = self.checkpoint(cell.run, cell.ckpt)
        if checkpoint.deleted:
            return None
        files = spec.solutions_files(cell.task, cell.variant, checkpoint.step)
        if not files:
            return None
        root = files[0] if len(files) == 1 else _common_root(files)
        # by checkpoint too: the memo keeps one hash per file name in a scope
        scope = f"runs.{cell.run}.solutions/{cell.task}/{cell.variant}/{cell.ckpt}"
        return self._content().of_files(scope, root, files)

    def include_paths_id(self) -> Any:
        """`lm_eval.include_paths` by content: the task YAMLs (and Python files) under each
        path, in order. An empty list stays `[]`, the identity harness cells always had."""
        paths = list((self.config.get("lm_eval") or {}).get("include_paths") or [])
        if not paths:
            return paths
        ids = []
        for i, raw in enumerate(paths):
            path = Path(os.path.expanduser(os.path.expandvars(str(raw))))
            ids.append(
                self._content().of_files(f"lm_eval.include_paths/{i}", path, task_yaml_files(path))
            )
        return ids

    def broken_lines(self, *, age: bool = True) -> list[str]:
        """One line per broken checkpoint, naming the file and the problem. With `age`, how long
        it has been unchanged, and files by their full path; without (a job's params, which must
        not change by the minute nor when the project moves), files relative to the run's path."""
        return [
            f"run {run}: checkpoint {u.name} looks broken"
            + (f" (unchanged for {u.idle_seconds / 60:.0f} min)" if age else "")
            + f": {u.problem if age else self._relative(run, u.problem)}"
            for run, u in self.broken
        ]

    def final_checkpoints(self) -> list[str]:
        """`run/ckpt` of every final checkpoint (named without a step): labelled in the report."""
        return [f"{r.name}/{c.name}" for r in self.runs.values() for c in r.checkpoints if c.final]

    def waiting_lines(self, *, age: bool = True) -> list[str]:
        """One line per checkpoint being written: `run r: checkpoint c waiting: being written
        (shard 2 of 2 as .tmp, last change 3 s ago)`; without `age` (a job's params) no time."""
        return [
            f"run {run}: checkpoint {u.name} {u.waiting_line(age=age)}" for run, u in self.waiting
        ]

    def _relative(self, run: str, text: str) -> str:
        """`text` with the run's directory left out of its paths (a replay run's: where its
        solutions are), so that a job's params do not change when the project moves."""
        found = self.runs[run]
        path = found.path
        if path is None and found.checkpoints:
            path = found.checkpoints[0].path
        return text.replace(f"{path}{os.sep}", "") if path is not None else text

    @functools.cached_property
    def engine_groups(self) -> dict[str, tuple[str, ...]]:
        """Engine group -> its tasks; each group is one infer job per checkpoint. The default
        group `""` (every task without `engine_group`) is the rule `infer`. Once per plan:
        input functions ask per job."""
        groups: dict[str, list[str]] = {}
        for name in self.tasks:
            group = (self.config["tasks"][name] or {}).get("engine_group") or ""
            groups.setdefault(group, []).append(name)
        return {g: tuple(ts) for g, ts in sorted(groups.items())}

    def runs_with_backend(self, backend: str) -> list[str]:
        return [name for name, run in self.runs.items() if run.backend == backend]

    def checkpoint(self, run: str, ckpt: str) -> Checkpoint:
        """A checkpoint of the plan, or one whose source was deleted (its results stay)."""
        try:
            return self._checkpoints[(run, ckpt)]
        except KeyError:
            raise UserError(f"no checkpoint {ckpt!r} in run {run!r}") from None

    @functools.cached_property
    def _checkpoints(self) -> dict[tuple[str, str], Checkpoint]:
        """(run, name) -> checkpoint, built once: input functions ask per job, and a scan of
        the run per job made planning quadratic in checkpoints. The first of a name wins."""
        index: dict[tuple[str, str], Checkpoint] = {}
        for name, run in self.runs.items():
            for c in (*run.checkpoints, *self.deleted.get(name, ())):
                index.setdefault((name, c.name), c)
        return index

    def score_files(self) -> list[str]:
        """The evaluate step's cell metrics file of every cell, under `outdir`."""
        layout = Layout(self.outdir)
        return [layout.score(cell) for cell in self.cell_keys]

    @functools.cached_property
    def cell_keys(self) -> tuple[CellKey, ...]:
        """Every cell the config asks for, in step order (once per plan: input functions ask)."""
        return tuple(self.cell_steps)

    @functools.cached_property
    def cell_steps(self) -> Mapping[CellKey, int]:
        """Every cell the config asks for, in step order, with its checkpoint's step (what
        `ckpteval status` shows beside each); read-only: callers share it."""
        return MappingProxyType(
            {
                CellKey(run.name, ckpt.name, task, variant): ckpt.step
                for run in self.runs.values()
                for ckpt in run.checkpoints
                for task, variants in self.task_variants.items()
                for variant in variants
            }
        )


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML config file; unreadable or non-mapping files are a `UserError`."""
    try:
        with open(path, encoding="utf-8") as handle:
            cfg = yaml.safe_load(handle)
    except FileNotFoundError:
        raise UserError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: a directory; give the config's YAML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: unreadable ({exc})") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML{_yaml_problem(exc)}") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: a config must be a mapping of keys (runs:, tasks:, ...)")
    return cfg


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Where the parser gave up and why, so a user finds the unclosed bracket without a YAML
    linter: ` at line 3, column 6: expected ',' or '}', but got ':' (while parsing a flow
    mapping from line 2)`; ` (first line of the error)` when the error carries no position."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or not problem:
        return f" ({str(exc).splitlines()[0]})"
    where = f" at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and start is not None:
        where += f" ({context} from line {start.line + 1})"
    return where


def validate_config(config: dict[str, Any], schema_path: Path = SCHEMA_PATH) -> None:
    """Validate against the JSON schema, filling defaults in place, as Snakemake's
    `snakemake.utils.validate(config, schema, set_default=True)` does (the same validator and
    default rule); on failure, the most relevant error as one line, `config: <key path>:
    <problem>`, where Snakemake's message is several lines with the whole schema.
    """
    import jsonschema

    if not isinstance(config, dict) or not config:
        raise UserError(
            "config is empty: give a config file with --configfile (see config/README.md)"
        )
    _pasted_val_files(config)
    if isinstance(config.get("tasks"), dict):
        for name, opts in config["tasks"].items():
            if opts is None:
                config["tasks"][name] = {}
            elif isinstance(opts, dict):
                _pasted_checker(name, opts)
    schema = _schema(str(schema_path))
    try:
        _defaulting_validator()(schema).validate(config)
    except jsonschema.ValidationError:
        error = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(schema).iter_errors(copy.deepcopy(config))
        )
        if error is None:
            raise
        key = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        raise UserError(f"config: {key}: {_short(error)}") from None
    for name, opts in config["tasks"].items():
        _canonical_checker(name, opts)


@functools.cache
def _schema(path: str) -> dict[str, Any]:
    """The config schema, read once per process with libyaml where PyYAML has it: Snakemake's
    `validate` reads it with the pure-Python parser, ~0.3 s of every parse of the workflow
    (each `snakemake`, each Slurm job's, `ckpteval status` and `check`). Never changed: the
    defaults it holds are copied into a config, not shared."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=loader)


@functools.cache
def _defaulting_validator() -> Any:
    """Draft 2020-12 that fills a missing property with its schema default, as Snakemake's
    `validate(..., set_default=True)` (from jsonschema's FAQ); the default is a copy."""
    from jsonschema import Draft202012Validator, validators

    check_properties = Draft202012Validator.VALIDATORS["properties"]

    def set_defaults(validator: Any, properties: Any, instance: Any, schema: Any) -> Any:
        for name, subschema in properties.items():
            if "default" in subschema:
                instance.setdefault(name, copy.deepcopy(subschema["default"]))
        yield from check_properties(validator, properties, instance, schema)

    return validators.extend(Draft202012Validator, {"properties": set_defaults})


def _pasted_val_files(config: dict[str, Any]) -> None:
    """verl's `data.val_files` pasted into a task (as `data: {val_files}`, `data.val_files` or
    `val_files`) or at the top level: one line naming ckpteval's key for the same files, where
    the schema would only call it unknown. Not translated: verl takes a list of files and
    ckpteval one file or directory per task."""
    places: list[tuple[str, Any]] = [("", config)]
    if isinstance(config.get("tasks"), dict):
        places += [(f"tasks.{name}.", opts) for name, opts in config["tasks"].items()]
    for prefix, opts in places:
        if not isinstance(opts, dict):
            continue
        data = opts.get("data")
        for key, present in (
            ("data.val_files", isinstance(data, dict) and "val_files" in data),
            ("data.val_files", "data.val_files" in opts),
            ("val_files", bool(prefix) and "val_files" in opts),
        ):
            if present:
                task = prefix or "tasks.<name>."
                raise UserError(
                    f"config: {prefix}{key}: verl's key; ckpteval reads a task's validation "
                    f"set from {task}problems: one file (.parquet, .jsonl) or a directory of "
                    "them, one task per set (config/README.md)"
                )


def _pasted_checker(task: str, opts: dict[str, Any]) -> None:
    """Another tool's block for a checker pasted at the task's level, as that tool's config has
    it (verl's `custom_reward_function: {path, name}`), moved into the task's `checker:`."""
    from ckpteval.checkers import available, checker_named_by

    for key in [k for k in opts if k not in available() and checker_named_by(str(k))]:
        checker = opts.get("checker")
        if checker is None or checker == checker_named_by(key):
            opts["checker"] = {}
        elif not isinstance(checker, dict):
            raise UserError(
                f"config: tasks.{task}.{key}: names checker {checker_named_by(key)}, but "
                f"tasks.{task}.checker is {checker}; give one"
            )
        opts["checker"][key] = opts.pop(key)


def _canonical_checker(task: str, opts: dict[str, Any]) -> None:
    """A task's `checker:` mapping as its checker's identity holds it (another tool's spelling
    translated, documented defaults dropped: `Checker.canonical_options`), in place, so that a
    default written out or verl's block pasted is the same setting as ckpteval's short form."""
    from ckpteval.checkers import checker_class
    from ckpteval.tasks import checker_name

    value = opts.get("checker")
    if not isinstance(value, dict):
        return
    key = f"config: tasks.{task}.checker"
    try:
        name = checker_name(value)
    except UserError as exc:
        raise UserError(f"{key}: {exc}") from None
    cls = checker_class(name) if name else None
    if cls is not None and cls.task_options is not None:
        opts["checker"] = cls.canonical_options(key, value)


def _short(error: Any) -> str:
    """A one-line description of a jsonschema error."""
    if error.validator == "additionalProperties":
        return (
            error.message.replace("were unexpected", "are not known keys").replace(
                "was unexpected", "is not a known key"
            )
            + " (see config/README.md)"
        )
    if error.validator == "required":
        return error.message
    if error.validator == "pattern" and error.schema.get("pattern") == "\\{step\\}":
        return f"{error.instance!r} must contain the placeholder {{step}}"
    return error.message if len(error.message) < 200 else error.message[:200] + "..."


def sampling_configs(raw: dict[str, Any] | list[dict[str, Any]]) -> dict[str, Sampling]:
    """The config's sampling configs by name. A list is named from the values
    (`{temperature: 0.6, top_p: 0.95, n: 8}` -> `t0.6p0.95n8`, plus `m<max_new_tokens>` when that
    is not the default 512), so variants read `t0.6p0.95n8-s1`."""

    def make(name: str, s: dict[str, Any]) -> Sampling:
        return Sampling(
            name,
            float(s.get("temperature", 0.0)),
            float(s.get("top_p", 1.0)),
            int(s.get("max_new_tokens", 512)),
            int(s.get("n", 1)),
        )

    if isinstance(raw, dict):
        return {name: make(name, s) for name, s in raw.items()}
    out: dict[str, Sampling] = {}
    for s in raw:
        sampling = make("", s)
        name = f"t{sampling.temperature:g}p{sampling.top_p:g}n{sampling.n}" + (
            f"m{sampling.max_new_tokens}" if sampling.max_new_tokens != 512 else ""
        )
        if name in out:
            raise UserError(f"config: sampling: two entries are both {name}; drop one")
        out[name] = make(name, s)
    return out


def seeds_for(sampling: Sampling, config: dict[str, Any]) -> list[int]:
    """The seeds a sampling config runs: every configured seed for sampled configs; one for a
    greedy one (temperature 0), whose samples no seed changes, labelled with `engine.seed`."""
    if sampling.temperature == 0:
        return [int((config.get("engine") or {}).get("seed", 42))]
    return [int(seed) for seed in config["seeds"]]


def build_tasks(
    config: dict[str, Any],
) -> tuple[dict[str, TaskSpec], dict[str, Variant], dict[str, tuple[str, ...]]]:
    """Tasks, variants, and which variants each task runs, from a validated config (no disk I/O)."""
    samplings = sampling_configs(config["sampling"])
    variants = {
        s.variant(seed): Variant(s, seed)
        for s in samplings.values()
        for seed in seeds_for(s, config)
    }
    tasks: dict[str, TaskSpec] = {}
    task_variants: dict[str, tuple[str, ...]] = {}
    for name, opts in config["tasks"].items():
        tasks[name] = resolve_task(name, with_reasoning(name, opts or {}, config.get("reasoning")))
        wanted = (opts or {}).get("sampling") or list(samplings)
        for s in wanted:
            if s not in samplings:
                raise UserError(
                    f"config: tasks.{name}.sampling: {s!r} is not a sampling config; "
                    f"defined: {', '.join(samplings)}"
                )
        task_variants[name] = tuple(
            samplings[s].variant(seed) for s in wanted for seed in seeds_for(samplings[s], config)
        )
    return tasks, variants, task_variants


def with_reasoning(name: str, opts: dict[str, Any], default: Any) -> dict[str, Any]:
    """A task's options with its effective `reasoning` (its own, else the top-level default)
    normalized, or without the key when reasoning is off: the task's identity then hashes what
    the task does, and a config without reasoning keeps every identity it had."""
    own = "reasoning" in opts
    where = f"tasks.{name}.reasoning" if own else "reasoning"
    effective = from_config(opts["reasoning"] if own else default, where)
    out = {k: v for k, v in opts.items() if k != "reasoning"}
    if effective is not None:
        out["reasoning"] = effective.as_dict()
    return out


def build_plan(
    config: dict[str, Any], base_dir: Path | None = None, *, allow_empty_runs: bool = False
) -> Plan:
    """Resolve runs (discovering checkpoints), tasks and variants from a validated config.

    A vllm run whose directory holds nothing its patterns match (and has no results yet) is a
    `UserError` naming the patterns, unless `allow_empty_runs` (`ckpteval watch`, which waits
    for a training run's first checkpoint)."""
    base_dir = base_dir or Path.cwd()
    tasks, variants, task_variants = build_tasks(config)
    left_out = left_out_tasks(tasks, config)
    for name in left_out:
        del tasks[name], task_variants[name]

    runs: dict[str, Run] = {}
    broken: list[tuple[str, Unfinished]] = []
    waiting: list[tuple[str, Unfinished]] = []
    deleted: dict[str, tuple[Checkpoint, ...]] = {}
    for name, r in config["runs"].items():
        if r.get("train_logs") and not allow_empty_runs:
            _check_train_logs(name, r["train_logs"], base_dir)
        backend = r["backend"]
        if backend == "openai":
            runs[name] = _weightless_run(name, r, base_dir, task_variants)
            continue
        if backend == "replay":
            models = Path(Layout(config["outdir"]).models_of(name))
            runs[name], unfinished, gone = _replay_run(name, r, base_dir, task_variants, models)
        else:
            runs[name], unfinished, gone = _vllm_run(name, r, base_dir, config, allow_empty_runs)
        for u in unfinished:
            (broken if u.idle_seconds >= r["settle_seconds"] else waiting).append((name, u))
        if gone:
            deleted[name] = tuple(gone)
    runs = {
        name: dataclasses.replace(
            run,
            chat_template=resolve(
                config["runs"][name].get("chat_template"),
                key=f"config: runs.{name}.chat_template",
                base_dir=base_dir,
                backend=run.backend,
            ),
        )
        for name, run in runs.items()
    }

    check_plain_turns(runs, tasks)
    check_piston_limits(tasks, config)
    tp = config["engine"]["tensor_parallel_size"]
    if tp > 1 and not config["engine"]["allow_tensor_parallel"]:
        raise UserError(
            f"config: engine.tensor_parallel_size: {tp} > 1 changes scores between runs; keep 1 "
            "(one GPU per job), or set engine.allow_tensor_parallel: true for models that do not fit"
        )
    shard = parse_shard(config.get("shard"))
    runs = {
        name: dataclasses.replace(run, checkpoints=tuple(select(run.checkpoints, name, shard)))
        for name, run in runs.items()
    }
    return Plan(
        config["outdir"],
        runs,
        tasks,
        variants,
        task_variants,
        config,
        shard,
        tuple(broken),
        tuple(waiting),
        deleted,
        left_out=tuple(left_out.values()),
    )


def left_out_tasks(tasks: dict[str, TaskSpec], config: dict[str, Any]) -> dict[str, str]:
    """The tasks marked `optional` whose checker runs a program not installed here
    (`Checker.programs`: rustc for Rust), each with the line saying so: left out of the plan, so
    that a machine without an optional tool (the demo's Rust task) runs the rest. A task not
    marked optional stays, and its evaluate job fails naming the program: a task asked for is
    never silently dropped. Decided on the machine that plans."""
    from ckpteval.checkers import checker_class

    evaluate = config.get("evaluate") or {}
    out: dict[str, str] = {}
    for name, spec in tasks.items():
        if not config["tasks"][name].get("optional") or spec.checker == "harness":
            continue
        needed = checker_class(spec.checker).programs(spec.language, evaluate)
        missing = [p for p in needed if shutil.which(p) is None]
        if missing:
            out[name] = (
                f"task {name} left out: it is optional and its checker runs "
                f"{' and '.join(missing)}, not found on PATH; install {' '.join(missing)} "
                f"(Debian: sudo apt-get install {' '.join(missing)}) to run it"
            )
    if out and len(out) == len(tasks):
        raise UserError(f"config: tasks: every task is left out ({'; '.join(out.values())})")
    return out


def _check_train_logs(name: str, logs: dict[str, Any], base_dir: Path) -> None:
    """The trainer's logs a run names (`runs.<name>.train_logs.path`) exist and hold a log file:
    a wrong path is one line now, not a failed aggregate job. (`ckpteval watch` may start
    before the trainer has logged anything: it skips this, like a run's empty directory.)"""
    from ckpteval.trainlogs import log_files

    log_files(
        resolve_path(str(logs["path"]), base_dir), where=f"config: runs.{name}.train_logs.path"
    )


def check_piston_limits(tasks: dict[str, TaskSpec], config: dict[str, Any]) -> None:
    """Each checker that generate tasks use checks the config's `evaluate` section against its
    tasks' problems (`Checker.check_run_config`: the stdio checker, a Piston server's limits),
    so that a problem it cannot judge as it asks is one line now, not in an evaluate job."""
    from ckpteval.checkers import checker_class

    evaluate = config.get("evaluate") or {}
    by_checker: dict[str, dict[str, Any]] = {}
    for name, task in tasks.items():
        if task.kind == "generate":
            by_checker.setdefault(task.checker, {})[name] = task
    for checker, named in by_checker.items():
        checker_class(checker).check_run_config(named, evaluate)


def _vllm_run(
    name: str, r: dict[str, Any], base_dir: Path, config: dict[str, Any], allow_empty_runs: bool
) -> tuple[Run, list[Unfinished], list[Checkpoint]]:
    """A vllm run: its checkpoints, those that look unfinished (being written, or broken once
    unchanged for longer than it settles), and those whose results remain but whose files are
    gone (deleted)."""
    if not r.get("path"):
        raise UserError(
            f"config: runs.{name}.path: required for backend vllm (the training "
            "run's output directory)"
        )
    for key in ("endpoint", "solutions"):
        if r.get(key) is not None:
            raise UserError(
                f"config: runs.{name}.{key}: only for backend "
                f"{'openai' if key == 'endpoint' else 'replay'}; this run's backend "
                "is vllm (set runs.<name>.backend)"
            )
    s3_url = str(r["path"]) if is_s3(r["path"]) else None
    path = local_path(s3_url) if s3_url else resolve_path(r["path"], base_dir)
    if s3_url is None and not path.is_dir():
        raise UserError(
            f"config: runs.{name}.path: {path} is not a directory; point it at the training "
            "run's output directory"
        )
    base_model = resolve_path(r["base_model"], base_dir) if r.get("base_model") else None
    if base_model is not None and not base_model.is_dir():
        raise UserError(f"config: runs.{name}.base_model: {base_model} is not a directory")
    if r.get("evaluate_base") and base_model is None:
        raise UserError(f"config: runs.{name}.evaluate_base needs runs.{name}.base_model")
    found = {"marker": r.get("complete_marker"), "final_names": r["final_names"]}
    if s3_url:
        where = f"config: runs.{name}.path"
        ckpts, unfinished = discover_s3(s3_url, r["patterns"], where=where, **found)
    else:
        ckpts = discover_checkpoints(path, r["patterns"], **found)
        unfinished = unfinished_checkpoints(path, r["patterns"], **found)
    present = {c.name for c in ckpts} | {u.name for u in unfinished}
    models = Path(Layout(config["outdir"]).models_of(name))
    gone = deleted_checkpoints(models, path, present | {"base"}, r["patterns"])
    if not ckpts and not unfinished and not allow_empty_runs:
        _nothing_found(name, r["patterns"], s3_url or path, models, gone)
    if r.get("evaluate_base"):
        ckpts = [Checkpoint("base", 0, base_model, is_base=True), *ckpts]
    return Run(name, path, r["format"], base_model, tuple(ckpts)), unfinished, gone


def _nothing_found(
    name: str, patterns: list[str], where: Path | str, models: Path, gone: list[Checkpoint]
) -> None:
    """A run that finds no checkpoint is a mistake, said in one line: where it looked, what is
    there, and, when earlier results of the run exist, for how many checkpoints (a wrong or
    parent directory, an empty one, a wrong S3 prefix: its results would silently drop out).
    What an S3 prefix holds takes one more listing, made only here."""
    if isinstance(where, Path):
        names = {p.name for p in where.iterdir()}
    else:
        names = {
            key.split("/", 1)[0] for key, *_ in list_objects(where, f"config: runs.{name}.path")
        }
    entries = sorted(n for n in names if not n.startswith("."))
    holds = (
        f" (it holds {', '.join(entries[:5])}{', ...' if len(entries) > 5 else ''})"
        if entries
        else " (it is empty)"
    )
    if gone:
        raise UserError(
            f"config: runs.{name}.path: no checkpoint in {where} matches {', '.join(patterns)}"
            f"{holds}, but {models} has results for {len(gone)} checkpoint(s) of run {name}; "
            "point it at the training run's output directory"
        )
    raise UserError(
        f"config: runs.{name}.patterns: nothing in {where} matches {', '.join(patterns)}{holds}"
    )


def _endpoint_run(name: str, r: dict[str, Any], base_dir: Path) -> Run:
    """An `openai` run: the endpoint's one model, as checkpoint `step_<runs.<name>.step>`."""
    key = f"config: runs.{name}"
    if not r.get("endpoint"):
        raise UserError(f"{key}.endpoint: backend openai needs endpoint: {{base_url, model}}")
    if r.get("solutions") is not None:
        raise UserError(f"{key}.solutions: only for backend replay")
    step = int(r["step"])
    path = resolve_path(r["path"], base_dir) if r.get("path") else base_dir
    ckpt = Checkpoint(f"step_{step}", step, path)
    return Run(name, None, "openai", None, (ckpt,), "openai", dict(r["endpoint"]), None)


def _weightless_run(
    name: str, r: dict[str, Any], base_dir: Path, task_variants: dict[str, tuple[str, ...]]
) -> Run:
    """An `openai` or `replay` run: no weights, no consolidation; checkpoints named `step_<N>`.

    An endpoint serves one model (checkpoint `step_<runs.<name>.step>`). Replay files come from
    the `solutions` pattern (`{task}`, optionally `{variant}` and `{step}`; a directory means
    `<dir>/{task}.jsonl`); its checkpoints are `_replay_run`'s (none here).
    A directory per checkpoint (`model_solution_x/checkpoint_{step}`: a pattern with `{step}`
    and no `{task}`, or a directory holding `checkpoint_<N>/` directories and no `<task>.jsonl`)
    holds one or more JSONL files per task (`Run.solutions_files`).
    """
    backend = r["backend"]
    key = f"config: runs.{name}"
    if r.get("evaluate_base") or r.get("base_model"):
        raise UserError(f"{key}.base_model: only vllm runs have a base model to evaluate")
    if backend == "openai":
        return _endpoint_run(name, r, base_dir)
    if r.get("endpoint") is not None:
        raise UserError(f"{key}.endpoint: only for backend openai")
    if not r.get("solutions"):
        raise UserError(
            f"{key}.solutions: backend replay needs solutions: a directory of "
            "<task>.jsonl files or a pattern with {task}"
        )
    pattern = str(resolve_path(r["solutions"], base_dir))
    tasks = list(task_variants)
    if "{" not in pattern:
        if not Path(pattern).is_dir():
            raise UserError(
                f"{key}.solutions: {pattern} is neither a directory nor a pattern with {{task}}"
            )
        per_ckpt = _checkpoint_dirs_pattern(Path(pattern), tasks)
        pattern = per_ckpt or str(Path(pattern) / "{task}.jsonl")
    dirs = "{step}" in pattern and "{task}" not in pattern
    unknown = set(re.findall(r"\{(\w*)\}", pattern)) - {"task", "variant", "step"}
    if ("{task}" not in pattern and not dirs) or unknown or (dirs and "{variant}" in pattern):
        raise UserError(
            f"{key}.solutions: {r['solutions']!r} must contain {{task}} and may "
            "contain {variant} and {step}, nothing else in braces; or be a directory "
            "per checkpoint: a pattern with {step} alone (e.g. "
            "model_solution_x/checkpoint_{step})"
        )
    if "{variant}" not in pattern:
        for task, variants in task_variants.items():
            if len(variants) > 1:
                raise UserError(
                    f"{key}.solutions: task {task} runs {len(variants)} variants "
                    f"({', '.join(variants)}) but the pattern has no {{variant}}; add it, or "
                    f"give tasks.{task}.sampling one sampling config and seeds one seed"
                )
    return Run(
        name,
        None,
        backend,
        None,
        (),
        backend,
        None,
        pattern,
        dirs,
        tasks[0] if len(tasks) == 1 else None,
    )


def _replay_run(
    name: str,
    r: dict[str, Any],
    base_dir: Path,
    task_variants: dict[str, tuple[str, ...]],
    models: Path,
) -> tuple[Run, list[Unfinished], list[Checkpoint]]:
    """A replay run: its checkpoints (the steps whose files all exist), the steps that lack a
    task's files (reported as waiting, then broken, as a checkpoint being written is), and the
    steps not complete now whose results remain (`models`: a model card per step; kept and
    marked, as a deleted checkpoint is). Before, a step missing one task's files, or all its
    files, dropped out of the plan and the report without a word."""
    key = f"config: runs.{name}"
    run = _weightless_run(name, r, base_dir, task_variants)
    pattern, dirs = str(run.solutions), run.per_checkpoint_dirs
    files = [(t, v) for t, vs in task_variants.items() for v in vs]
    steps = _replay_steps(pattern, dirs) if "{step}" in pattern else [int(r["step"])]

    def missing(step: int) -> Path | None:
        """The first file the step lacks (in a directory per checkpoint: `<task>.jsonl`, one
        of the forms `Run.solutions_files` accepts), or None."""
        for t, v in files:
            found = run.solutions_files(t, v, step)
            if not found or not all(p.is_file() for p in found):
                where = run.solutions_file(t, v, step)
                return where / f"{t}.jsonl" if dirs else where
        return None

    lacking = {s: where for s in steps if (where := missing(s)) is not None}
    complete = [s for s in steps if s not in lacking]
    base = Path(pattern.split("{", 1)[0])
    root = base if base.is_dir() else base.parent
    recorded = _replay_steps_recorded(models)
    # kept as a deleted checkpoint's are: a step whose files are gone, and one that lacks a
    # task's files now (a task added to the config) but was scored before
    gone = [
        Checkpoint(f"step_{s}", s, root, deleted=True)
        for s in sorted(recorded - set(complete))
        if "{step}" in pattern
    ]
    if not steps:
        had = (
            f", but {models} has results for {len(gone)} checkpoint(s) of run {name}"
            if gone
            else ""
        )
        raise UserError(
            f"{key}.solutions: no {'directory' if dirs else 'file'} matches {pattern}{had}"
        )
    if not complete:
        step = steps[0]
        if dirs:
            task = next(t for t, v in files if not run.solutions_files(t, v, step))
            where = run.solutions_file(task, "", step)
            raise UserError(
                f"{key}.solutions: no solutions of task {task} in {where} (with "
                f"several tasks: {where}/{task}/*.jsonl or {where}/{task}.jsonl)"
            )
        raise UserError(f"{key}.solutions: no file {lacking[step]}")
    unfinished = [
        Unfinished(
            f"step_{s}",
            where,
            _idle_seconds(run, files, s),
            f"no solutions file {where} (the step's other files are there)",
            f"no file {where.name} yet",
        )
        for s, where in sorted(lacking.items())
    ]
    ckpts = tuple(Checkpoint(f"step_{s}", s, root) for s in sorted(complete))
    return dataclasses.replace(run, checkpoints=ckpts), unfinished, gone


def _replay_steps_recorded(models: Path) -> set[int]:
    """The steps of a replay run that have a model card (results) under `models`."""
    if not models.is_dir():
        return set()
    return {int(m.group(1)) for p in models.glob("step_*.json") if (m := _STEP_CARD.match(p.name))}


_STEP_CARD = re.compile(r"step_(\d+)\.json\Z")


def _idle_seconds(run: Run, files: list[tuple[str, str]], step: int) -> float:
    """Seconds since the newest of a replay step's files changed (0 when none can be read)."""
    times = [
        p.stat().st_mtime for t, v in files for p in run.solutions_files(t, v, step) if p.is_file()
    ]
    return max(0.0, time.time() - max(times)) if times else 0.0


#: Directory names of checkpoints in a replay run's solutions directory: the prefix and the step.
_CKPT_DIR = re.compile(r"(?P<prefix>(?:checkpoint|step|global_step|ckpt)[_-]?)(?P<step>\d+)\Z")


def _checkpoint_dirs_pattern(path: Path, tasks: list[str]) -> str | None:
    """For a solutions directory holding a directory per checkpoint (`checkpoint_<step>/`, or
    step_, global_step, ckpt, with _ or - or nothing) and no `<task>.jsonl` of its own: the
    pattern `<dir>/<prefix>{step}`; else None (the directory holds `<task>.jsonl` files)."""
    if any((path / f"{t}.jsonl").is_file() for t in tasks):
        return None
    prefixes = {
        m.group("prefix") for p in path.iterdir() if p.is_dir() and (m := _CKPT_DIR.match(p.name))
    }
    if len(prefixes) > 1:
        raise UserError(
            f"{path}: checkpoint directories named in {len(prefixes)} ways "
            f"({', '.join(sorted(prefixes))}...); give runs.<name>.solutions as a "
            "pattern with {step}, e.g. " + str(path / "checkpoint_{step}")
        )
    return str(path / f"{prefixes.pop()}{{step}}") if prefixes else None


def _jsonl_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*.jsonl") if p.is_file())


def _replay_steps(pattern: str, dirs: bool = False) -> list[int]:
    """Steps for which at least one file (`dirs`: directory) matching a `{step}` solutions
    pattern exists."""
    import glob

    if dirs:
        regex = re.compile(
            re.escape(pattern.rstrip("/")).replace(r"\{step\}", r"(?P<step>\d+)") + r"\Z"
        )
        return sorted(
            {
                int(m.group("step"))
                for f in glob.glob(pattern.replace("{step}", "*"))
                if Path(f).is_dir() and (m := regex.match(f.rstrip("/")))
            }
        )

    regex = re.compile(
        re.escape(pattern)
        .replace(r"\{step\}", r"(?P<step>\d+)")
        .replace(r"\{task\}", r"[^/]+")
        .replace(r"\{variant\}", r"[^/]+")
        + r"\Z"
    )
    wild = pattern.replace("{task}", "*").replace("{variant}", "*").replace("{step}", "*")
    steps = {int(m.group("step")) for f in glob.glob(wild) if (m := regex.match(f))}
    return sorted(steps)


def resolve_path(path: str, base_dir: Path) -> Path:
    """A path of the config (`~` and `$VARS` expanded), relative ones taken from `base_dir`."""
    p = Path(os.path.expanduser(os.path.expandvars(path)))
    return p if p.is_absolute() else (base_dir / p)


def _common_root(files: list[Path]) -> Path:
    """The deepest directory holding all of `files` (one file: its directory)."""
    return Path(os.path.commonpath([str(f.parent) for f in files]))
