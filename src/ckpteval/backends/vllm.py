"""The vLLM backend: one engine per infer job, built through lm-eval's `VLLM` model class.

lm-eval's wrapper owns the `vllm.LLM` (its `.model`), so harness tasks run with lm-eval's own
request handling and ckpteval's tasks call the very same engine. The engine is created on first
use; prompt lengths and chat templates only need the Hugging Face tokenizer, which loads in a
fraction of a second, so a job whose requests are all cached never starts vLLM.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ckpteval.backends import (
    Backend,
    Completion,
    Generation,
    Prompt,
    SamplingSpec,
    chat_messages,
)
from ckpteval.errors import UserError

log = logging.getLogger(__name__)


def settings_refusal(exc: BaseException) -> str | None:
    """The reason of vLLM's config check (a pydantic `ValidationError` raised before any weight
    is loaded: a setting the model cannot take, such as `max_model_len` beyond the model's
    context), as one line in ckpteval's terms; None for any other failure. Its first line
    ("1 validation error for ModelConfig") says nothing, the reason is on the next ones."""
    if type(exc).__name__ != "ValidationError":
        return None
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    detail = next((x for x in lines[1:] if x.startswith("Value error")), None)
    detail = (detail or (lines[1] if len(lines) > 1 else lines[0] if lines else "")).removeprefix(
        "Value error, "
    )
    detail = detail.split(" To allow overriding", 1)[0]
    if "max_model_len" in detail:
        detail += " Lower engine.max_model_len in the config to the model's context."
    return detail


class VllmBackend(Backend):
    name = "vllm"

    def __init__(self, model_dir: Path, engine_cfg: dict[str, Any]) -> None:
        self.model_dir = model_dir
        self.cfg = engine_cfg
        self._lm: Any = None
        self._tokenizer: Any = None
        self._riders: list[
            tuple[list[Prompt], list[SamplingSpec], Callable[..., None], Callable[[], bool] | None]
        ] = []
        self._engine_log: list[tuple[str | None, int]] = []
        self._text_log: list[tuple[str, str]] = []
        self._own_call = False
        self.swaps = 0
        self.swap_seconds = 0.0
        #: Layers per CPU kernel of the loaded engine (engine.cpu_kernels.cpu_linear_kinds).
        self.cpu_kernels: dict[str, int] = {}
        #: Which engine job's engine generated (an engine may serve several checkpoints).
        self.served_by: str | None = None

    @property
    def identity(self) -> dict[str, Any]:
        import importlib.metadata as md

        return {
            "backend": "vllm",
            "vllm": md.version("vllm"),
            "dtype": self.cfg["dtype"],
            "max_model_len": self.cfg["max_model_len"],
            "seed": self.cfg["seed"],
            "tensor_parallel_size": self.cfg["tensor_parallel_size"],
        }

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        return self._tokenizer

    def render_chat(
        self,
        system: str | None,
        user: str,
        template: str | None = None,
        history: Sequence[Mapping[str, str]] = (),
    ) -> Prompt:
        messages = chat_messages(system, user, history)
        return str(
            self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, chat_template=template
            )
        )

    def check_prompts(self, prompts: dict[str, Prompt], max_tokens: int, task: str) -> None:
        limit = int(self.cfg["max_model_len"])
        ids = list(prompts)
        if not ids:
            return
        lengths = [len(x) for x in self.tokenizer([str(prompts[i]) for i in ids])["input_ids"]]
        for tid, n_tokens in zip(ids, lengths, strict=True):
            if n_tokens + max_tokens > limit:
                raise UserError(
                    f"task {task}, problem {tid}: prompt of {n_tokens} tokens + max_new_tokens "
                    f"{max_tokens} exceeds engine.max_model_len {limit}; raise engine.max_model_len "
                    f"or lower tasks.{task}.max_new_tokens"
                )

    @property
    def lm(self) -> Any:
        """lm-eval's VLLM wrapper; `.model` is the `vllm.LLM`. Created on first access."""
        if self._lm is None:
            from ckpteval.engine.heap import engine_imports

            with engine_imports():
                from lm_eval.models.vllm_causallms import VLLM
                from vllm.platforms import current_platform

            extra: dict[str, Any] = {}
            if current_platform.is_cpu():
                # vLLM's CPU worker crashes ("CPU Generator does not use offset") when a seeded
                # sampling request's prompt is prefilled in chunks; whole-prompt prefill avoids it.
                extra["enable_chunked_prefill"] = False
                from ckpteval.engine.cpu_kernels import apply_cpu_kernels
                from ckpteval.engine.kvcache import cpu_engine_args

                extra.update(cpu_engine_args(self.model_dir, self.cfg["max_model_len"]))

                kernels_plan = apply_cpu_kernels()
            start = time.monotonic()
            log.info(
                "loading vLLM engine for %s (gpu_memory_utilization %s)",
                self.model_dir,
                self.cfg["gpu_memory_utilization"],
            )
            try:
                self._lm = VLLM(
                    pretrained=str(self.model_dir),
                    dtype=self.cfg["dtype"],
                    max_model_len=self.cfg["max_model_len"],
                    seed=self.cfg["seed"],
                    tensor_parallel_size=self.cfg["tensor_parallel_size"],
                    gpu_memory_utilization=self.cfg["gpu_memory_utilization"],
                    enforce_eager=self.cfg["enforce_eager"],
                    batch_size="auto",
                    **extra,
                )
            except Exception as exc:
                refusal = settings_refusal(exc)
                if refusal is None:
                    raise
                raise UserError(
                    f"vLLM refused the engine for {self.model_dir}: {refusal}"
                ) from None
            self.load_seconds = time.monotonic() - start
            self.loads += 1
            log.info("engine loaded in %.1f s", self.load_seconds)
            if current_platform.is_cpu():
                from ckpteval.engine.cpu_kernels import cpu_linear_kinds, describe, vllm_library

                self.cpu_kernels = self._lm.model.collective_rpc(cpu_linear_kinds)[0]
                log.info(
                    "CPU linear kernels: %s",
                    describe(self.cpu_kernels, kernels_plan, vllm_library()),
                )
        return self._lm

    def generate(self, prompts: list[Prompt], specs: list[SamplingSpec]) -> list[Generation]:
        from vllm import SamplingParams

        params = [SamplingParams(**spec.as_dict()) for spec in specs]
        self._own_call = True  # not one of lm-eval's calls: nothing for `harness_outputs`
        try:
            outputs = self.lm.model.generate([str(p) for p in prompts], params, use_tqdm=False)
        finally:
            self._own_call = False
        return [_generation(out) for out in outputs]

    def swap(self, model_dir: Path) -> None:
        """Serve another checkpoint of the same architecture and tokenizer: its weights are
        loaded into the running engine and checked (ckpteval.engine.swap); an engine not started yet
        simply starts on the new checkpoint."""
        if self._lm is not None:
            from ckpteval.engine.swap import swap_weights

            self.swap_seconds += swap_weights(self._lm.model, model_dir)
            self.swaps += 1
        self.model_dir = model_dir
        self._tokenizer = None

    def load(self) -> None:
        self.lm  # noqa: B018 - the property loads the engine

    def ride_along(
        self,
        prompts: list[Prompt],
        specs: list[SamplingSpec],
        done: Callable[[list[Generation], float], None],
        claim: Callable[[], bool] | None = None,
    ) -> None:
        self._riders.append((prompts, specs, done, claim))

    def _next_rider(self) -> tuple[list[Prompt], list[SamplingSpec], Callable[..., None]] | None:
        while self._riders:
            prompts, specs, done, claim = self._riders.pop(0)
            if claim is None or claim():
                return prompts, specs, done
        return None

    def drop_riders(self) -> None:
        self._riders.clear()

    def harness_model(self) -> Any:
        """lm-eval's VLLM on this engine; each of its engine calls takes the next queued
        `ride_along` requests with it (vLLM answers mixed requests in input order), and records
        its outputs' finish reasons and token counts for `harness_outputs` (lm-eval keeps only
        the text)."""
        lm = self.lm
        llm = lm.model
        if not getattr(llm, "_ckpteval_riding", False):
            plain = llm.generate
            lm.set_cache_hook(_TextLog(self._text_log))

            def generate(
                prompts: Any, sampling_params: Any = None, *args: Any, **kwargs: Any
            ) -> Any:
                outputs = generate_with_riders(prompts, sampling_params, *args, **kwargs)
                if not self._own_call:
                    self._engine_log.extend(
                        (out.outputs[0].finish_reason, len(out.outputs[0].token_ids))
                        for out in outputs
                        if out.outputs
                    )
                return outputs

            def generate_with_riders(
                prompts: Any, sampling_params: Any = None, *args: Any, **kwargs: Any
            ) -> Any:
                rider = self._next_rider()
                if rider is None:
                    return plain(prompts, sampling_params, *args, **kwargs)
                from vllm import SamplingParams

                extra, specs, done = rider
                own = list(prompts)
                params = (
                    list(sampling_params)
                    if isinstance(sampling_params, list)
                    else [sampling_params] * len(own)
                )
                started = time.monotonic()
                outputs = plain(
                    own + [str(p) for p in extra],
                    params + [SamplingParams(**s.as_dict()) for s in specs],
                    *args,
                    **kwargs,
                )
                seconds = time.monotonic() - started
                theirs, ours = outputs[: len(own)], outputs[len(own) :]
                tokens = [sum(len(o.token_ids) for o in out.outputs) for out in outputs]
                share = seconds * sum(tokens[len(own) :]) / max(1, sum(tokens))
                self.ride_seconds += share
                done([_generation(out) for out in ours], share)
                return theirs

            llm.generate = generate
            llm._ckpteval_riding = True
        return lm

    def harness_outputs(self) -> list[tuple[str, str, str | None, int]]:
        """(context, text, finish_reason, tokens) of each lm-eval `generate_until` request
        answered since the last call, in the order lm-eval's model sent them; clears the log.

        lm-eval reports each answer to its cache hook in the order of its engine outputs, so
        the two logs pair one to one (a call with any other output, e.g. a loglikelihood
        request, leaves nothing to pair: the caller clears before a generate_until call)."""
        texts, engine = list(self._text_log), list(self._engine_log)
        self._text_log.clear()
        self._engine_log.clear()
        if len(texts) != len(engine):
            return []
        return [(c, t, f, n) for (c, t), (f, n) in zip(texts, engine, strict=True)]

    def count_tokens(self, text: str) -> int:
        """Tokens of a completion's text (lm-eval returns text only)."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def keep_tokens(self, text: str, n: int) -> str:
        """`text` up to the end of its `n`-th token, cut at the tokenizer's character offsets
        (an exact prefix of `text`, never a re-decoded one). A character whose bytes the `n`-th
        token only begins is left out, as vLLM's detokenizer holds back an incomplete one."""
        offsets = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)[
            "offset_mapping"
        ]
        if len(offsets) <= n:
            return text
        if n <= 0:
            return ""
        return text[: min(offsets[n - 1][1], offsets[n][0])]


class _TextLog:
    """An lm-eval cache hook that records each generated answer with its context."""

    def __init__(self, log: list[tuple[str, str]]) -> None:
        self.log = log

    def add_partial(self, attr: str, req: Any, res: Any) -> None:
        if attr == "generate_until":
            self.log.append((str(req[0]), str(res)))


def _generation(out: Any) -> Generation:
    """A vLLM `RequestOutput` as a `Generation`."""
    return Generation(
        len(out.prompt_token_ids),
        tuple(Completion(o.text, o.finish_reason, len(o.token_ids)) for o in out.outputs),
    )
