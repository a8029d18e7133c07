"""Reasoning-aware generation and scoring (ckpteval.reasoning): the pure split, the config, and
end to end on a tiny model trained to emit `<think>...</think> answer` (slow)."""

from __future__ import annotations

import inspect
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import run_snakemake, small_config, write_config

from ckpteval import demo
from ckpteval.backends import SamplingSpec
from ckpteval.config import build_tasks, validate_config
from ckpteval.demo import ArithItem
from ckpteval.engine.cache import cache_key
from ckpteval.errors import UserError
from ckpteval.io import iter_jsonl, read_json, write_json
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


def keep_chars(text: str, n: int) -> str:
    """The stand-in tokenizer's `keep_tokens`: one token per character."""
    return text[:n]


def test_with_a_budget_the_answer_keeps_its_own_token_budget() -> None:
    """Reasoning and answer get separate budgets: a short reasoning does not lend its unused
    tokens to the answer (the engine was asked for both in one request)."""
    cfg = Reasoning(start="<think>", end="</think>", budget=50)
    raw = "<think>ab</think> #### 12345\n\nQ: next"
    kw: dict[str, Any] = {"keep_tokens": keep_chars}
    # " #### 12345\n\n" is 13 tokens: a budget of 13 reaches the stop "\n\n"
    assert cut(raw, cfg, answer_budget=13, **kw) == Split(" #### 12345", 17, False, "stop")
    # 8 tokens: cut at the answer budget, as an engine asked for 8 tokens would have
    assert cut(raw, cfg, answer_budget=8, **kw) == Split(" #### 12", 17, False, "length")
    # a stop string that only completes past the answer budget is not seen (as in the engine)
    assert cut(raw, cfg, answer_budget=12, **kw).finish_reason == "length"
    # a plain answer (reasoning never opened) has the same answer budget
    assert cut("#### 12345", cfg, answer_budget=4, **kw) == Split("####", 0, False, "length")
    # without a reasoning budget the engine's own limit already is the answer's: nothing cut
    no_budget = Reasoning(start="<think>", end="</think>")
    assert cut(raw, no_budget, answer_budget=3, **kw).answer == " #### 12345"
    # a backend without a tokenizer leaves the answer uncut (its total is the engine's)
    assert cut(raw, cfg, answer_budget=3, keep_tokens=lambda t, n: None).answer == " #### 12345"


def test_keep_tokens_is_an_exact_prefix_of_the_text_at_a_token_boundary(demo_dir: Path) -> None:
    from ckpteval.backends.vllm import VllmBackend

    backend = VllmBackend(demo_dir / "base", {})
    text = "Tom has 12 apples.\n\n  He eats 3: 12 - 3 = 9 #### 9"
    n_all = backend.count_tokens(text)
    assert backend.keep_tokens(text, n_all) == text == backend.keep_tokens(text, n_all + 5)
    assert backend.keep_tokens(text, 0) == ""
    for n in range(1, n_all):
        kept = backend.keep_tokens(text, n)
        assert text.startswith(kept) and len(kept) < len(text)
        assert backend.count_tokens(kept) == n
    # a character of several byte-level tokens is never split: kept whole or left out
    wide = "ab é€ cd"
    for n in range(backend.count_tokens(wide) + 1):
        kept = backend.keep_tokens(wide, n)
        assert wide.startswith(kept) and backend.count_tokens(kept) <= n


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
    # what the engine is asked is what the cache keys: reasoning on or off is another request
    ident = {"backend": "x"}
    assert cache_key("Q", asked, ident) != cache_key("Q", spec, ident)


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


# ------------------------------------------------------------------------------ end to end

#: The think model: trained 200 steps (about 30 s on one core), it has learnt the format on
#: every measured build (`<think>\n` steps separated by blank lines `\n\n</think> #### N`).
THINK_STEPS = 200
#: One-step reasonings are 21-25 tokens up to and including `</think>`, two-step ones 29-33:
#: a budget between them truncates some samples and not others.
BUDGET = 26
CFG = {"start": "<think>", "end": "</think>", "budget": BUDGET}
ARITH_STOPS = ("\n\n", "\nQuestion:")  # the arith task's stop strings (ckpteval.tasks)
HARNESS_STOPS = ("Question:", "\n\n", "<|im_end|>")  # ckpteval_arith.yaml's `until`


