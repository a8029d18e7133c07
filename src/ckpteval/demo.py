"""A tiny causal LM and a small training run, built offline and deterministically, for the demo.

The embedded demo (and the tests) need real checkpoints that vLLM, lm-eval and transformers load,
with a step axis on which a metric actually moves. `build_run` makes one: a 3.3M-parameter Llama
with a 512-token byte-level BPE tokenizer, trained on CPU for 600 AdamW steps on arithmetic word
problems, saved every `save_every` steps the way a trainer would.

The model learns the answer format of the `arith` task
(`"Question: {question}\\nAnswer:"` -> `" <reasoning> #### N"` then eos) from training pairs
generated from the same templates as the 20 evaluation items in `data/tasks/arith.jsonl`, but never
the evaluation questions themselves; it also sees the same pairs in ChatML form, so chat templates
work. Building is deterministic for a given seed, step count and machine (CPU float arithmetic
depends on the thread count, which `build_run` fixes, and on the CPU's instruction set).

The weights differ between machines, so the demo's curve must not hinge on a lucky run: the
learning rate is low enough (1e-3, warm-up then cosine) that training is not chaotic, and answer
tokens weigh more in the loss, so that within 600 steps the model learns the arithmetic itself,
not just the format. Measured greedy `arith` pass@1 (base, step_150, 300, 450, 600): README,
"The demo"; `tests/test_demo.py` asserts the shape (rising, last best) with a margin.

Command line: `python -m ckpteval.demo build --out resources/demo [--steps N --save-every M]`
writes `OUT/run/step_{N}/` (the checkpoints), `OUT/base/` (the step-0 random init, the run's base
model) and `OUT/stamp.json`; run again with the same parameters, it does nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from ckpteval.errors import UserError
from ckpteval.io import iter_jsonl, read_json, write_json

EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (EOS, IM_START, IM_END)
VOCAB_SIZE = 512
PROMPT_FORMAT = "Question: {question}\nAnswer:"
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen2's pre-tokenizer split, but a digit keeps its leading space (" 4" is one token, as " four"
# would be): every digit is its own token, which makes arithmetic learnable, at few tokens a number.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DEFAULT_STEPS = 600
DEFAULT_SAVE_EVERY = 150
SAVED_DTYPE = "bfloat16"
BUILD_THREADS = 1
BATCH_SIZE = 8
# 2e-3 learnt faster at first but ended anywhere between 0.05 and 0.5 pass@1 depending on the
# machine (rounding decided the run); 1e-3 rises steadily on every build measured.
LEARNING_RATE = 1e-3
WARMUP_STEPS = 20
CHAT_FRACTION = 0.25
ANSWER_WEIGHT = 4.0
TRAIN_POOL_SIZE = 4000
MODEL_SHAPE: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}

_NAMES = (
    "Ana",
    "Ben",
    "Chen",
    "Dara",
    "Eli",
    "Fatima",
    "Gus",
    "Hana",
    "Ivan",
    "Jo",
    "Kofi",
    "Lena",
)
_ITEMS = ("apples", "pens", "stickers", "marbles", "books", "cards", "shells", "coins", "eggs")


@dataclasses.dataclass(frozen=True)
class ArithItem:
    """One word problem: the question, and the answer as `<reasoning> #### <number>`."""

    question: str
    answer: str


def _add(rng: random.Random, name: str, item: str) -> ArithItem:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return ArithItem(
        f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have?",
        f"{a} + {b} = {a + b} #### {a + b}",
    )


def _sub(rng: random.Random, name: str, item: str) -> ArithItem:
    a = rng.randint(3, 12)
    b = rng.randint(1, a - 1)
    return ArithItem(
        f"{name} has {a} {item} and gives away {b}. How many {item} are left?",
        f"{a} - {b} = {a - b} #### {a - b}",
    )


def _mul(rng: random.Random, name: str, item: str) -> ArithItem:
    a, b = rng.randint(2, 5), rng.randint(2, 5)
    return ArithItem(
        f"{name} has {a} bags with {b} {item} in each. How many {item} in total?",
        f"{a} * {b} = {a * b} #### {a * b}",
    )


def _div(rng: random.Random, name: str, item: str) -> ArithItem:
    a, b = rng.randint(2, 5), rng.randint(2, 5)
    return ArithItem(
        f"{name} shares {a * b} {item} equally among {a} friends. How many {item} does each get?",
        f"{a * b} / {a} = {b} #### {b}",
    )


def _add_sub(rng: random.Random, name: str, item: str) -> ArithItem:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    c = rng.randint(1, a + b - 1)
    return ArithItem(
        f"{name} has {a} {item}, finds {b} more and loses {c}. How many {item} are left?",
        f"{a} + {b} = {a + b}. {a + b} - {c} = {a + b - c} #### {a + b - c}",
    )


def _mul_add(rng: random.Random, name: str, item: str) -> ArithItem:
    a, b, c = rng.randint(2, 5), rng.randint(2, 5), rng.randint(1, 9)
    return ArithItem(
        f"{name} buys {a} packs of {b} {item} and gets {c} more. How many {item} now?",
        f"{a} * {b} = {a * b}. {a * b} + {c} = {a * b + c} #### {a * b + c}",
    )


def _change(rng: random.Random, name: str, item: str) -> ArithItem:
    a, b = rng.randint(2, 5), rng.randint(2, 4)
    paid = 20 if a * b <= 20 else 50
    return ArithItem(
        f"{name} buys {b} {item} at {a} dollars each and pays {paid} dollars. How much change?",
        f"{b} * {a} = {a * b}. {paid} - {a * b} = {paid - a * b} #### {paid - a * b}",
    )


def _three_days(rng: random.Random, name: str, item: str) -> ArithItem:
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 9)
    return ArithItem(
        f"{name} picks {a} {item} on Monday, {b} on Tuesday and {c} on Wednesday. How many in all?",
        f"{a} + {b} = {a + b}. {a + b} + {c} = {a + b + c} #### {a + b + c}",
    )


TEMPLATES: tuple[Callable[[random.Random, str, str], ArithItem], ...] = (
    _add,
    _sub,
    _mul,
    _div,
    _add_sub,
    _mul_add,
    _change,
    _three_days,
)


def generate_arith(rng: random.Random) -> Iterator[ArithItem]:
    """Yield word problems forever, cycling through the templates with random names and numbers."""
    while True:
        for template in TEMPLATES:
            yield template(rng, rng.choice(_NAMES), rng.choice(_ITEMS))


def eval_items() -> list[dict[str, Any]]:
    """The packaged `arith` evaluation items (`task_id`, `question`, `answer`)."""
    path = resources.files("ckpteval") / "data" / "tasks" / "arith.jsonl"
    with resources.as_file(path) as real_path:
        return list(iter_jsonl(real_path))


def training_pairs(count: int, seed: int) -> list[ArithItem]:
    """`count` distinct generated problems, none of which is an evaluation question."""
    held_out = {row["question"] for row in eval_items()}
    rng = random.Random(f"arith-train-{seed}")
    pairs: dict[str, ArithItem] = {}
    for item in generate_arith(rng):
        if item.question not in held_out:
            pairs.setdefault(item.question, item)
        if len(pairs) == count:
            return list(pairs.values())
    raise AssertionError("unreachable: generate_arith is infinite")


def completion_prompt(question: str) -> str:
    """The evaluation prompt; the model continues it with `" <reasoning> #### N"` and eos."""
    return PROMPT_FORMAT.format(question=question)


def _tokenizer_corpus() -> list[str]:
    """Text the BPE merges are learned from: the task's phrasing, code keywords, ChatML roles."""
    rng = random.Random("tokenizer-corpus")
    items = generate_arith(rng)
    corpus = [
        completion_prompt(item.question) + " " + item.answer for item, _ in zip(items, range(800))
    ]
    corpus += [
        "def main():\n    for i in range(10):\n        if i % 2 == 0:\n            print(i)\n"
        "    return None\n\nclass Solution:\n    def solve(self, nums: list[int]) -> int:\n"
        "        total = 0\n        while nums:\n            total += nums.pop()\n"
        "        return total\n\nimport sys\nfrom typing import List\nlambda x: x + 1\n",
        "fn main() {\n    let mut total: i64 = 0;\n    for i in 0..10 {\n        total += i;\n"
        "    }\n"
        '    println!("{}", total);\n}\n\npub fn solve(nums: &Vec<i32>) -> usize {\n'
        "    match nums.len() { 0 => 0, n => n }\n}\nimpl Solver for Vec<u8> { }\nstruct Point "
        "{ x: f64, y: f64 }\nuse std::io;\n#[test]\nfn it_works() { assert_eq!(2 + 2, 4); }\n",
        "system\nuser\nassistant\nYou are a helpful assistant.\n",
        "0123456789 + - * / = % < > ( ) [ ] { } # ! ? . , ; : ' \" \t\n",
    ] * 20
    return corpus


