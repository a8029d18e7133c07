"""Where completions come from: the backend of a run (`runs.<name>.backend`).

- `vllm` (default): one vLLM engine per infer job, loaded lazily through lm-eval's `VLLM` class, so
  lm-eval tasks and ckpteval's own tasks share it (`ckpteval.backends.vllm`).
- `openai`: a model served elsewhere behind an OpenAI-compatible `/v1/completions` endpoint
  (`ckpteval.backends.openai`); no GPU in the job.
- `replay`: generations that already exist as JSONL; nothing is generated, the files are validated
  and copied into the generation contract (`ckpteval.backends.replay`).

A backend turns prompts, each with its `SamplingSpec`, into `Generation`s and offers an lm-eval model for
harness tasks. Everything that could change a completion besides the prompt and sampling is its
`identity`: the generation cache keys on it. Weightless runs (openai, replay) have no consolidated
model; their `models/{run}/{ckpt}.json` is a model card (`model_card`) so every later step finds the
same provenance file for every backend.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ckpteval.io import sha256_json

#: A prompt is text, or (openai runs with a chat template) the chat messages sent to the endpoint.
Prompt = str | list[dict[str, str]]


@dataclass(frozen=True)
class SamplingSpec:
    """The sampling parameters of one request, as vLLM's `SamplingParams` names them."""

    n: int
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["stop"] = list(self.stop)
        return out


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str | None
    tokens: int | None


@dataclass(frozen=True)
class Generation:
    """All samples of one prompt."""

    prompt_tokens: int | None
    outputs: tuple[Completion, ...]


def chat_messages(
    system: str | None, user: str, history: Sequence[Mapping[str, str]] = ()
) -> list[dict[str, str]]:
    """The messages a chat prompt sends: the system message if any, the earlier turns, then
    the user's."""
    head = [{"role": "system", "content": system}] if system else []
    turns = [{"role": m["role"], "content": m["content"]} for m in history]
    return [*head, *turns, {"role": "user", "content": user}]


class Backend(abc.ABC):
    """Generates completions for one infer job. Loading is lazy: a job whose every request is in
    the cache never loads anything (`loads` stays 0)."""

    name: str = ""
    loads: int = 0
    load_seconds: float = 0.0
    #: Engine seconds spent on requests that rode along with lm-eval's calls (`ride_along`).
    ride_seconds: float = 0.0

    @property
    @abc.abstractmethod
    def identity(self) -> dict[str, Any]:
        """What, besides weights, prompt and sampling, can change a completion."""

    def render_chat(
        self,
        system: str | None,
        user: str,
        template: str | None = None,
        history: Sequence[Mapping[str, str]] = (),
    ) -> Prompt:
        """A chat prompt for `user` (after an optional system message and the `history` of
        earlier turns: few-shot examples), through `template` (Jinja text; None: the model's
        own; ckpteval.chat_templates)."""
        raise NotImplementedError

    def check_prompts(self, prompts: dict[str, Prompt], max_tokens: int, task: str) -> None:
        """Raise `UserError` naming `task` if a prompt cannot fit with `max_tokens` new tokens."""

    @abc.abstractmethod
    def generate(self, prompts: list[Prompt], specs: list[SamplingSpec]) -> list[Generation]:
        """One `Generation` per prompt, in order; `specs[i]` samples `prompts[i]` (one call may
        mix tasks and variants, so the engine batches all of them)."""

    @abc.abstractmethod
    def harness_model(self) -> Any:
        """The lm-eval model (`lm_eval.api.model.LM`) that harness tasks run on."""

    def count_tokens(self, text: str) -> int | None:
        """Tokens of a completion's text, where the backend has a tokenizer (lm-eval returns
        text only, so harness token counts are recounted this way)."""
        return None

    def keep_tokens(self, text: str, n: int) -> str | None:
        """The prefix of `text` that its first `n` tokens cover (all of it when shorter), where
        the backend has a tokenizer; None where it has not (a reasoning task's answer budget is
        then left to the engine's total)."""
        return None

    def harness_outputs(self) -> list[tuple[str, str, str | None, int]]:
        """(context, answer text, finish_reason, tokens) of the lm-eval generate_until requests
        `harness_model` answered since the last call, where the backend sees its engine's
        outputs (vllm); empty where it does not (lm-eval returns text only)."""
        return []

    def load(self) -> None:
        """Load the engine now rather than on first use (an assist job prices its load)."""

    def ride_along(
        self,
        prompts: list[Prompt],
        specs: list[SamplingSpec],
        done: Callable[[list[Generation], float], None],
        claim: Callable[[], bool] | None = None,
    ) -> None:
        """Offer requests to travel with the next engine call lm-eval makes; `done(generations,
        seconds)` receives them if they do. `claim()`, asked when a call takes them, may say
        they went elsewhere (an assist job took them): the next offer travels instead.
        Backends that cannot merge calls ignore the offer (the caller generates whatever was
        not taken)."""

    def drop_riders(self) -> None:
        """Withdraw offers no engine call took."""

    def harness_identity(self) -> dict[str, Any]:
        """The identity of `harness_model`'s answers (lm-eval's version joins the backend's)."""
        import importlib.metadata as md

        return {**self.identity, "lm_eval": md.version("lm_eval")}

    def close(self) -> None:
        """Release the engine or connections."""


def model_card(run: str, backend: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The `models/{run}/{ckpt}.json` of a weightless run: what produced its generations.

    `weights_sha256` is null (there are no weights here); `identity_sha256` names the model the way
    the generation cache does, so two runs on the same endpoint model share cached completions.
    """
    if backend == "openai":
        ident = {
            "backend": "openai",
            "base_url": settings["base_url"].rstrip("/"),
            "model": settings["model"],
        }
    else:
        # the replayed files count per cell (each generation meta records its files' content)
        ident = {"backend": "replay", "run": run, "step": settings["step"]}
    return {
        "run": run,
        "backend": backend,
        "source": ident,
        "format": backend,
        "weights_sha256": None,
        "identity_sha256": sha256_json(ident),
    }


def cache_namespace(manifest: dict[str, Any]) -> str:
    """The cache directory name of a model: its weights hash, else its card's identity hash."""
    digest = manifest.get("weights_sha256") or manifest.get("identity_sha256")
    if not digest:
        raise ValueError("a model manifest needs weights_sha256 or identity_sha256")
    return str(digest)[:24]


def make_backend(
    run_cfg: dict[str, Any], *, model_dir: Path | None, engine_cfg: dict[str, Any], where: str
) -> Backend:
    """The backend a run's config asks for (`where` names the run in error messages)."""
    backend = run_cfg.get("backend", "vllm")
    if backend == "vllm":
        from ckpteval.backends.vllm import VllmBackend

        assert model_dir is not None, "vllm runs infer from a consolidated model directory"
        return VllmBackend(model_dir, engine_cfg)
    if backend == "openai":
        from ckpteval.backends.openai import OpenAIBackend

        return OpenAIBackend(run_cfg["endpoint"], engine_cfg, where=f"{where}.endpoint")
    raise ValueError(f"backend {backend!r} does not generate (replay runs copy files)")
