"""Find a training run's checkpoints on disk and order them by step.

Discovery happens when the Snakefile is parsed (not in a Snakemake `checkpoint` rule), so `-n`,
`--dag` and target-file reruns see every job, and checkpoints written since the last invocation
are picked up by simply running again. A directory counts only once it looks completely written:
a configured marker file, or otherwise the format's own completeness rule, so a checkpoint that a
trainer is still writing is skipped until a later invocation.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from ckpteval.errors import UserError


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a run: `name` is the directory name and the `{ckpt}` wildcard value."""

    name: str
    step: int
    path: Path
    is_base: bool = False


#: A bare file in a run directory is a checkpoint when it is one of these (`torch.save` files).
BARE_FILE_SUFFIXES = (".pt", ".pth", ".bin")


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """`step_{step}` -> a regex matching `step_120` with the step as group 1."""
    if pattern.count("{step}") != 1:
        raise UserError(f"checkpoint pattern {pattern!r} must contain {{step}} exactly once")
    head, tail = pattern.split("{step}")
    return re.compile(re.escape(head) + r"(\d+)" + re.escape(tail) + r"\Z")


def discover_checkpoints(
    run_dir: Path, patterns: list[str], *, marker: str | None = None
) -> list[Checkpoint]:
    """Complete checkpoints directly below `run_dir`, ordered by step.

    A checkpoint is a directory whose name matches a pattern, or a bare `torch.save` file
    (`step_5.pt`, `.pth`, `.bin`) whose name without the suffix does; the file's checkpoint is
    named without it. A directory is complete when its `marker` exists, or else by its format's
    rules; a bare file always by its format's (a zip save has its end record). Two checkpoints
    with the same step (e.g. `step_5` and `checkpoint-5`) are ambiguous and refused.
    """
    regexes = [pattern_regex(p) for p in patterns]
    found: dict[int, Checkpoint] = {}
    for child in sorted(run_dir.iterdir()):
        if child.name.startswith("."):
            continue
        if child.is_dir():
            name = child.name
        elif child.is_file() and child.suffix in BARE_FILE_SUFFIXES:
            name = child.name[: -len(child.suffix)]
        else:
            continue
        match = next((m for rx in regexes if (m := rx.match(name))), None)
        if match is None:
            continue
        complete = (child / marker).exists() if marker and child.is_dir() else is_complete(child)
        if not complete:
            continue
        step = int(match.group(1))
        if step in found:
            raise UserError(
                f"{run_dir}: {found[step].path.name} and {child.name} are both step {step}; "
                "keep one or narrow runs.<run>.patterns"
            )
        found[step] = Checkpoint(name, step, child)
    return [found[s] for s in sorted(found)]


def is_complete(path: Path) -> bool:
    """Whether a checkpoint directory looks fully written, by the rules of its format."""
    from ckpteval.formats import is_complete as format_is_complete

    return format_is_complete(path)


def checkpoint_fingerprint(path: Path) -> str:
    """A cheap digest of a checkpoint's files (relative name, size, mtime), read without opening them.

    It changes when a trainer rewrites weights in place, so the consolidate rule can rerun (and the
    weights hash decide what else must); it is blind to a directory's own mtime.
    """
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        st = f.stat()
        digest.update(f"{f.relative_to(path) if f != path else f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]
