"""What a checkpoint format hands to `consolidate`: its tensors, read lazily, and its side files.

A format module knows how to recognise its files, whether a trainer has finished writing them, and
how to enumerate the tensors inside without loading them. Everything that is the same for every
format (mapping names onto the architecture, verification, dtype casts, writing safetensors,
hashing, the smoke generation) lives in `ckpteval.consolidate`, so adding a format is one module
that builds a `CheckpointFormat` plus one line in `ckpteval.formats.FORMATS`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ckpteval.errors import UserError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TensorRef:
    """One tensor of a checkpoint, not yet loaded.

    `read()` returns it as a CPU tensor. `byte_range` is set when the tensor is stored raw
    (little-endian, contiguous) at `[start, end)` of `file`, as in safetensors: then it can be
    streamed in chunks, and the whole file can be linked instead of rewritten.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    file: Path
    read: Callable[[], torch.Tensor]
    byte_range: tuple[int, int] | None = None

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass
class SourceCheckpoint:
    """A checkpoint opened by its format.

    `tensors` holds every tensor entry under its name in the checkpoint (non-tensor entries such as
    optimizer hyper-parameters are left out and counted in `non_tensors`). `meta_dir` is where the
    checkpoint's own config.json and tokenizer files would be (None: only `base_model` has them).
    `base_dir` is the model the checkpoint is a delta on, when the format resolved one (a LoRA
    adapter's base): config.json always comes from it, tokenizer files when the checkpoint lacks
    them. `label` names the file that lists the tensors, for error messages. `notes` tell the
    manifest what was fixed or merged.
    """

    path: Path
    tensors: dict[str, TensorRef]
    label: str
    meta_dir: Path | None
    base_dir: Path | None = None
    non_tensors: int = 0
    notes: list[str] = field(default_factory=list)


def own_dir(path: Path) -> Path | None:
    """The usual `side_dir`: the checkpoint's own directory (None for a single file)."""
    return path if path.is_dir() else None


@dataclass(frozen=True)
class CheckpointFormat:
    """A registered checkpoint format.

    `detect(path)` says whether `path` is in this format (including a copy still being written);
    `is_complete(path)` whether the writer has finished (its completion marker); `open(path,
    base_model, dtype)` enumerates the tensors; `dtype` is the output dtype, for formats that must
    materialise a model (a LoRA merge). `markers` describes the completion marker for users.
    `side_dir(path)` is where the checkpoint keeps its own config.json and tokenizer files (its
    `SourceCheckpoint.meta_dir`), found from names alone: `open` uses it, and so does the parse,
    which must know the chat template consolidation will copy without opening anything.
    """

    name: str
    description: str
    markers: str
    detect: Callable[[Path], bool]
    is_complete: Callable[[Path], bool]
    open: Callable[[Path, Path | None, str], SourceCheckpoint]
    side_dir: Callable[[Path], Path | None] = own_dir


def in_memory(tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A `TensorRef.read` for a tensor already loaded (or memory-mapped)."""
    return lambda: tensor.detach()


def checkpoint_error(source: Path, file: Path | str | None, problem: str) -> UserError:
    """The one-line error every format raises: `checkpoint: file: problem`."""
    where = str(source)
    if file is not None:
        file = Path(file)
        try:
            shown = file.relative_to(source) if file != source else None
        except ValueError:
            shown = file
        if shown is not None:
            where = f"{where}: {shown}"
    return UserError(f"{where}: {problem}")


def nonempty_file(path: Path) -> bool:
    """A regular file with at least one byte (a trainer's placeholder is not a checkpoint)."""
    try:
        return path.is_file() and os.path.getsize(path) > 0
    except OSError:
        return False
