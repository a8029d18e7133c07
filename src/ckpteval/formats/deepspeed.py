"""DeepSpeed ZeRO checkpoints (OpenRLHF, DeepSpeed-Chat, any `engine.save_checkpoint`).

`engine.save_checkpoint(save_dir, tag="global_step{N}")` writes, for a data-parallel world of W
ranks (model-parallel rank 00), into `save_dir/global_step{N}/`:

- ZeRO stage 1 and 2: `mp_rank_00_model_states.pt` (rank 0: the module's state dict in the
  training dtype, the parameter names and shapes per optimizer group, buffers, shared and frozen
  parameters, `dp_world_size`), and per rank `[bf16_]zero_pp_rank_{R}_mp_rank_00_optim_states.pt`
  holding the rank's slice of every group's flat fp32 master weights (and the Adam moments);
- ZeRO stage 3: per rank `zero_pp_rank_{R}_mp_rank_00_model_states.pt` (the same metadata, the
  rank's slice of frozen parameters, no weights) and the rank's optimizer file as above;

then rank 0 writes `save_dir/latest` holding the tag. The weights are the fp32 master weights,
merged exactly as DeepSpeed's own `zero_to_fp32.py` merges them (deepspeed/utils/zero_to_fp32.py,
0.19.8): stage 1/2, each group's rank partitions concatenated in rank order and cut into
parameters in order, alignment paddings skipped; stage 3, every parameter is `ceil(numel / W)`
elements of each rank's flat space (groups concatenated), the ranks' pieces concatenated and the
padding dropped; frozen parameters from the model states (stage 3: the ranks' fragments
concatenated); buffers from rank 0's module, as float32 when floating point; shared parameters
point at their source. One parameter at a time, from files loaded memory-mapped.

The pickles name DeepSpeed classes (`LossScaler`, `ZeroStageEnum`, `fragment_address`), so
`torch.load(weights_only=True)` alone refuses them, and ckpteval never imports deepspeed: every
`deepspeed.*` global in a file is mapped to `DeepSpeedObject`, an inert stand-in that records
what it was built with and runs nothing; anything else outside torch's weights-only allowlist is
still refused. Detection and completeness read no tensor and import no torch: the world size is
read from the model states' pickle opcodes (`dp_world_size`), never by unpickling.
"""

from __future__ import annotations

import math
import pickletools
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpteval.formats.base import CheckpointFormat, SourceCheckpoint, TensorRef, checkpoint_error
from ckpteval.formats.torch_save import complete_zip

if TYPE_CHECKING:
    import torch

MODEL_RE = re.compile(r"(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt\Z")
OPTIM_RE = re.compile(r"(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt\Z")
STEP_RE = re.compile(r"global_step(\d+)\Z")
LATEST = "latest"
CONFIG_MARKERS = ("config.json", "tokenizer.json", "tokenizer_config.json")


def detect(path: Path) -> bool:
    """A directory holding DeepSpeed model-states or ZeRO optimizer-states files."""
    return path.is_dir() and any(
        MODEL_RE.match(p.name) or OPTIM_RE.match(p.name) for p in path.glob("*_states.pt")
    )


@dataclass(frozen=True)
class Layout:
    """The files of one ZeRO checkpoint: `model` by data-parallel rank (stage 1/2: rank 0 only),
    `optim` by rank; `stage3` when every rank writes model states; `mp_ranks` seen."""

    model: dict[int, Path]
    optim: dict[int, Path]
    stage3: bool
    bf16: bool
    mp_ranks: frozenset[int]


