"""Hugging Face directories: `config.json` beside `model.safetensors` or indexed safetensors shards.

Also accepted, because trainers write them and vLLM refuses them: a single `model.safetensors`
beside an index that names shards which do not exist (vLLM: "Weight files referenced in index but
missing"), and shards without an index. The tensors are read from the files that do exist; the
consolidated directory gets a correct index (or none). The source is never modified.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ckpteval.formats.base import CheckpointFormat, SourceCheckpoint, TensorRef, checkpoint_error
from ckpteval.formats.safetensors_io import INDEX_NAME, SINGLE_NAME, read_header, tensor_refs

ADAPTER_FILE = "adapter_model.safetensors"
SHARD_RE = re.compile(r".*-(\d+)-of-(\d+)\.safetensors\Z")


def _safetensors_files(path: Path) -> list[Path]:
    return sorted(p for p in path.glob("*.safetensors") if p.name != ADAPTER_FILE)


def detect(path: Path) -> bool:
    """A directory with model safetensors or a safetensors index."""
    return path.is_dir() and ((path / INDEX_NAME).exists() or bool(_safetensors_files(path)))


def _index_files(path: Path) -> list[str] | None:
    """The shard names the index refers to; None when there is no readable index."""
    try:
        weight_map = json.loads((path / INDEX_NAME).read_text())["weight_map"]
        return sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _complete_file(path: Path, source: Path) -> bool:
    from ckpteval.errors import UserError

    try:
        read_header(path, source)
    except UserError:
        return False
    return True


TMP_SHARD_RE = re.compile(r"(.*)-(\d+)-of-(\d+)\.safetensors(?:\.tmp|\.part|\.partial)?\Z")


def expected_shards(path: Path) -> list[tuple[str, bool]]:
    """(name, complete) of every weight shard a directory being written will hold: those its
    index names, else the `-of-N` set any shard's name (even a `.tmp` one) announces; [] when
    neither says (a single file)."""
    names = _index_files(path) if (path / INDEX_NAME).exists() else None
    if names is None:
        match = next((m for f in sorted(path.iterdir()) if (m := TMP_SHARD_RE.match(f.name))), None)
        if match is None:
            return []
        head, width, total = match.group(1), len(match.group(3)), int(match.group(3))
        names = [
            f"{head}-{i:0{width}d}-of-{total:0{width}d}.safetensors" for i in range(1, total + 1)
        ]
    return [(n, (path / n).exists() and _complete_file(path / n, path)) for n in names]


def is_complete(path: Path) -> bool:
    """`config.json`, and weights whose every file is present with all the bytes its header needs.

    With an index, every shard it names must be complete (transformers writes the index after the
    shards); a lone `model.safetensors` counts when the index's shards are all missing (the broken
    layout this format repairs). Without an index, `model.safetensors` or a full `-of-N` set.
    """
    if not (path / "config.json").is_file():
        return False
    single = path / SINGLE_NAME
    if (path / INDEX_NAME).exists():
        names = _index_files(path)
        if names is None:
            return False
        shards = [path / n for n in names]
        if all(s.exists() for s in shards):
            return all(_complete_file(s, path) for s in shards)
        return (
            not any(s.exists() for s in shards) and single.exists() and _complete_file(single, path)
        )
    if single.exists():
        return _complete_file(single, path)
    files = _safetensors_files(path)
    totals = {int(m.group(2)) for f in files if (m := SHARD_RE.match(f.name))}
    return (
        len(totals) == 1
        and len(files) == totals.pop()
        and all(_complete_file(f, path) for f in files)
    )


def _resolve_files(path: Path, notes: list[str]) -> tuple[list[Path], str]:
    """Which safetensors files hold the weights, and the file that names them (for errors)."""
    index = path / INDEX_NAME
    single = path / SINGLE_NAME
    if index.exists():
        names = _index_files(path)
        if names is None:
            raise checkpoint_error(path, index, "not a valid safetensors index (no weight_map)")
        missing = [n for n in names if not (path / n).exists()]
        if not missing:
            return [path / n for n in names], INDEX_NAME
        if single.exists() and SINGLE_NAME not in names:
            notes.append(
                f"{INDEX_NAME} names missing shard(s) {', '.join(missing)}: read {SINGLE_NAME} "
                "instead and left the index out"
            )
            return [single], SINGLE_NAME
        more = f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""
        raise checkpoint_error(path, index, f"names shard {missing[0]}, which does not exist{more}")
    if single.exists():
        return [single], SINGLE_NAME
    files = _safetensors_files(path)
    if not files:
        raise checkpoint_error(path, None, f"no {SINGLE_NAME}, {INDEX_NAME} or *.safetensors")
    if len(files) > 1:
        notes.append(f"no {INDEX_NAME}; read {len(files)} safetensors files")
    return files, files[0].name if len(files) == 1 else "*.safetensors"


def _check_index(path: Path, tensors: dict[str, TensorRef]) -> None:
    """Every tensor the index maps must be in the shard it names."""
    weight_map: dict[str, str] = json.loads((path / INDEX_NAME).read_text())["weight_map"]
    for name, shard in weight_map.items():
        ref = tensors.get(name)
        if ref is None or ref.file.name != shard:
            raise checkpoint_error(
                path, path / shard, f"lacks tensor {name}, which {INDEX_NAME} says it holds"
            )


def open_checkpoint(path: Path, base_model: Path | None, dtype: str) -> SourceCheckpoint:
    """Read every weight file's header; tensors stay on disk until written."""
    notes: list[str] = []
    files, label = _resolve_files(path, notes)
    tensors: dict[str, TensorRef] = {}
    for file in files:
        for name, ref in tensor_refs(file, path).items():
            if name in tensors:
                raise checkpoint_error(
                    path, file, f"tensor {name} is also in {tensors[name].file.name}"
                )
            tensors[name] = ref
    if label == INDEX_NAME:
        _check_index(path, tensors)
    return SourceCheckpoint(path=path, tensors=tensors, label=label, meta_dir=path, notes=notes)


FORMAT = CheckpointFormat(
    name="hf",
    description="Hugging Face directory (config.json + model.safetensors or safetensors shards)",
    markers=f"config.json and complete {SINGLE_NAME} or every shard of {INDEX_NAME}",
    detect=detect,
    is_complete=is_complete,
    open=open_checkpoint,
)
