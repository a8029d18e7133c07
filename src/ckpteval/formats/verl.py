"""verl checkpoints: `global_step_{N}/actor/` as verl's FSDP and Megatron checkpoint managers write.

verl (FSDP backend) saves, per rank R of a world of W, `torch.save(model.state_dict())` as
`actor/model_world_size_{W}_rank_{R}.pt`: each tensor a DTensor (FSDP2, and FSDP1 given a
device mesh, as verl's workers always do) holding the rank's piece and its placement. Beside them
sit `optim_*`/`extra_state_*` files (never read here), `fsdp_config.json` (`world_size`) and
`huggingface/` (config.json, tokenizer, chat template, generation config). The trainer writes
`latest_checkpointed_iteration.txt` beside `global_step_{N}/` after every rank has finished.

The merge rule is verl's own (`verl/model_merger/fsdp_model_merger.py`): a tensor sharded as
`Shard(d)` along the FSDP mesh dimension is the concatenation of the ranks' pieces along `d` in
rank order; a `Replicate` dimension (HSDP's `ddp`) is taken from its first coordinate; a plain
tensor is concatenated along dim 0. It is applied lazily, one tensor at a time, from the rank
files loaded memory-mapped with `weights_only=True` (DTensor and its mesh are allowed types).

Shards of a LoRA actor (peft's `lora_A`/`lora_B` names) have the adapter folded in by
`verl_lora`, with the scale from `actor/lora_train_meta.json`.

verl's Megatron backend (`actor/dist_ckpt/`) is recognised and refused with the command that
merges it: no test here can build one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpteval.formats import verl_lora
from ckpteval.formats.base import (
    CheckpointFormat,
    SourceCheckpoint,
    TensorRef,
    checkpoint_error,
    nonempty_file,
)
from ckpteval.formats.torch_save import complete_zip

if TYPE_CHECKING:
    import torch

ACTOR = "actor"
FSDP_CONFIG = "fsdp_config.json"
HF_DIR = "huggingface"
MEGATRON_DIR = "dist_ckpt"
TRACKER = "latest_checkpointed_iteration.txt"
SHARD_RE = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt\Z")
STEP_RE = re.compile(r"global_step_(\d+)\Z")


def actor_dir(path: Path) -> Path | None:
    """The `actor/` directory of a `global_step_N/` directory, or `path` when it is one."""
    for candidate in (path / ACTOR, path):
        if candidate.is_dir() and (
            (candidate / FSDP_CONFIG).exists()
            or (candidate / MEGATRON_DIR).is_dir()
            or any(SHARD_RE.match(p.name) for p in candidate.glob("model_world_size_*.pt"))
        ):
            return candidate
    return None


def hf_dir(path: Path) -> Path | None:
    """The format's `side_dir`: `actor/huggingface/`, where verl keeps config.json, the tokenizer
    and its chat template (None when it has none)."""
    actor = actor_dir(path)
    meta = actor / HF_DIR if actor is not None else None
    return meta if meta is not None and meta.is_dir() else None


def model_file(path: Path, file: Path) -> bool:
    """Whether `file` (under checkpoint `path`) is one consolidation reads: a model rank shard,
    `fsdp_config.json`, `lora_train_meta.json` or a file of `huggingface/` (Megatron:
    `dist_ckpt/` too)."""
    actor = actor_dir(path)
    if actor is None:
        return True
    try:
        rel = file.relative_to(actor).parts
    except ValueError:
        return False
    return bool(rel) and (
        rel[0] in (FSDP_CONFIG, HF_DIR, MEGATRON_DIR, verl_lora.LORA_META)
        or SHARD_RE.match(rel[0]) is not None
    )


def detect(path: Path) -> bool:
    """`global_step_N/` (or its `actor/`) with rank shards, `fsdp_config.json` or `dist_ckpt/`."""
    return path.is_dir() and actor_dir(path) is not None


def is_megatron(actor: Path) -> bool:
    return (actor / MEGATRON_DIR).is_dir() and not any(actor.glob("model_world_size_*.pt"))


def _shard_files(actor: Path) -> dict[int, dict[int, Path]]:
    """world size -> rank -> file, for every `model_world_size_W_rank_R.pt` present."""
    out: dict[int, dict[int, Path]] = {}
    for file in actor.glob("model_world_size_*.pt"):
        if m := SHARD_RE.match(file.name):
            out.setdefault(int(m.group(1)), {})[int(m.group(2))] = file
    return out


def world_size(actor: Path) -> int | None:
    """`fsdp_config.json`'s world size, else the one world size the shard names give."""
    try:
        return int(json.loads((actor / FSDP_CONFIG).read_text(encoding="utf-8"))["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        sizes = list(_shard_files(actor))
        return sizes[0] if len(sizes) == 1 else None


def tracked_step(path: Path, actor: Path) -> tuple[int | None, int | None]:
    """(this checkpoint's step from `global_step_N`, the tracker's latest step), None if unknown."""
    step_dir = path if actor != path else path.parent if path.name == ACTOR else path
    match = STEP_RE.match(step_dir.name)
    try:
        latest = int((step_dir.parent / TRACKER).read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        latest = None
    return (int(match.group(1)) if match else None), latest


def pending_shards(path: Path) -> tuple[int, int, list[str]]:
    """(shards written completely, shards expected, names still missing or partly written)."""
    actor = actor_dir(path)
    if actor is None or is_megatron(actor):
        return 0, 0, []
    size = world_size(actor)
    files = _shard_files(actor).get(size or 0, {})
    expected = size or len(files)
    pending = [
        f"model_world_size_{size}_rank_{r}.pt"
        for r in range(expected)
        if r not in files or not complete_zip(files[r])
    ]
    return expected - len(pending), expected, pending


def pending_marker(path: Path) -> str:
    """What a verl checkpoint whose shards are all written still waits for, or ""."""
    actor = actor_dir(path)
    if actor is None:
        return ""
    step, latest = tracked_step(path, actor)
    if not is_megatron(actor) and not nonempty_file(actor / FSDP_CONFIG):
        return f"{FSDP_CONFIG} not there yet"
    if step is not None and latest is not None and step > latest:
        return f"{TRACKER} still says step {latest}"
    return ""


def is_complete(path: Path) -> bool:
    """Every rank's shard written to its end record and `fsdp_config.json` there (Megatron:
    `dist_ckpt/.metadata`); and, when `latest_checkpointed_iteration.txt` sits beside
    `global_step_N/`, N is not past it (the trainer writes it once every rank has finished)."""
    actor = actor_dir(path)
    if actor is None:
        return False
    step, latest = tracked_step(path, actor)
    if step is not None and latest is not None and step > latest:
        return False
    if is_megatron(actor):
        return nonempty_file(actor / MEGATRON_DIR / ".metadata")
    done, expected, _ = pending_shards(path)
    return nonempty_file(actor / FSDP_CONFIG) and expected > 0 and done == expected


def megatron_refusal(path: Path) -> str:
    actor = actor_dir(path) or path
    return (
        f"verl Megatron checkpoint ({actor.name}/{MEGATRON_DIR}): ckpteval does not consolidate "
        f"it; merge it with `python -m verl.model_merger merge --backend megatron --local_dir "
        f"{actor} --target_dir <dir>` and point a run at <dir>"
    )


def _load_rank(file: Path, source: Path) -> dict[str, Any]:
    import logging
    import pickle
    import zipfile

    import torch
    import torch.distributed.tensor  # noqa: F401 - registers DTensor for weights_only loads

    # Unpickling a DeviceMesh without process groups warns about torch.compile: irrelevant here.
    mesh_log = logging.getLogger("torch.distributed.device_mesh")
    level = mesh_log.level
    mesh_log.setLevel(logging.ERROR)
    try:
        return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0]
        raise checkpoint_error(
            source,
            file,
            f"holds objects other than tensors and DTensors, which ckpteval does not unpickle "
            f"(weights_only; an FSDP1 ShardedTensor save is one): {first}",
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise checkpoint_error(
            source, file, f"unreadable rank shard, truncated? ({first})"
        ) from None
    finally:
        mesh_log.setLevel(level)


def _rank_order(value: Any, rank: int) -> tuple[int, int | None] | None:
    """For a rank's DTensor: (its position along the sharded mesh dimension, the tensor dim it
    shards), or None when the rank's piece is a replica verl leaves out (a `Replicate` mesh
    dimension at a coordinate other than 0). A plain tensor: (rank, 0), concatenated on dim 0."""
    from torch.distributed.tensor import DTensor

    if not isinstance(value, DTensor):
        return rank, 0
    coords = (value.device_mesh.mesh == rank).nonzero()
    coord = [int(c) for c in coords[0]] if len(coords) else [rank]
    position, dim = 0, None
    for i, placement in enumerate(value.placements):
        if placement.is_shard():
            if dim is not None:
                raise ValueError("sharded along two mesh dimensions (FSDP + TP)")
            position, dim = coord[i], placement.dim
        elif placement.is_replicate():
            if coord[i] != 0:
                return None
        else:
            raise ValueError(f"placement {placement} (partial sums)")
    return position, dim


def _merge(pieces: list[tuple[int, int | None, torch.Tensor]]) -> Callable[[], torch.Tensor]:
    def read() -> torch.Tensor:
        import torch

        ordered = sorted(pieces, key=lambda p: p[0])
        dim = ordered[0][1]
        if dim is None:
            return ordered[0][2]
        return torch.cat([p[2] for p in ordered], dim=dim).contiguous()

    return read


def _collect(
    path: Path, states: dict[int, dict[str, Any]], files: dict[int, Path]
) -> tuple[dict[str, TensorRef], int]:
    import torch
    from torch.distributed.tensor import DTensor

    tensors: dict[str, TensorRef] = {}
    non_tensors = 0
    first = states[0]
    for key, value in first.items():
        if not isinstance(value, torch.Tensor):
            non_tensors += 1
            continue
        pieces = []
        for rank, state in states.items():
            if key not in state:
                raise checkpoint_error(path, files[rank], f"has no tensor {key} (rank 0's has)")
            try:
                order = _rank_order(state[key], rank)
            except ValueError as exc:
                raise checkpoint_error(
                    path, files[rank], f"tensor {key}: {exc}: not an FSDP shard ckpteval merges"
                ) from None
            if order is not None:
                local = state[key]
                local = local._local_tensor if isinstance(local, DTensor) else local
                pieces.append((order[0], order[1], local))
        shape = tuple(value.shape) if isinstance(value, DTensor) else None
        if shape is None:
            shape = (sum(p[2].shape[0] for p in pieces), *tuple(value.shape[1:]))
        _check_pieces(path, files[0], key, pieces, shape)
        local0 = pieces[0][2]
        tensors[key] = TensorRef(key, shape, local0.dtype, files[0], _merge(pieces))
    return tensors, non_tensors


def _check_pieces(
    path: Path, file: Path, key: str, pieces: list[Any], shape: tuple[int, ...]
) -> None:
    """The pieces, concatenated, make the tensor's global shape: a missing rank or a mixed-up
    shard is an error, never a silently smaller tensor."""
    dim = pieces[0][1]
    if dim is None:
        got = tuple(pieces[0][2].shape)
    else:
        sizes = [tuple(p[2].shape) for p in pieces]
        got = list(sizes[0])
        got[dim] = sum(s[dim] for s in sizes)
        got = tuple(got)
    if got != tuple(shape):
        raise checkpoint_error(
            path, file, f"tensor {key}: rank pieces make {list(got)}, not its shape {list(shape)}"
        )


def open_checkpoint(path: Path, base_model: Path | None, dtype: str) -> SourceCheckpoint:
    """Check every rank's shard is there in full, load them memory-mapped, list merged tensors."""
    actor = actor_dir(path)
    if actor is None:
        raise checkpoint_error(path, None, "not a verl checkpoint (no actor/ with rank shards)")
    if is_megatron(actor):
        raise checkpoint_error(path, None, megatron_refusal(path))
    size = world_size(actor)
    if size is None:
        raise checkpoint_error(
            path, actor / FSDP_CONFIG, "missing, and the shard names give no single world size"
        )
    files = _shard_files(actor).get(size, {})
    for rank in range(size):
        name = f"model_world_size_{size}_rank_{rank}.pt"
        if rank not in files:
            raise checkpoint_error(
                path, actor / name, f"missing (world size {size}): copy every rank's shard"
            )
        if not complete_zip(files[rank]):
            raise checkpoint_error(
                path, files[rank], "truncated (no zip end record): still being written?"
            )
    states = {rank: _load_rank(files[rank], path) for rank in range(size)}
    tensors, non_tensors = _collect(path, states, files)
    source = SourceCheckpoint(
        path=path,
        tensors=tensors,
        label=files[0].name,
        meta_dir=hf_dir(path),
        non_tensors=non_tensors,
        notes=[f"merged {size} verl FSDP rank shards ({actor.name}/model_world_size_{size}_*)"],
    )
    if verl_lora.has_lora(list(tensors)):
        return verl_lora.open_lora(path, actor, source, base_model, dtype)
    return source


FORMAT = CheckpointFormat(
    name="verl",
    description=(
        "verl global_step_N/actor/ (FSDP rank shards model_world_size_W_rank_R.pt; "
        "Megatron dist_ckpt/ is refused)"
    ),
    markers=f"every model_world_size_W_rank_R.pt complete, {FSDP_CONFIG}, and {TRACKER} >= N",
    detect=detect,
    is_complete=is_complete,
    open=open_checkpoint,
    side_dir=hf_dir,
)