def layout(path: Path) -> Layout:
    model: dict[int, Path] = {}
    optim: dict[int, Path] = {}
    mp: set[int] = set()
    stage3 = bf16 = False
    for file in sorted(path.glob("*_states.pt")):
        if m := MODEL_RE.match(file.name):
            mp.add(int(m.group(2)))
            stage3 = stage3 or m.group(1) is not None
            if int(m.group(2)) == 0:
                model[int(m.group(1) or 0)] = file
        elif m := OPTIM_RE.match(file.name):
            mp.add(int(m.group(3)))
            bf16 = bf16 or m.group(1) is not None
            if int(m.group(3)) == 0:
                optim[int(m.group(2))] = file
    return Layout(model, optim, stage3, bf16, frozenset(mp))


def _pickle_bytes(file: Path) -> bytes | None:
    """The pickle of a zip-format `torch.save` file (tensor data aside), or None."""
    try:
        with zipfile.ZipFile(file) as archive:
            name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
            return archive.read(name)
    except (OSError, zipfile.BadZipFile, StopIteration, KeyError):
        return None


def pickled_int(file: Path, key: str) -> int | None:
    """The int stored under dict key `key` in `file`'s pickle, read from its opcodes (nothing is
    unpickled, torch is not imported): how completeness learns `dp_world_size`."""
    data = _pickle_bytes(file)
    if data is None:
        return None
    found = False
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name in ("BINPUT", "LONG_BINPUT", "MEMOIZE", "PUT"):
                continue
            if found:
                return arg if op.name in ("BININT", "BININT1", "BININT2", "INT") else None
            found = op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE") and arg == key
    except (ValueError, EOFError):
        return None
    return None


def pickle_globals(file: Path) -> set[str]:
    """`module.name` of every global `file`'s pickle refers to (GLOBAL and STACK_GLOBAL)."""
    data = _pickle_bytes(file)
    if data is None:
        return set()
    names: set[str] = set()
    strings: list[str] = []
    for op, arg, _ in pickletools.genops(data):
        if op.name == "GLOBAL":
            names.add(arg.replace(" ", "."))
        elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
            names.add(f"{strings[-2]}.{strings[-1]}")
        elif op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
    return names


def world_size(lay: Layout) -> int | None:
    """`dp_world_size` from the first complete model-states file, else None."""
    for file in lay.model.values():
        if complete_zip(file) and (size := pickled_int(file, "dp_world_size")) is not None:
            return size
    return None


def expected_files(path: Path) -> list[tuple[str, bool]]:
    """(file name, written completely) of every file the checkpoint needs, model states first;
    when the world size is not known yet, the files present."""
    lay = layout(path)
    size = world_size(lay)
    ranks = range(size) if size else sorted(set(lay.model) | set(lay.optim))
    prefix = "bf16_" if lay.bf16 else ""
    out: list[tuple[str, bool]] = []
    for rank in ranks if lay.stage3 else [0]:
        name = f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt" if lay.stage3 else None
        name = name or "mp_rank_00_model_states.pt"
        out.append((name, rank in lay.model and complete_zip(lay.model[rank])))
    for rank in ranks:
        name = f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        out.append((name, rank in lay.optim and complete_zip(lay.optim[rank])))
    return out


def tracked_step(path: Path) -> tuple[int | None, int | None]:
    """(this checkpoint's N from `global_stepN`, the N `latest` beside it names), None if
    unknown: DeepSpeed's rank 0 writes `latest` once it has saved the checkpoint."""
    match = STEP_RE.match(path.name)
    try:
        latest = STEP_RE.match((path.parent / LATEST).read_text(encoding="utf-8").strip())
    except (OSError, UnicodeDecodeError):
        latest = None
    return (int(match.group(1)) if match else None), (int(latest.group(1)) if latest else None)


def pending_marker(path: Path) -> str:
    """What a ZeRO checkpoint whose files are all written still waits for, or ""."""
    step, latest = tracked_step(path)
    if step is not None and latest is not None and step > latest:
        return f"{LATEST} still says global_step{latest}"
    return ""


def is_complete(path: Path) -> bool:
    """The world size is known (rank 0's model states written), every rank's file has its zip
    end record, and `latest` beside the checkpoint (if there) does not name an older step."""
    lay = layout(path)
    files = expected_files(path)
    return (
        world_size(lay) is not None
        and bool(lay.optim)
        and all(done for _, done in files)
        and not pending_marker(path)
    )


