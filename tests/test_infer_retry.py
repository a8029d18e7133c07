"""A CUDA OOM becomes one line and a retry with less memory; engine groups split a checkpoint's
tasks over several infer jobs. (A real OOM needs a GPU: the backend below raises torch's own
OutOfMemoryError where a GPU engine would.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_snakemake, write_config
from safetensors.numpy import save_file

from ckpteval.backends import Backend, Generation, Prompt, SamplingSpec
from ckpteval.config import build_tasks, validate_config
from ckpteval.engine.generate import Job, gpu_memory_utilization, is_cuda_oom, run_infer
from ckpteval.errors import UserError
from ckpteval.io import write_json


class OutOfMemoryOnGenerate(Backend):
    """What a GPU engine does when the KV cache or activations do not fit."""

    name = "vllm"

    @property
    def identity(self) -> dict[str, Any]:
        return {"backend": "test"}

    def generate(self, prompts: list[Prompt], specs: list[SamplingSpec]) -> list[Generation]:
        import torch

        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except torch.OutOfMemoryError as exc:
            raise RuntimeError("engine step failed") from exc  # as vLLM wraps worker errors

    def harness_model(self) -> Any:
        raise AssertionError("not used")


def test_gpu_memory_utilization_is_lowered_on_each_retry() -> None:
    assert gpu_memory_utilization(0.8, 1) == 0.8
    assert gpu_memory_utilization(0.8, 2) == 0.68
    assert gpu_memory_utilization(0.8, 3) == pytest.approx(0.578)


def test_oom_is_recognised_through_wrapping_and_vllm_messages() -> None:
    import torch

    assert is_cuda_oom(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_cuda_oom(
        ValueError(
            "Free memory on device (3.1/79.2 GiB) on startup is less than "
            "desired GPU memory utilization (0.9, 71.3 GiB)."
        )
    )
    assert not is_cuda_oom(ValueError("No available memory for the cache blocks."))
    assert not is_cuda_oom(RuntimeError("something else"))


def test_oom_in_a_job_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    config = {"runs": {"r": {"path": "."}}, "tasks": {"arith": {"limit": 2}}}
    validate_config(config)
    tasks, variants, _ = build_tasks(config)
    jobs = [Job(tasks["arith"], variants["greedy-s42"], tmp_path / "arith" / "greedy-s42.jsonl")]
    write_json(tmp_path / "m.json", {"weights_sha256": "ab" * 32})
    with pytest.raises(UserError) as err:
        run_infer(
            jobs,
            manifest_path=tmp_path / "m.json",
            model_dir=tmp_path,
            run_cfg={"backend": "vllm"},
            engine_cfg=config["engine"],
            cache_dir=tmp_path / "cache",
            attempt=2,
            backend=OutOfMemoryOnGenerate(),
        )
    message = str(err.value)
    assert message.startswith(
        "CUDA out of memory with engine.gpu_memory_utilization 0.68 (attempt 2)"
    )
    assert "lower engine.gpu_memory_utilization" in message and "\n" not in message
    assert not jobs[0].out.exists()


def test_prompt_longer_than_the_context_is_one_line_before_any_engine(
    demo_dir: Path, tmp_path: Path
) -> None:
    from ckpteval.backends.vllm import VllmBackend

    config = {
        "runs": {"r": {"path": "."}},
        "tasks": {"arith": {}, "math_qwen": {"limit": 2}},
        "engine": {"max_model_len": 256},
    }
    validate_config(config)
    tasks, variants, task_variants = build_tasks(config)
    jobs = [
        Job(tasks[t], variants[v], tmp_path / t / f"{v}.jsonl")
        for t, vs in task_variants.items()
        for v in vs
    ]
    write_json(tmp_path / "m.json", {"weights_sha256": "cd" * 32})
    backend = VllmBackend(demo_dir / "base", config["engine"])
    with pytest.raises(UserError) as err:
        run_infer(
            jobs,
            manifest_path=tmp_path / "m.json",
            model_dir=demo_dir / "base",
            run_cfg={"backend": "vllm"},
            engine_cfg=config["engine"],
            cache_dir=tmp_path / "cache",
            backend=backend,
        )
    message = str(err.value)
    assert re.match(
        r"task math_qwen, problem math_qwen/0: prompt of \d+ tokens \+ max_new_tokens "
        r"512 exceeds engine.max_model_len 256; raise engine.max_model_len or lower "
        r"tasks.math_qwen.max_new_tokens",
        message,
    ), message
    assert backend.loads == 0 and not any(tmp_path.rglob("*.jsonl"))


def _fake_checkpoint(run: Path, name: str) -> None:
    d = run / name
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    save_file({"w": np.zeros(4, dtype=np.float32)}, str(d / "model.safetensors"))


def test_engine_groups_are_one_infer_job_each_with_retry_resources(tmp_path: Path) -> None:
    for step in (10, 20):
        _fake_checkpoint(tmp_path / "run", f"step_{step}")
    write_config(
        tmp_path,
        {
            "runs": {"demo": {"path": str(tmp_path / "run")}},
            "tasks": {
                "arith": {},
                "math_qwen": {},
                "pyfunc": {"engine_group": "code"},
                "rustfunc": {"engine_group": "code"},
            },
            "consolidate": {"smoke": "none"},
        },
    )
    dry = run_snakemake(tmp_path, "-n")
    assert dry.returncode == 0, dry.stderr[-3000:]
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", dry.stdout, re.M))
    assert (counts["infer"], counts["infer_code"], counts["consolidate"]) == ("2", "2", "2")
    # Each group's engine job stages its own tasks' cells; rule `generation` places each one.
    jobs = re.findall(r"rule (infer\w*|generation):\n(.*?)\n\n", dry.stdout, re.S)
    code = next(body for rule, body in jobs if rule == "infer_code")
    assert "output: results/staging/demo/step_10/code" in code or "step_20/code" in code
    placed = [
        body
        for rule, body in jobs
        if rule == "generation" and re.search(r"input: .*staging/demo/step_\d+/code", body)
    ]
    assert len(placed) == 4 and all("pyfunc/" in b or "rustfunc/" in b for b in placed)
    assert counts["generation"] == "8"
    assert (
        "logs/infer/demo/step_10.code.r1.log" in dry.stdout or "step_20.code.r1.log" in dry.stdout
    )
    assert re.search(r"resources: .*gpu=1.*infer_attempt=1", dry.stdout)
    assert counts["evaluate"] == "8"
