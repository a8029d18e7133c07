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
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from ckpteval.plan.layout import CellKey, Layout

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


def generation_path(source: str | Path) -> Path:
    """The generation file of the cell `{root}/scores/{run}/{ckpt}/{task}/{variant}.json`:
    `{root}/generations/{run}/{ckpt}/{task}/{variant}.jsonl`, the workflow's layout."""
    path = Path(source)
    root = path.parents[4] if len(path.parents) > 4 else path.parent
    return Path(Layout(str(root)).generation(CellKey(*path.parts[-4:-1], path.stem)))


def read_cell_samples(source: str | Path, known_prompts: Container[str] = ()) -> CellSamples:
    """A cell's score lines (scalar fields) and generation lines (scalar fields and the texts),
    read with Arrow's JSON reader (a file it rejects is read line by line)."""
    scores = _read_columns(Path(source).with_suffix(".jsonl"))
    scores = {k: v for k, v in scores.items() if k != "prompt" and _scalar(v)}
    gen_path = generation_path(source)
    generations = _read_columns(gen_path) if gen_path.is_file() else {}
    prompts: dict[str, Any] = {}
    ids = generations.get("task_id", [])
    if "prompt" in generations and any(str(i) not in known_prompts for i in ids):
        for task_id, prompt in zip(ids, generations["prompt"]):
            prompts.setdefault(str(task_id), _cut(prompt))
    generations = {
        k: v
        for k, v in generations.items()
        if k in GENERATION_FIELDS or k != "prompt" and _scalar(v)
    }
    note = "" if generations else f"no generation file at {gen_path}"
    return CellSamples(scores, generations, _verdicts(scores), prompts, note)


def _verdicts(scores: Columns) -> dict[str, tuple[int, int]]:
    counts: dict[str, list[int]] = {}
    for task_id, passed in zip(scores.get("task_id", []), scores.get("passed", [])):
        count = counts.setdefault(str(task_id), [0, 0])
        count[0] += passed is True
        count[1] += 1
    return {k: (v[0], v[1]) for k, v in counts.items()}


def _read_columns(path: Path) -> Columns:
    """Every field of a JSONL file as a column (null where a line lacks it), long texts cut."""
    try:
        size = path.stat().st_size
        table = pa_json.read_json(
            path,
            read_options=pa_json.ReadOptions(use_threads=False, block_size=max(size + 1, 1 << 16)),
        )
    except (OSError, pa.ArrowInvalid):
        return _read_columns_slowly(path)
    if any(pa.types.is_temporal(f.type) for f in table.schema):  # a text Arrow took for a date
        return _read_columns_slowly(path)
    return {name: _column(table[name]) for name in table.column_names}


def _column(column: pa.ChunkedArray) -> list[Any]:
    values = column.to_pylist()
    if pa.types.is_string(column.type) and len(column):
        longest = pc.max(pc.utf8_length(column)).as_py()
        if longest is not None and longest > MAX_TEXT:
            values = [_cut(v) for v in values]
    return values


def _read_columns_slowly(path: Path) -> Columns:
    rows = list(_lines(path))
    names = list(dict.fromkeys(name for row in rows for name in row))
    return {name: [_cut(row.get(name)) for row in rows] for name in names}


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


def encode_blob(value: Any) -> str:
    """gzip (no timestamp, so the same input gives the same bytes) and base64, for the page."""
    data = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return base64.b64encode(gzip.compress(data, compresslevel=6, mtime=0)).decode("ascii")


def decode_blob(text: str) -> Any:
    """The inverse of `encode_blob` (the page does the same with DecompressionStream)."""
    return json.loads(gzip.decompress(base64.b64decode(text)))
