"""Plain `torch.save` state dicts: `pytorch_model.bin` (optionally sharded with an index), `*.pt`.

The checkpoint may be a directory or the file itself. Nested dicts (`{"model": ..., "optimizer":
..., "step": 3}`) are flattened to dotted names; which subtree is the model is decided by
`consolidate` from the architecture. Files are loaded with `weights_only=True` (no arbitrary
unpickling) and memory-mapped, so tensors are paged in as they are written out.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ckpteval.formats.base import (
    CheckpointFormat,
    SourceCheckpoint,
    TensorRef,
    checkpoint_error,
    in_memory,
    nonempty_file,
)

SUFFIXES = (".bin", ".pt", ".pth")
SINGLE_NAME = "pytorch_model.bin"
INDEX_NAME = "pytorch_model.bin.index.json"
# What trainers save beside the model and which is never the model.
NOT_MODEL = ("optimizer", "scheduler", "scaler", "rng_state", "training_args", "lr_scheduler")


def _candidates(path: Path) -> list[Path]:
    """The model file(s) `path` offers: itself, the index, `pytorch_model.bin`, or `*.pt` files."""
    if path.is_file():
        return [path] if path.suffix in SUFFIXES else []
    if not path.is_dir():
        return []
    for name in (INDEX_NAME, SINGLE_NAME):
        if (path / name).exists():
            return [path / name]
    return sorted(
        p
        for p in path.iterdir()
        if p.suffix in SUFFIXES and p.is_file() and not p.name.startswith(NOT_MODEL)
    )


def detect(path: Path) -> bool:
    """`pytorch_model.bin`, its index, or one `*.pt`/`*.pth`/`*.bin` model file (or that file)."""
    return bool(_candidates(path))


def _index_shards(path: Path) -> list[Path] | None:
    try:
        weight_map = json.loads((path / INDEX_NAME).read_text())["weight_map"]
        return [path / n for n in sorted(set(weight_map.values()))]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def complete_zip(path: Path) -> bool:
    """A zip-format save is complete once its end-of-central-directory record is written."""
    if not nonempty_file(path):
        return False
    with open(path, "rb") as handle:
        if handle.read(4) != b"PK\x03\x04":
            return True  # the legacy (pre-1.6) format has no end marker to check
    return zipfile.is_zipfile(path)


def is_complete(path: Path) -> bool:
    """Every model file present and, for zip-format saves, with its end record written."""
    if path.is_dir() and (path / INDEX_NAME).exists():
        shards = _index_shards(path)
        return shards is not None and all(complete_zip(s) for s in shards)
    files = _candidates(path)
    return len(files) == 1 and complete_zip(files[0])


def _model_files(path: Path) -> tuple[list[Path], str]:
    if path.is_dir() and (path / INDEX_NAME).exists():
        shards = _index_shards(path)
        if shards is None:
            raise checkpoint_error(path, path / INDEX_NAME, "not a valid index (no weight_map)")
        for shard in shards:
            if not shard.exists():
                raise checkpoint_error(
                    path, path / INDEX_NAME, f"names {shard.name}, which does not exist"
                )
        return shards, INDEX_NAME
    files = _candidates(path)
    if len(files) != 1:
        names = ", ".join(f.name for f in files)
        raise checkpoint_error(
            path, None, f"{len(files)} candidate model files ({names}): point the run at one file"
        )
    return files, files[0].name


def _flatten(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _flatten(value, f"{prefix}{key}.")
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _flatten(value, f"{prefix}{i}.")
    else:
        yield prefix[:-1], obj


def _load(file: Path, source: Path) -> Any:
    import pickle

    import torch

    try:
        try:
            return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise checkpoint_error(
            source,
            file,
            f"holds Python objects other than tensors, which ckpteval does not unpickle "
            f"(weights_only): save the state dict alone ({first})",
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise checkpoint_error(
            source, file, f"unreadable torch.save file, truncated? ({first})"
        ) from None


def open_checkpoint(path: Path, base_model: Path | None, dtype: str) -> SourceCheckpoint:
    """Load (memory-mapped) every model file and list its tensors under their flattened names."""
    import torch

    files, label = _model_files(path)
    tensors: dict[str, TensorRef] = {}
    non_tensors = 0
    for file in files:
        for name, value in _flatten(_load(file, path)):
            if not isinstance(value, torch.Tensor):
                non_tensors += 1
                continue
            if name in tensors:
                raise checkpoint_error(
                    path, file, f"tensor {name} is also in {tensors[name].file.name}"
                )
            tensors[name] = TensorRef(
                name=name,
                shape=tuple(value.shape),
                dtype=value.dtype,
                file=file,
                read=in_memory(value),
            )
    return SourceCheckpoint(
        path=path,
        tensors=tensors,
        label=label,
        meta_dir=path if path.is_dir() else None,
        non_tensors=non_tensors,
    )


FORMAT = CheckpointFormat(
    name="torch",
    description="torch.save state dict (pytorch_model.bin, its index, or one *.pt / *.pth file)",
    markers="a complete pytorch_model.bin (or every shard of its index) or *.pt file",
    detect=detect,
    is_complete=is_complete,
    open=open_checkpoint,
)
