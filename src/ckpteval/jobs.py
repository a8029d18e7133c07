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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpteval.contract import Identity
from ckpteval.errors import UserError


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
            ks=[int(k) for k in s["evaluate.ks"]],
            checker_options=_checker_options(s),
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

    def scoring_kwargs(self) -> dict[str, Any]:
        """The scorer's keyword arguments (score_samples, score_harness_file), worker count
        aside (a runtime knob)."""
        out: dict[str, Any] = {
            "timeout": self.timeout,
            "ks": self.ks,
            "checker_options": dict(self.checker_options),
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

    @classmethod
    def decode(cls, text: str) -> SummaryJob:
        identity = Identity.from_text(text)
        s = identity.settings
        return cls(
            identity,
            title=s["aggregate.title"],
            bootstrap=int(s["aggregate.bootstrap"]),
            truncation_threshold=_float(s.get("aggregate.truncation_threshold")),
        )


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
