"""Reasoning-aware generation and scoring (ckpteval.reasoning): the pure split, the config, and
end to end on a tiny model trained to emit `<think>...</think> answer` (slow)."""

from __future__ import annotations

from typing import Any

import pytest

from ckpteval.backends import SamplingSpec
from ckpteval.config import build_tasks, validate_config
from ckpteval.errors import UserError
from ckpteval.reasoning import Reasoning, Split, engine_spec, from_config, split

THINK = Reasoning(start="<think>", end="</think>")


def chars(text: str) -> int:
    """A stand-in tokenizer for the pure tests: one token per character."""
    return len(text)


def cut(completion: str, cfg: Reasoning = THINK, **kw: Any) -> Split:
    args: dict[str, Any] = {
        "prompt": "Q: 1+1?\nA:",
        "cfg": cfg,
        "stops": ("\n\n", "Q:"),
        "engine_finish": "stop",
        "count_tokens": chars,
    }
    args.update(kw)
    return split(completion, **args)


def test_the_answer_is_after_the_first_end_marker_and_stops_apply_only_there() -> None:
    raw = "<think>\nQ: what is 1+1?\n\nit is 2\n</think> #### 2\n\nQ: next"
    s = cut(raw)
    assert s.answer == " #### 2" and not s.truncated_reasoning and s.finish_reason == "stop"
    assert s.reasoning_tokens == raw.index("</think>") + len("</think>")
    # the end marker twice: the reasoning ends at the first, the second belongs to the answer
    s = cut("<think>a</think> 5 </think> 6")
    assert s.answer == " 5 </think> 6" and s.reasoning_tokens == len("<think>a</think>")


def test_a_reasoning_that_never_ends_is_truncated_not_an_answer() -> None:
    s = cut("<think>\n1+1 is 2\n\n#### 2", engine_finish="length")
    assert s == Split("", len("<think>\n1+1 is 2\n\n#### 2"), True, "length")
    # ended by the end of sequence before closing: still truncated, finish "stop"
    assert cut("  <think> so #### 3").truncated_reasoning
    assert cut("  <think> so #### 3").finish_reason == "stop"
    # opened by the prompt (Qwen3-style templates end the prompt with <think>)
    s = cut("1+1 is 2 #### 2", prompt="<|im_start|>assistant\n<think>\n")
    assert s.truncated_reasoning and s.answer == ""
    # no start configured: every completion is reasoning first
    assert cut("1+1 is 2 #### 2", Reasoning(end="</think>")).truncated_reasoning
    assert cut("2</think> #### 2", Reasoning(end="</think>")).answer == " #### 2"


def test_a_completion_that_never_opened_reasoning_is_a_plain_answer() -> None:
    s = cut("#### 2\n\nQ: more")
    assert s == Split("#### 2", 0, False, "stop")
    # an end marker without a start (start configured, not in the prompt): plain answer too
    s = cut("so </think> #### 2")
    assert s == Split("so </think> #### 2", 0, False, "stop")
    # a start later in the text does not open reasoning
    assert cut("x <think> y").answer == "x <think> y"
    assert cut("x <think> y", engine_finish="length").finish_reason == "length"


def test_markers_inside_stop_strings_and_stop_strings_inside_markers() -> None:
    cfg = Reasoning(start="Q:", end="\n\n")  # markers that are also the task's stop strings
    s = cut("Q: think\n\n#### 4\n\nQ:", cfg)
    assert s.answer == "#### 4" and s.reasoning_tokens == len("Q: think\n\n")
    s = cut("<think>x</think>A</think>", stops=("</think>",))
    assert s.answer == "A" and s.finish_reason == "stop"


