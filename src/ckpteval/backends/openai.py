"""The openai backend: a model served elsewhere behind an OpenAI-compatible endpoint.

Requests go to `<base_url>/completions` (or `/chat/completions` for tasks with a chat template),
one prompt per request with `n` samples, at most `concurrency` at a time. Connection failures,
timeouts, 429 and 5xx answers are retried with exponential backoff (a server that is still
starting gets time to come up); any other 4xx is the request's fault and stops the job with the
server's message. The stop strings, seed and `include_stop_str_in_output` are sent as vLLM's
server takes them. Harness tasks use lm-eval's own `local-completions` client on the same URL.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests
import requests.adapters

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

#: First retry delay in seconds; each further retry doubles it, up to `MAX_BACKOFF`.
BACKOFF = 0.5
MAX_BACKOFF = 30.0


class EndpointError(UserError):
    """The endpoint refused, failed or rejected a request (one line naming the URL)."""


class OpenAIBackend(Backend):
    name = "openai"

    def __init__(self, endpoint: dict[str, Any], engine_cfg: dict[str, Any], *, where: str) -> None:
        self.base_url = str(endpoint["base_url"]).rstrip("/")
        self.model = str(endpoint["model"])
        self.concurrency = int(endpoint.get("concurrency", 8))
        self.retries = int(endpoint.get("retries", 4))
        self.timeout = float(endpoint.get("timeout", 600))
        self.where = where
        self.cfg = engine_cfg
        key_env = endpoint.get("api_key_env")
        key = os.environ.get(key_env) if key_env else None
        if key_env and not key:
            raise UserError(f"{where}.api_key_env: environment variable {key_env} is not set")
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=self.concurrency)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self._harness: Any = None

    @property
    def identity(self) -> dict[str, Any]:
        return {"backend": "openai", "base_url": self.base_url, "model": self.model}

    def render_chat(
        self,
        system: str | None,
        user: str,
        template: str | None = None,
        history: Sequence[Mapping[str, str]] = (),
    ) -> Prompt:
        # `template` is always None here: the server applies its own (ckpteval.chat_templates).
        return chat_messages(system, user, history)

    def generate(self, prompts: list[Prompt], specs: list[SamplingSpec]) -> list[Generation]:
        if not prompts:
            return []
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(self._generate_one, prompts, specs))

    def _generate_one(self, prompt: Prompt, spec: SamplingSpec) -> Generation:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": spec.max_tokens,
            "temperature": spec.temperature,
            "top_p": spec.top_p,
            "n": spec.n,
            "seed": spec.seed,
        }
        if spec.stop:
            body["stop"] = list(spec.stop)
        if spec.include_stop_str_in_output:
            body["include_stop_str_in_output"] = True
        if isinstance(prompt, list):
            url, body["messages"] = f"{self.base_url}/chat/completions", prompt
        else:
            url, body["prompt"] = f"{self.base_url}/completions", prompt
        answer = self._post(url, body)
        try:
            choices = sorted(answer["choices"], key=lambda c: c.get("index", 0))
            texts = [
                c["message"]["content"] if isinstance(prompt, list) else c["text"] for c in choices
            ]
            usage = answer.get("usage") or {}
        except (KeyError, TypeError) as exc:
            raise EndpointError(
                f"{url}: answer is not an OpenAI completion ({exc!r} missing); "
                f"check {self.where}.base_url"
            ) from None
        if len(texts) != spec.n:
            raise EndpointError(f"{url}: asked for n={spec.n} samples, got {len(texts)}")
        total = usage.get("completion_tokens")
        per_sample = total if spec.n == 1 else None
        return Generation(
            usage.get("prompt_tokens"),
            tuple(
                Completion(t or "", c.get("finish_reason"), per_sample)
                for t, c in zip(texts, choices, strict=True)
            ),
        )

    def _post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST with retries; a clear one-line `EndpointError` when it cannot succeed."""
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                delay = min(MAX_BACKOFF, BACKOFF * 2 ** (attempt - 1))
                log.warning(
                    "%s: %s; retry %d/%d in %.1f s", url, last, attempt, self.retries, delay
                )
                time.sleep(delay)
            try:
                reply = self.session.post(
                    url, json=body, headers=self.headers, timeout=self.timeout
                )
            except requests.ConnectionError as exc:
                last = f"connection refused or dropped ({_reason(exc)})"
                continue
            except requests.Timeout:
                last = f"no answer within {self.timeout:g} s"
                continue
            if reply.status_code == 429 or reply.status_code >= 500:
                last = f"HTTP {reply.status_code} {_message(reply)}"
                continue
            if reply.status_code >= 400:
                raise EndpointError(
                    f"{url} rejected a request: HTTP {reply.status_code} {_message(reply)}; check "
                    f"{self.where} (model {self.model!r}) and the task's prompt length and "
                    "max_new_tokens"
                )
            try:
                return dict(reply.json())
            except ValueError:
                raise EndpointError(
                    f"{url}: answer is not JSON; check {self.where}.base_url (it should end in /v1)"
                ) from None
        raise EndpointError(
            f"{url}: {last} after {self.retries + 1} attempt(s); is the server "
            f"running? check {self.where}.base_url"
        )

    def harness_model(self) -> Any:
        """lm-eval's own `local-completions` client on the same endpoint (created once)."""
        if self._harness is None:
            from lm_eval.models.openai_completions import LocalCompletionsAPI

            self._harness = LocalCompletionsAPI(
                model=self.model,
                base_url=f"{self.base_url}/completions",
                tokenizer_backend=None,
                tokenized_requests=False,
                num_concurrent=self.concurrency,
                max_retries=max(1, self.retries),
                timeout=int(self.timeout),
                max_length=int(self.cfg["max_model_len"]),
                seed=int(self.cfg["seed"]),
                header=self.headers or None,
            )
        return self._harness

    def close(self) -> None:
        self.session.close()


def _reason(exc: Exception) -> str:
    text = str(exc)
    for marker in (
        "Connection refused",
        "Name or service not known",
        "timed out",
        "Connection reset",
        "Remote end closed",
    ):
        if marker in text:
            return marker
    return type(exc).__name__


def _message(reply: requests.Response) -> str:
    """The server's error message, short."""
    try:
        data = reply.json()
        text = (
            data.get("error", {}).get("message")
            if isinstance(data.get("error"), dict)
            else (data.get("message") or data.get("error") or data.get("detail"))
        )
    except ValueError:
        text = reply.text
    return " ".join(str(text or reply.reason).split())[:200]
