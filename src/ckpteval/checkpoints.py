"""Find a training run's checkpoints on disk and order them by step.

Discovery happens when the Snakefile is parsed (not in a Snakemake `checkpoint` rule), so `-n`,
`--dag` and target-file reruns see every job, and checkpoints written since the last invocation
are picked up by simply running again. A directory counts only once it looks completely written:
a configured marker file, or otherwise the format's own completeness rule, so a checkpoint that a
trainer is still writing is skipped until a later invocation.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ckpteval.errors import UserError
from ckpteval.io import sha256_file, sha256_json, write_json


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a run: `name` is the directory name and the `{ckpt}` wildcard value."""

    name: str
    step: int
    path: Path
    is_base: bool = False
    #: Its source is gone (a trainer's `save_total_limit`), its results are still on disk.
    deleted: bool = False
    #: A final checkpoint named without a step (`final`, `last`, `{run_name}_final`): placed one
    #: step after the last numbered checkpoint and labelled "final" in tables and plots.
    final: bool = False
    #: On S3 (`runs.<name>.path: s3://...`): the checkpoint's URL, and the objects consolidation
    #: reads (ckpteval.s3); `path` is then where Snakemake's S3 storage puts their local copies.
    url: str | None = None
    objects: tuple[Any, ...] = ()


#: A bare file in a run directory is a checkpoint when it is one of these (`torch.save` files).
BARE_FILE_SUFFIXES = (".pt", ".pth", ".bin")


def _glob(text: str) -> str:
    """`text` as a regex in which `*` stands for any non-empty name (a run name)."""
    return re.escape(text).replace(r"\*", ".+?")


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """`step_{step}` -> a regex matching `step_120` with the step as group 1; `*` matches any
    non-empty text (`*_step{step}` finds `myrun_step100`)."""
    if pattern.count("{step}") != 1:
        raise UserError(f"checkpoint pattern {pattern!r} must contain {{step}} exactly once")
    head, tail = pattern.split("{step}")
    return re.compile(_glob(head) + r"(\d+)" + _glob(tail) + r"\Z")


def _entry_name(child: Path) -> str | None:
    """The checkpoint name of a run directory entry: a directory's name, a bare `torch.save`
    file's name without its suffix; None for anything else."""
    if child.name.startswith("."):
        return None
    if child.is_dir():
        return child.name
    if child.is_file() and child.suffix in BARE_FILE_SUFFIXES:
        return child.name[: -len(child.suffix)]
    return None


def _name(child: Path) -> str:
    """A run directory's entries sort by name: the order of sorting the paths themselves (one
    parent), without pathlib's comparison per pair (~0.1 s at 1,000 checkpoints, every parse)."""
    return child.name


def _final_candidates(run_dir: Path, names: list[str]) -> Iterator[tuple[Path, str]]:
    """(path, name) of every entry named as a final checkpoint (`final`, `*_final`, ...)."""
    regexes = [re.compile(_glob(n) + r"\Z") for n in names]
    for child in sorted(run_dir.iterdir(), key=_name):
        name = _entry_name(child)
        if name is not None and any(rx.match(name) for rx in regexes):
            yield child, name


def _candidates(run_dir: Path, patterns: list[str]) -> Iterator[tuple[Path, str, int]]:
    """(path, checkpoint name, step) of every entry of `run_dir` a pattern matches."""
    regexes = [pattern_regex(p) for p in patterns]
    for child in sorted(run_dir.iterdir(), key=_name):
        name = _entry_name(child)
        if name is None:
            continue
        match = next((m for rx in regexes if (m := rx.match(name))), None)
        if match is not None:
            yield child, name, int(match.group(1))


def _complete(child: Path, marker: str | None) -> bool:
    return (child / marker).exists() if marker and child.is_dir() else is_complete(child)


