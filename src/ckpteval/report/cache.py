"""What a report build keeps of each cell for the next build: the aggregate step rebuilds the
report after every new checkpoint, and at 1,000 checkpoints x 20 tasks x 500 problems reading
and compressing every cell's samples again costs minutes, while one checkpoint's cells changed.

A cell's entry holds what the report takes from the cell's files (its blob, its verdict counts,
its provenance fields) under a key of the files' identity: the cell json's path and the size
and modification time (ns) of the json, its score lines and its generation lines. A rescored
or regenerated cell has a new key, so its entry is never reused. A task's prompts (the same at
every checkpoint) are kept once per task. Entries this build did not use are removed, so the
cache holds the cells of the last build only.

Layout of the directory (the aggregate step's `staging/_report_cache/`, `ckpteval aggregate`'s
`.summary_report_cache/` beside the summary):
`<key>.json` per cell (`{"blob": str, "verdicts": [[task_id, passed, n], ...], "raw": {...}}`)
and `prompts-<task hash>.json` per task (`{"task": str, "prompts": {task_id: prompt}}`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ckpteval.io import atomic_open

#: Part of every key: a change of what an entry holds (the blob's columns, its encoding)
#: makes every older entry unused.
FORMAT = "report-cell-1"


class CellCache:
    """Entries of the cells a build reads, in `directory` (None: nothing kept)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.used: set[str] = set()
        self.prompts: dict[str, dict[str, Any]] = {}
        self.changed: set[str] = set()

    def key(self, source: str | Path, files: list[Path]) -> str:
        """The cell's key: its json's path and its files' sizes and modification times."""
        parts = [FORMAT, str(Path(source).resolve())]
        for path in files:
            try:
                stat = path.stat()
            except OSError:
                parts.append(f"{path.name}:-")
                continue
            parts.append(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
        return hashlib.blake2b("\0".join(parts).encode(), digest_size=16).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        if self.directory is None:
            return None
        self.used.add(f"{key}.json")
        try:
            value = json.loads((self.directory / f"{key}.json").read_text("utf-8"))
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def put(self, key: str, entry: dict[str, Any]) -> None:
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        self.used.add(f"{key}.json")
        # written in place: a killed build's half entry is no JSON object, so `get` skips it
        text = json.dumps(entry, separators=(",", ":"), ensure_ascii=False)
        (self.directory / f"{key}.json").write_text(text, "utf-8")

    def task_prompts(self, task: str) -> dict[str, Any]:
        """The task's prompts kept by earlier builds (added to by this one)."""
        if task not in self.prompts:
            self.prompts[task] = {}
            if self.directory is not None:
                self.used.add(self._prompts_name(task))
                try:
                    kept = json.loads((self.directory / self._prompts_name(task)).read_text())
                    if kept.get("task") == task and isinstance(kept.get("prompts"), dict):
                        self.prompts[task] = kept["prompts"]
                except (OSError, ValueError, AttributeError):
                    pass
        return self.prompts[task]

    def add_prompts(self, task: str, prompts: dict[str, Any]) -> None:
        if prompts:
            self.task_prompts(task).update(prompts)
            self.changed.add(task)

    def close(self) -> None:
        """Write the tasks' prompts that changed; remove every file this build did not use."""
        if self.directory is None or not self.directory.is_dir():
            return
        for task in self.changed:
            with atomic_open(self.directory / self._prompts_name(task), "w") as handle:
                json.dump({"task": task, "prompts": self.prompts[task]}, handle, ensure_ascii=False)
        for old in self.directory.iterdir():
            if old.name not in self.used and old.is_file():
                old.unlink()

    @staticmethod
    def _prompts_name(task: str) -> str:
        return f"prompts-{hashlib.blake2b(task.encode(), digest_size=8).hexdigest()}.json"
