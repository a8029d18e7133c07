"""Reasoning-aware answers: where a completion's reasoning ends and what of it is scored.

A task with `reasoning: {start: "<think>", end: "</think>", budget: N}` (per task, or the
top-level default for every task) is generated without the task's stop strings (they would fire
inside the reasoning: "\\n\\n" or "Question:" are common in a chain of thought) and with
`budget` more tokens than the task's own answer budget (`engine_spec`). Each raw completion is
then cut here (`split`), purely from its text:

- the reasoning ends at the FIRST end marker; the answer is the text after it, cut at the first
  task stop string (stops apply only after the reasoning);
- a completion that opened reasoning (it starts, after whitespace, with `start`; or the prompt
  ends with `start`, as Qwen3-style chat templates do; or no `start` is configured) and never
  closes it is `truncated_reasoning`: its answer is "" and its verdict is the error type
  `truncated_reasoning`, never a wrong answer parsed out of the reasoning;
- a completion that never opened reasoning (with `start` configured) is a plain answer: stops
  apply from its first character and it has 0 reasoning tokens;
- with a `budget`, reasoning longer than `budget` tokens (the tokens up to and including the end
  marker) is `truncated_reasoning` too, as if generation had been cut at the budget; and the
  answer keeps at most the task's own token budget (`answer_budget`, its `max_new_tokens`): the
  engine was asked for both budgets in one request, so a short reasoning would otherwise leave
  its unused tokens to the answer. Reasoning and answer thus get separate budgets, as if
  generated in two steps (exactly so for greedy decoding).

`finish_reason` of the result is "stop" when a stop string or the end of sequence ended the
answer and "length" when a token limit cut it (the engine's, or the reasoning budget).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ckpteval.backends import Prompt, SamplingSpec
from ckpteval.errors import UserError

#: The error type of a sample whose reasoning never ended (ckpteval.checkers.ERROR_TYPES).
TRUNCATED = "truncated_reasoning"


@dataclass(frozen=True)
class Reasoning:
    """A task's reasoning markers and its reasoning token budget (None: no separate budget)."""

    end: str
    start: str | None = None
    budget: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The config form, unset keys left out (what a task's identity hashes)."""
        out: dict[str, Any] = {"end": self.end}
        if self.start is not None:
            out["start"] = self.start
        if self.budget is not None:
            out["budget"] = self.budget
        return out


def from_config(value: Any, where: str) -> Reasoning | None:
    """A `reasoning:` config value (a mapping, or null/false: off) as a `Reasoning`; `where`
    names the key in the one-line error a bad value gets."""
    if value is None or value is False:
        return None
    if isinstance(value, Reasoning):
        return value
    if not isinstance(value, Mapping):
        raise UserError(
            f"config: {where}: must be a mapping {{start, end, budget}} or null/false to turn "
            f"reasoning off, not {value!r}"
        )
    end, start, budget = value.get("end"), value.get("start"), value.get("budget")
    if not isinstance(end, str) or not end:
        raise UserError(
            f"config: {where}.end: the end-of-reasoning marker (e.g. </think>) is "
            "required and must be a non-empty string"
        )
    if start is not None and (not isinstance(start, str) or not start):
        raise UserError(f"config: {where}.start: must be a non-empty string (e.g. <think>)")
    if budget is not None and (
        not isinstance(budget, int) or isinstance(budget, bool) or budget < 1
    ):
        raise UserError(f"config: {where}.budget: must be an integer >= 1 (reasoning tokens)")
    unknown = sorted(set(value) - {"start", "end", "budget"})
    if unknown:
        raise UserError(
            f"config: {where}: unknown key(s) {', '.join(unknown)}; "
            "reasoning takes start, end, budget"
        )
    return Reasoning(end=end, start=start, budget=budget)


def task_reasoning(options: Mapping[str, Any]) -> Reasoning | None:
    """The effective reasoning of a task from its options (config.build_tasks puts it there)."""
    return from_config(options.get("reasoning"), "reasoning")


def engine_spec(spec: SamplingSpec, cfg: Reasoning | None) -> SamplingSpec:
    """What is asked of the engine for a task sampled with `spec`: without the task's stop
    strings (the end of sequence still ends it) and with `budget` more tokens when set."""
    if cfg is None:
        return spec
    return replace(
        spec,
        stop=(),
        include_stop_str_in_output=False,
        max_tokens=spec.max_tokens + (cfg.budget or 0),
    )


@dataclass(frozen=True)
class Split:
    """One completion cut into reasoning and answer (the generation line's new fields)."""

    answer: str
    reasoning_tokens: int | None
    truncated_reasoning: bool
    finish_reason: str | None

    def fields(self) -> dict[str, Any]:
        return {
            "answer": self.answer,
            "reasoning_tokens": self.reasoning_tokens,
            "truncated_reasoning": self.truncated_reasoning,
            "finish_reason": self.finish_reason,
        }


def opened(completion: str, prompt: Prompt, cfg: Reasoning) -> bool:
    """Whether the completion is inside reasoning from its first token."""
    if cfg.start is None:
        return True
    if completion.lstrip().startswith(cfg.start):
        return True
    return isinstance(prompt, str) and prompt.rstrip().endswith(cfg.start)


def cut_at_stops(text: str, stops: Sequence[str], include_stop: bool = False) -> tuple[str, bool]:
    """`text` up to the earliest stop string (kept when `include_stop`); whether one was found."""
    best: tuple[int, str] | None = None
    for stop in stops:
        if not stop:
            continue
        at = text.find(stop)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, stop)
    if best is None:
        return text, False
    at, stop = best
    return text[: at + len(stop) if include_stop else at], True


