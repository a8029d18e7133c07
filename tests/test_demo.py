"""The demo training run: real checkpoints that transformers loads and that learn the format."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ckpteval import demo
from ckpteval.io import sha256_file

FORMAT_STEPS = 80
FORMAT_SAVE_EVERY = 40
#: The demo's last checkpoint answers at least this share of the 20 arith problems, and at least
#: this much more than its first checkpoint (measured: README, "The demo").
DEMO_LAST_AT_LEAST = 0.6
DEMO_RISE_AT_LEAST = 0.4


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short demo build: long enough that greedy decoding follows the answer format."""
    out = tmp_path_factory.mktemp("demo")
    demo.build(out, steps=FORMAT_STEPS, save_every=FORMAT_SAVE_EVERY, echo=lambda line: None)
    return out


def _greedy(model_dir: Path, prompt: str, max_new_tokens: int = 32) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    encoded = tokenizer(prompt, return_tensors="pt")
    output = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(output[0, encoded.input_ids.shape[1] :], skip_special_tokens=True)


def arith_pass_at_1(model_dir: Path) -> float:
    """The `arith` task's greedy pass@1, as the demo scores it: bf16 weights and arithmetic (what
    vLLM runs on CPU), the task's prompt, stop strings and 64-token cap, the gsm8k checker's
    answer extraction. transformers instead of vLLM: no engine start per checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ckpteval.checkers.math import as_number, extract_answer, gold_answer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    stops = ("\n\n", "\nQuestion:")
    passed = 0
    items = demo.eval_items()
    for item in items:
        encoded = tokenizer(demo.completion_prompt(item["question"]), return_tensors="pt")
        with torch.no_grad():
            output = model.generate(
                **encoded,
                max_new_tokens=64,
                do_sample=False,
                stop_strings=list(stops),
                tokenizer=tokenizer,
            )
        text = tokenizer.decode(output[0, encoded.input_ids.shape[1] :], skip_special_tokens=True)
        for stop in stops:
            text = text.split(stop)[0]
        answer, _ = extract_answer(text)
        passed += answer is not None and as_number(answer) == as_number(gold_answer(item))
    return passed / len(items)


def test_eval_items_are_well_formed_and_held_out_of_training() -> None:
    items = demo.eval_items()
    assert len(items) == 20
    assert [row["task_id"] for row in items] == [f"arith/{i}" for i in range(20)]
    for row in items:
        reasoning, _, number = row["answer"].rpartition(" #### ")
        assert reasoning and re.fullmatch(r"-?\d+", number), row
        assert reasoning.rsplit("= ", 1)[-1] == number, row
    questions = {row["question"] for row in items}
    pairs = demo.training_pairs(demo.TRAIN_POOL_SIZE, seed=0)
    assert len({pair.question for pair in pairs}) == demo.TRAIN_POOL_SIZE
    assert not questions & {pair.question for pair in pairs}

    # Same templates: every evaluation answer has the shape some training answer has.
    def shape(answer: str) -> str:
        return re.sub(r"\d+", "N", answer)

    assert {shape(row["answer"]) for row in items} <= {shape(pair.answer) for pair in pairs}


@pytest.mark.slow
def test_build_writes_checkpoints_with_real_steps(demo_out: Path) -> None:
    run = demo_out / "run"
    assert sorted(p.name for p in run.iterdir()) == ["step_40", "step_80"]
    for step_dir in [*run.iterdir(), demo_out / "base"]:
        names = {p.name for p in step_dir.iterdir()}
        assert {
            "config.json",
            "model.safetensors",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "trainer_state.json",
        } <= names
    assert json.loads((run / "step_80" / "trainer_state.json").read_text())["global_step"] == 80
    assert json.loads((demo_out / "base" / "trainer_state.json").read_text())["global_step"] == 0
    config = json.loads((run / "step_40" / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["tie_word_embeddings"] is True
    assert config["max_position_embeddings"] >= 4096
    # Training changed the weights between checkpoints.
    hashes = {sha256_file(d / "model.safetensors") for d in [demo_out / "base", *run.iterdir()]}
    assert len(hashes) == 3


def test_build_is_idempotent_and_rebuilds_on_new_parameters(tmp_path: Path) -> None:
    lines: list[str] = []
    demo.build(tmp_path, steps=2, save_every=1, echo=lines.append)
    assert sum(line.startswith("wrote ") for line in lines) == 2
    assert lines[-1].startswith("built 2 checkpoints")
    weights = tmp_path / "run" / "step_2" / "model.safetensors"
    before = weights.stat().st_mtime_ns

    lines.clear()
    checkpoints = demo.build(tmp_path, steps=2, save_every=1, echo=lines.append)
    assert [p.name for p in checkpoints] == ["step_1", "step_2"]
    assert len(lines) == 1 and "already built" in lines[0]
    assert weights.stat().st_mtime_ns == before

    demo.build(tmp_path, steps=3, save_every=3, echo=lines.append)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["step_3"]


@pytest.mark.slow
@pytest.mark.numeric
def test_trained_checkpoint_answers_in_the_task_format(demo_out: Path) -> None:
    pair = demo.training_pairs(1, seed=0)[0]
    completion = _greedy(demo_out / "run" / "step_80", demo.completion_prompt(pair.question))
    assert re.fullmatch(r" [\d +\-*/=.]+ #### \d+", completion), completion


def test_tokenizer_renders_chatml_and_spells_numbers_by_digit(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    demo.build_tokenizer(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.pad_token == "<|endoftext|>"
    assert 400 <= len(tokenizer) <= 512
    assert tokenizer.tokenize(" 123") == ["Ġ1", "2", "3"]
    answer = " 12 - 7 = 5 #### 5"
    assert tokenizer.decode(tokenizer(answer)["input_ids"]) == answer


def test_build_run_is_deterministic(tmp_path: Path) -> None:
    first = demo.build_run(tmp_path / "a", steps=4, save_every=2, seed=3)
    second = demo.build_run(tmp_path / "b", steps=4, save_every=2, seed=3)
    other_seed = demo.build_run(tmp_path / "c", steps=4, save_every=4, seed=4)
    assert [p.name for p in first] == ["step_2", "step_4"]
    for a, b in zip(first, second):
        assert sha256_file(a / "model.safetensors") == sha256_file(b / "model.safetensors")
        assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    assert sha256_file(first[-1] / "model.safetensors") != sha256_file(
        other_seed[-1] / "model.safetensors"
    )


def test_build_run_leaves_only_finished_checkpoints(tmp_path: Path) -> None:
    demo.build_run(tmp_path, steps=3, save_every=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2", "step_3"]


def test_cli_rejects_nonpositive_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["build", "--out", str(tmp_path), "--steps", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--steps" in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.numeric
def test_the_demo_curve_rises_and_its_last_checkpoint_is_best(demo_dir: Path) -> None:
    """The story `make demo` tells: arith pass@1 near zero untrained, rising at every saved
    checkpoint, highest at the last. Asserted as ranges with a margin, not as digits: CPUs and
    thread counts round differently, so the weights (and a near-tie answer or two out of 20)
    differ from machine to machine. Measured ranges: README, "The demo"."""
    steps = sorted((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    curve = [arith_pass_at_1(demo_dir / "base"), *(arith_pass_at_1(p) for p in steps)]
    print("arith pass@1:", dict(zip(["base", *(p.name for p in steps)], curve)))
    base, trained = curve[0], curve[1:]
    assert base <= 0.1, curve
    assert trained[-1] == max(curve) and trained[-1] >= DEMO_LAST_AT_LEAST, curve
    assert trained[-1] - trained[0] >= DEMO_RISE_AT_LEAST, curve
    # Rising: a checkpoint may tie or trail the one before by one answer in 20, never more.
    assert all(b >= a - 0.05 for a, b in zip(trained, trained[1:])), curve
