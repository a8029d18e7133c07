"""An engine job's settings are built once (ckpteval.engine.job.EngineSettings): numerics from
its cells' identities, never from the config; the rest from runtime knobs; GPUs from both."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from ckpteval.engine.gpus import engine_gpus
from ckpteval.engine.job import EngineSettings

KNOBS = {"gpu_memory_utilization": 0.3, "enforce_eager": True, "chunk_size": 64}


def _smk(engine: dict, attempt: int | None = None) -> SimpleNamespace:
    resources = {} if attempt is None else {"infer_attempt": attempt}
    return SimpleNamespace(config={"engine": engine}, resources=resources)


def test_numerics_come_from_the_identity_never_from_the_config() -> None:
    """The config says max_model_len 4096 and dtype float16, the cells' identities 512 and
    bfloat16: the engine gets the identities' (a key the job's identity lacks cannot change
    its output)."""
    config = {**KNOBS, "max_model_len": 4096, "dtype": "float16", "allow_tensor_parallel": False}
    job = SimpleNamespace(numerics={"max_model_len": 512, "dtype": "bfloat16"})
    settings = EngineSettings.of_job(_smk(config, attempt=2), job)
    assert settings.as_dict() == {
        **KNOBS,
        "allow_tensor_parallel": False,
        "max_model_len": 512,
        "dtype": "bfloat16",
    }
    assert settings.attempt == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.chunk_size = 1  # type: ignore[misc]


def test_gpus_need_both_the_identity_and_the_safety_switch() -> None:
    tp2 = SimpleNamespace(numerics={"tensor_parallel_size": 2})
    on = EngineSettings.of_job(_smk({**KNOBS, "allow_tensor_parallel": True}), tp2)
    off = EngineSettings.of_job(_smk({**KNOBS, "allow_tensor_parallel": False}), tp2)
    assert (engine_gpus(on.as_dict()), engine_gpus(off.as_dict())) == (2, 1)
    assert on.attempt == 1  # no attempt given: the first


def test_a_setting_the_model_cannot_take_is_one_line_naming_the_config_key(
    demo_dir: Path, tmp_path: Path
) -> None:
    """vLLM's own config check (a pydantic ValidationError whose first line, all a job's log
    kept, says only "1 validation error for ModelConfig"): ckpteval's line gives the reason and
    the key to change. Real vLLM, no engine: the check runs before any weight is read."""
    import json
    import shutil

    from vllm.config import ModelConfig

    from ckpteval.backends.vllm import settings_refusal

    for f in (demo_dir / "base").iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, tmp_path / f.name)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    with pytest.raises(Exception) as refused:
        ModelConfig(model=str(tmp_path), max_model_len=4096)
    line = settings_refusal(refused.value)
    assert line is not None and "\n" not in line, line
    assert "max_model_len (4096)" in line and "64" in line and "engine.max_model_len" in line
    assert settings_refusal(RuntimeError("CUDA error")) is None
