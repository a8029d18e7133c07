"""Format detection and completion markers: what checkpoint discovery relies on at parse time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ckpteval.errors import UserError
from ckpteval.formats import FORMATS, detect_format, is_complete
from ckpteval.formats.safetensors_io import read_header

WEIGHTS = {"a.weight": torch.ones(64, 8), "b.weight": torch.zeros(8)}


def _hf(path: Path, *, config: bool = True) -> Path:
    path.mkdir(parents=True)
    save_file(WEIGHTS, path / "model.safetensors")
    if config:
        (path / "config.json").write_text("{}")
    return path


def _chop(path: Path, nbytes: int = 100) -> None:
    os.truncate(path, path.stat().st_size - nbytes)


def test_registry_lists_every_format_in_detection_order() -> None:
    assert list(FORMATS) == ["lora", "verl", "deepspeed", "dcp", "hf", "torch"]


def test_hf_single_file(tmp_path: Path) -> None:
    done = _hf(tmp_path / "done")
    assert (detect_format(done), is_complete(done)) == ("hf", True)
    no_config = _hf(tmp_path / "no_config", config=False)
    assert (detect_format(no_config), is_complete(no_config)) == ("hf", False)
    _chop(done / "model.safetensors")
    assert (detect_format(done), is_complete(done)) == ("hf", False)


def test_hf_index_waits_for_every_shard_and_accepts_the_lone_file_layout(tmp_path: Path) -> None:
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text("{}")
    save_file({"a.weight": WEIGHTS["a.weight"]}, sharded / "model-00001-of-00002.safetensors")
    index = {
        "weight_map": {
            "a.weight": "model-00001-of-00002.safetensors",
            "b.weight": "model-00002-of-00002.safetensors",
        }
    }
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    assert (detect_format(sharded), is_complete(sharded)) == ("hf", False)
    save_file({"b.weight": WEIGHTS["b.weight"]}, sharded / "model-00002-of-00002.safetensors")
    assert is_complete(sharded)

    lone = _hf(tmp_path / "lone")
    index = {"weight_map": {name: "model-00001-of-00001.safetensors" for name in WEIGHTS}}
    (lone / "model.safetensors.index.json").write_text(json.dumps(index))
    assert (detect_format(lone), is_complete(lone)) == ("hf", True)


def test_hf_shards_without_index_need_the_full_set(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "config.json").write_text("{}")
    save_file({"a.weight": WEIGHTS["a.weight"]}, shards / "model-00001-of-00002.safetensors")
    assert (detect_format(shards), is_complete(shards)) == ("hf", False)
    save_file({"b.weight": WEIGHTS["b.weight"]}, shards / "model-00002-of-00002.safetensors")
    assert is_complete(shards)


def test_dcp_is_complete_once_metadata_is_written(tmp_path: Path) -> None:
    ckpt = tmp_path / "dcp"
    ckpt.mkdir()
    (ckpt / "__0_0.distcp").write_bytes(b"\0" * 32)
    assert (detect_format(ckpt), is_complete(ckpt)) == ("dcp", False)
    (ckpt / ".metadata").write_bytes(b"\x80\x04.")
    assert is_complete(ckpt)


def test_lora_needs_config_and_complete_weights(tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    save_file(WEIGHTS, adapter / "adapter_model.safetensors")
    assert (detect_format(adapter), is_complete(adapter)) == ("lora", False)
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    assert is_complete(adapter)
    _chop(adapter / "adapter_model.safetensors")
    assert not is_complete(adapter)


def test_torch_save_files_and_dirs(tmp_path: Path) -> None:
    ckpt = tmp_path / "bin"
    ckpt.mkdir()
    torch.save(WEIGHTS, ckpt / "pytorch_model.bin")
    (ckpt / "training_args.bin").write_bytes(b"\0")
    assert (detect_format(ckpt), is_complete(ckpt)) == ("torch", True)
    _chop(ckpt / "pytorch_model.bin", 10)
    assert not is_complete(ckpt)

    single = tmp_path / "step_3.pt"
    torch.save({"model": WEIGHTS}, single)
    assert (detect_format(single), is_complete(single)) == ("torch", True)

    trainer_state_only = tmp_path / "state"
    trainer_state_only.mkdir()
    torch.save({}, trainer_state_only / "optimizer.pt")
    assert not is_complete(trainer_state_only)
    with pytest.raises(UserError, match="unknown checkpoint format"):
        detect_format(trainer_state_only)


def test_unrecognised_or_missing_paths(tmp_path: Path) -> None:
    assert not is_complete(tmp_path)
    assert not is_complete(tmp_path / "nope")
    with pytest.raises(UserError, match="nope: checkpoint not found"):
        detect_format(tmp_path / "nope")


def test_safetensors_header_problems_are_one_line_errors(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    with pytest.raises(UserError, match=r"model.safetensors: corrupt safetensors header"):
        read_header(path, tmp_path)
    path.write_bytes(b"abc")
    with pytest.raises(
        UserError, match=r"model.safetensors: truncated shard \(3 bytes, no header\)"
    ):
        read_header(path, tmp_path)


def test_completeness_checks_do_not_import_torch(tmp_path: Path) -> None:
    """Discovery runs when the workflow is parsed, for every checkpoint dir: it must stay cheap."""
    path = str(_hf(tmp_path / "hf"))
    code = (
        "import sys\n"
        "from ckpteval.formats import detect_format, is_complete\n"
        f"assert is_complete({path!r}) and detect_format({path!r}) == 'hf'\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
