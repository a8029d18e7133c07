"""LoRA adapters (`adapter_config.json` + `adapter_model.safetensors`), merged into their base.

The merge is peft's own (`PeftModel.from_pretrained(...).merge_and_unload()`), so whatever peft
supports (ranks, alphas, rsLoRA, DoRA, `modules_to_save`) is merged as peft would. The base model
is the run's `base_model` (a Hugging Face directory) or, when that is not set, the adapter's
`base_model_name_or_path` if it is an existing local directory; the hub is never consulted.
The base is loaded in the output dtype, so the merge needs memory for one copy of the model.
peft only warns when an adapter's tensors do not fit the base model (the adapter then silently
does nothing); here that is an error.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from ckpteval.errors import UserError
from ckpteval.formats.base import (
    CheckpointFormat,
    SourceCheckpoint,
    TensorRef,
    checkpoint_error,
    in_memory,
    nonempty_file,
)
from ckpteval.formats.safetensors_io import read_header

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"


def detect(path: Path) -> bool:
    """A directory with `adapter_config.json` or `adapter_model.safetensors`."""
    return path.is_dir() and ((path / CONFIG).exists() or (path / WEIGHTS).exists())


def is_complete(path: Path) -> bool:
    """peft writes the weights, then `adapter_config.json`: both there, the weights in full."""
    if not (nonempty_file(path / CONFIG) and (path / WEIGHTS).exists()):
        return False
    try:
        read_header(path / WEIGHTS, path)
    except UserError:
        return False
    return True


def _base_model(path: Path, base_model: Path | None) -> Path:
    from ckpteval.io import read_json

    named = read_json(path / CONFIG).get("base_model_name_or_path")
    if base_model is None and named and Path(named).is_absolute() and Path(named).is_dir():
        base_model = Path(named)
    if base_model is None:
        hint = f" ({CONFIG} names {named!r}, not a local directory)" if named else ""
        raise checkpoint_error(
            path,
            path / CONFIG,
            f"LoRA adapter without a base model: set base_model for this run{hint}",
        )
    if not (base_model / "config.json").is_file():
        raise checkpoint_error(
            path,
            path / CONFIG,
            f"base model {base_model} is not a Hugging Face directory (no config.json)",
        )
    return base_model


def open_checkpoint(path: Path, base_model: Path | None, dtype: str) -> SourceCheckpoint:
    """Merge the adapter into the base model in memory; the merged state dict is the checkpoint."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = _base_model(path, base_model)
    read_header(path / WEIGHTS, path)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, dtype))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            peft_model = PeftModel.from_pretrained(model, str(path))
        except (ValueError, RuntimeError, KeyError) as exc:
            # torch's load_state_dict puts the useful part ("size mismatch for ...") on line 2.
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            reason = " ".join(lines[:2])[:300] or type(exc).__name__
            raise checkpoint_error(
                path, path / WEIGHTS, f"does not fit base model {base}: {reason}"
            ) from None
    for warning in caught:
        if "missing adapter keys" in str(warning.message):
            raise checkpoint_error(
                path,
                path / WEIGHTS,
                f"does not fit base model {base}: {str(warning.message)[:300]}",
            )
    tensors, folded = fold(peft_model, path / WEIGHTS)
    notes = [f"merged {folded} into {base}"]
    return SourceCheckpoint(
        path=path, tensors=tensors, label=WEIGHTS, meta_dir=path, base_dir=base, notes=notes
    )


def fold(peft_model: Any, file: Path) -> tuple[dict[str, TensorRef], str]:
    """peft's `merge_and_unload` (W + scale * B @ A per adapted layer, in the base weight's
    dtype), the merged state dict as a checkpoint's tensors, and what was merged, for the notes.
    The one fold every format that holds an adapter uses (`lora`, verl's LoRA actors)."""
    config = peft_model.peft_config["default"]
    folded = (
        f"{getattr(config.peft_type, 'value', config.peft_type)} adapter "
        f"(r={getattr(config, 'r', '?')}, alpha={getattr(config, 'lora_alpha', '?')})"
    )
    merged = peft_model.merge_and_unload()
    tensors = {
        name: TensorRef(
            name=name, shape=tuple(value.shape), dtype=value.dtype, file=file, read=in_memory(value)
        )
        for name, value in merged.state_dict().items()
    }
    return tensors, folded


FORMAT = CheckpointFormat(
    name="lora",
    description="LoRA adapter (adapter_config.json + adapter_model.safetensors), merged with peft",
    markers=f"{CONFIG} and a complete {WEIGHTS}",
    detect=detect,
    is_complete=is_complete,
    open=open_checkpoint,
)
