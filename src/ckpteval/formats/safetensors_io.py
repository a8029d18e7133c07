"""Streaming safetensors: read headers, read or stream single tensors, write shards, hash weights.

Nothing here maps a file into memory or holds more than one tensor (or one chunk of one) at a
time, so consolidating a checkpoint needs memory for the largest chunk, not for the model: a
`bfloat16` shard is written from a `float32` one 64 MiB at a time.

The file format (https://github.com/huggingface/safetensors): 8 bytes little-endian header length
N, N bytes of JSON `{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{...}}`, then the tensor bytes, offsets relative to the end of the header.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpteval.formats.base import TensorRef, checkpoint_error

if TYPE_CHECKING:
    import torch

CHUNK_BYTES = 16 << 20
MAX_HEADER_BYTES = 100 << 20
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
HASH_SCHEME = b"ckpteval-weights-v1\n"

# safetensors dtype name -> (torch attribute, bytes per element). Kept free of torch so that
# completeness checks at workflow parse time do not pay for importing it.
DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a safetensors dtype name."""
    import torch

    return getattr(torch, DTYPES[name][0])


def dtype_name(dtype: torch.dtype) -> str:
    """The safetensors name of a torch dtype."""
    attr = str(dtype).removeprefix("torch.")
    for name, (torch_attr, _) in DTYPES.items():
        if torch_attr == attr:
            return name
    raise ValueError(f"safetensors cannot store {dtype}")


@dataclass(frozen=True)
class Entry:
    """One tensor's header entry: dtype name, shape and absolute byte range in the file."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype][1]


def read_header(path: Path, source: Path) -> dict[str, Entry]:
    """Parse and check a safetensors header; a short or corrupt file is a one-line `UserError`.

    The check is what tells a truncated shard from a complete one without reading the tensors:
    every tensor's bytes must lie inside the file and match its dtype and shape.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise checkpoint_error(source, path, f"truncated shard ({size} bytes, no header)")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES:
                raise checkpoint_error(
                    source, path, f"not a safetensors file (header length {length} is implausible)"
                )
            if 8 + length > size:
                raise checkpoint_error(
                    source,
                    path,
                    f"truncated shard: header needs {8 + length} bytes, file has {size}",
                )
            raw = handle.read(length)
    except FileNotFoundError:
        raise checkpoint_error(source, path, "file not found") from None
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except (UnicodeDecodeError, ValueError) as exc:
        raise checkpoint_error(source, path, f"corrupt safetensors header ({exc})") from None
    data_start = 8 + length
    entries: dict[str, Entry] = {}
    end_of_data = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = str(info["dtype"])
            itemsize = DTYPES[dtype][1]
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise checkpoint_error(
                source, path, f"corrupt safetensors header entry for tensor {name}: {info}"
            ) from None
        numel = 1
        for dim in shape:
            numel *= dim
        if end - begin != numel * itemsize or begin < 0:
            raise checkpoint_error(
                source,
                path,
                f"corrupt safetensors header: tensor {name} {list(shape)} {info['dtype']} "
                f"spans {end - begin} bytes",
            )
        entries[name] = Entry(dtype, shape, data_start + begin, data_start + end)
        end_of_data = max(end_of_data, end)
    if data_start + end_of_data > size:
        raise checkpoint_error(
            source,
            path,
            f"truncated shard: tensor data ends at byte {data_start + end_of_data}, "
            f"file has {size} bytes",
        )
    return entries


def tensor_refs(path: Path, source: Path) -> dict[str, TensorRef]:
    """Lazy references to every tensor of a safetensors file (header checked now)."""
    return {
        name: TensorRef(
            name=name,
            shape=entry.shape,
            dtype=torch_dtype(entry.dtype),
            file=path,
            read=_reader(path, entry),
            byte_range=(entry.start, entry.end),
        )
        for name, entry in read_header(path, source).items()
    }


def _reader(path: Path, entry: Entry) -> Callable[[], torch.Tensor]:
    def read() -> torch.Tensor:
        import torch

        dtype = torch_dtype(entry.dtype)
        if entry.end == entry.start:
            return torch.empty(entry.shape, dtype=dtype)
        buffer = next(iter_bytes(path, entry.start, entry.end, entry.end - entry.start))
        return torch.frombuffer(buffer, dtype=dtype).reshape(entry.shape)

    return read


