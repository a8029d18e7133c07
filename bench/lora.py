"""LoRA checkpoints: merge + reload into a running engine, against serving adapters (`enable_lora`).

    python bench/lora.py                      # the demo's LoRA run, 3 adapter checkpoints
    python bench/lora.py --demo resources/demo --adapters 3

The demo's LoRA case: a LoRA run on the demo's last checkpoint (its base model), trained with
peft for a few steps to answer arithmetic without the reasoning (`#### N` alone), so the adapter
visibly changes the outputs; an adapter is saved every 10 steps, as a trainer would.

Two sides, each in its own process with its own engine, on the same prompts (the demo's 20
`arith` questions, greedy):

- merge + reload (what ckpteval does today): each adapter is merged into its base by
  ckpteval's consolidation (peft `merge_and_unload`, a CPU job in the workflow), the engine
  starts on the first merged model, and every next one is swapped in (`ckpteval.engine.swap`:
  `reload_weights`, prefix-cache reset, read-back check), then generates;
- adapter serving: one engine on the base with `enable_lora`; each adapter is a `LoRARequest`
  (vLLM loads it on first use), no merge, no reload.

It prints per side the engine start, the per-checkpoint seconds (merge, reload, generation), the
ratio of the GPU-side per-checkpoint seconds, and whether the outputs agree (tests/numeric.py:
equal, or first differing at a near-tie under the merged model).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STEPS_PER_ADAPTER = 10
RANK = 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MAX_TOKENS = 48


def demo_prompts() -> list[str]:
    from ckpteval.demo import completion_prompt, eval_items

    return [completion_prompt(row["question"]) for row in eval_items()]


def train_adapters(base: Path, out: Path, count: int) -> list[Path]:
    """`out/step_{10 i}`: peft LoRA adapters on `base`, trained to answer with `#### N` alone."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ckpteval.demo import EOS, completion_prompt, training_pairs

    tokenizer = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=RANK, lora_alpha=2 * RANK, lora_dropout=0.0, target_modules=TARGETS)
    peft_model = get_peft_model(model, config)
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=5e-3)
    pairs = training_pairs(400, seed=7)
    texts = [
        completion_prompt(p.question) + " #### " + p.answer.split("#### ")[-1] + EOS for p in pairs
    ]
    saved = []
    peft_model.train()
    for step in range(1, count * STEPS_PER_ADAPTER + 1):
        batch = tokenizer(
            texts[(step * 8) % 392 : (step * 8) % 392 + 8], return_tensors="pt", padding=True
        )
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        peft_model(**batch, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % STEPS_PER_ADAPTER == 0:
            target = out / f"step_{step}"
            peft_model.save_pretrained(target)
            adapter_config = json.loads((target / "adapter_config.json").read_text())
            adapter_config["base_model_name_or_path"] = str(base.resolve())
            (target / "adapter_config.json").write_text(json.dumps(adapter_config))
            saved.append(target)
    return saved


def engine_args() -> dict[str, Any]:
    """The demo's engine settings, as VllmBackend passes them on CPU."""
    args: dict[str, Any] = {"dtype": "bfloat16", "max_model_len": 1024, "seed": 42}
    import torch

    if torch.cuda.is_available():
        return {**args, "gpu_memory_utilization": 0.5}
    return {
        **args,
        "gpu_memory_utilization": 0.15,
        "enforce_eager": True,
        "enable_chunked_prefill": False,
    }


def side_merged(adapters: list[Path], base: Path, work: Path) -> dict[str, Any]:
    """Merge each adapter (ckpteval's consolidation), start on the first, swap in the rest."""
    from vllm import LLM, SamplingParams

    from ckpteval.consolidate import consolidate_checkpoint
    from ckpteval.engine.swap import swap_weights

    merged, merge_s = [], []
    for adapter in adapters:
        started = time.monotonic()
        out = work / "models" / adapter.name
        consolidate_checkpoint(
            adapter, out, work / "models" / f"{adapter.name}.json", base_model=base, smoke="none"
        )
        merge_s.append(time.monotonic() - started)
        merged.append(out)
    started = time.monotonic()
    llm = LLM(str(merged[0]), **engine_args())
    start_s = time.monotonic() - started
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, seed=42)
    reload_s, gen_s, texts = [], [], []
    for i, model in enumerate(merged):
        reload_s.append(swap_weights(llm, model) if i else 0.0)
        started = time.monotonic()
        outputs = llm.generate(demo_prompts(), params, use_tqdm=False)
        gen_s.append(time.monotonic() - started)
        texts.append([o.outputs[0].text for o in outputs])
    swap_weights(llm, base)  # the base model's own answers: what the adapters change
    base_texts = [o.outputs[0].text for o in llm.generate(demo_prompts(), params, use_tqdm=False)]
    return {
        "base_texts": base_texts,
        "start": start_s,
        "merge": merge_s,
        "reload": reload_s[1:],
        "generate": gen_s,
        "texts": texts,
        "models": [str(m) for m in merged],
    }