def think_answer(item: ArithItem) -> str:
    """`a + b = c. c - d = e #### e` as `<think>\\na + b = c\\n\\nc - d = e\\n\\n</think> #### e`:
    a blank line inside every reasoning, where the arith task's stop string "\\n\\n" fires."""
    steps, number = item.answer.split(" #### ")
    lines = "\n\n".join(s.strip() for s in steps.split(". "))
    return f"<think>\n{lines}\n\n</think> #### {number}"


@pytest.fixture(scope="module")
def think_run(request: pytest.FixtureRequest) -> Path:
    """A run with one checkpoint of the think model, built once and cached by its stamp."""
    out = Path(request.config.cache.mkdir("ckpteval-reasoning-demo"))
    stamp = {
        **demo._stamp(THINK_STEPS, THINK_STEPS, 0),
        "answer_format": inspect.getsource(think_answer),
    }
    if not (out / "stamp.json").exists() or read_json(out / "stamp.json") != stamp:
        shutil.rmtree(out / "run", ignore_errors=True)
        demo.build_run(
            out / "run",
            steps=THINK_STEPS,
            save_every=THINK_STEPS,
            answer_format=think_answer,
            chat_fraction=0.0,
        )
        write_json(out / "stamp.json", stamp)
    return out / "run"


@pytest.fixture(scope="module")
def swept(think_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One workflow run (one vLLM engine): arith and the lm-eval arith task with the top-level
    reasoning; pyfunc and the same lm-eval task under another name with reasoning turned off."""
    work = tmp_path_factory.mktemp("reasoning")
    config = small_config(
        think_run,
        reasoning=CFG,
        tasks={
            "arith": {},
            "arith_harness": {"limit": 20},
            "pyfunc": {"limit": 2, "reasoning": None},
            "plain_harness": {"harness": "ckpteval_arith", "limit": 20, "reasoning": False},
        },
    )
    write_config(work, config)
    proc = run_snakemake(work)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return work / "results"


def hand_split(raw: str, tokenizer: Any, stops: tuple[str, ...]) -> tuple[str, bool, int]:
    """The test's own reading of a raw completion: (answer, truncated, reasoning tokens)."""
    assert raw.lstrip().startswith("<think>"), raw  # the model always opens its reasoning
    end = raw.find("</think>")
    if end < 0:
        return "", True, len(tokenizer(raw, add_special_tokens=False)["input_ids"])
    head = raw[: end + len("</think>")]
    used = len(tokenizer(head, add_special_tokens=False)["input_ids"])
    if used > BUDGET:
        return "", True, BUDGET
    answer = raw[end + len("</think>") :]
    for stop in stops:
        answer = answer.split(stop)[0]
    return answer, False, used


def number_after_hashes(text: str) -> int | None:
    found = re.search(r"#### (-?\d+)", text)
    return int(found.group(1)) if found else None


def lines_of(results: Path, task: str) -> list[dict[str, Any]]:
    (path,) = (results / "generations").glob(f"*/*/{task}/greedy-s42.jsonl")
    return list(iter_jsonl(path))


@pytest.mark.slow
def test_answers_are_parsed_after_the_reasoning_and_scored_as_counted_by_hand(
    swept: Path, think_run: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(next(think_run.iterdir())))
    gold = {row["task_id"]: int(row["answer"].split("####")[1]) for row in demo.eval_items()}
    lines = lines_of(swept, "arith")
    assert len(lines) == len(gold) == 20
    correct = truncated = answered = 0
    for line in lines:
        raw = line["completion"]
        answer, cut, used = hand_split(raw, tokenizer, ARITH_STOPS)
        assert (line["answer"], line["truncated_reasoning"]) == (answer, cut), raw
        assert line["reasoning_tokens"] == used
        assert line["finish_reason"] == ("length" if cut else "stop")
        truncated += cut
        answered += number_after_hashes(answer) is not None
        correct += (not cut) and number_after_hashes(answer) == gold[line["task_id"]]
        # Without reasoning the arith task's stop "\n\n" fires inside the think block, before
        # any answer:
        naive = raw
        for stop in ARITH_STOPS:
            naive = naive.split(stop)[0]
        assert "</think>" not in naive and number_after_hashes(naive) is None, raw
    assert 0 < truncated < len(lines), "the budget must cut some samples and not others"
    assert answered == len(lines) - truncated, "every reasoning that ended gave an answer"
    (cell_path,) = (swept / "scores").glob("*/*/arith/greedy-s42.json")
    cell = json.loads(cell_path.read_text())
    assert cell["metrics"]["accuracy"]["value"] == pytest.approx(correct / len(lines))
    assert cell["metrics"]["pass@1"]["value"] == pytest.approx(correct / len(lines))
    assert cell["error_types"].get("truncated_reasoning", 0) == truncated
    scored = list(iter_jsonl(cell_path.with_suffix(".jsonl")))
    flagged = {s["task_id"] for s in scored if s["error_type"] == "truncated_reasoning"}
    assert flagged == {line["task_id"] for line in lines if line["truncated_reasoning"]}


@pytest.mark.slow
def test_lm_eval_metrics_see_only_the_answer_and_truncations_are_flagged(
    swept: Path, think_run: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(next(think_run.iterdir())))
    lines = lines_of(swept, "arith_harness")
    assert len(lines) == 20
    truncated = 0
    for line in lines:
        raw = line["completion"]
        answer, cut, _ = hand_split(raw, tokenizer, HARNESS_STOPS)
        assert (line["answer"], line["truncated_reasoning"]) == (answer, cut), raw
        assert line["finish_reason"] == ("length" if cut else "stop")
        strict = line["filtered"]["strict-match"]
        flexible = line["filtered"]["flexible-extract"]
        if cut:
            truncated += 1
            # lm-eval's last-number filter would have found the reasoning's numbers
            assert re.search(r"\d", raw) and flexible == strict == "[invalid]"
            assert line["metrics"]["exact_match,strict-match"] == 0.0
        else:
            assert strict == str(number_after_hashes(answer))
    assert 0 < truncated < len(lines)
    (cell_path,) = (swept / "scores").glob("*/*/arith_harness/greedy-s42.json")
    cell = json.loads(cell_path.read_text())
    assert cell["error_types"]["truncated_reasoning"] == truncated
    scored = list(iter_jsonl(cell_path.with_suffix(".jsonl")))
    assert sum(s["error_type"] == "truncated_reasoning" for s in scored) == truncated


@pytest.mark.slow
def test_a_task_with_reasoning_off_keeps_its_stops_and_every_line_its_finish_reason(
    swept: Path,
) -> None:
    for line in lines_of(swept, "pyfunc"):
        assert "answer" not in line and "truncated_reasoning" not in line
        assert line["finish_reason"] in ("stop", "length")
    # lm-eval without reasoning: its stop "\n\n" cuts inside the think block, and the engine's
    # finish reason (a stop string) reaches every harness line
    plain = lines_of(swept, "plain_harness")
    assert len(plain) == 20
    for line in plain:
        assert "answer" not in line and "truncated_reasoning" not in line
        assert line["completion"].lstrip().startswith("<think>")
        assert "</think>" not in line["completion"] and line["finish_reason"] == "stop"
        assert line["metrics"]["exact_match,strict-match"] == 0.0
        assert isinstance(line["completion_tokens"], int)
    meta = json.loads(next((swept / "generations").glob("*/*/pyfunc/*.meta.json")).read_text())
    assert meta["sampling"]["stop"]  # the task's stop strings went to the engine
    arith = json.loads(next((swept / "generations").glob("*/*/arith/*.meta.json")).read_text())
    assert arith["sampling"]["stop"] == [] and arith["sampling"]["max_tokens"] == 48 + BUDGET


def test_the_evaluate_step_scores_the_answer_and_fails_truncated_reasoning(tmp_path: Path) -> None:
    from ckpteval.evaluate import score_samples

    problems = {"p": {"task_id": "p", "question": "1+1?", "answer": "so #### 2"}}
    samples = [
        # the raw completion holds a right-looking number; the answer after reasoning is wrong
        {
            "task_id": "p",
            "sample_idx": 0,
            "completion": "<think>#### 2</think> #### 3",
            "answer": " #### 3",
            "truncated_reasoning": False,
        },
        {
            "task_id": "p",
            "sample_idx": 1,
            "completion": "<think>x</think> #### 2",
            "answer": " #### 2",
            "truncated_reasoning": False,
        },
        {
            "task_id": "p",
            "sample_idx": 2,
            "completion": "<think>#### 2",
            "answer": "",
            "truncated_reasoning": True,
            "reasoning_tokens": 7,
        },
        {"task_id": "p", "sample_idx": 3, "completion": "#### 2"},  # no reasoning configured
    ]
    cell = score_samples(
        "gsm8k", problems, iter(samples), tmp_path / "s.jsonl", tmp_path / "s.json", workers=1
    )
    verdicts = [(v["passed"], v["error_type"]) for v in iter_jsonl(tmp_path / "s.jsonl")]
    assert verdicts == [
        (False, "wrong_answer"),
        (True, None),
        (False, "truncated_reasoning"),
        (True, None),
    ]
    assert cell["error_types"] == {"truncated_reasoning": 1, "wrong_answer": 1}
    assert cell["metrics"]["accuracy"]["value"] == pytest.approx(0.5)


def test_a_gold_answer_field_of_another_tools_samples_is_not_what_is_scored(
    tmp_path: Path,
) -> None:
    """Samples files from other tools often carry the gold answer as `answer`: only a reasoning
    line (with its boolean `truncated_reasoning`) is scored on `answer`, or every sample would
    pass on the gold."""
    from ckpteval.evaluate import score_samples

    problems = {"p": {"task_id": "p", "question": "1+1?", "answer": "so #### 2"}}
    samples = [
        {"task_id": "p", "sample_idx": 0, "completion": "#### 3", "answer": "#### 2"},
        {"task_id": "p", "sample_idx": 1, "completion": "#### 3", "answer": "#### 2",
         "truncated_reasoning": "no"},
        {"task_id": "p", "sample_idx": 2, "completion": "<think>x</think>#### 2",
         "answer": "#### 2", "truncated_reasoning": False},
    ]  # fmt: skip
    score_samples(
        "gsm8k", problems, iter(samples), tmp_path / "s.jsonl", tmp_path / "s.json", workers=1
    )
    assert [v["passed"] for v in iter_jsonl(tmp_path / "s.jsonl")] == [False, False, True]


def test_lm_eval_lines_of_truncated_reasoning_are_their_own_error_type(tmp_path: Path) -> None:
    from ckpteval.harness import harness_lines, score_harness_file

    def sample(doc_id: int, response: str, score: float) -> dict[str, Any]:
        return {
            "doc_id": doc_id,
            "arguments": [("Question: same prompt\nAnswer:", {"until": ["\n\n"]})],
            "resps": [[response]],
            "filtered_resps": [response],
            "target": "2",
            "filter": "none",
            "metrics": ["exact_match"],
            "exact_match": score,
        }

    # two docs with the very same prompt: details are matched by (task, doc), not by text
    details = {
        ("t", 0): {
            "completion": "<think>2",
            "tokens": 3,
            "finish_reason": "length",
            "answer": "",
            "reasoning_tokens": 3,
            "truncated_reasoning": True,
        },
        ("t", 1): {
            "completion": "<think>x</think>2",
            "tokens": 5,
            "finish_reason": "stop",
            "answer": "2",
            "reasoning_tokens": 4,
            "truncated_reasoning": False,
        },
    }
    lines = harness_lines({"t": [sample(0, "", 0.0), sample(1, "2", 1.0)]}, details)
    assert [(x["completion"], x["finish_reason"], x["truncated_reasoning"]) for x in lines] == [
        ("<think>2", "length", True),
        ("<think>x</think>2", "stop", False),
    ]
    assert [x["completion_tokens"] for x in lines] == [3, 5]
    gen = tmp_path / "g.jsonl"
    gen.write_text("".join(json.dumps(x) + "\n" for x in lines))
    cell = score_harness_file(gen, tmp_path / "s.jsonl", tmp_path / "s.json", provenance={})
    assert cell["error_types"] == {"wrong_answer": 0, "truncated_reasoning": 1}
    assert [v["error_type"] for v in iter_jsonl(tmp_path / "s.jsonl")] == [
        "truncated_reasoning",
        None,
    ]
