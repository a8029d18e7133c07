"""Infer throughput: ckpteval's infer step against a bare `LLM.generate` on the same prompts.

Runs the infer step (`ckpteval.engine.generate.run_infer`, the function the workflow's infer rule calls) for
every task and variant of a config on one consolidated model, with an empty cache, and prints
engine loads, load seconds, generation seconds and tokens. Then, in the same process and on the
same engine (prefix cache reset), it sends exactly the prompts ckpteval sent, with the same
sampling parameters, to one bare `vllm.LLM.generate` call, alternating with more infer steps on
empty caches, and prints every run, how much of ckpteval's time is spent outside the engine, and
the ratio of the two sides' best throughput. Target: ckpteval >= 90% of the bare engine's
throughput on a mixed task set.

    python bench/infer.py                          # CPU: the tiny demo model, a mixed task set
    python bench/infer.py --model results/models/run/step_1000 --config config/examples/one-node-8gpu.yaml

`--model` is a consolidated model directory (its manifest `<dir>.json` beside it); without it the
demo run is built (`python -m ckpteval.demo build`) and its last checkpoint consolidated. The
config's `tasks`, `sampling`, `seeds` and `engine` are used (`runs` is ignored).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

# The default mixed task set: ckpteval's own tasks (Python, Rust, math, arithmetic, a chat-free
# CoT prompt) and an lm-eval task, greedy and sampled.
MIXED: dict[str, Any] = {
    "tasks": {
        "arith": {},
        "arith_harness": {},
        "math_qwen": {},
        "pyfunc": {},
        "rustfunc": {},
        "humaneval": {"limit": 48},
    },
    "sampling": {
        "greedy": {"temperature": 0.0, "max_new_tokens": 128},
        "hot": {"temperature": 0.8, "top_p": 0.95, "n": 4, "max_new_tokens": 128},
    },
    "engine": {"gpu_memory_utilization": 0.15, "enforce_eager": True},
}


def _demo_model(work: Path) -> Path:
    from ckpteval.consolidate import consolidate_checkpoint
    from ckpteval.demo import build

    checkpoints = build(work / "demo", echo=lambda line: None)
    model = work / "model"
    if not (work / "model.json").exists():
        consolidate_checkpoint(checkpoints[-1], model, work / "model.json", smoke="none")
    return model


def _config(path: Path | None) -> dict[str, Any]:
    from ckpteval.config import validate_config

    raw = yaml.safe_load(path.read_text()) if path else json.loads(json.dumps(MIXED))
    config = {k: raw[k] for k in ("tasks", "sampling", "seeds", "engine", "lm_eval") if k in raw}
    config["runs"] = {"bench": {"path": "."}}
    validate_config(config)
    if "hot" in config["sampling"]:  # lm-eval tasks take one sample per request
        for name in config["tasks"]:
            if name.endswith("harness"):
                config["tasks"][name]["sampling"] = ["greedy"]
    return config


def _bare_requests(
    gen_dir: Path, metas: list[dict[str, Any]], eos: str
) -> tuple[list[str], list[Any]]:
    """Exactly what ckpteval sent: each problem's prompt once, with its file's sampling."""
    from vllm import SamplingParams

    prompts: list[str] = []
    params: list[Any] = []
    for meta in metas:
        lines = [
            json.loads(x) for x in (gen_dir / meta["task"] / f"{meta['variant']}.jsonl").open()
        ]
        if "sampling" in meta:
            sp = SamplingParams(**meta["sampling"])
            first = [x for x in lines if x["sample_idx"] == 0]
        else:  # an lm-eval task: its YAML's generation settings, as lm-eval's VLLM applies them
            config = next(iter(meta["lm_eval_config"].values()))
            gen = {**config.get("generation_kwargs", {}), **(meta.get("lm_eval_gen_kwargs") or {})}
            sp = SamplingParams(
                max_tokens=int(gen.get("max_gen_toks", 256)),
                stop=[*gen.get("until", []), eos],
                temperature=float(gen.get("temperature", 0.0)),
                top_p=float(gen.get("top_p", 1.0)),
                seed=gen.get("seed"),
            )
            first = lines
        for line in first:
            prompts.append(line["prompt"])
            params.append(sp)
    return prompts, params


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="consolidated model dir (manifest <dir>.json)")
    parser.add_argument("--config", type=Path, help="a ckpteval config (tasks, sampling, engine)")
    parser.add_argument("--workdir", type=Path, help="where the demo model and outputs go")
    parser.add_argument(
        "--repeats",
        type=int,
        default=7,
        help="timed (ckpteval, bare) pairs after the first run (default 7)",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    from ckpteval.backends.vllm import VllmBackend
    from ckpteval.config import build_tasks
    from ckpteval.engine.generate import Job, run_infer

    work = args.workdir or Path(tempfile.mkdtemp(prefix="ckpteval-bench-infer-"))
    work.mkdir(parents=True, exist_ok=True)
    model = args.model or _demo_model(work)
    manifest = model.parent / f"{model.name}.json"
    work = Path(tempfile.mkdtemp(prefix="runs-", dir=work))
    config = _config(args.config)
    tasks, variants, task_variants = build_tasks(config)
    backend = VllmBackend(model, config["engine"])

    engine_seconds = [0.0]  # time ckpteval spends inside LLM.generate (engine work)

    def ckpteval_run(index: int) -> tuple[float, int, list[dict[str, Any]], Path]:
        """The whole infer step on an empty cache: (wall s, tokens, metas, output dir)."""
        run_dir = work / f"run-{index}"
        jobs = [
            Job(tasks[t], variants[v], run_dir / "gen" / t / f"{v}.jsonl")
            for t, vs in task_variants.items()
            for v in vs
        ]
        if index:
            backend.lm.model.reset_prefix_cache()
        engine_seconds[0] = 0.0
        wall = time.monotonic()
        run_infer(
            jobs,
            manifest_path=manifest,
            model_dir=model,
            run_cfg={"backend": "vllm"},
            engine_cfg=config["engine"],
            cache_dir=run_dir / "cache",
            include_paths=config.get("lm_eval", {}).get("include_paths", []),
            backend=backend,
        )
        wall = time.monotonic() - wall
        metas = [json.loads(j.meta.read_text()) for j in jobs]
        return wall, sum(m["completion_tokens"] or 0 for m in metas), metas, run_dir

    def bare_run(prompts: list[str], params: list[Any]) -> tuple[float, int]:
        llm = backend.lm.model
        llm.reset_prefix_cache()
        wall = time.monotonic()
        outputs = generate(prompts, params, use_tqdm=False)
        return (
            time.monotonic() - wall,
            sum(len(o.token_ids) for out in outputs for o in out.outputs),
        )

    # Run 0 loads the engine: its figures are what an infer job pays. Then the engine is warmed
    # and both sides run `repeats` times, alternating, from an empty (and prefix-) cache each
    # time. ckpteval's time is the whole infer step (task loading, prompts, cache, lm-eval,
    # files), not only generation. Each side's best run counts (as `timeit` does): other load on
    # the machine only ever adds time, and on a shared machine it swings wall times by several x
    # from one minute to the next.
    from vllm import SamplingParams

    _, _, first, run_dir = ckpteval_run(0)
    loads, load_s = backend.loads, backend.load_seconds
    llm = backend.lm.model
    generate = llm.generate

    def timed_generate(*a: Any, **kw: Any) -> Any:
        t0 = time.monotonic()
        try:
            return generate(*a, **kw)
        finally:
            engine_seconds[0] += time.monotonic() - t0

    llm.generate = timed_generate  # ckpteval's calls are timed; bare_run calls `generate` itself
    prompts, params = _bare_requests(
        run_dir / "gen", first, backend.lm.tokenizer.decode(backend.lm.eot_token_id)
    )
    generate(["warm up"], SamplingParams(max_tokens=8), use_tqdm=False)
    pairs = []
    for index in range(args.repeats):
        ours_s, tokens, metas, _ = ckpteval_run(index + 1)
        inside = engine_seconds[0]
        bare_s, bare_tokens = bare_run(prompts, params)
        pairs.append(
            {
                "ours_s": ours_s,
                "engine_s": inside,
                "bare_s": bare_s,
                "tokens": tokens,
                "bare_tokens": bare_tokens,
                "ratio": (tokens / ours_s) / (bare_tokens / bare_s),
            }
        )
    samples = sum(m["n_samples"] for m in metas)
    cells = ", ".join(f"{m['task']}/{m['variant']}" for m in metas)
    print(f"model: {model}")
    print(
        f"tasks x variants: {len(metas)} files, {len(prompts)} prompts, {samples} samples ({cells})"
    )
    print(
        f"first infer job: engine loads {loads}, load {load_s:.1f} s, generation "
        f"{sum(m['generation_seconds'] for m in first):.1f} s, "
        f"{sum(m['completion_tokens'] or 0 for m in first)} completion tokens"
    )
    for i, pair in enumerate(pairs, start=1):
        print(
            f"pair {i}: ckpteval {pair['ours_s']:.2f} s ({pair['engine_s']:.2f} s in the engine), "
            f"{pair['tokens']} tokens, {pair['tokens'] / pair['ours_s']:.1f} tokens/s | bare "
            f"LLM.generate {pair['bare_s']:.2f} s, {pair['bare_tokens']} tokens, "
            f"{pair['bare_tokens'] / pair['bare_s']:.1f} tokens/s | ratio {pair['ratio']:.1%}"
        )
    overhead = statistics.median((p["ours_s"] - p["engine_s"]) / p["ours_s"] for p in pairs)
    best = min(pairs, key=lambda p: p["ours_s"])
    best_bare = min(pairs, key=lambda p: p["bare_s"])
    ours = best["tokens"] / best["ours_s"]
    bare = best_bare["bare_tokens"] / best_bare["bare_s"]
    print(f"ckpteval time outside the engine (median of runs): {overhead:.1%}")
    print(
        f"best runs: ckpteval {best['ours_s']:.2f} s, {ours:.1f} tokens/s (engine loads "
        f"{loads}, load {load_s:.1f} s in the first job) | bare {best_bare['bare_s']:.2f} s, "
        f"{bare:.1f} tokens/s"
    )
    ratio = ours / bare
    print(f"ckpteval / bare throughput (best of {len(pairs)} each): {ratio:.1%} (target >= 90%)")
    return 0 if ratio >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
