"""Atomic file writes, JSONL reading and appending, content hashes, and pools of lock files.

Every output of the workflow is written to a temporary name in the same directory and renamed when
complete, so a killed job never leaves a file that looks finished.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

from ckpteval.errors import UserError

T = TypeVar("T")

_UMASK = os.umask(0)
os.umask(_UMASK)


def user_cache_dir() -> Path:
    """Where ckpteval keeps what it can compute again (lm-eval's task indexes, model classes'
    tensor lists): `$XDG_CACHE_HOME/ckpteval`, else `~/.cache/ckpteval`."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ckpteval"


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike[str], mode: str = "w", durable: bool = True
) -> Iterator[IO[Any]]:
    """Open a temp file beside `path`; rename it over `path` only if the block completes.

    Temp files of `path` that a killed writer left behind are removed first: one job writes a
    given output at a time, so an older temp file of the same name can only be debris. With
    `durable`, the bytes are on disk before the rename; without, a crash of the machine may
    leave the file empty: only for files a reader checks and writes again (a per-parse cache
    such as a checkpoint's source identity), where an fsync per file is a second on a shared
    filesystem for a thousand checkpoints.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs are shared like any other file
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _remove_stale_temps(path: Path) -> None:
    """Remove `path`'s temp files (`.<name>.XXXXXXXX.tmp`, mkstemp's 8 random characters) in
    one listing of its directory (a pathlib glob per write made a directory of n files cost
    n^2 / 2 pattern matches to fill)."""
    prefix, size = f".{path.name}.", len(path.name) + 14
    with os.scandir(path.parent) as entries:
        stale = [
            e.path
            for e in entries
            if len(e.name) == size and e.name.startswith(prefix) and e.name.endswith(".tmp")
        ]
    for name in stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def write_json(path: str | os.PathLike[str], obj: Any, durable: bool = True) -> None:
    """Write `obj` as indented JSON, atomically (`durable`: see `atomic_open`)."""
    with atomic_open(path, durable=durable) as handle:
        json.dump(obj, handle, indent=2, sort_keys=True, default=_jsonable)
        handle.write("\n")


def write_jsonl(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> int:
    """Write one JSON object per line, atomically; returns the number of lines."""
    count = 0
    with atomic_open(path) as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False, default=_jsonable) + "\n")
            count += 1
    return count


def append_jsonl(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> None:
    """Append lines and fsync: a crash loses at most a torn last line, which readers skip."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r, ensure_ascii=False, default=_jsonable) + "\n" for r in rows)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def read_meta(path: Path) -> dict[str, Any]:
    """A JSON record a job may find missing (meta, manifest, failure note): {} when absent."""
    return read_json(path) if path.exists() else {}


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file; a missing or malformed file is a `UserError` naming it."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None


def json_or_none(path: str | os.PathLike[str]) -> Any:
    """The JSON of a file, or None if it cannot be read or parsed: what planning and `ckpteval
    status` ask of each cell's meta and score file, 40,000 reads at 1,000 checkpoints x 20 cells.
    The bytes come from `os.read`, not a Python file object: `open()` builds three objects per
    file and asks whether it is a terminal, which cost more than the read and the parse of a
    small record."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:  # decoded here: json.loads of bytes first guesses their encoding
        return json.loads(b"".join(chunks).decode("utf-8"))
    except ValueError:  # malformed JSON or bytes that are no UTF-8 text
        return None


def iter_jsonl(
    path: str | os.PathLike[str], *, errors: list[str] | None = None
) -> Iterator[dict[str, Any]]:
    """Yield the JSON objects of a JSONL file, one per non-blank line.

    With `errors` given, a malformed line (bad JSON, not an object, not UTF-8) is described there as
    `file:line: problem` and skipped; without it, the first one raises a `UserError`.
    """
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    with handle:
        for lineno, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
                if not isinstance(row, dict):
                    raise ValueError("expected a JSON object")
            except (UnicodeDecodeError, ValueError) as exc:
                message = f"{path}:{lineno}: malformed line ({type(exc).__name__}: {exc})"
                if errors is None:
                    raise UserError(message) from None
                errors.append(message)
                continue
            yield row


def sha256_file(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, streamed."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def canonical_json(obj: Any) -> str:
    """An object's canonical JSON (sorted keys, no spaces): equal texts, equal `sha256_json`."""
    return _CANONICAL.encode(obj)


def sha256_json(obj: Any) -> str:
    """Hex SHA-256 of an object's canonical JSON: the key of anything content-addressed."""
    return hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()


def _jsonable(obj: Any) -> Any:
    """Turn numpy scalars, paths and dataclasses into JSON-native values."""
    if hasattr(obj, "item") and callable(obj.item):
        return obj.item()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if hasattr(obj, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


#: One encoder for every canonical text: `json.dumps` with options builds one per call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=_jsonable)


def first_free_lock(pool: Iterable[tuple[T, Path]], mode: int) -> tuple[T, int] | None:
    """The first (item, lock file) of `pool` whose file no process holds, with an exclusive
    `flock` taken on it: (item, fd); closing `fd`, or the holder's death, frees it. None when all
    are held. Lock files are created with `mode`."""
    for item, path in pool:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return item, fd
    return None
