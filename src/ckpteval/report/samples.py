"""The report's per-sample data: every cell's completions and verdicts, as compressed blobs.

The report opens in under 3 s even for 100 checkpoints x 20 tasks x 500 problems because no
completion is decoded until asked for: each cell (run, ckpt, task, variant) becomes one
gzip-compressed, base64-encoded `<script type="application/json">` holding its score lines and
generation lines as columns (JSON arrays, which compress well), that the page inflates
(`DecompressionStream`) when the drill-down or the problem row opens it. Prompts are the same
at every checkpoint, so they are stored once per task, not once per cell; a group's verdict
matrix (problem x checkpoint: passed samples / scored samples) is its own small blob, from which
the page finds the problems that flipped between any two checkpoints.

Blobs are deterministic given the files (gzip header without a timestamp), so the aggregate step
rebuilds the same bytes from the same inputs.
"""

from __future__ import annotations

import base64
import functools
import gzip
import json
from collections.abc import Container, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from itertools import chain, repeat
from pathlib import Path
from typing import Any

import msgspec

from ckpteval.plan.layout import generation_of_score, score_samples_of

#: Generation-line fields kept besides the scalar ones (a chat prompt is a list: kept apart).
GENERATION_FIELDS = ("completion", "reasoning", "answer", "finish_reason", "truncated_reasoning")
#: Longest text kept per field in the report; the rest is named as cut (the file has it all).
MAX_TEXT = 20_000
Columns = dict[str, list[Any]]


@dataclass
class CellSamples:
    """One cell's score lines and generation lines as columns (the page joins them on
    (task_id, sample_idx)), and its per-problem verdict counts."""

    scores: Columns
    generations: Columns
    #: per problem: "ids" (task_id), "passed" (samples that passed), "n" (samples): columns,
    #: as the cache and the verdict matrices keep them
    verdicts: dict[str, list[Any]]
    #: task_id -> prompt, from the generation file (only those not in `known_prompts`)
    prompts: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def blob(self) -> dict[str, Any]:
        return {"s": self.scores, "g": self.generations, "note": self.note}


def read_cell_samples(
    source: str | Path, known_prompts: AbstractSet[str] = frozenset()
) -> CellSamples:
    """A cell's score lines (scalar fields) and generation lines (scalar fields and the texts),
    read with msgspec (a file it rejects is read line by line)."""
    scores = _read_columns(score_samples_of(Path(source)))
    scores = {k: v for k, v in scores.items() if k != "prompt" and v is not _NESTED}
    gen_path = generation_of_score(Path(source))
    generations = _read_columns(gen_path, _KEPT) if gen_path.is_file() else {}
    prompts: dict[str, Any] = {}
    ids = generations.get("task_id", [])
    column = generations.pop("prompt", None)
    if column is not None and not _keys(ids) <= known_prompts:
        for task_id, prompt in zip(ids, column):
            prompts.setdefault(str(task_id), _cut(_decoded(prompt)))
    generations = {k: v for k, v in generations.items() if v is not _NESTED}
    note = "" if generations else f"no generation file at {gen_path}"
    return CellSamples(scores, generations, _verdicts(scores), prompts, note)


#: `_read_columns`' value for a column of lists or objects (a list of tests), which a blob
#: leaves out, unless the column is one of `_KEPT`.
_NESTED: Any = object()
#: The generation columns kept whatever they hold (a chat prompt is a list of messages).
_KEPT = frozenset({"prompt", *GENERATION_FIELDS})


def _verdicts(scores: Columns) -> dict[str, list[Any]]:
    """Per problem (in the order of its first sample) the samples that passed and the
    samples, as columns, in one pass (at 10M samples a report's build spent seconds here)."""
    column = scores.get("task_id", ())
    ids = list(column) if set(map(type, column)) <= {str} else [str(i) for i in column]
    passed = scores.get("passed") or [None] * len(ids)
    if len(_keys(ids)) == len(ids):  # one sample per problem: the usual greedy cell
        if set(map(type, passed)) == {bool}:
            return {"ids": ids, "passed": list(map(int, passed)), "n": [1] * len(ids)}
        return {"ids": ids, "passed": [int(p is True) for p in passed], "n": [1] * len(ids)}
    counts: dict[str, list[int]] = {}
    for task_id, ok in zip(ids, passed):
        count = counts.setdefault(task_id, [0, 0])
        count[0] += ok is True
        count[1] += 1
    return {
        "ids": list(counts),
        "passed": [v[0] for v in counts.values()],
        "n": [v[1] for v in counts.values()],
    }