def discover_checkpoints(
    run_dir: Path,
    patterns: list[str],
    *,
    marker: str | None = None,
    final_names: list[str] | tuple[str, ...] = (),
) -> list[Checkpoint]:
    """Complete checkpoints directly below `run_dir`, ordered by step.

    A checkpoint is a directory whose name matches a pattern, or a bare `torch.save` file
    (`step_5.pt`, `.pth`, `.bin`) whose name without the suffix does; the file's checkpoint is
    named without it. A directory is complete when its `marker` exists, or else by its format's
    rules; a bare file always by its format's (a zip save has its end record). Two checkpoints
    with the same step (e.g. `step_5` and `checkpoint-5`) are ambiguous and refused.

    An entry named as in `final_names` (`final`, `last`, `*_final`; no step in its name) is the
    run's final checkpoint: ordered last, at one step past the last numbered checkpoint (a
    numbered checkpoint written later moves it along). Two final checkpoints are refused.
    """
    found: dict[int, Checkpoint] = {}
    for child, name, step in _candidates(run_dir, patterns):
        if not _complete(child, marker):
            continue
        if step in found:
            raise UserError(
                f"{run_dir}: {found[step].path.name} and {child.name} are both step {step}; "
                "keep one or narrow runs.<run>.patterns"
            )
        found[step] = Checkpoint(name, step, child)
    numbered = [found[s] for s in sorted(found)]
    finals = [
        (child, name)
        for child, name in _final_candidates(run_dir, list(final_names))
        if name not in {c.name for c in numbered} and _complete(child, marker)
    ]
    if len(finals) > 1:
        raise UserError(
            f"{run_dir}: {finals[0][0].name} and {finals[1][0].name} are both a final checkpoint; "
            "keep one or narrow runs.<run>.final_names"
        )
    last = numbered[-1].step if numbered else 0
    return numbered + [Checkpoint(name, last + 1, child, final=True) for child, name in finals]


def discover_s3(
    url: str,
    patterns: list[str],
    *,
    where: str,
    marker: str | None = None,
    final_names: list[str] | tuple[str, ...] = (),
) -> tuple[list[Checkpoint], list[Unfinished]]:
    """Checkpoints under an `s3://` prefix, from its object listing alone (ckpteval.s3): those
    completely uploaded, ordered as `discover_checkpoints` orders them, and those still waiting
    for objects (a missing shard, a trainer's marker), with what they wait for."""
    from ckpteval import s3

    regexes = [pattern_regex(p) for p in patterns]
    final_rx = [re.compile(_glob(n) + r"\Z") for n in final_names]
    found: dict[int, Checkpoint] = {}
    finals: list[Checkpoint] = []
    waiting: list[Unfinished] = []
    for entry in s3.entries(url, where):
        match = next((m for rx in regexes if (m := rx.match(entry.name))), None)
        is_final = match is None and any(rx.match(entry.name) for rx in final_rx)
        if match is None and not is_final:
            continue
        local = s3.local_path(entry.url)
        missing = s3.waiting_for(entry, marker)
        if missing is not None:
            waiting.append(Unfinished(entry.name, local, entry.idle_seconds(), missing, missing))
            continue
        ckpt = Checkpoint(
            entry.name,
            int(match.group(1)) if match else 0,
            local,
            url=entry.url,
            objects=entry.needed(),
            final=is_final,
        )
        if is_final:
            finals.append(ckpt)
        elif ckpt.step in found:
            raise UserError(
                f"{url}: {found[ckpt.step].name} and {entry.name} are both step {ckpt.step}; "
                "keep one or narrow runs.<run>.patterns"
            )
        else:
            found[ckpt.step] = ckpt
    if len(finals) > 1:
        raise UserError(
            f"{url}: {finals[0].name} and {finals[1].name} are both a final checkpoint; "
            "keep one or narrow runs.<run>.final_names"
        )
    numbered = [found[s] for s in sorted(found)]
    last = numbered[-1].step if numbered else 0
    return numbered + [replace(f, step=last + 1) for f in finals], waiting