def split(
    completion: str,
    *,
    prompt: Prompt,
    cfg: Reasoning,
    stops: Sequence[str],
    include_stop: bool = False,
    engine_finish: str | None,
    count_tokens: Callable[[str], int | None],
    completion_tokens: int | None = None,
    answer_budget: int | None = None,
    keep_tokens: Callable[[str, int], str | None] | None = None,
) -> Split:
    """Cut one raw completion (generated without stop strings) into its answer (module doc).

    `engine_finish` is the engine's finish reason ("stop": end of sequence, "length": its token
    limit). `count_tokens` is the backend's tokenizer; where it has none (an endpoint, a replay)
    it returns None: a closed reasoning's token count is then None and its budget unchecked,
    and a never-closed reasoning (all of the completion) is counted by the engine's
    `completion_tokens` when given. With a `budget`, the answer is first cut to `answer_budget`
    tokens by `keep_tokens` (the backend's tokenizer; None from it: left uncut), then at the
    task's stop strings, as an engine asked for `answer_budget` tokens would have stopped.
    """

    def answer_of(text: str) -> tuple[str, str | None]:
        cut = False
        if cfg.budget is not None and answer_budget is not None and keep_tokens is not None:
            kept = keep_tokens(text, answer_budget)
            if kept is not None and len(kept) < len(text):
                text, cut = kept, True
        answer, stopped = cut_at_stops(text, stops, include_stop)
        return answer, "stop" if stopped else "length" if cut else engine_finish

    if not opened(completion, prompt, cfg):
        answer, finish = answer_of(completion)
        return Split(answer, 0, False, finish)
    at = completion.find(cfg.end)
    if at < 0:
        used = count_tokens(completion)
        if used is None:
            used = completion_tokens
        if cfg.budget is not None and used is not None and used > cfg.budget:
            return Split("", cfg.budget, True, "length")
        return Split("", used, True, engine_finish)
    used = count_tokens(completion[: at + len(cfg.end)])
    if cfg.budget is not None and used is not None and used > cfg.budget:
        return Split("", cfg.budget, True, "length")
    answer, finish = answer_of(completion[at + len(cfg.end) :])
    return Split(answer, used, False, finish)
