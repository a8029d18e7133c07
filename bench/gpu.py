"""The GPU runbook: one command on a machine with a GPU and no network measures the infer step.

    python bench/gpu.py                  # a GPU: Qwen3-1.7B's shape, 4 checkpoints, 7 tasks
    python bench/gpu.py --tiny           # no GPU (the default there): a tiny shape on CPU, for CI

It builds random-weight checkpoints of a real architecture (Qwen3-1.7B's `config.json`, shipped in
`bench/data/qwen3-1.7b/`), perturbs them into N checkpoints of one training run, writes a workflow
config and runs the real workflow (`snakemake --profile profiles/local`, one GPU slot) with
`engine.swap` on and off, each from an empty cache: first up to the consolidated models (not
timed; the second sweep reuses the first's, hard-linked), then the infer step (`--until
generation`, timed). Then a bare `vllm.LLM.generate`, with the same engine settings, answers
exactly the prompts of the last checkpoint.

Figures come from the generation metas where they record them (engine `load_seconds`, `swaps`,
`swap_seconds`, `served_by`, `completion_tokens`, `generation_seconds`); the GPU's busy share is
NVML's utilization sampled during the infer step (`pynvml`; "n/a" without it or without a GPU).

Tokenizer: there is no network, so Qwen's tokenizer cannot be fetched. The demo's byte-level BPE
(`ckpteval.demo.build_tokenizer`, 512 tokens) is built locally and its vocabulary padded with
filler tokens (`<fill{id}>`, never produced by encoding) up to the config's `vocab_size`. The
embedding and LM-head matrices therefore keep the real model's size, and so does the compute per
token (the LM head over 151,936 rows is part of it). What differs: the same text makes more
tokens than Qwen's tokenizer would (prompts are longer in tokens), and random weights hardly ever
pick eos or a stop string, so every completion runs to `max_new_tokens`: an upper bound on a
trained model's generation time for the same budget.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from _workflow import snakemake

REPO = Path(__file__).resolve().parents[1]
QWEN3_CONFIG = REPO / "bench" / "data" / "qwen3-1.7b" / "config.json"
#: The shape `--tiny` puts in place of Qwen3-1.7B's: the same architecture, minutes on CPU.
TINY_SHAPE: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "max_window_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,  # vLLM's CPU attention takes head sizes of 32 and up
    "vocab_size": 1024,
}
ALL_TASKS = ["arith", "arith_harness", "pyfunc", "rustfunc", "humaneval", "math_qwen", "stdio_demo"]
TINY_TASKS = ["arith", "arith_harness"]
#: Seed 004's sweep, the projection's target: checkpoints x tasks on GPUs.
SWEEP = {"checkpoints": 30, "tasks": 7, "gpus": 16}
STEP = 100
BARE_REPEATS = 3
NOISE = 1e-3  # added to every parameter between two checkpoints (the init's std is 0.02)


def has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch, no GPU
        return False


# ---- checkpoints ------------------------------------------------------------------------------


def padded_tokenizer(out: Path, vocab_size: int) -> Path:
    """The demo's BPE with filler tokens appended to its vocabulary up to `vocab_size`.

    A filler is a plain vocabulary entry with no merge leading to it: encoding never produces it,
    decoding an id the model picks gives `<fill{id}>`. Every id the model can emit decodes."""
    from ckpteval.demo import build_tokenizer

    build_tokenizer(out)
    path = out / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    taken = len(vocab) + sum(1 for t in data["added_tokens"] if t["content"] not in vocab)
    if taken > vocab_size:
        sys.exit(f"bench: the tokenizer has {taken} tokens, more than vocab_size {vocab_size}")
    top = max(max(vocab.values()), max(t["id"] for t in data["added_tokens"]))
    for token_id in range(top + 1, vocab_size):
        vocab[f"<fill{token_id}>"] = token_id
    path.write_text(json.dumps(data, ensure_ascii=False))
    return out


def model_config(tiny: bool, tokenizer_dir: Path) -> Any:
    """Qwen3-1.7B's config (or its tiny shape), with the local tokenizer's eos and bos ids."""
    from transformers import AutoConfig, AutoTokenizer

    raw = json.loads(QWEN3_CONFIG.read_text())
    if tiny:
        raw.update(TINY_SHAPE)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    raw["bos_token_id"] = raw["eos_token_id"] = tokenizer.eos_token_id
    raw["pad_token_id"] = tokenizer.eos_token_id
    raw.pop("transformers_version", None)
    model_type = raw.pop("model_type")
    return AutoConfig.for_model(model_type, **raw)


def build_checkpoints(run_dir: Path, n: int, tiny: bool) -> list[Path]:
    """`run_dir/step_{100 i}` for i = 1..n: a random init, then `NOISE` added to every parameter
    before each save (as a training run moves its weights). Built on the GPU when there is one."""
    import torch
    from transformers import AutoModelForCausalLM

    shutil.rmtree(run_dir, ignore_errors=True)
    tokenizer_dir = padded_tokenizer(run_dir.parent / "tokenizer", _vocab_size(tiny))
    config = model_config(tiny, tokenizer_dir)
    device = "cuda" if has_cuda() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    saved = []
    for i in range(1, n + 1):
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param), alpha=NOISE)
        target = run_dir / f"step_{i * STEP}"
        model.save_pretrained(target)
        for item in tokenizer_dir.iterdir():
            shutil.copy2(item, target / item.name)
        (target / "trainer_state.json").write_text(json.dumps({"global_step": i * STEP}))
        saved.append(target)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return saved


def _vocab_size(tiny: bool) -> int:
    return int(
        TINY_SHAPE["vocab_size"] if tiny else json.loads(QWEN3_CONFIG.read_text())["vocab_size"]
    )


# ---- the workflow -----------------------------------------------------------------------------


def engine_config(tiny: bool) -> dict[str, Any]:
    """Engine settings of both sweeps and of the bare engine."""
    if tiny:
        return {"gpu_memory_utilization": 0.15, "enforce_eager": True, "max_model_len": 2048}
    return {"gpu_memory_utilization": 0.85, "enforce_eager": False, "max_model_len": 4096}


def workflow_config(run_dir: Path, args: argparse.Namespace, swap: bool) -> dict[str, Any]:
    return {
        "runs": {"bench": {"path": str(run_dir)}},
        "tasks": {name: {} for name in args.tasks},
        "sampling": {"greedy": {"temperature": 0.0, "max_new_tokens": args.max_new_tokens}},
        "seeds": [42],
        "engine": {**engine_config(args.tiny), "swap": swap},
        "consolidate": {"smoke": "none"},
        "evaluate": {"workers": 2, "timeout": 10},
    }


class BusySampler:
    """NVML utilization of the busiest GPU, sampled every `period` seconds in a thread.

    `share()` is the mean over the samples (0..1), or None without pynvml or a GPU."""

    def __init__(self, period: float = 0.5) -> None:
        self.period = period
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handles = self._open()

    @staticmethod
    def _open() -> list[Any]:
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception:  # noqa: BLE001 - no pynvml, no driver: "n/a"
            return []

    def _run(self) -> None:
        import pynvml

        while not self._stop.wait(self.period):
            rates = [pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles]
            self.samples.append(max(rates) / 100.0)

    def __enter__(self) -> BusySampler:
        if self._handles:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def share(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


def sweep(
    out: Path, run_dir: Path, args: argparse.Namespace, swap: bool, models_from: Path | None = None
) -> dict[str, Any]:
    """One sweep from an empty cache: consolidate (untimed), then the timed infer step.

    With `models_from` (the other sweep's work directory), its consolidated models and their
    source records are hard-linked in first: the same checkpoints, consolidated once (minutes
    per checkpoint at Qwen3-1.7B's size, and not what is measured); the consolidate step then
    finds nothing to do."""
    work = out / ("swap-on" if swap else "swap-off")
    shutil.rmtree(work, ignore_errors=True)
    (work / "config").mkdir(parents=True)
    config = workflow_config(run_dir, args, swap)
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    if models_from is not None:
        for part in ("models", "sources"):
            shutil.copytree(
                models_from / "results" / part, work / "results" / part, copy_function=os.link
            )
    snakemake(work, "--until", "consolidate")
    with BusySampler() as sampler:
        seconds = snakemake(work, "--until", "generation")
    metas = [json.loads(p.read_text()) for p in (work / "results").rglob("*.meta.json")]
    return {"work": work, "seconds": seconds, "busy": sampler.share(), **meta_figures(metas)}


def meta_figures(metas: list[dict[str, Any]]) -> dict[str, Any]:
    """Engine starts, swaps and generation totals as the metas record them.

    A meta carries its engine's figures up to that checkpoint (`swaps`, `swap_seconds` count
    up along a chain), so each engine (`served_by`) counts once, with its largest values."""
    engines: dict[Any, dict[str, float]] = {}
    for meta in metas:
        if not meta.get("engine_loads"):
            continue
        seen = engines.setdefault(meta.get("served_by"), {"load": 0.0, "swaps": 0, "swap_s": 0.0})
        seen["load"] = max(seen["load"], float(meta.get("load_seconds") or 0.0))
        seen["swaps"] = max(seen["swaps"], int(meta.get("swaps") or 0))
        seen["swap_s"] = max(seen["swap_s"], float(meta.get("swap_seconds") or 0.0))
    loads = [e["load"] for e in engines.values()]
    swaps = sum(int(e["swaps"]) for e in engines.values())
    return {
        "cells": len(metas),
        "checkpoints": len({m.get("model_dir") for m in metas}),
        "loads": len(engines),
        "load_seconds": sum(loads) / len(loads) if loads else 0.0,
        "swaps": swaps,
        "swap_seconds": sum(e["swap_s"] for e in engines.values()) / swaps if swaps else 0.0,
        "tokens": sum(int(m.get("completion_tokens") or 0) for m in metas),
        "generation_seconds": sum(float(m.get("generation_seconds") or 0.0) for m in metas),
    }


# ---- the bare engine --------------------------------------------------------------------------


def _bench_infer() -> Any:
    """bench/infer.py as a module: its `_bare_requests` rebuilds exactly what ckpteval sent."""
    spec = importlib.util.spec_from_file_location("bench_infer", REPO / "bench" / "infer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bare_generate(work: Path, ckpt: str, tiny: bool) -> dict[str, Any]:
    """A bare `vllm.LLM` on checkpoint `ckpt`'s consolidated model, same engine settings, answers
    the prompts ckpteval sent for it, after one warm-up call. Also gives ckpteval's own figures
    for that checkpoint, from its metas."""
    from vllm import LLM, SamplingParams

    gen_dir = next(work.glob(f"results/generations/*/{ckpt}"))
    metas = [json.loads(p.read_text()) for p in gen_dir.rglob("*.meta.json")]
    model_dir = work / metas[0]["model_dir"]
    engine = engine_config(tiny)
    extra = {} if has_cuda() else {"enable_chunked_prefill": False}  # as VllmBackend on CPU
    if not has_cuda():
        from ckpteval.engine.kvcache import cpu_engine_args

        extra.update(cpu_engine_args(model_dir, engine["max_model_len"]))
    started = time.monotonic()
    llm = LLM(
        str(model_dir),
        dtype="bfloat16",
        max_model_len=engine["max_model_len"],
        seed=42,
        gpu_memory_utilization=engine["gpu_memory_utilization"],
        enforce_eager=engine["enforce_eager"],
        **extra,
    )
    start_seconds = time.monotonic() - started
    eos = llm.get_tokenizer().eos_token
    prompts, params = _bench_infer()._bare_requests(gen_dir, metas, eos)
    llm.generate(["warm up"], SamplingParams(max_tokens=8), use_tqdm=False)
    runs = []
    for _ in range(BARE_REPEATS):  # the best run counts: other load only ever adds time
        llm.reset_prefix_cache()
        started = time.monotonic()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        runs.append(time.monotonic() - started)
    tokens = sum(len(o.token_ids) for out in outputs for o in out.outputs)
    ours = meta_figures(metas)
    return {
        "start_seconds": start_seconds,
        "prompts": len(prompts),
        "bare_tokens": tokens,
        "bare_seconds": min(runs),
        "ours_tokens": ours["tokens"],
        "ours_seconds": ours["generation_seconds"],
    }


# ---- figures ----------------------------------------------------------------------------------


def projection(on: dict[str, Any], off: dict[str, Any]) -> dict[str, float]:
    """GPU-hours of seed 004's sweep (C checkpoints x T tasks on G GPUs), from measured parts.

    S: engine start seconds (swap off's mean), w: seconds per swap, g: generation GPU-seconds
    per checkpoint x task, o: per-job overhead outside engine and generation (process start,
    imports, files), measured on swap off as (infer wall - loads x S - generation) / checkpoints.
        swap off: C x (o + S + T x g) / 3600
        swap on:  (C x o + E x S + (C - E) x w + C x T x g) / 3600, E = min(G, C) engines
    """
    c, t, g_count = SWEEP["checkpoints"], SWEEP["tasks"], SWEEP["gpus"]
    start = off["load_seconds"]
    swap = on["swap_seconds"]
    gen = off["generation_seconds"] / max(off["cells"], 1)
    over = (off["seconds"] - off["loads"] * start - off["generation_seconds"]) / off["checkpoints"]
    over = max(over, 0.0)
    engines = min(g_count, c)
    hours_off = c * (over + start + t * gen) / 3600
    hours_on = (c * over + engines * start + (c - engines) * swap + c * t * gen) / 3600
    return {
        "S": start,
        "w": swap,
        "g": gen,
        "o": over,
        "E": engines,
        "off": hours_off,
        "on": hours_on,
    }


def report(on: dict[str, Any], off: dict[str, Any], bare: dict[str, Any], device: str) -> None:
    """Print the runbook's figures (one `name: value` line each)."""
    print(f"device: {device}")
    for name, side in (("swap on", on), ("swap off", off)):
        print(
            f"{name}: {side['checkpoints']} checkpoints, {side['cells']} generation files, "
            f"engine loads {side['loads']}, swaps {side['swaps']}, infer step {side['seconds']:.1f} s"
        )
    print(
        f"engine start seconds: {off['load_seconds']:.2f} (bare LLM: {bare['start_seconds']:.2f})"
    )
    print(f"swap seconds: {on['swap_seconds']:.3f} per swap ({on['swaps']} swaps)")
    ours = bare["ours_tokens"] / max(bare["ours_seconds"], 1e-9)
    theirs = bare["bare_tokens"] / max(bare["bare_seconds"], 1e-9)
    print(
        f"generated tokens per second: ckpteval {ours:.1f} ({bare['ours_tokens']} tokens in "
        f"{bare['ours_seconds']:.2f} s, the last checkpoint's generation_seconds), bare "
        f"LLM.generate {theirs:.1f} ({bare['bare_tokens']} tokens in {bare['bare_seconds']:.2f} s, "
        f"best of {BARE_REPEATS}) on the same {bare['prompts']} prompts, ratio {ours / theirs:.2f}"
    )
    for name, side in (("swap on", on), ("swap off", off)):
        busy = "n/a" if side["busy"] is None else f"{side['busy']:.0%}"
        print(f"GPU busy share during the infer step ({name}): {busy}")
        per_cell = side["seconds"] / max(side["cells"], 1)
        print(f"GPU-seconds per checkpoint x task ({name}): {per_cell:.2f}")
    p = projection(on, off)
    c, t, g = SWEEP["checkpoints"], SWEEP["tasks"], SWEEP["gpus"]
    print(
        f"projection, {c} checkpoints x {t} tasks on {g} GPUs: S={p['S']:.2f} s start, "
        f"w={p['w']:.3f} s swap, g={p['g']:.2f} s generation per checkpoint x task, "
        f"o={p['o']:.2f} s job overhead"
    )
    print(f"  swap off: C x (o + S + T x g) / 3600 = {p['off']:.3f} GPU-hours")
    print(
        f"  swap on: (C x o + E x S + (C - E) x w + C x T x g) / 3600, E={p['E']} = {p['on']:.3f} GPU-hours"
    )
    print(
        f"  wall hours on {g} GPUs, perfectly packed: swap off {p['off'] / g:.3f}, swap on {p['on'] / g:.3f}"
    )


def main(argv: list[str] | None = None) -> int:
    cuda = has_cuda()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tiny",
        action=argparse.BooleanOptionalAction,
        default=not cuda,
        help="a tiny shape of the same architecture (default without CUDA)",
    )
    parser.add_argument("--checkpoints", type=int, help="default 4 (tiny: 3)")
    parser.add_argument(
        "--tasks", nargs="+", help=f"default {' '.join(ALL_TASKS)} (tiny: {' '.join(TINY_TASKS)})"
    )
    parser.add_argument("--max-new-tokens", type=int, help="default 256 (tiny: 32)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/ckpteval-bench-gpu"))
    args = parser.parse_args(argv)
    args.checkpoints = args.checkpoints or (3 if args.tiny else 4)
    args.tasks = args.tasks or (TINY_TASKS if args.tiny else ALL_TASKS)
    args.max_new_tokens = args.max_new_tokens or (32 if args.tiny else 256)
    if args.checkpoints < 2:
        parser.error("--checkpoints must be at least 2 (a swap needs a second checkpoint)")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    run_dir = args.out / "run"
    started = time.monotonic()
    ckpts = build_checkpoints(run_dir, args.checkpoints, args.tiny)
    print(f"built {len(ckpts)} random-weight checkpoints in {time.monotonic() - started:.1f} s")
    on = sweep(args.out, run_dir, args, True)
    off = sweep(args.out, run_dir, args, False, models_from=on["work"])
    bare = bare_generate(on["work"], ckpts[-1].name, args.tiny)
    shape = "tiny Qwen3 shape" if args.tiny else "Qwen3-1.7B shape"
    report(on, off, bare, f"{_gpu_name() if cuda else 'cpu'} ({shape}, random weights)")
    return 0


def _gpu_name() -> str:
    import torch

    return str(torch.cuda.get_device_name(0))


if __name__ == "__main__":
    sys.exit(main())
