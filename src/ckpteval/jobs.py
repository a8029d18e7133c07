"""Each workflow job's identity param, decoded into the typed record its step reads.

A job's identity (ckpteval.contract) is exactly the settings that change its output, and
Snakemake reruns the job when it changes. Steps take every such setting from these records,
never from `snakemake.config` (tests/test_identity_bound.py holds them to it; knobs that change
nothing come through ckpteval.knobs): so a key that is not in a job's identity cannot change that
job's output, and the rerun contract holds by construction. A setting a record needs and the
identity lacks is a contract bug, and fails here with a KeyError rather than silently falling
back on the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpteval.contract import Identity
from ckpteval.errors import UserError
from ckpteval.plan.layout import CellKey


@dataclass(frozen=True)
class ModelJob:
    """A consolidate job: how to read the checkpoint and what to write."""

    identity: Identity
    fmt: str
    dtype: str

    @classmethod
    def decode(cls, text: str, run: str) -> ModelJob:
        """The identity holds the base model by content (ckpteval.content); the job reads the
        directory itself as its declared input."""
        identity = Identity.from_text(text)
        s = identity.settings
        return cls(identity, fmt=s[f"runs.{run}.format"], dtype=s["consolidate.dtype"])


@dataclass(frozen=True)
class ScoringJob:
    """An evaluate job: the task it scores against and the checker settings its checker reads.

    A setting the cell's checker does not read is not in its identity (contract rows with
    `only: checker`); the checker's own default applies then, whatever the config says."""

    identity: Identity
    task: str
    checker: str
    definition: str
    task_options: dict[str, Any] = field(hash=False)
    max_generated_tests: int | None
    timeout: float | None
    timeout_factor: float | None
    ks: list[int] = field(hash=False)
    checker_options: dict[str, Any] = field(hash=False)
    #: The options of the task's `checker:` mapping (a file option as its content id).
    task_checker: dict[str, Any] = field(hash=False, default_factory=dict)

    @classmethod
    def decode(cls, text: str, task: str) -> ScoringJob:
        identity = Identity.from_text(text)
        s = identity.settings
        return cls(
            identity,
            task=task,
            checker=s["checker"],
            definition=s["task.definition"],
            task_options=dict(s["task.options"]),
            max_generated_tests=s.get(f"tasks.{task}.max_generated_tests"),
            timeout=_float(s.get("evaluate.timeout")),
            timeout_factor=_float(s.get("evaluate.timeout_factor")),
            ks=[int(k) for k in s.get("evaluate.ks", ())],  # a self-test's has none
            checker_options=_checker_options(s),
            task_checker={
                key[len(prefix) :]: value
                for key, value in s.items()
                if key.startswith(prefix := f"tasks.{task}.checker.")
            },
        )

    def build_task(self, problems: Path | None) -> Any:
        """This job's task (and no other's), its problems read from `problems` (the rule's
        input: a path moves without rerunning, the content counts by `task.definition`)."""
        from ckpteval.tasks import resolve_task

        options = dict(self.task_options)
        if problems is not None:
            options["problems"] = str(problems)
        if self.max_generated_tests is not None:
            options["max_generated_tests"] = self.max_generated_tests
        spec = resolve_task(self.task, options)
        if spec.config_hash()[:16] != self.definition:
            raise UserError(
                f"task {self.task}: its problems changed after the workflow planned this job "
                f"({problems or 'built-in'}); run the workflow again"
            )
        return spec

    def scoring_kwargs(self, checker_files: Mapping[str, Path] | None = None) -> dict[str, Any]:
        """The scorer's keyword arguments (score_samples, score_harness_file), worker count
        aside (a runtime knob). `checker_files` are the rule's inputs for the task's file
        options (`checker_<option>`), whose content must be the one its identity names."""
        from ckpteval.checkers import checker_class

        options = {**self.checker_options, **self.task_checker}
        for option, path in (checker_files or {}).items():
            if option in options:
                content = checker_class(self.checker).content_id(option, path)
                if f"sha256:{content[:16]}" != options[option]:
                    raise UserError(
                        f"task {self.task}: checker file {path} changed after the workflow "
                        "planned this job; run the workflow again"
                    )
                options[option] = str(path)
        env = self.identity.settings.get("evaluate.python_env")
        if env:
            from ckpteval.checkers.python import python_env_identity

            if python_env_identity(env["path"]) != env:
                raise UserError(
                    f"evaluate.python_env: the packages of {env['path']} changed after the "
                    "workflow planned this job; run the workflow again"
                )
        out: dict[str, Any] = {
            "timeout": self.timeout,
            "ks": self.ks,
            "checker_options": options,
        }
        if self.timeout_factor is not None:
            out["timeout_factor"] = self.timeout_factor
        return out


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _checker_options(settings: dict[str, Any]) -> dict[str, Any]:
    """The checker's construction options, from the evaluate settings in its identity."""
    options: dict[str, Any] = {}
    if "evaluate.sandbox" in settings:
        options["sandbox"] = settings["evaluate.sandbox"]
    if settings.get("evaluate.python_env"):  # its path, beside what it holds
        options["python_env"] = settings["evaluate.python_env"]["path"]
    if settings.get("evaluate.piston_url"):
        prefix = "evaluate.piston_limits."
        options["endpoint"] = settings["evaluate.piston_url"]
        options["piston_limits"] = {
            key[len(prefix) :]: value for key, value in settings.items() if key.startswith(prefix)
        }
    return options


