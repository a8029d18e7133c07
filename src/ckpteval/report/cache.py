"""What a report build keeps of each cell for the next build: the aggregate step rebuilds the
report after every new checkpoint, and at 1,000 checkpoints x 20 tasks x 500 problems reading
and compressing every cell's samples again costs minutes, while one checkpoint's cells changed.

A cell's entry holds what the report takes from the cell's files (its blob, its verdict counts
as columns, its provenance fields) under a key of the files' identity: the cell json's path and
the size and modification time (ns) of the json, its score lines and its generation lines. A
rescored or regenerated cell has a new key, so its entry is never reused. A task's prompts (the
same at every checkpoint) are kept once per task. Entries this build did not use are removed,
so the cache holds the cells of the last build only.

The entries of the cells of one directory of cell directories (the workflow's
`scores/{run}/{ckpt}/`: one checkpoint's tasks) share a pack file: a rebuild of 20,000 cells
reads 1,000 files, not 20,000, and a new checkpoint adds one pack without rewriting the others.
A pack is rewritten only when one of its entries was added or left unused. Packs are
written and read by msgspec: at 10M samples they are 300 MB of JSON, most of it blob text.

Layout of the directory (the aggregate step's `staging/_report_cache/`, `ckpteval aggregate`'s
`.summary_report_cache/` beside the summary):
`pack-<directory hash>.json` per pack (`{"format": FORMAT, "entries": {key: {"blob": str,
"verdicts": {"ids": [task_id, ...], "passed": [int, ...], "n": [int, ...]}, "raw": {...}}}}`)
and `prompts-<task hash>.json` per task (`{"task": str, "prompts": {task_id: prompt}}`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import msgspec

from ckpteval.io import atomic_open

#: Part of every key and every pack: a change of what an entry holds (the blob's columns, its
#: encoding) makes every older entry unused.
FORMAT = "report-cell-2"


class CellCache:
    """Entries of the cells a build reads, in `directory` (None: nothing kept). `hits` and
    `misses` count the cells this build found and did not find there."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.hits = 0
        self.misses = 0
        self.prompts: dict[str, dict[str, Any]] = {}
        self.changed: set[str] = set()
        #: pack name -> (its entries as read, the entries this build used or added)
        self.packs: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        self.written: set[str] = set()

    def key(self, source: str | Path, files: list[str | Path]) -> str:
        """The cell's key: its json's path and its files' sizes and modification times."""
        parts = [FORMAT, self._real(str(source))]
        for path in files:
            try:
                stat = os.stat(path)
            except OSError:
                parts.append(f"{os.path.basename(path)}:-")
                continue
            parts.append(f"{os.path.basename(path)}:{stat.st_size}:{stat.st_mtime_ns}")
        return hashlib.blake2b("\0".join(parts).encode(), digest_size=16).hexdigest()

    def get(self, source: str | Path, key: str) -> dict[str, Any] | None:
        """The entry of the cell at `source` under `key`, or None (counted as a miss)."""
        if self.directory is None:
            self.misses += 1
            return None
        kept, used = self._pack(source)
        entry = kept.get(key)
        if isinstance(entry, dict):
            used[key] = entry
            self.hits += 1
            return entry
        self.misses += 1
        return None

    def put(self, source: str | Path, key: str, entry: dict[str, Any]) -> None:
        if self.directory is None:
            return
        self._pack(source)[1][key] = entry

    def task_prompts(self, task: str) -> dict[str, Any]:
        """The task's prompts kept by earlier builds (added to by this one)."""
        if task not in self.prompts:
            self.prompts[task] = {}
            if self.directory is not None:
                self.written.add(self._prompts_name(task))
                try:
                    kept = json.loads((self.directory / self._prompts_name(task)).read_text())
                    if kept.get("task") == task and isinstance(kept.get("prompts"), dict):
                        self.prompts[task] = kept["prompts"]
                except (OSError, ValueError, AttributeError):
                    pass
        return self.prompts[task]

    def add_prompts(self, task: str, prompts: dict[str, Any]) -> None:
        """Add the prompts of problems the task's prompts lack (a problem keeps its first)."""
        known = self.task_prompts(task)
        new = {k: v for k, v in prompts.items() if k not in known}
        if new:
            known.update(new)
            self.changed.add(task)

    def close(self) -> None:
        """Write the packs and the tasks' prompts that changed; remove every file this build
        did not use."""
        if self.directory is None:
            return
        if self.packs or self.changed:
            self.directory.mkdir(parents=True, exist_ok=True)
        if not self.directory.is_dir():
            return
        for name, (kept, used) in self.packs.items():
            if used.keys() != kept.keys():
                # a temp name and a rename without atomic_open's fsync (a thousand packs at
                # 10M samples): a pack a crash cut short is no JSON object, so it is unused
                tmp = self.directory / f".{name}.tmp"
                tmp.write_bytes(msgspec.json.encode({"format": FORMAT, "entries": used}))
                os.replace(tmp, self.directory / name)
        for task in self.changed:
            with atomic_open(self.directory / self._prompts_name(task), "w") as handle:
                json.dump({"task": task, "prompts": self.prompts[task]}, handle, ensure_ascii=False)
        for old in self.directory.iterdir():
            if old.name not in self.written and old.is_file():
                old.unlink()

    def _pack(self, source: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
        """The pack of the cell at `source` (read on first use): the directory two levels up,
        `scores/{run}/{ckpt}/` in the workflow's layout."""
        parent = os.path.dirname(os.path.dirname(self._real(str(source))))
        name = f"pack-{hashlib.blake2b(parent.encode(), digest_size=8).hexdigest()}.json"
        pack = self.packs.get(name)
        if pack is None:
            assert self.directory is not None
            self.written.add(name)
            kept: dict[str, Any] = {}
            try:
                value = msgspec.json.decode((self.directory / name).read_bytes())
                # a pack cut short is no JSON (msgspec's DecodeError is a ValueError); another
                # format's is unused
                if value.get("format") == FORMAT and isinstance(value.get("entries"), dict):
                    kept = value["entries"]
            except (OSError, ValueError, AttributeError):
                pass
            pack = self.packs[name] = (kept, {})
        return pack

    @staticmethod
    def _real(source: str) -> str:
        """`source` as an absolute path (`realpath` per cell was a second of a rebuild at 1M
        samples; a cell reached through a symlink gets an entry of its own)."""
        return os.path.abspath(source)

    @staticmethod
    def _prompts_name(task: str) -> str:
        return f"prompts-{hashlib.blake2b(task.encode(), digest_size=8).hexdigest()}.json"
