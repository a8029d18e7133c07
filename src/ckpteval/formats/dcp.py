"""torch.distributed.checkpoint (DCP) directories, as FSDP2 and torchtitan write them.

A DCP directory holds one `__{rank}_{n}.distcp` file per writer and a `.metadata` file that the
coordinator writes last, after every rank has finished: `.metadata` is the completion marker. It
maps each fully qualified name (`model.model.layers.0...`, `optim.state...`) to the chunks that
make up the tensor. torch reads such a directory back in one process without a process group, so a
checkpoint written by N GPUs is consolidated on one CPU, one tensor at a time. Which entries are
the model and how their prefixes map to Hugging Face names is decided by `consolidate`, the same
way for every format; optimizer state is simply never read.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ckpteval.formats.base import (
    CheckpointFormat,
    SourceCheckpoint,
    TensorRef,
    checkpoint_error,
    nonempty_file,
)

if TYPE_CHECKING:
    import torch

METADATA = ".metadata"


def detect(path: Path) -> bool:
    """A directory with `.metadata` or `*.distcp` files (the latter: maybe still being written)."""
    return path.is_dir() and ((path / METADATA).exists() or any(path.glob("*.distcp")))


def is_complete(path: Path) -> bool:
    """`.metadata` is written by the coordinator after all ranks have written their files."""
    return nonempty_file(path / METADATA)


def _loader(
    path: Path, fqn: str, shape: tuple[int, ...], dtype: torch.dtype
) -> Callable[[], torch.Tensor]:
    def read() -> torch.Tensor:
        import torch
        import torch.distributed.checkpoint as dcp

        tensor = torch.empty(shape, dtype=dtype)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            dcp.load({fqn: tensor}, storage_reader=dcp.FileSystemReader(str(path)), no_dist=True)
        return tensor

    return read


def open_checkpoint(path: Path, base_model: Path | None, dtype: str) -> SourceCheckpoint:
    """List the tensors in `.metadata`; check that every file it refers to is there in full."""
    import pickle

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if not (path / METADATA).is_file():
        raise checkpoint_error(
            path, path / METADATA, "missing: the checkpoint is incomplete (still being written?)"
        )
    try:
        metadata = FileSystemReader(str(path)).read_metadata()
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as exc:
        raise checkpoint_error(path, path / METADATA, f"unreadable DCP metadata ({exc})") from None
    needed: dict[str, int] = {}
    file_of: dict[str, str] = {}
    for index, info in metadata.storage_data.items():
        needed[info.relative_path] = max(
            needed.get(info.relative_path, 0), info.offset + info.length
        )
        file_of.setdefault(index.fqn, info.relative_path)
    for name, end in sorted(needed.items()):
        file = path / name
        if not file.exists():
            raise checkpoint_error(path, file, f"missing (named in {METADATA})")
        size = file.stat().st_size
        if size < end:
            raise checkpoint_error(
                path, file, f"truncated: {METADATA} needs {end} bytes, file has {size}"
            )
    tensors: dict[str, TensorRef] = {}
    non_tensors = 0
    for fqn, item in metadata.state_dict_metadata.items():
        if not isinstance(item, TensorStorageMetadata):
            non_tensors += 1
            continue
        shape = tuple(int(d) for d in item.size)
        tensors[fqn] = TensorRef(
            name=fqn,
            shape=shape,
            dtype=item.properties.dtype,
            file=path / file_of.get(fqn, METADATA),
            read=_loader(path, fqn, shape, item.properties.dtype),
        )
    return SourceCheckpoint(
        path=path, tensors=tensors, label=METADATA, meta_dir=path, non_tensors=non_tensors
    )


FORMAT = CheckpointFormat(
    name="dcp",
    description="torch.distributed.checkpoint directory (.metadata + __N_M.distcp), e.g. FSDP2",
    markers=METADATA,
    detect=detect,
    is_complete=is_complete,
    open=open_checkpoint,
)