def _keys(ids: Sequence[Any]) -> set[str]:
    """The task_ids `ids` as strings, without a call per id when they are strings."""
    keys = set(ids)
    return keys if set(map(type, keys)) <= {str} else set(map(str, ids))


#: A JSONL file's lines, each an object (`_read_columns`).
_LINES = msgspec.json.Decoder(dict[str, Any])
_ENCODER = msgspec.json.Encoder()


def _read_columns(path: Path, kept: Container[str] = ()) -> dict[str, Any]:
    """Every field of a JSONL file as a column (null where a line lacks it), long texts cut
    (but the prompts', which the caller cuts if it needs them: most often it needs none); a
    column holding a list or an object is `_NESTED` unless its name is in `kept`. A field that
    is a string in the first line is read as `msgspec.Raw` (its JSON text, which the blob's
    encoder copies as it is: the page decodes the same string), the lines by msgspec into a
    struct of the first line's fields (`_line_decoder`): per cell of 500 samples 1.5 ms of CPU
    less than dicts of decoded strings, most of it the completions' and prompts' unescaping.
    A file where a later line has a field the first lacks is read as dicts
    (`_read_dict_columns`); a file msgspec rejects (a damaged line, a line that is no object)
    line by line, which skips those. Blank lines are skipped."""
    try:
        data = path.read_bytes()
    except OSError:
        return _read_columns_slowly(path, kept)
    lines = _line_decoder(data)
    if lines is not None:
        decoder, raws = lines
        try:
            rows = decoder.decode_lines(data)
        except msgspec.DecodeError:  # a field the first line lacks, or a damaged line
            pass
        else:
            return _struct_columns(rows, decoder.type, raws, kept)  # type: ignore[arg-type]
    try:
        return _read_dict_columns(data, kept)
    except msgspec.DecodeError:
        return _read_columns_slowly(path, kept)


def _line_decoder(data: bytes) -> tuple[msgspec.json.Decoder, frozenset[str]] | None:
    """The decoder of lines with the fields of the first non-blank line of `data` and the
    fields it reads as `msgspec.Raw` (None when that line is no JSON object)."""
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        line = data[start:end]
        start = end + 1
        if line.strip():
            try:
                first = _LINES.decode(line)
            except msgspec.DecodeError:
                return None
            return _decoder(tuple((k, _raw(v) and k not in _DECODED) for k, v in first.items()))
    return None


#: The fields the verdicts read: decoded whatever the first line holds.
_DECODED = frozenset({"task_id", "passed"})


def _raw(value: Any) -> bool:
    """Whether a field whose value is `value` in the first line is read as `msgspec.Raw`: a
    text, or null (most often a text elsewhere, as an error type is); not a number or a
    boolean, which the verdicts read and which cost little to decode."""
    return value is None or isinstance(value, str)


@functools.lru_cache(maxsize=64)
def _decoder(fields: tuple[tuple[str, bool], ...]) -> tuple[msgspec.json.Decoder, frozenset[str]]:
    """A decoder of lines with these (name, read as `msgspec.Raw`) fields, each null where a
    line lacks it; a line with another field fails (`forbid_unknown_fields`). The struct's
    attributes are `f0`, `f1`, ... (a field's name need not be an identifier)."""
    line = msgspec.defstruct(
        "Line",
        [
            (f"f{i}", msgspec.Raw, _NULL) if raw else (f"f{i}", Any, None)
            for i, (_, raw) in enumerate(fields)
        ],
        rename={f"f{i}": name for i, (name, _) in enumerate(fields)},
        forbid_unknown_fields=True,
    )
    return msgspec.json.Decoder(line), frozenset(name for name, raw in fields if raw)


#: A `msgspec.Raw` field's value where a line lacks it.
_NULL = msgspec.Raw(b"null")


def _struct_columns(
    rows: list[Any], line: type, raws: frozenset[str], kept: Container[str]
) -> dict[str, Any]:
    """`_read_columns`' columns of lines decoded by a `_decoder` struct, whose fields `raws`
    are `msgspec.Raw` (tuples, which the blob's encoder writes as arrays)."""
    names = line.__struct_encode_fields__  # type: ignore[attr-defined]
    columns = {}
    values: tuple[Any, ...]
    for name, values in zip(names, zip(*map(msgspec.structs.astuple, rows))):
        if name == "prompt":
            columns[name] = values
        elif name in raws:
            if name not in kept and _nested(values):
                columns[name] = _NESTED
            elif max(map(len, values)) > MAX_TEXT:  # a JSON text at most that long is no
                columns[name] = [_cut_raw(v) for v in values]  # longer a string
            else:
                columns[name] = values
        else:
            types = set(map(type, values))
            if name not in kept and not _NESTED_TYPES.isdisjoint(types):
                columns[name] = _NESTED
            elif str in types and _longest(values, types) > MAX_TEXT:
                columns[name] = [_cut(v) for v in values]
            else:
                columns[name] = values
    return columns