@dataclass(frozen=True)
class SummaryJob:
    """The aggregate job: how the summary is built from the cells."""

    identity: Identity
    title: str
    bootstrap: int
    truncation_threshold: float | None
    #: task -> the main metric its config chooses (`tasks.<task>.main_metric`)
    main_metric: dict[str, str] = field(hash=False, default_factory=dict)
    #: run -> its `train_logs` setting (`path`, `val_kwargs`, `response_length`, `metrics`)
    train_logs: dict[str, dict[str, Any]] = field(hash=False, default_factory=dict)

    @classmethod
    def decode(cls, text: str) -> SummaryJob:
        identity = Identity.from_text(text)
        s = identity.settings
        return cls(
            identity,
            title=s["aggregate.title"],
            bootstrap=int(s["aggregate.bootstrap"]),
            truncation_threshold=_float(s.get("aggregate.truncation_threshold")),
            main_metric=chosen_main_metrics(s),
            train_logs=_train_logs(s),
        )


def _train_logs(settings: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """run -> `runs.<run>.train_logs`, rebuilt from an identity's flat keys."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in settings.items():
        run, marker, rest = key.removeprefix("runs.").partition(".train_logs.")
        if not key.startswith("runs.") or not marker:
            continue
        node = out.setdefault(run, {})
        *parents, leaf = rest.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def chosen_main_metrics(settings: Mapping[str, Any]) -> dict[str, str]:
    """task -> `tasks.<task>.main_metric`, of a config or an identity's settings."""
    if isinstance(settings.get("tasks"), Mapping):  # a config
        return {
            task: opts["main_metric"]
            for task, opts in settings["tasks"].items()
            if isinstance(opts, Mapping) and opts.get("main_metric")
        }
    return {
        key.split(".")[1]: value
        for key, value in settings.items()
        if key.startswith("tasks.") and key.endswith(".main_metric") and key.count(".") == 2
    }


@dataclass(frozen=True)
class PublishJob:
    """The publish job: the config's `publish` section, as its identity holds it."""

    identity: Identity
    section: dict[str, Any] = field(hash=False)

    @classmethod
    def decode(cls, text: str) -> PublishJob:
        identity = Identity.from_text(text)
        top = {
            key.split(".", 1)[1]: value
            for key, value in identity.settings.items()
            if key.startswith("publish.") and key.count(".") == 1
        }
        return cls(identity, top)


# ---- the infer side: an engine job's request file (ckpteval.verbs) is its identity document,
# the cells' identities with what ckpteval.contract.engine_payload puts beside them


@dataclass(frozen=True)
class CellJob:
    """One cell an engine job generates (or a replay job copies): its generation identity, and
    the task and variant built from it. The task's options travel beside the identity (its
    request entry, or the replay rule's param) and must hash to the definition it holds."""

    key: CellKey
    identity: Identity
    task_options: dict[str, Any] = field(hash=False)
    problems: str | None

    def build_task(self) -> Any:
        """This cell's task, or a UserError if its options no longer match its identity."""
        from ckpteval.tasks import resolve_task

        options = dict(self.task_options)
        if self.problems is not None:
            options["problems"] = self.problems
        spec = resolve_task(self.key.task, options)
        if spec.config_hash()[:16] != self.identity.settings["task.definition"]:
            raise UserError(
                f"task {self.key.task}: its definition changed after the workflow planned this job "
                f"({self.problems or 'built-in'}); run the workflow again"
            )
        return spec

    def build_variant(self) -> Any:
        """The sampling values and seed the identity holds, under the variant's name."""
        from ckpteval.config import Sampling, Variant, parse_variant

        name, _ = parse_variant(self.key.variant)
        s = self.identity.settings
        values = {
            k: s[f"sampling.{name}.{k}"] for k in ("temperature", "top_p", "max_new_tokens", "n")
        }
        return Variant(Sampling(name, **values), int(s["variant.seed"]))


@dataclass(frozen=True)
class EngineJob:
    """An engine job (rules `infer*`, `endpoint*`), decoded from its request file and its
    model's manifest: the cells to generate, the engine settings that change numerics (from the
    cells' identities), the served model (from the model's identity) and the run's template."""

    run: str
    ckpt: str
    cells: tuple[CellJob, ...]
    numerics: dict[str, Any] = field(hash=False)
    served: dict[str, Any] = field(hash=False)
    chat_template: str
    include_paths: tuple[str, ...]

    @classmethod
    def decode(
        cls, body: dict[str, Any], manifest: dict[str, Any], run: str, ckpt: str
    ) -> EngineJob:
        """`body`: the request file (ckpteval.verbs) of checkpoint `ckpt` of `run`; `manifest`:
        its model or model card."""
        tasks = body.get("tasks") or {}
        cells = tuple(
            _request_cell_job(CellKey(run, ckpt, c["task"], c["variant"]), c, tasks)
            for c in body.get("cells") or []
        )
        return cls(
            run,
            ckpt,
            cells,
            numerics={**_engine_numerics(cells), "seed": body.get("seed")},
            served=_served_model(manifest.get("settings") or {}, run),
            chat_template=str(body.get("chat_template") or "auto"),
            include_paths=tuple(body.get("include_paths") or ()),
        )

    def cell(self, task: str, variant: str) -> CellJob:
        key = CellKey(self.run, self.ckpt, task, variant)
        return next(c for c in self.cells if c.key == key)

    def run_cfg(self, endpoint_knobs: dict[str, Any]) -> dict[str, Any]:
        """The run's entry as the backends take it: the served model from the model's
        identity, the endpoint's knobs (concurrency, retries, timeout, credentials) beside."""
        out: dict[str, Any] = {
            "backend": self.served["backend"],
            "chat_template": self.chat_template,
        }
        if self.served["backend"] == "openai":
            out["endpoint"] = {**endpoint_knobs, **self.served["endpoint"]}
        return out

    def check_template(self, identity: str | None) -> None:
        """The template the job resolved is the one its chat-asking cells' identities name."""
        key = f"runs.{self.run}.chat_template"
        for cell in self.cells:
            wanted = cell.identity.settings.get(key)
            if wanted is not None and wanted != identity:
                raise UserError(
                    f"config: {key}: the template changed after the workflow planned this job "
                    f"({identity} != {wanted}); run the workflow again"
                )


def _request_cell_job(key: CellKey, cell: dict[str, Any], tasks: dict[str, Any]) -> CellJob:
    task = tasks.get(key.task) or {}
    return CellJob(
        key,
        Identity(dict(cell["record"]["settings"])),
        task_options=dict(task.get("options") or {}),
        problems=task.get("problems"),
    )


#: Engine settings that change numerics, as cells' identities hold them (contract rows).
NUMERIC_KEYS = ("dtype", "max_model_len", "tensor_parallel_size")


def _engine_numerics(cells: tuple[CellJob, ...]) -> dict[str, Any]:
    """The numeric engine settings shared by the cells (one engine serves them all)."""
    found: dict[str, Any] = {}
    for cell in cells:
        for key in NUMERIC_KEYS:
            value = cell.identity.settings.get(f"engine.{key}")
            if value is not None and found.setdefault(key, value) != value:
                raise UserError(f"engine.{key}: cells of one engine job disagree; run again")
    return found


def _served_model(settings: dict[str, Any], run: str) -> dict[str, Any]:
    """Backend and endpoint model from a model's identity settings (`runs.<run>.*`)."""
    prefix = f"runs.{run}."
    endpoint = {
        key[len(prefix) + len("endpoint.") :]: value
        for key, value in settings.items()
        if key.startswith(prefix + "endpoint.")
    }
    return {"backend": settings.get(prefix + "backend", "vllm"), "endpoint": endpoint}
