"""Load and validate the workflow config; expand it into the plan of jobs.

The Snakefile hands its `config` dict here at parse time. Validation fills schema defaults in place
(so the rules see one complete config) and turns the first schema error into one line naming the
key. `build_plan` then discovers checkpoints on disk and resolves task names, so every user mistake
surfaces before the DAG is built.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ckpteval.checkpoints import Checkpoint, discover_checkpoints
from ckpteval.errors import UserError
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


@dataclass(frozen=True)
class Variant:
    """A sampling config paired with a seed: the unit a generation file holds."""

    sampling: Sampling
    seed: int

    @property
    def name(self) -> str:
        return self.sampling.variant(self.seed)


@dataclass(frozen=True)
class Run:
    name: str
    path: Path
    format: str
    base_model: Path | None
    checkpoints: tuple[Checkpoint, ...]


@dataclass(frozen=True)
class Plan:
    """Everything the rules need, derived once from the validated config."""

    outdir: str
    runs: dict[str, Run]
    tasks: dict[str, TaskSpec]
    variants: dict[str, Variant]
    task_variants: dict[str, tuple[str, ...]]
    config: dict[str, Any] = field(repr=False)

    def checkpoint(self, run: str, ckpt: str) -> Checkpoint:
        try:
            return next(c for c in self.runs[run].checkpoints if c.name == ckpt)
        except (KeyError, StopIteration):
            raise UserError(f"no checkpoint {ckpt!r} in run {run!r}") from None

    def cells(self) -> list[dict[str, Any]]:
        """Every (run, ckpt, task, variant) the config asks for, in step order."""
        out = []
        for run in self.runs.values():
            for ckpt in run.checkpoints:
                for task, variants in self.task_variants.items():
                    for variant in variants:
                        out.append(
                            {"run": run.name, "ckpt": ckpt.name, "step": ckpt.step,
                             "task": task, "variant": variant}
                        )
        return out


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML config file; unreadable or non-mapping files are a `UserError`."""
    try:
        with open(path, encoding="utf-8") as handle:
            cfg = yaml.safe_load(handle)
    except FileNotFoundError:
        raise UserError(f"{path}: config file not found") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: a config must be a mapping of keys (runs:, tasks:, ...)")
    return cfg


def validate_config(config: dict[str, Any], schema_path: Path = SCHEMA_PATH) -> None:
    """Validate against the JSON schema with Snakemake's validator, filling defaults in place.

    Snakemake's own message is several lines with the whole schema; on failure we report the most
    relevant error as `config: <key path>: <problem>` instead.
    """
    import jsonschema
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    if not isinstance(config, dict) or not config:
        raise UserError("config is empty: give a config file with --configfile (see config/README.md)")
    for name, opts in (config.get("tasks") or {}).items():
        if opts is None:
            config["tasks"][name] = {}
    try:
        validate(config, str(schema_path), set_default=True)
    except WorkflowError:
        with open(schema_path, encoding="utf-8") as handle:
            schema = yaml.safe_load(handle)
        error = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(schema).iter_errors(copy.deepcopy(config))
        )
        if error is None:
            raise
        key = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        raise UserError(f"config: {key}: {_short(error)}") from None


def _short(error: Any) -> str:
    """A one-line description of a jsonschema error."""
    if error.validator == "additionalProperties":
        return error.message.replace("were unexpected", "are not known keys").replace(
            "was unexpected", "is not a known key"
        ) + " (see config/README.md)"
    if error.validator == "required":
        return error.message
    if error.validator == "pattern" and error.schema.get("pattern") == "\\{step\\}":
        return f"{error.instance!r} must contain the placeholder {{step}}"
    return error.message if len(error.message) < 200 else error.message[:200] + "..."


def build_tasks(config: dict[str, Any]) -> tuple[dict[str, TaskSpec], dict[str, Variant], dict[str, tuple[str, ...]]]:
    """Tasks, variants, and which variants each task runs, from a validated config (no disk I/O)."""
    samplings = {
        name: Sampling(name, float(s["temperature"]), float(s["top_p"]),
                       int(s["max_new_tokens"]), int(s["n"]))
        for name, s in config["sampling"].items()
    }
    variants = {
        s.variant(seed): Variant(s, seed) for s in samplings.values() for seed in config["seeds"]
    }
    tasks: dict[str, TaskSpec] = {}
    task_variants: dict[str, tuple[str, ...]] = {}
    for name, opts in config["tasks"].items():
        tasks[name] = resolve_task(name, opts or {})
        wanted = (opts or {}).get("sampling") or list(samplings)
        for s in wanted:
            if s not in samplings:
                raise UserError(
                    f"config: tasks.{name}.sampling: {s!r} is not a sampling config; "
                    f"defined: {', '.join(samplings)}"
                )
        task_variants[name] = tuple(
            samplings[s].variant(seed) for s in wanted for seed in config["seeds"]
        )
    return tasks, variants, task_variants


def build_plan(config: dict[str, Any], base_dir: Path | None = None) -> Plan:
    """Resolve runs (discovering checkpoints), tasks and variants from a validated config."""
    base_dir = base_dir or Path.cwd()
    tasks, variants, task_variants = build_tasks(config)

    runs: dict[str, Run] = {}
    for name, r in config["runs"].items():
        path = _resolve(r["path"], base_dir)
        if not path.is_dir():
            raise UserError(
                f"config: runs.{name}.path: {path} is not a directory; point it at the training "
                "run's output directory"
            )
        base_model = _resolve(r["base_model"], base_dir) if r.get("base_model") else None
        if base_model is not None and not base_model.is_dir():
            raise UserError(f"config: runs.{name}.base_model: {base_model} is not a directory")
        if r.get("evaluate_base") and base_model is None:
            raise UserError(f"config: runs.{name}.evaluate_base needs runs.{name}.base_model")
        ckpts = discover_checkpoints(path, r["patterns"], marker=r.get("complete_marker"))
        if r.get("evaluate_base"):
            ckpts = [Checkpoint("base", 0, base_model, is_base=True), *ckpts]
        runs[name] = Run(name, path, r["format"], base_model, tuple(ckpts))

    tp = config["engine"]["tensor_parallel_size"]
    if tp > 1 and not config["engine"]["allow_tensor_parallel"]:
        raise UserError(
            f"config: engine.tensor_parallel_size: {tp} > 1 changes scores between runs; keep 1 "
            "(one GPU per job), or set engine.allow_tensor_parallel: true for models that do not fit"
        )
    return Plan(config["outdir"], runs, tasks, variants, task_variants, config)


def _resolve(path: str, base_dir: Path) -> Path:
    p = Path(os.path.expanduser(os.path.expandvars(path)))
    return p if p.is_absolute() else (base_dir / p)