def build_tokenizer(out_dir: str | os.PathLike[str]) -> Path:
    """Train the byte-level BPE, wrap it with a ChatML chat template, `save_pretrained` it.

    `tokenizer_config.json` is patched to name `PreTrainedTokenizerFast`: transformers 5 writes
    `TokenizersBackend`, a class older loaders (vLLM's among them) may not know. It also gets the
    chat template, which transformers 5 writes only to `chat_template.jinja`.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS,
        pad_token=EOS,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    out = Path(out_dir)
    wrapped.save_pretrained(out)
    config_path = out / "tokenizer_config.json"
    config = read_json(config_path)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = CHAT_TEMPLATE
    write_json(config_path, config)
    return out


def _training_example(tokenizer: Any, pair: ArithItem, chat: bool) -> tuple[list[int], int]:
    """One training example's token ids (the completion prompt and answer then eos, or the ChatML
    exchange) and how many of them are prompt.

    The pre-tokenizer splits at the prompt's end (`:` / newline, then a digit), so the prompt's
    tokens are a prefix of the example's.
    """
    if chat:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": pair.question}], tokenize=False, add_generation_prompt=True
        )
        text = prompt + pair.answer + IM_END + "\n"
    else:
        prompt = completion_prompt(pair.question)
        text = prompt + " " + pair.answer + EOS
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    n_prompt = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    return ids, n_prompt


def _collate(examples: list[tuple[list[int], int]], pad_id: int) -> dict[str, Any]:
    """Right-padded model inputs and per-token loss weights.

    The loss covers every real token, prompt included: predicting the question too is what teaches
    a model this small to copy (the name and item recur within each question; with the loss on
    the answer alone, copying the operands took three times as many steps). Answer tokens weigh
    `ANSWER_WEIGHT` times more: once the operands are copied (a hundred steps), what is left to
    learn is the arithmetic, a few answer tokens among the question's unpredictable names.
    """
    import torch

    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    weights = torch.zeros((len(examples), width), dtype=torch.float32)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (ids, n_prompt) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        weights[row, : len(ids)] = 1.0
        weights[row, n_prompt : len(ids)] = ANSWER_WEIGHT
        mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "weights": weights}


def _loss(model: Any, batch: dict[str, Any]) -> Any:
    """Weighted next-token cross-entropy (float32 logits), normalised by the total weight."""
    import torch

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    targets = batch["input_ids"][:, 1:]
    weights = batch["weights"][:, 1:]
    losses = torch.nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
    ).view_as(weights)
    return (losses * weights).sum() / weights.sum()


def _lr_factor(step: int, total: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, total - WARMUP_STEPS)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def _save_checkpoint(model: Any, tokenizer_dir: Path, target: Path, state: dict[str, Any]) -> None:
    """Write a complete HF checkpoint dir under a temp name, then rename it to `target`.

    Weights are stored in bfloat16 (safetensors); the tokenizer files, `generation_config.json` and
    a `trainer_state.json` (HF Trainer's `global_step`, `log_history`) sit beside them.
    """
    import torch

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(tmp)
        for item in tokenizer_dir.iterdir():
            shutil.copy2(item, tmp / item.name)
        write_json(tmp / "trainer_state.json", state)
        for item in tmp.iterdir():
            item.chmod(0o644)
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the checkpoint from other users
        if target.exists():
            shutil.rmtree(target)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _new_model(tokenizer: Any, seed: int) -> Any:
    """The randomly initialised Llama; float32 for training, saved as bfloat16."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    im_end_id = tokenizer.convert_tokens_to_ids(IM_END)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        dtype=SAVED_DTYPE,
        **MODEL_SHAPE,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=eos_id, eos_token_id=[eos_id, im_end_id], pad_token_id=eos_id
    )
    return model


