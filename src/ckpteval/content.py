"""Content identities of the files a setting names (a base model, replay files, lm-eval task
YAMLs): hashes of names and bytes, never paths, so a moved project reruns nothing.

An identity (ckpteval.contract) must not hold a path: a project copied or moved to another disk,
or checkpoints mounted elsewhere, would rerun everything although no byte changed. A setting
that names files (`runs.*.base_model`, `runs.*.solutions`, `lm_eval.include_paths`) enters its
identities as `sha256:<16 hex>` of the files' names (relative to what the setting names) and
bytes instead, computed here.

A 7B base model is ~15 GB: hashing it at every parse would cost a minute. So a file of more than
`ALWAYS_HASH_BYTES` is hashed once and then known by (setting, relative name, size, mtime_ns),
a memo kept in `<outdir>/sources/content.json`. `cp -a`, `rsync -a` and `mv` keep size and mtime,
so a moved project hashes nothing again; a file rewritten in place gets a new mtime and is hashed
again. Small files (config, tokenizer, templates) are hashed at every parse: an edit of one byte
of them is seen even if its mtime was restored. The memo is only written where `outdir` already
exists, so a `ckpteval check` of a new project leaves no file behind.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ckpteval.io import sha256_file, sha256_json, write_json
from ckpteval.plan.layout import Layout

#: Files up to this size are hashed at every parse; larger ones once per (size, mtime_ns).
ALWAYS_HASH_BYTES = 1 << 20


def content_id(files: dict[str, str]) -> str:
    """The identity value of a set of files: relative name -> sha256, as `sha256:<16 hex>`."""
    return f"sha256:{sha256_json(files)[:16]}"


class ContentIds:
    """Content hashes of files, memoized per parse and (large files) across parses."""

    def __init__(self, outdir: str | os.PathLike[str]) -> None:
        self.memo_path = Path(Layout(os.fspath(outdir)).content_memo())
        self._memo: dict[str, dict[str, dict[str, Any]]] | None = None
        self._ids: dict[tuple[str, str], str] = {}
        self._dirty = False

    def of_files(self, scope: str, root: Path, files: Iterable[Path]) -> str:
        """The content id of `files` (under `root`, named relative to it), memoized by `scope`
        (the setting, e.g. `runs.demo.base_model`) for this parse and in the memo file."""
        files = sorted(set(files))
        key = (scope, json.dumps([str(root), [str(f) for f in files]]))
        if key not in self._ids:
            memo = self._load().setdefault(scope, {})
            shas = {_rel(f, root): self._sha(memo, f, _rel(f, root)) for f in files}
            self._ids[key] = content_id(shas)
            self._save()
        return self._ids[key]

    def _sha(self, memo: dict[str, dict[str, Any]], path: Path, rel: str) -> str:
        st = path.stat()
        stat = [st.st_size, st.st_mtime_ns]
        entry = memo.get(rel)
        if st.st_size > ALWAYS_HASH_BYTES and entry and entry.get("stat") == stat:
            return str(entry["sha256"])
        sha = sha256_file(path)
        if st.st_size > ALWAYS_HASH_BYTES:
            memo[rel] = {"stat": stat, "sha256": sha}
            self._dirty = True
        return sha

    def _load(self) -> dict[str, dict[str, dict[str, Any]]]:
        if self._memo is None:
            try:
                data = json.loads(self.memo_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                data = {}
            self._memo = data if isinstance(data, dict) else {}
        return self._memo

    def _save(self) -> None:
        """Write the memo when it learnt a hash and `outdir` exists (a cache: a lost write only
        costs a hash at the next parse)."""
        if not self._dirty or not self.memo_path.parent.parent.is_dir():
            return
        try:
            write_json(self.memo_path, self._memo)
        except OSError:
            return
        self._dirty = False


def _rel(path: Path, root: Path) -> str:
    """A file's name in an identity: relative to what the setting names (`.`: that file)."""
    return "." if path == root else str(path.relative_to(root))


def model_files(model_dir: Path) -> list[Path]:
    """The files of a Hugging Face model directory that the consolidation and transformers read:
    every file directly in it (config, tokenizer, chat template, weight shards and their index)
    and those of its `additional_chat_templates/`. Hidden files and other subdirectories (a
    hub download's `.cache/`, Llama's `original/` weights) are not read, and not hashed."""
    from ckpteval.consolidate import TEMPLATE_DIR

    top = [p for p in model_dir.iterdir() if p.is_file() and not p.name.startswith(".")]
    extra = model_dir / TEMPLATE_DIR
    more = [p for p in extra.rglob("*") if p.is_file()] if extra.is_dir() else []
    return [*top, *more]


def task_yaml_files(include_path: Path) -> list[Path]:
    """What lm-eval reads of an include path: its task YAMLs and the Python files they name
    (`!function utils.x`), found recursively like lm-eval's TaskManager; a file is itself."""
    if include_path.is_file():
        return [include_path]
    if not include_path.is_dir():
        return []
    return [
        p
        for p in include_path.rglob("*")
        if p.is_file() and p.suffix in (".yaml", ".yml", ".py") and "__pycache__" not in p.parts
    ]