class DeepSpeedObject:
    """What a DeepSpeed object in a checkpoint's pickle becomes here: the arguments and state it
    was rebuilt with. No DeepSpeed code runs (deepspeed is never imported)."""

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _as_int(value: Any) -> int:
    """A pickled `ZeroStageEnum(2)` (a stand-in holding its argument) or a plain int."""
    if isinstance(value, DeepSpeedObject):
        return int(value.args[0])
    return int(value)


def load_states(file: Path, source: Path) -> dict[str, Any]:
    """`torch.load(weights_only=True, mmap=True)` with each `deepspeed.*` global of the file
    mapped to `DeepSpeedObject`; anything else torch does not allow is refused in one line."""
    import pickle

    import torch

    stand_ins = [(DeepSpeedObject, n) for n in pickle_globals(file) if n.startswith("deepspeed.")]
    try:
        with torch.serialization.safe_globals(stand_ins):
            return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0]
        raise checkpoint_error(
            source, file, f"holds objects ckpteval does not unpickle (weights_only): {first}"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise checkpoint_error(source, file, f"unreadable, truncated? ({first})") from None


def _check_files(path: Path) -> Layout:
    """Every file the checkpoint needs is there and complete, else one line naming it."""
    lay = layout(path)
    if lay.mp_ranks - {0}:
        raise checkpoint_error(
            path,
            None,
            f"model-parallel DeepSpeed checkpoint (mp_rank_{max(lay.mp_ranks):02d} files): "
            "ckpteval merges data-parallel ZeRO ranks only, as zero_to_fp32 does; save HF "
            "checkpoints from the trainer (OpenRLHF: --save_hf_ckpt) and point a run at them",
        )
    if not lay.optim:
        raise checkpoint_error(
            path,
            None,
            "DeepSpeed checkpoint without *_optim_states.pt (ZeRO stage 0, or saved without the "
            "optimizer): the fp32 weights zero_to_fp32 merges are not there",
        )
    size = world_size(lay)
    for name, done in expected_files(path):
        if done:
            continue
        file = path / name
        how = "truncated (no zip end record): still being written?" if file.exists() else None
        how = how or f"missing (world size {size}): copy every rank's file"
        raise checkpoint_error(path, file, how)
    if size is None:
        first = path / expected_files(path)[0][0]
        raise checkpoint_error(path, first, "no dp_world_size in it: not DeepSpeed model states")
    return lay


@dataclass(frozen=True)
class ZeroStates:
    """What the merge reads from the files (zero_to_fp32's `zero_model_state` + optim parse)."""

    stage: int
    world: int
    flat: list[list[torch.Tensor]]  # rank -> group -> the rank's flat fp32 partition
    paddings: list[list[int]] | None
    models: list[dict[str, Any]]  # model states by rank (stage 1/2: rank 0 only)


def read_states(path: Path, lay: Layout) -> ZeroStates:
    models = [load_states(lay.model[r], path) for r in sorted(lay.model)]
    optims = [load_states(lay.optim[r], path) for r in sorted(lay.optim)]
    first = optims[0].get("optimizer_state_dict", {})
    if "zero_stage" not in first:
        raise checkpoint_error(path, lay.optim[0], "not a ZeRO optimizer state (no zero_stage)")
    stage = _as_int(first["zero_stage"])
    counts = first.get("partition_count")
    world = max(counts) if isinstance(counts, list) else int(counts)
    if world != len(optims):
        raise checkpoint_error(
            path,
            lay.optim[0],
            f"partition_count {world} but {len(optims)} *_optim_states.pt files: "
            "a rank's file is missing or left from another save",
        )
    key = "fp32_flat_groups" if stage == 3 else "single_partition_of_fp32_groups"
    if stage not in (1, 2, 3) or (stage == 3) != lay.stage3:
        raise checkpoint_error(path, lay.optim[0], f"ZeRO stage {stage} with these files")
    flat = [list(o["optimizer_state_dict"][key]) for o in optims]
    paddings = first.get("param_alignment_paddings")
    for model, file in zip(models, lay.model.values(), strict=True):
        if "buffer_names" not in model or "param_shapes" not in model:
            raise checkpoint_error(path, file, "not DeepSpeed model states (no param_shapes)")
    return ZeroStates(stage, world, flat, paddings, models)


def _numel(shape: Any) -> int:
    return math.prod(tuple(shape))


def _ref(name: str, shape: Any, dtype: Any, file: Path, read: Callable[[], Any]) -> TensorRef:
    return TensorRef(name, tuple(int(d) for d in shape), dtype, file, read)


def _span(parts: list[torch.Tensor], starts: list[int], begin: int, end: int) -> list[Any]:
    """The pieces of the virtual concatenation of `parts` (starting at `starts`) in
    [begin, end): slices of the parts that overlap it, in order."""
    out = []
    for part, start in zip(parts, starts, strict=True):
        lo, hi = max(begin, start), min(end, start + part.numel())
        if lo < hi:
            out.append(part[lo - start : hi - start])
    return out


def _cumulative(sizes: list[int]) -> list[int]:
    starts, total = [], 0
    for size in sizes:
        starts.append(total)
        total += size
    return starts


def _gather(pieces: list[Any], numel: int, shape: Any) -> torch.Tensor:
    import torch

    flat = pieces[0] if len(pieces) == 1 else torch.cat(pieces, 0)
    return flat[:numel].reshape(tuple(shape)).contiguous()


def zero2_tensors(path: Path, file: Path, z: ZeroStates) -> dict[str, TensorRef]:
    """Stage 1/2 (`_zero2_merge_trainable_params`): group g is the ranks' partitions
    concatenated; its parameters follow one another, each followed by its alignment padding."""
    refs: dict[str, TensorRef] = {}
    for g, shapes in enumerate(z.models[0]["param_shapes"]):
        parts = [z.flat[r][g] for r in range(z.world)]
        starts = _cumulative([p.numel() for p in parts])
        pads = z.paddings[g] if z.paddings is not None else None
        if pads is not None and len(pads) != len(shapes):
            raise checkpoint_error(
                path, file, f"group {g}: {len(pads)} paddings, not {len(shapes)}"
            )
        offset = 0
        for i, (name, shape) in enumerate(shapes.items()):
            numel = _numel(shape)
            begin = offset

            def read(
                b: int = begin, n: int = numel, s: Any = shape, p: Any = parts, at: Any = starts
            ) -> Any:
                return _gather(_span(p, at, b, b + n), n, s)

            refs[name] = _ref(name, shape, parts[0].dtype, file, read)
            offset += numel + (pads[i] if pads is not None else 0)
        align = 2 * z.world
        total = sum(p.numel() for p in parts)
        if align * math.ceil(offset / align) != align * math.ceil(total / align):
            raise checkpoint_error(
                path, file, f"group {g}: parameters take {offset} elements, partitions hold {total}"
            )
    return refs


def zero3_tensors(path: Path, file: Path, z: ZeroStates) -> dict[str, TensorRef]:
    """Stage 3 (`_zero3_merge_trainable_params`): parameter k is `ceil(numel / W)` elements at
    the same offset of every rank's flat space (its groups concatenated, offsets from rank 0's
    group sizes); the ranks' pieces concatenated, cut to numel."""
    shapes = {k: v for d in z.models[0]["param_shapes"] for k, v in d.items()}
    group_starts = _cumulative([t.numel() for t in z.flat[0]])
    refs: dict[str, TensorRef] = {}
    offset = 0
    for name, shape in shapes.items():
        numel = _numel(shape)
        part = math.ceil(numel / z.world)

        def read(b: int = offset, p: int = part, n: int = numel, s: Any = shape) -> Any:
            pieces = []
            for rank in range(z.world):
                pieces += _span(z.flat[rank], group_starts, b, b + p)
            return _gather(pieces, n, s)

        refs[name] = _ref(name, shape, z.flat[0][0].dtype, file, read)
        offset += part
    avail = sum(t.numel() for t in z.flat[0])
    if offset != avail:
        raise checkpoint_error(path, file, f"parameters take {offset} elements per rank of {avail}")
    return refs


def side_tensors(file: Path, z: ZeroStates) -> dict[str, TensorRef]:
    """Buffers (rank 0's module, floating ones as float32) and frozen parameters (stage 3: the
    ranks' fragments concatenated), in zero_to_fp32's order: buffers, then frozen."""
    refs: dict[str, TensorRef] = {}
    first = z.models[0]
    module = first.get("module") or {}
    for name in first["buffer_names"]:
        if name in module:
            tensor = module[name]
            read = (
                (lambda t=tensor: t.float()) if tensor.is_floating_point() else (lambda t=tensor: t)
            )
            dtype = read().dtype
            refs[name] = _ref(name, tensor.shape, dtype, file, read)
    for name, shape in (first.get("frozen_param_shapes") or {}).items():
        frags = [m["frozen_param_fragments"][name] for m in z.models]
        if z.stage == 3:

            def read(f: Any = frags, n: int = _numel(shape), s: Any = shape) -> Any:
                return _gather(f, n, s)
        else:

            def read(f: Any = frags) -> Any:
                return f[0]

        refs[name] = _ref(name, shape, frags[0].dtype, file, read)
    return refs


def side_dir(path: Path) -> Path | None:
    """The format's `side_dir`: the checkpoint's directory when a config or tokenizer file lies
    beside the ZeRO files (DeepSpeed itself writes none; else they come from `base_model`)."""
    return path if any((path / m).is_file() for m in CONFIG_MARKERS) else None


def open_checkpoint(path: Path, base_model: Path | None, dtype: str) -> SourceCheckpoint:
    """Check every rank's file is there in full, load them memory-mapped, list the merged
    tensors (fp32 master weights, as zero_to_fp32 writes them)."""
    lay = _check_files(path)
    z = read_states(path, lay)
    file = lay.optim[0]
    refs = side_tensors(lay.model[0], z)
    refs.update((zero3_tensors if z.stage == 3 else zero2_tensors)(path, file, z))
    for alias, source in (z.models[0].get("shared_params") or {}).items():
        if source in refs:
            refs[alias] = _alias(refs[source], alias)
    meta = side_dir(path)
    if meta is None and base_model is None:
        raise checkpoint_error(
            path,
            None,
            "a DeepSpeed checkpoint holds no config.json or tokenizer: set base_model for this "
            "run (the model training started from, e.g. OpenRLHF's --pretrain)",
        )
    return SourceCheckpoint(
        path=path,
        tensors=refs,
        label=file.name,
        meta_dir=meta,
        notes=[
            f"merged ZeRO stage {z.stage} fp32 master weights of {z.world} ranks as DeepSpeed's "
            "zero_to_fp32 does"
        ],
    )


def _alias(ref: TensorRef, name: str) -> TensorRef:
    return TensorRef(name, ref.shape, ref.dtype, ref.file, ref.read, ref.byte_range)


FORMAT = CheckpointFormat(
    name="deepspeed",
    description=(
        "DeepSpeed ZeRO global_stepN/ (mp_rank_00_model_states.pt or zero_pp_rank_R_mp_rank_00"
        "_model_states.pt, and [bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt per rank)"
    ),
    markers=f"every rank's *_model_states.pt and *_optim_states.pt complete, and {LATEST} >= N",
    detect=detect,
    is_complete=is_complete,
    open=open_checkpoint,
    side_dir=side_dir,
)