def build_run(
    run_dir: str | os.PathLike[str],
    *,
    steps: int = DEFAULT_STEPS,
    save_every: int = DEFAULT_SAVE_EVERY,
    seed: int = 0,
    base_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
    answer_format: Callable[[ArithItem], str] | None = None,
    chat_fraction: float = CHAT_FRACTION,
) -> list[Path]:
    """Train the demo model from scratch; return the checkpoint dirs `run_dir/step_{N}` in order.

    A checkpoint is written after every `save_every` steps and after the last step. With `base_dir`,
    the step-0 random initialisation is saved there too. `progress` receives one line per
    checkpoint written. `answer_format` rewrites each training answer (the reasoning test's model
    learns `<think>...</think> #### N` this way); `chat_fraction` of the pairs are seen as ChatML.

    Training runs on `BUILD_THREADS` torch threads whatever the caller set: float results depend on
    the thread count, and two threads on a busy 2-core machine spin-wait on each other (measured
    17x slower than one thread under load here).
    """
    import torch

    _check_schedule(steps, save_every)
    threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)
    try:
        return _train(
            Path(run_dir), steps, save_every, seed, base_dir, progress, answer_format, chat_fraction
        )
    finally:
        torch.set_num_threads(threads)


def _train(
    run_dir: Path,
    steps: int,
    save_every: int,
    seed: int,
    base_dir: str | os.PathLike[str] | None,
    progress: Callable[[str], None] | None,
    answer_format: Callable[[ArithItem], str] | None = None,
    chat_fraction: float = CHAT_FRACTION,
) -> list[Path]:
    import torch
    from transformers import PreTrainedTokenizerFast

    with tempfile.TemporaryDirectory(prefix="ckpteval-demo-tok-") as tok_tmp:
        tokenizer_dir = build_tokenizer(tok_tmp)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
        model = _new_model(tokenizer, seed)
        if base_dir is not None:
            initial_state = {"global_step": 0, "log_history": []}
            _save_checkpoint(model, tokenizer_dir, Path(base_dir), initial_state)
        pairs = training_pairs(TRAIN_POOL_SIZE, seed)
        if answer_format is not None:
            pairs = [dataclasses.replace(p, answer=answer_format(p)) for p in pairs]
        # A fixed fraction of the pairs is seen as a ChatML exchange, so chat templates work too.
        chat_mix = random.Random(f"chat-mix-{seed}")
        as_chat = [chat_mix.random() < chat_fraction for _ in pairs]
        order = random.Random(f"batches-{seed}")
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.98), weight_decay=0.01
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, steps))
        saved: list[Path] = []
        log_history: list[dict[str, Any]] = []
        model.train()
        for step in range(1, steps + 1):
            picks = order.sample(range(len(pairs)), BATCH_SIZE)
            examples = [_training_example(tokenizer, pairs[i], as_chat[i]) for i in picks]
            loss = _loss(model, _collate(examples, tokenizer.pad_token_id))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if step % 10 == 0 or step == steps:
                log_history.append({"step": step, "loss": round(loss.item(), 4)})
            if step % save_every == 0 or step == steps:
                target = run_dir / f"step_{step}"
                state = {"global_step": step, "max_steps": steps, "log_history": log_history}
                _save_checkpoint(model.eval(), tokenizer_dir, target, state)
                model.train()
                saved.append(target)
                if progress is not None:
                    progress(f"wrote {target} (step {step}/{steps}, loss {loss.item():.3f})")
    return saved


