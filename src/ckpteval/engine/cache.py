"""The content-addressed generation cache: every finished request, keyed by what it asked.

    <outdir>/cache/<model>/<task>.jsonl      one line per request: {key, ...}

`<model>` is the manifest's weights hash (or a weightless model card's identity hash); a key
(`request_key`) hashes the request (a prompt with its sampling and seed, or an lm-eval engine call)
with the answering backend's identity (engine version, dtype, context length). Infer jobs, assist
jobs and lm-eval's cached model all read and append here, so nothing is generated twice: a killed
job, a deleted generation file or a changed task regenerates only what is missing. Appends are
locked and fsynced; a torn last line (a kill mid-write) is skipped on read.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ckpteval.backends import Generation, Prompt, SamplingSpec
from ckpteval.io import iter_jsonl, sha256_json

log = logging.getLogger("ckpteval.engine.cache")


def cache_row(key: str, task_id: str, g: Generation) -> dict[str, Any]:
    """One cache line: a request's key and every sample of its generation."""
    return {
        "key": key,
        "task_id": task_id,
        "prompt_tokens": g.prompt_tokens,
        "outputs": [
            {"text": o.text, "finish_reason": o.finish_reason, "tokens": o.tokens}
            for o in g.outputs
        ],
    }


def request_key(request: dict[str, Any], identity: dict[str, Any]) -> str:
    """The one key function of the cache, for both kinds of request: a ckpteval generation
    (`{"prompt", "sampling"}`, the sampling with its seed) and an lm-eval engine call
    (`{"kind", "args"}`), joined with the identity of the backend that answers it."""
    return sha256_json({**request, "backend": identity})


def cache_key(prompt: Prompt, spec: SamplingSpec, identity: dict[str, Any]) -> str:
    """The key of a ckpteval generation request."""
    return request_key({"prompt": prompt, "sampling": spec.as_dict()}, identity)


def read_cache(cache_file: Path, wanted: set[str] | None = None) -> dict[str, dict[str, Any]]:
    """Cache rows by key (only `wanted` keys if given); a torn last line is skipped."""
    if not cache_file.exists():
        return {}
    torn: list[str] = []
    rows = {}
    for row in iter_jsonl(cache_file, errors=torn):
        key = row.get("key")
        if key and (wanted is None or key in wanted):
            rows[key] = row
    if torn:
        log.warning(
            "%s: skipped %d torn line(s) (a killed job's last write)", cache_file, len(torn)
        )
    return rows


def store_rows(rows: Iterable[tuple[Path, dict[str, Any]]]) -> None:
    """Append (cache file, row) pairs to their cache files, one locked append per file."""
    by_file: dict[Path, list[dict[str, Any]]] = {}
    for cache_file, row in rows:
        by_file.setdefault(cache_file, []).append(row)
    for cache_file, file_rows in by_file.items():
        append_cache(cache_file, file_rows)


def append_cache(cache_file: Path, rows: list[dict[str, Any]]) -> None:
    """Append rows under an exclusive lock: runs sharing weights (a base model in two runs) may
    append to one cache file at the same time. A torn last line from a kill is skipped on read,
    so each append starts on a fresh line."""
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    fd = os.open(cache_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_size and not _ends_with_newline(cache_file):
            data = b"\n" + data
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"