def iter_bytes(
    path: Path, start: int, end: int, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[bytearray]:
    """The bytes `[start, end)` of a file, `chunk_bytes` at a time, in fresh writable buffers."""
    with open(path, "rb") as handle:
        handle.seek(start)
        remaining = end - start
        while remaining > 0:
            chunk = bytearray(min(chunk_bytes, remaining))
            if handle.readinto(chunk) != len(chunk):
                raise OSError(f"{path}: short read (file changed while reading?)")
            remaining -= len(chunk)
            yield chunk


def tensor_bytes(
    ref: TensorRef, out_dtype: torch.dtype, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[bytearray | memoryview]:
    """The tensor's data as `out_dtype`, little-endian, in chunks.

    A tensor stored raw is streamed and cast chunk by chunk; any other is read whole (one tensor).
    """
    import torch

    if ref.byte_range is not None:
        start, end = ref.byte_range
        if ref.dtype == out_dtype:
            yield from iter_bytes(ref.file, start, end, chunk_bytes)
            return
        itemsize = ref.dtype.itemsize
        step = max(itemsize, chunk_bytes - chunk_bytes % itemsize)
        for chunk in iter_bytes(ref.file, start, end, step):
            cast = torch.frombuffer(chunk, dtype=ref.dtype).to(out_dtype)
            yield cast.view(torch.uint8).numpy().data
        return
    tensor = ref.read()
    if tuple(tensor.shape) != ref.shape:
        raise checkpoint_error(
            ref.file.parent,
            ref.file,
            f"tensor {ref.name} has shape {list(tensor.shape)} on disk, "
            f"{list(ref.shape)} in the checkpoint's metadata",
        )
    flat = tensor.detach().to("cpu", out_dtype).contiguous().reshape(-1)
    if flat.numel():
        yield flat.view(torch.uint8).numpy().data


def write_file(
    path: Path,
    tensors: Sequence[tuple[str, TensorRef, torch.dtype]],
    chunk_bytes: int = CHUNK_BYTES,
) -> int:
    """Write `(output name, source, output dtype)` triples as one safetensors file; returns bytes.

    The header is computed from shapes alone, then each tensor is streamed behind it, so memory
    stays at one chunk whatever the file size.
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, ref, dtype in tensors:
        nbytes = ref.numel * dtype.itemsize
        header[name] = {
            "dtype": dtype_name(dtype),
            "shape": list(ref.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        for name, ref, dtype in tensors:
            written = 0
            for chunk in tensor_bytes(ref, dtype, chunk_bytes):
                handle.write(chunk)
                written += len(chunk)
            expected = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            if written != expected:
                raise RuntimeError(f"{path}: wrote {written} bytes for {name}, expected {expected}")
        handle.flush()
        os.fsync(handle.fileno())
    return 8 + len(raw) + offset


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a consolidated directory: the index's shards, or the single file."""
    index = model_dir / INDEX_NAME
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    return [model_dir / SINGLE_NAME]


@dataclass(frozen=True)
class WeightsSummary:
    """The content hash, tensor count and parameter count of a directory's weights."""

    sha256: str
    tensors: int
    params: int


def summarize_weights(model_dir: Path, chunk_bytes: int = CHUNK_BYTES) -> WeightsSummary:
    """Hash every tensor's name, dtype, shape and bytes, in name order, streamed.

    The hash identifies the model, not its files: it does not depend on how tensors are split
    into shards, on their order inside a file, on header padding or on mtimes — only on what a
    loader would see.
    """
    entries: dict[str, tuple[Path, Entry]] = {}
    for path in weight_files(model_dir):
        for name, entry in read_header(path, model_dir).items():
            entries[name] = (path, entry)
    digest = hashlib.sha256(HASH_SCHEME)
    params = 0
    for name in sorted(entries):
        path, entry = entries[name]
        line = f"{name}\t{entry.dtype}\t{list(entry.shape)}\n"
        digest.update(line.encode())
        for chunk in iter_bytes(path, entry.start, entry.end, chunk_bytes):
            digest.update(chunk)
        params += (entry.end - entry.start) // entry.itemsize
    return WeightsSummary(digest.hexdigest(), len(entries), params)