def _check_schedule(steps: int, save_every: int) -> None:
    if steps < 1 or save_every < 1:
        raise UserError(
            f"--steps ({steps}) and --save-every ({save_every}) must be positive integers"
        )


def _stamp(steps: int, save_every: int, seed: int) -> dict[str, Any]:
    """What a build depends on: its parameters, this module's code, the eval items, libraries."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(json.dumps(eval_items(), sort_keys=True).encode())
    libraries = {name: metadata.version(name) for name in ("torch", "transformers", "tokenizers")}
    return {
        "steps": steps,
        "save_every": save_every,
        "seed": seed,
        "code_sha256": digest.hexdigest(),
        **libraries,
    }


def build(
    out: str | os.PathLike[str],
    *,
    steps: int = DEFAULT_STEPS,
    save_every: int = DEFAULT_SAVE_EVERY,
    seed: int = 0,
    echo: Callable[[str], None] = print,
) -> list[Path]:
    """Build `out/run/step_*` and `out/base` unless `out/stamp.json` says they are already built.

    The stamp is written last, so an interrupted build is redone from scratch next time.
    """
    _check_schedule(steps, save_every)
    out = Path(out)
    stamp_path = out / "stamp.json"
    stamp = _stamp(steps, save_every, seed)
    run_dir = out / "run"
    if stamp_path.exists() and read_json(stamp_path) == stamp:
        checkpoints = sorted(run_dir.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
        echo(f"demo already built in {out} (steps={steps}, save_every={save_every}, seed={seed})")
        return checkpoints
    with contextlib.suppress(FileNotFoundError):
        stamp_path.unlink()
    shutil.rmtree(run_dir, ignore_errors=True)
    started = time.monotonic()
    checkpoints = build_run(
        run_dir, steps=steps, save_every=save_every, seed=seed, base_dir=out / "base", progress=echo
    )
    write_json(stamp_path, stamp)
    echo(f"built {len(checkpoints)} checkpoints in {out} in {time.monotonic() - started:.1f} s")
    return checkpoints


def main(argv: list[str] | None = None) -> int:
    """`python -m ckpteval.demo build --out DIR [--steps N] [--save-every M] [--seed S]`."""
    parser = argparse.ArgumentParser(
        prog="python -m ckpteval.demo", description=(__doc__ or "").split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build", help="build the demo training run (idempotent)")
    build_cmd.add_argument("--out", required=True, type=Path, help="e.g. resources/demo")
    build_cmd.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    build_cmd.add_argument("--save-every", type=int, default=DEFAULT_SAVE_EVERY)
    build_cmd.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    try:
        build(args.out, steps=args.steps, save_every=args.save_every, seed=args.seed)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