def deleted_checkpoints(
    models_dir: Path, run_dir: Path, present: set[str], patterns: list[str]
) -> list[Checkpoint]:
    """Checkpoints consolidated earlier (a manifest under `models_dir`) that are no longer in
    `run_dir` and which discovery no longer lists: their results stay in the summary, marked.

    Looked up in the run's directory by the recorded source's name, not at the recorded path:
    a copied project's manifests still name the original's checkpoints, which may well exist."""
    if not models_dir.is_dir():
        return []
    regexes = [pattern_regex(p) for p in patterns]
    out = []
    for manifest in sorted(models_dir.glob("*.json")):
        name = manifest.stem
        if name in present:
            continue
        try:
            recorded = json.loads(manifest.read_text(encoding="utf-8"))
            source = recorded.get("local_copy") or recorded.get("source")
        except (OSError, ValueError, AttributeError):
            continue
        match = next((m for rx in regexes if (m := rx.match(name))), None)
        if not source or (run_dir / Path(source).name).exists() or match is None:
            continue
        out.append(Checkpoint(name, int(match.group(1)), Path(source), deleted=True))
    return sorted(out, key=lambda c: c.step)


@dataclass(frozen=True)
class Unfinished:
    """A checkpoint that does not look completely written: still being written, or broken."""

    name: str
    path: Path
    #: Seconds since any of its files last changed.
    idle_seconds: float
    problem: str
    #: How far the writing got, for a user ("shard 2 of 2 as .tmp"); "" when nothing is known.
    progress: str = ""

    def waiting_line(self, *, age: bool = True) -> str:
        """`waiting: being written (shard 2 of 2 as .tmp, last change 3 s ago)`; without `age`
        (a job's params, which must not change by the second) only what is missing."""
        parts = [self.progress] if self.progress else []
        if age:
            parts.append(f"last change {self.idle_seconds:.0f} s ago")
        return "waiting: being written" + (f" ({', '.join(parts)})" if parts else "")


def unfinished_checkpoints(
    run_dir: Path,
    patterns: list[str],
    *,
    marker: str | None = None,
    final_names: list[str] | tuple[str, ...] = (),
) -> list[Unfinished]:
    """The entries `discover_checkpoints` skips as not completely written, with what is wrong
    (a truncated tensor file, a missing shard, no marker) and how long they have been idle:
    one that stays so past `runs.<name>.settle_seconds` is broken, not still being written."""
    import time

    out = []
    entries = [(child, name) for child, name, _ in _candidates(run_dir, patterns)]
    entries += list(_final_candidates(run_dir, list(final_names)))
    for child, name in dict.fromkeys(entries):
        if _complete(child, marker):
            continue
        files = [child] if child.is_file() else [child, *child.rglob("*")]
        newest = max((f.stat().st_mtime for f in files if f.exists()), default=0.0)
        idle = max(0.0, time.time() - newest)
        out.append(Unfinished(name, child, idle, _problem(child, marker), writing_progress(child)))
    return out


#: Suffixes of files a writer renames into place once complete (`model.safetensors.tmp`).
TMP_SUFFIXES = (".tmp", ".part", ".partial")


def _tmp_of(path: Path, name: str) -> bool:
    return any((path / f"{name}{suffix}").exists() for suffix in TMP_SUFFIXES)


