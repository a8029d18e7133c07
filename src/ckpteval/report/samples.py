"""The report's per-sample data: every cell's completions and verdicts, as compressed blobs.

The report opens in under 3 s even for 100 checkpoints x 20 tasks x 500 problems because no
completion is decoded until asked for: each cell (run, ckpt, task, variant) becomes one
gzip-compressed, base64-encoded `<script type="application/json">` that the page inflates
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Score-line fields shown with each completion; other scalar fields go to "extra".
SCORE_FIELDS = ("passed", "score", "error_type", "stderr_tail", "hack")
#: Generation-line fields shown with each completion (the reasoning segment is folded).
GENERATION_FIELDS = ("completion", "reasoning", "answer", "finish_reason", "truncated_reasoning")
#: Longest text kept per field in the report; the rest is named as cut (the file has it all).
MAX_TEXT = 20_000
_SKIP = {"task_id", "sample_idx", "prompt", *SCORE_FIELDS, *GENERATION_FIELDS}


@dataclass
class CellSamples:
    """One cell's samples as the page shows them, and its per-problem verdict counts."""

    rows: list[dict[str, Any]]
    #: task_id -> (passed samples, scored samples)
    verdicts: dict[str, tuple[int, int]]
    #: task_id -> prompt, from the generation file (empty when it is gone)
    prompts: dict[str, Any] = field(default_factory=dict)
    note: str = ""


def generation_path(source: str | Path) -> Path:
    """The generation file of the cell `{root}/scores/{run}/{ckpt}/{task}/{variant}.json`:
    `{root}/generations/{run}/{ckpt}/{task}/{variant}.jsonl`, the workflow's layout."""
    path = Path(source)
    root = path.parents[4] if len(path.parents) > 4 else path.parent
    return root / "generations" / Path(*path.parts[-4:]).with_suffix(".jsonl")


def read_cell_samples(source: str | Path) -> CellSamples:
    """Join a cell's score lines with its generation lines on (task_id, sample_idx)."""
    scores = Path(source).with_suffix(".jsonl")
    generations = _generation_lines(generation_path(source))
    rows: list[dict[str, Any]] = []
    verdicts: dict[str, list[int]] = {}
    prompts: dict[str, Any] = {}
    for line in _lines(scores):
        key = (str(line.get("task_id")), _int(line.get("sample_idx")))
        gen = generations.get(key, {})
        if key[0] not in prompts and "prompt" in gen:
            prompts[key[0]] = _cut(gen["prompt"])
        rows.append(_row(key, line, gen))
        count = verdicts.setdefault(key[0], [0, 0])
        count[0] += line.get("passed") is True
        count[1] += 1
    note = "" if generations else f"no generation file at {generation_path(source)}"
    return CellSamples(rows, {k: (v[0], v[1]) for k, v in verdicts.items()}, prompts, note)


def _row(key: tuple[str, int], score: dict[str, Any], gen: dict[str, Any]) -> dict[str, Any]:
    """One sample: its verdict fields, its generation fields and any other scalar score field."""
    row: dict[str, Any] = {"task_id": key[0], "sample_idx": key[1]}
    row.update({name: _cut(score.get(name)) for name in SCORE_FIELDS if name in score})
    row.update({name: _cut(gen[name]) for name in GENERATION_FIELDS if name in gen})
    extra = {
        name: _cut(value)
        for name, value in score.items()
        if name not in _SKIP and (value is None or isinstance(value, (str, int, float, bool)))
    }
    if extra:
        row["extra"] = extra
    return row


def _generation_lines(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    if not path.is_file():
        return {}
    return {(str(line.get("task_id")), _int(line.get("sample_idx"))): line for line in _lines(path)}


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


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


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
