"""The registry of checkpoint formats a training run can write.

Each format is one module that builds a `CheckpointFormat` (detect, is_complete, open); `FORMATS`
lists them in detection order, most specific first (a LoRA adapter directory may also hold
safetensors; an HF directory may also hold `*.pt` trainer state). Adding a format is one new
module plus one entry here.

Detection and completeness checks import neither torch nor transformers: checkpoint discovery
calls them for every directory when the workflow is parsed.
"""

from __future__ import annotations

from pathlib import Path

from ckpteval.errors import UserError
from ckpteval.formats import dcp, deepspeed, hf, lora, torch_save, verl
from ckpteval.formats.base import (
    CheckpointFormat,
    SourceCheckpoint,
    TensorRef,
    checkpoint_error,
    own_dir,
)

FORMATS: dict[str, CheckpointFormat] = {
    fmt.name: fmt
    for fmt in (
        lora.FORMAT,
        verl.FORMAT,
        deepspeed.FORMAT,
        dcp.FORMAT,
        hf.FORMAT,
        torch_save.FORMAT,
    )
}

__all__ = [
    "FORMATS",
    "CheckpointFormat",
    "SourceCheckpoint",
    "TensorRef",
    "detect_format",
    "get_format",
    "is_complete",
    "side_dir",
]


def get_format(name: str) -> CheckpointFormat:
    """The format registered as `name`; an unknown name is a `UserError` listing the known ones."""
    try:
        return FORMATS[name]
    except KeyError:
        raise UserError(
            f"unknown checkpoint format {name!r}: use one of auto, {', '.join(FORMATS)}"
        ) from None


def _detect(path: Path) -> CheckpointFormat | None:
    return next((fmt for fmt in FORMATS.values() if fmt.detect(path)), None)


def detect_format(path: str | Path) -> str:
    """The name of the format `path` is written in; a `UserError` when none matches."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: checkpoint not found")
    fmt = _detect(path)
    if fmt is None:
        known = "; ".join(f"{f.name}: {f.description}" for f in FORMATS.values())
        raise checkpoint_error(
            path, None, f"unknown checkpoint format (expected one of {known}); set the run's format"
        )
    return fmt.name


def is_complete(path: str | Path) -> bool:
    """Whether `path` is a checkpoint its writer has finished (False for anything unrecognised)."""
    path = Path(path)
    fmt = _detect(path)
    return fmt is not None and fmt.is_complete(path)


def side_dir(path: str | Path, fmt: str | None = "auto") -> Path | None:
    """Where the checkpoint at `path` keeps its own config.json and tokenizer files, as its
    format (`fmt`, or the one detected) opens it: verl's `actor/huggingface/`, most formats' own
    directory; None when there is none (a single file, a path not there yet)."""
    path = Path(path)
    chosen = _detect(path) if fmt in ("auto", "", None) else FORMATS.get(str(fmt))
    return (chosen.side_dir if chosen is not None else own_dir)(path)