def _longest(values: tuple[Any, ...], types: set[type]) -> int:
    """The length of the longest string of `values` (whose types are `types`)."""
    texts = values if len(types) == 1 else [v for v in values if isinstance(v, str)]
    return max(map(len, texts))


def _nested(values: tuple[msgspec.Raw, ...]) -> bool:
    """Whether a JSON text of `values` is an array or an object (a look at each only when
    one holds a bracket)."""
    joined = b"".join(values)
    if b"[" not in joined and b"{" not in joined:
        return False
    return any(memoryview(v)[0] in _OPENING for v in values)


#: The first byte of a JSON array and of an object.
_OPENING = frozenset(b"[{")


def _decoded(value: Any) -> Any:
    """A `msgspec.Raw` JSON text's value; any other value as it is."""
    return msgspec.json.decode(value) if isinstance(value, msgspec.Raw) else value


def _cut_raw(value: msgspec.Raw) -> Any:
    """`_cut` of a JSON text: the text itself unless it is a string that is cut."""
    if len(value) <= MAX_TEXT:
        return value
    text = _decoded(value)
    cut = _cut(text)
    return value if cut is text else cut


def _read_dict_columns(data: bytes, kept: Container[str]) -> dict[str, Any]:
    """`_read_columns` of lines whose fields vary: each line a dict, the columns taken by
    `map(dict.get)` (a third of a comprehension's time). A file with no line longer than
    `MAX_TEXT` bytes has no text to cut."""
    rows = _LINES.decode_lines(data)
    long = len(data) > MAX_TEXT and max(map(len, data.split(b"\n"))) > MAX_TEXT
    columns = {}
    for name in dict.fromkeys(chain.from_iterable(rows)):
        values = list(map(dict.get, rows, repeat(name)))
        if name == "prompt":
            columns[name] = values
        elif name not in kept and not _NESTED_TYPES.isdisjoint(map(type, values)):
            columns[name] = _NESTED
        else:
            columns[name] = [_cut(v) for v in values] if long else values
    return columns


#: The types msgspec gives a JSON array and object.
_NESTED_TYPES = frozenset({list, dict})


def _read_columns_slowly(path: Path, kept: Container[str] = ()) -> dict[str, Any]:
    rows = list(_lines(path))
    names = list(dict.fromkeys(name for row in rows for name in row))
    columns = {name: [_cut(row.get(name)) for row in rows] for name in names}
    return {
        name: values if name in kept or _scalar(values) else _NESTED
        for name, values in columns.items()
    }


def _scalar(values: list[Any]) -> bool:
    return all(v is None or isinstance(v, (str, int, float, bool)) for v in values[:50])


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file; a damaged line is skipped (the aggregate names it)."""
    try:
        handle = open(path, encoding="utf-8", errors="replace")
    except OSError:
        return
    with handle:
        for text in handle:
            try:
                value = json.loads(text)
            except ValueError:
                continue
            if isinstance(value, dict):
                yield value


def _cut(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return value[:MAX_TEXT] + f"\n… ({len(value) - MAX_TEXT} more characters in the file)"
    return value


#: gzip level of the blobs. Measured on the bench's cells (bench/report.py), CPU per cell of 500
#: samples: level 6 1.6 ms (10.4 KB), 4 1.0 ms (11.8 KB), 3 0.62 ms (12.2 KB), 2 0.44 ms
#: (12.6 KB), 1 0.43 ms (12.9 KB); at 20,000 cells level 2 saves 23 s of a first build over 6.
BLOB_LEVEL = 2


def encode_blob(value: Any) -> str:
    """gzip (no timestamp, so the same input gives the same bytes) and base64, for the page."""
    data = _ENCODER.encode(value)
    return base64.b64encode(gzip.compress(data, compresslevel=BLOB_LEVEL, mtime=0)).decode("ascii")


def decode_blob(text: str) -> Any:
    """The inverse of `encode_blob` (the page does the same with DecompressionStream)."""
    return json.loads(gzip.decompress(base64.b64decode(text)))
