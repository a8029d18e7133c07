"""The validation curve a trainer logged, read back to sit beside ckpteval's reward.

Users regularly find the offline number differs from the in-training one; this module reads the
trainer's own curve so the two can be put side by side (`compare_curves`). Two formats, as verl's
`verl.utils.tracking.Tracking` writes them:

- **TensorBoard event files** (`events.out.tfevents.*`, `trainer.logger: [tensorboard]`, under
  `$TENSORBOARD_DIR` or `tensorboard_log/<project>/<experiment>/`): TFRecord framing (an 8-byte
  little-endian length, its 4-byte masked CRC-32C, the record, the record's CRC) around `Event`
  protocol buffers. `read_event_scalars` reads them without TensorBoard or protobuf installed:
  every scalar, whether written as `simple_value` (`SummaryWriter.add_scalar`, verl's way) or as
  a one-element float tensor (TensorBoard 2's `tf.summary.scalar`). The length's CRC is checked,
  so a file cut while it was written ends at its last whole record; the record's own CRC is not
  (pure-Python CRC over megabytes of histograms would cost seconds, and a record that parses
  wrongly is skipped).
- **verl's file logger** (`trainer.logger: [file]`, `$VERL_FILE_LOGGER_PATH` or
  `<VERL_FILE_LOGGER_ROOT>/<project>/<experiment>.jsonl`): one JSON object per `log` call,
  `{"step": int, "data": {metric: value}}`. Any JSONL of `{"step", ...metrics}` is read too.

verl names its validation metrics `val-core/<data_source>/<var>/mean@<N>` (`<var>` is `acc` when
the reward function returns an `acc` key, else `reward`; N the responses per prompt,
`actor_rollout_ref.rollout.val_kwargs.n`): ckpteval's reward cells report the same names
(`ckpteval.evaluate`), so a curve is matched to a cell's metric by name.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.errors import UserError

EVENT_GLOB = "events.out.tfevents.*"

#: verl's validation settings (`actor_rollout_ref.rollout.val_kwargs`, and
#: `data.max_response_length`) and the sampling key of ckpteval's that means the same.
VAL_KWARGS = {
    "n": "n",
    "temperature": "temperature",
    "top_p": "top_p",
    "response_length": "max_new_tokens",
}


# ------------------------------------------------------------------------- CRC-32C (Castagnoli)


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC_TABLE = _crc_table()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C, rotated right by 15 and offset by 0xA282EAD8."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# -------------------------------------------------------------------------- protocol buffers


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of a serialized message: an int for varints, bytes for
    length-delimited fields, the raw 4 or 8 bytes for fixed-width ones."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def _tensor_scalar(buf: bytes) -> float | None:
    """The value of a one-element float or double `TensorProto` (dtype 1 or 2), else None."""
    dtype, values = None, []
    for number, wire, value in _fields(buf):
        if number == 1 and wire == 0:
            dtype = value
        elif number == 4 and wire == 2:  # tensor_content: raw little-endian values
            width = 4 if dtype == 1 else 8
            values += [v for (v,) in struct.iter_unpack("<f" if width == 4 else "<d", value)]
        elif number == 5:  # float_val, packed or not
            values += [v for (v,) in struct.iter_unpack("<f", value)]
        elif number == 6:  # double_val
            values += [v for (v,) in struct.iter_unpack("<d", value)]
    return float(values[0]) if dtype in (1, 2) and len(values) == 1 else None


def _summary_values(buf: bytes) -> Iterator[tuple[str, float]]:
    for number, wire, value in _fields(buf):
        if number != 1 or wire != 2:
            continue
        tag, scalar = None, None
        for field, kind, item in _fields(value):
            if field == 1 and kind == 2:
                tag = item.decode("utf-8", errors="replace")
            elif field == 2 and kind == 5:
                scalar = struct.unpack("<f", item)[0]
            elif field == 8 and kind == 2:
                scalar = _tensor_scalar(item)
        if tag is not None and scalar is not None:
            yield tag, float(scalar)


def _records(data: bytes) -> Iterator[bytes]:
    """The records of a TFRecord file, up to the first incomplete or misframed one."""
    pos = 0
    while pos + 12 <= len(data):
        header = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        (crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        end = pos + 12 + length + 4
        if crc != masked_crc32c(header) or end > len(data):
            return
        yield data[pos + 12 : pos + 12 + length]
        pos = end


def read_event_scalars(path: Path) -> Iterator[tuple[str, int, float]]:
    """(tag, step, value) of every scalar in one TensorBoard event file, in file order."""
    for record in _records(Path(path).read_bytes()):
        try:
            step, summary = 0, None
            for number, wire, value in _fields(record):
                if number == 2 and wire == 0:
                    step = value - (1 << 64) if value >= 1 << 63 else value
                elif number == 5 and wire == 2:
                    summary = value
            if summary is not None:
                for tag, value in _summary_values(summary):
                    yield tag, step, value
        except (IndexError, ValueError, struct.error):
            continue  # a record that does not parse as an Event (its CRC is not checked)


def read_jsonl_scalars(path: Path) -> Iterator[tuple[str, int, float]]:
    """(metric, step, value) of a verl file-logger JSONL (`{"step", "data": {...}}`) or of any
    JSONL of `{"step", metric: value, ...}`; lines that do not parse are skipped."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                continue
            data = row.get("data") if isinstance(row.get("data"), dict) else row
            for key, value in data.items():
                if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                    yield key, row["step"], float(value)