def test_empty_answers_whitespace_unicode_and_include_stop() -> None:
    assert cut("<think>x</think>") == Split("", len("<think>x</think>"), False, "stop")
    assert cut("<think>x</think>", engine_finish="length").finish_reason == "length"
    assert cut("\n \t<think>x</think>\n\n").answer == ""
    s = cut("<think>数学 🤔\n\nπ≈3</think> ✓ 3")
    assert s.answer == " ✓ 3" and s.reasoning_tokens == len("<think>数学 🤔\n\nπ≈3</think>")
    s = cut("<think>x</think>fn f() {\n}\nmore", stops=("\n}\n",), include_stop=True)
    assert s.answer == "fn f() {\n}\n"
    assert cut("", engine_finish="length") == Split("", 0, False, "length")


def test_the_budget_counts_tokens_up_to_and_including_the_end_marker() -> None:
    raw = "<think>abc</think> 7"
    n = len("<think>abc</think>")
    assert cut(raw, Reasoning(start="<think>", end="</think>", budget=n)).answer == " 7"
    over = cut(raw, Reasoning(start="<think>", end="</think>", budget=n - 1))
    assert over == Split("", n - 1, True, "length")
    # never closed, within the budget: truncated by the end of sequence, not by the budget
    capped = Reasoning(start="<think>", end="</think>", budget=100)
    assert cut("<think>abc", capped) == Split("", 10, True, "stop")
    assert cut(
        "<think>abc", Reasoning(end="</think>", start="<think>", budget=3)
    ).finish_reason == ("length")


def test_without_a_tokenizer_the_counts_are_unknown_not_guessed() -> None:
    budget = Reasoning(start="<think>", end="</think>", budget=5)
    s = cut("<think>abcdefgh</think> 1", budget, count_tokens=lambda _: None)
    assert s == Split(" 1", None, False, "stop")
    s = cut("<think>abcdefgh", budget, count_tokens=lambda _: None, completion_tokens=9)
    assert s == Split("", 5, True, "length")


def test_the_engine_is_asked_without_stops_and_with_the_budget_on_top() -> None:
    spec = SamplingSpec(1, 0.0, 1.0, 64, 42, ("\n\n",), True)
    assert engine_spec(spec, None) is spec
    asked = engine_spec(spec, Reasoning(end="</think>", budget=100))
    assert asked.stop == () and asked.max_tokens == 164 and not asked.include_stop_str_in_output
    assert engine_spec(spec, Reasoning(end="</think>")).max_tokens == 64


def config(**extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "runs": {"r": {"path": "/nonexistent"}},
        "tasks": {"arith": {}, "pyfunc": {"reasoning": None}, "arith_harness": {}},
    }
    cfg.update(extra)
    return cfg


def test_the_top_level_default_and_per_task_overrides() -> None:
    cfg = config(reasoning={"start": "<think>", "end": "</think>", "budget": 50})
    cfg["tasks"]["arith_harness"] = {"reasoning": {"end": "</r>"}}
    validate_config(cfg)
    tasks, _, _ = build_tasks(cfg)
    assert tasks["arith"].options["reasoning"] == {
        "start": "<think>",
        "end": "</think>",
        "budget": 50,
    }
    assert "reasoning" not in tasks["pyfunc"].options  # null turns it off for the task
    assert tasks["arith_harness"].options["reasoning"] == {"end": "</r>"}
    plain = config()
    validate_config(plain)
    off, _, _ = build_tasks(plain)
    # unset, or turned off, the task's identity is the one it had before reasoning existed
    assert off["pyfunc"].config_hash() == tasks["pyfunc"].config_hash()
    assert off["arith"].config_hash() != tasks["arith"].config_hash()


@pytest.mark.parametrize(
    "value",
    [{"start": "<think>"}, {"end": ""}, {"end": "</think>", "budget": 0}, True, "think"],
)
def test_a_bad_reasoning_value_is_one_line(value: Any) -> None:

    cfg = config(reasoning=value)
    with pytest.raises(UserError) as err:
        validate_config(cfg)
        build_tasks(cfg)
    assert "reasoning" in str(err.value) and "\n" not in str(err.value)


def test_from_config_names_the_key() -> None:
    with pytest.raises(UserError, match=r"tasks\.x\.reasoning\.budget"):
        from_config({"end": "</think>", "budget": True}, "tasks.x.reasoning")
    assert from_config(False, "reasoning") is None