def writing_progress(path: Path) -> str:
    """How far a checkpoint being written got: the first shard not yet complete out of how many
    (`shard 2 of 2 as .tmp`, `... partly written`, `... not there yet`) when its format names
    its shards (verl rank shards, DeepSpeed's rank files, an HF index), else the files still
    under a temporary name."""
    from ckpteval.formats import deepspeed, verl
    from ckpteval.formats.hf import expected_shards

    if not path.is_dir():
        return ""
    shards: list[tuple[str, bool]] = []
    if verl.detect(path):
        _, expected, pending = verl.pending_shards(path)
        actor = verl.actor_dir(path) or path
        for rank in range(expected):
            name = f"model_world_size_{expected}_rank_{rank}.pt"
            shards.append((str((actor / name).relative_to(path)), name not in pending))
    elif deepspeed.detect(path):
        shards = deepspeed.expected_files(path)
    else:
        shards = expected_shards(path)
    for i, (name, complete) in enumerate(shards):
        if complete:
            continue
        how = (
            "as .tmp"
            if _tmp_of(path, name)
            else "partly written"
            if (path / name).exists()
            else "not there yet"
        )
        return f"shard {i + 1} of {len(shards)} {how}"
    tmp = sorted(str(f.relative_to(path)) for f in path.rglob("*") if f.name.endswith(TMP_SUFFIXES))
    if tmp:
        return f"{tmp[0]} as .tmp" + (f" (+{len(tmp) - 1} more)" if len(tmp) > 1 else "")
    if deepspeed.detect(path):
        return deepspeed.pending_marker(path)
    return verl.pending_marker(path) if verl.detect(path) else ""


def _problem(path: Path, marker: str | None) -> str:
    """One line: why `path` does not count as a complete checkpoint."""
    from ckpteval.formats import detect_format, get_format

    if marker and path.is_dir():
        return f"no {marker} file (runs.<name>.complete_marker)"
    try:
        fmt = get_format(detect_format(path))
        fmt.open(path, None, "bfloat16")
    except UserError as exc:
        return str(exc).splitlines()[0]
    except Exception as exc:  # noqa: BLE001 - a broken file may fail any way; say how
        return f"{path}: unreadable ({type(exc).__name__}: {exc})"
    return f"{path}: incomplete {fmt.name} checkpoint (needs {fmt.markers})"


def is_complete(path: Path) -> bool:
    """Whether a checkpoint directory looks fully written, by the rules of its format."""
    from ckpteval.formats import is_complete as format_is_complete

    return format_is_complete(path)


def source_files(path: Path) -> dict[str, os.stat_result]:
    """A checkpoint's files (relative name -> stat); a bare checkpoint file is its own name.

    Of a verl checkpoint only what consolidation reads (the actor's model shards,
    `fsdp_config.json`, `huggingface/`): its optimizer and extra-state shards and a critic are
    several times the model's size, and hashing them would say nothing about the model."""
    from ckpteval.formats import verl

    if path.is_file():
        return {path.name: path.stat()}
    files = sorted(f for f in path.rglob("*") if f.is_file())
    if verl.detect(path):
        files = [f for f in files if verl.model_file(path, f)]
    return {str(f.relative_to(path)): f.stat() for f in files}


def _stat_key(st: os.stat_result) -> list[int]:
    """What says a file is the one hashed before: its size and modification time, which `cp -a`,
    `rsync -a` and `mv` keep (a moved or copied project hashes nothing again), and any rewrite
    changes. Not the inode, which every copy changes. (Records of older versions also hold the
    inode as a third entry: only the first two are compared.)"""
    return [st.st_size, st.st_mtime_ns]


def hash_source(path: Path) -> dict[str, dict[str, Any]]:
    """What the consolidate job records of its source: each file's stat and content hash."""
    files = source_files(path)
    root = path if path.is_dir() else path.parent
    return {
        rel: {"stat": _stat_key(st), "sha256": sha256_file(root / rel)} for rel, st in files.items()
    }


