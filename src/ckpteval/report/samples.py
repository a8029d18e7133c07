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
import gzip
import json
from collections.abc import Container, Iterator
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
    #: task_id -> (passed samples, scored samples)
    verdicts: dict[str, tuple[int, int]]
    #: task_id -> prompt, from the generation file (only those not in `known_prompts`)
    prompts: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def blob(self) -> dict[str, Any]:
        return {"s": self.scores, "g": self.generations, "note": self.note}


def read_cell_samples(source: str | Path, known_prompts: Container[str] = ()) -> CellSamples:
    """A cell's score lines (scalar fields) and generation lines (scalar fields and the texts),
    read with msgspec (a file it rejects is read line by line)."""
    scores = _read_columns(score_samples_of(Path(source)))
    scores = {k: v for k, v in scores.items() if k != "prompt" and v is not _NESTED}
    gen_path = generation_of_score(Path(source))
    generations = _read_columns(gen_path, _KEPT) if gen_path.is_file() else {}
    prompts: dict[str, Any] = {}
    ids = generations.get("task_id", [])
    column = generations.pop("prompt", None)
    if column is not None and not all(map(known_prompts.__contains__, map(str, ids))):
        for task_id, prompt in zip(ids, column):
            prompts.setdefault(str(task_id), _cut(prompt))
    generations = {k: v for k, v in generations.items() if v is not _NESTED}
    note = "" if generations else f"no generation file at {gen_path}"
    return CellSamples(scores, generations, _verdicts(scores), prompts, note)


#: `_read_columns`' value for a column of lists or objects (a list of tests), which a blob
#: leaves out, unless the column is one of `_KEPT`.
_NESTED: Any = object()
#: The generation columns kept whatever they hold (a chat prompt is a list of messages).
_KEPT = frozenset({"prompt", *GENERATION_FIELDS})


def _verdicts(scores: Columns) -> dict[str, tuple[int, int]]:
    """task_id -> (samples that passed, samples): a dict built in one pass (at 10M samples a
    report's build spent seconds here)."""
    ids = [str(i) for i in scores.get("task_id", [])]
    passed = scores.get("passed") or [None] * len(ids)
    if len(set(ids)) == len(ids):  # one sample per problem: the usual greedy cell
        return {i: (int(p is True), 1) for i, p in zip(ids, passed)}
    counts: dict[str, list[int]] = {}
    for task_id, ok in zip(ids, passed):
        count = counts.setdefault(task_id, [0, 0])
        count[0] += ok is True
        count[1] += 1
    return {k: (v[0], v[1]) for k, v in counts.items()}


#: A JSONL file's lines, each an object (`_read_columns`).
_LINES = msgspec.json.Decoder(dict[str, Any])
_ENCODER = msgspec.json.Encoder()


def _read_columns(path: Path, kept: Container[str] = ()) -> dict[str, Any]:
    """Every field of a JSONL file as a column (null where a line lacks it), long texts cut
    (but the prompts', which the caller cuts if it needs them: most often it needs none); a
    column holding a list or an object is `_NESTED` unless its name is in `kept`. The lines are
    parsed by msgspec's `decode_lines` (per cell of 500 samples it and its encoder take 3.6 ms
    of CPU where Arrow's JSON reader, its columns as Python lists and `json` took 6.7 ms; joining
    the lines into one array to parse took 0.5 ms more per cell) and the columns taken by
    `map(dict.get)` (a third of a comprehension's time). Blank lines are skipped; a file it
    rejects (a damaged line, a line that is no object) is read line by line, which skips those.
    A file with no line longer than `MAX_TEXT` bytes has no text to cut."""
    try:
        data = path.read_bytes()
        rows = _LINES.decode_lines(data)
    except (OSError, msgspec.DecodeError):
        return _read_columns_slowly(path, kept)
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


#: gzip level of the blobs. Measured on the bench's cells (bench/report.py): level 6 took 1.5 ms
#: of CPU per cell of 500 samples, level 3 0.64 ms for blobs 16% larger, level 1 0.46 ms for 25%
#: larger; at 20,000 cells level 3 saves 17 s of a first build.
BLOB_LEVEL = 3


def encode_blob(value: Any) -> str:
    """gzip (no timestamp, so the same input gives the same bytes) and base64, for the page."""
    data = _ENCODER.encode(value)
    return base64.b64encode(gzip.compress(data, compresslevel=BLOB_LEVEL, mtime=0)).decode("ascii")


def decode_blob(text: str) -> Any:
    """The inverse of `encode_blob` (the page does the same with DecompressionStream)."""
    return json.loads(gzip.decompress(base64.b64decode(text)))