def side_adapter(adapters: list[Path], base: Path) -> dict[str, Any]:
    """One engine on the base with LoRA enabled; each adapter served by a LoRARequest."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    started = time.monotonic()
    llm = LLM(str(base), enable_lora=True, max_lora_rank=RANK, max_loras=1, **engine_args())
    start_s = time.monotonic() - started
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, seed=42)
    gen_s, texts = [], []
    for i, adapter in enumerate(adapters, start=1):
        request = LoRARequest(adapter.name, i, str(adapter))
        started = time.monotonic()
        outputs = llm.generate(demo_prompts(), params, lora_request=request, use_tqdm=False)
        gen_s.append(time.monotonic() - started)
        texts.append([o.outputs[0].text for o in outputs])
    return {"start": start_s, "generate": gen_s, "texts": texts}


def run_side(side: str, work: Path, base: Path, adapters: list[Path]) -> dict[str, Any]:
    """One side in a child process (its own engine, nothing shared); returns its JSON result."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    cmd = [sys.executable, __file__, "--side", side, "--work", str(work), "--base", str(base)]
    proc = subprocess.run([*cmd, *map(str, adapters)], env=env, capture_output=True, text=True)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"bench: the {side} side failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def agreement(merged: dict[str, Any], adapter: dict[str, Any]) -> tuple[int, int, list[str]]:
    """(equal, near-tie, differing) completions between the sides, by tests/numeric.py's rules,
    with the merged model (float) as the reference."""
    sys.path.insert(0, str(REPO / "tests"))
    from numeric import assert_same_or_near_tie
    from transformers import AutoModelForCausalLM, AutoTokenizer

    equal = near = 0
    differ: list[str] = []
    for model_dir, ours, theirs in zip(
        merged["models"], merged["texts"], adapter["texts"], strict=True
    ):
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        for prompt, a, b in zip(demo_prompts(), ours, theirs, strict=True):
            try:
                same = assert_same_or_near_tie(model, tokenizer, prompt, a, b)
            except AssertionError as exc:
                differ.append(f"{Path(model_dir).name}: {str(exc)[:200]}")
                continue
            equal, near = (equal + 1, near) if same else (equal, near + 1)
    return equal, near, differ


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def report(
    merged: dict[str, Any], adapter: dict[str, Any], agree: tuple[int, int, list[str]]
) -> None:
    n = len(merged["generate"])
    m_gpu = mean(merged["reload"]) + mean(merged["generate"][1:])
    a_gpu = mean(adapter["generate"][1:])
    print(f"LoRA checkpoints: {n}, {len(demo_prompts())} prompts each, greedy, {MAX_TOKENS} tokens")
    print(
        f"merge + reload: engine start {merged['start']:.2f} s; per checkpoint: merge (CPU, "
        f"consolidate job) {mean(merged['merge']):.2f} s, reload {mean(merged['reload']):.3f} s, "
        f"generation {mean(merged['generate'][1:]):.2f} s"
    )
    print(
        f"adapter serving: engine start {adapter['start']:.2f} s; per checkpoint: generation "
        f"with the adapter {a_gpu:.2f} s (first adapter, loaded cold: "
        f"{adapter['generate'][0]:.2f} s)"
    )
    print(
        f"engine-side seconds per checkpoint after the first: merge + reload {m_gpu:.2f}, "
        f"adapter {a_gpu:.2f}, ratio merge+reload / adapter {m_gpu / a_gpu:.2f}"
    )
    total_m = m_gpu + mean(merged["merge"])
    print(f"with the merge counted too: {total_m:.2f} s, ratio {total_m / a_gpu:.2f}")
    changed = sum(a != b for texts in merged["texts"] for a, b in zip(texts, merged["base_texts"]))
    print(
        f"the adapters change {changed} of {n * len(demo_prompts())} completions of the base model"
    )
    equal, near, differ = agree
    print(f"outputs agree: {not differ} ({equal} equal, {near} near-tie, {len(differ)} differ)")
    for line in differ[:3]:
        print(f"  {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", type=Path, default=REPO / "resources" / "demo")
    parser.add_argument("--adapters", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("/tmp/ckpteval-bench-lora"))
    parser.add_argument("--side", choices=["merged", "adapter"], help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--base", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:  # a child: one side, its result on stdout
        result = (
            side_merged(args.paths, args.base, args.work)
            if args.side == "merged"
            else side_adapter(args.paths, args.base)
        )
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    from ckpteval.demo import build

    checkpoints = build(args.demo, echo=lambda line: None)
    base = checkpoints[-1]
    adapters = train_adapters(base, args.out / "lora-run", args.adapters)
    merged = run_side("merged", args.out, base, adapters)
    adapter = run_side("adapter", args.out, base, adapters)
    report(merged, adapter, agreement(merged, adapter))
    return 0


if __name__ == "__main__":
    sys.exit(main())