def sync_source_identity(path: Path, id_file: Path, manifest: Path) -> str:
    """Keep `id_file` (the consolidate rule's input) describing the content of checkpoint `path`,
    with a modification time that says whether that content is what was consolidated: older
    than `manifest` when the checkpoint's bytes are those the consolidate job recorded (its
    `source_files`: size, mtime and sha256 per file), newer otherwise. So a touched or copied
    file (hashed again, once) reruns nothing, and neither does restoring the original bytes; new
    bytes, or files added or removed, rerun the checkpoint's chain. A file with its recorded size
    and mtime (`cp -a`, `mv`, a mount elsewhere) is not hashed again.

    Returns "same" (the consolidated content), "changed", or "unknown" (files never hashed: a
    checkpoint not consolidated yet, whose job runs anyway).
    """

    current = source_files(path)
    root = path if path.is_dir() else path.parent
    old = _read_id(id_file)
    recorded = _read_id(manifest).get("source_files") or {}
    known: dict[str, dict[tuple[int, ...], str]] = {}
    for source in (recorded, old.get("files", {})):
        for rel, entry in source.items():
            if entry.get("sha256"):
                known.setdefault(rel, {})[tuple(entry["stat"][:2])] = entry["sha256"]
    files: dict[str, dict[str, Any]] = {}
    for rel, st in current.items():
        stat = _stat_key(st)
        sha = known.get(rel, {}).get(tuple(stat))
        if sha is None and rel in known:  # touched, copied or rewritten: look at the bytes
            sha = sha256_file(root / rel)
        files[rel] = {"stat": stat, "sha256": sha}
    content = _content(files)
    if (
        old.get("files") != files
        or old.get("content") != content
        or old.get("source") != str(path)
        or not id_file.exists()
    ):
        write_json(
            id_file, {"source": str(path), "content": content, "files": files}, durable=False
        )
    consolidated = _content(recorded) if recorded else None
    status = "unknown" if content is None else "same" if content == consolidated else "changed"
    _settle_mtime(status, id_file, manifest)
    return status


def sync_s3_identity(ckpt: Checkpoint, id_file: Path, manifest: Path) -> str:
    """`sync_source_identity` for a checkpoint on S3: its content is the listing of the objects
    consolidation reads (name, size, ETag; ckpteval.s3), nothing is downloaded. A copy
    re-uploaded, or moved to another prefix or bucket, with the same objects is the same content.
    The consolidate job records the same entries as its manifest's `source_files`."""
    files = {o.rel: {"size": o.size, "etag": o.etag} for o in ckpt.objects}
    content = sha256_json(files)
    old = _read_id(id_file)
    if old.get("content") != content or old.get("source") != ckpt.url or not id_file.exists():
        write_json(
            id_file,
            {"source": ckpt.url, "s3": True, "content": content, "files": files},
            durable=False,
        )
    recorded = _read_id(manifest).get("source_files") or {}
    status = "same" if recorded and sha256_json(recorded) == content else "changed"
    if not manifest.exists():
        status = "unknown"
    _settle_mtime(status, id_file, manifest)
    return status


def settle_s3_identity(id_file: Path, manifest: Path) -> None:
    """After a consolidate job: the identity file is what it consolidated (older than the
    manifest), as the next parse would leave it."""
    _settle_mtime("same", id_file, manifest)


def _settle_mtime(status: str, id_file: Path, manifest: Path) -> None:
    """Make `id_file` older than `manifest` when the content is the consolidated one, else
    newer (Snakemake's mtime trigger then reruns the consolidate job)."""
    import time

    if manifest.exists():
        built, mtime = manifest.stat().st_mtime_ns, id_file.stat().st_mtime_ns
        if status == "same" and mtime >= built:
            os.utime(id_file, ns=(built - 1_000_000, built - 1_000_000))
        elif status != "same" and mtime <= built:
            now = max(time.time_ns(), built + 1_000_000)
            os.utime(id_file, ns=(now, now))


def _content(files: dict[str, Any]) -> str | None:
    """The content hash of per-file entries (`{rel: {"sha256": ...}}`), None if one is unknown."""
    shas = {rel: entry.get("sha256") for rel, entry in files.items()}
    return sha256_json(shas) if all(shas.values()) else None


def _read_id(id_file: Path) -> dict[str, Any]:
    try:
        data = json.loads(id_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