def log_files(path: Path, where: str = "train_logs") -> list[Path]:
    """The event files and JSONL files at `path` (a file, or a directory searched recursively);
    a `UserError` that starts with `where` (the config key) when there are none."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise UserError(
            f"{where}: {path} does not exist; point it at the trainer's log directory "
            "(TensorBoard event files or verl's file-logger JSONL)"
        )
    found = sorted(f for f in {*path.rglob(EVENT_GLOB), *path.rglob("*.jsonl")} if f.is_file())
    if not found:
        raise UserError(
            f"{where}: no TensorBoard event file ({EVENT_GLOB}) or verl file-logger JSONL "
            f"under {path}"
        )
    return found


def read_curves(path: Path, metrics: Iterable[str] | None = None) -> dict[str, dict[int, float]]:
    """`{metric: {step: value}}` from the logs at `path` (`log_files`), only `metrics` if given;
    a step logged twice (a resumed run) keeps its last value, files read in name order."""
    wanted = None if metrics is None else set(metrics)
    curves: dict[str, dict[int, float]] = {}
    for file in log_files(path):
        is_events = file.name.startswith("events.out.tfevents.")
        rows = read_event_scalars(file) if is_events else read_jsonl_scalars(file)
        for tag, step, value in rows:
            if wanted is None or tag in wanted:
                curves.setdefault(tag, {})[step] = value
    return curves


# ------------------------------------------------------------------------- side by side


def settings_differences(
    val_kwargs: Mapping[str, Any] | None, sampling: Mapping[str, Any], samples: int
) -> list[str]:
    """`key: trainer X, ckpteval Y` for each of verl's validation settings given in `val_kwargs`
    that the task's generation does not match (`sampling`, `samples` per problem); [] when
    they match. Not given: [] too, but then nothing says they match (`settings_known`)."""
    ours = {**sampling, "n": samples}
    out = []
    for key, mine in VAL_KWARGS.items():
        if not val_kwargs or key not in val_kwargs:
            continue
        theirs, value = val_kwargs[key], ours.get(mine)
        if key == "temperature" and not val_kwargs.get("do_sample", True):
            theirs = 0.0  # verl's do_sample: false is greedy whatever the temperature
        if value is None or not math.isclose(float(theirs), float(value)):
            out.append(f"{key}: trainer {theirs}, ckpteval {value}")
    return out


@dataclass(frozen=True)
class CurvePoint:
    """One training step where both curves have a value."""

    step: int
    trainer: float
    ckpteval: float
    low: float | None
    high: float | None
    #: ckpteval's value differs from the trainer's by more than its interval, and the settings
    #: match (with different settings the curves need not agree, so nothing is flagged).
    flagged: bool


def compare_curves(
    trainer: Mapping[int, float],
    ours: Sequence[tuple[int, float, float | None, float | None]],
    *,
    settings_match: bool,
) -> list[CurvePoint]:
    """The steps both curves have: ckpteval's `(step, value, low, high)` (its 95% interval)
    beside the trainer's value, flagged where the trainer's lies outside the interval, only
    when `settings_match`."""
    points = []
    for step, value, low, high in ours:
        if step not in trainer:
            continue
        theirs = trainer[step]
        outside = low is not None and high is not None and not low <= theirs <= high
        points.append(CurvePoint(step, theirs, value, low, high, settings_match and outside))
    return points
