"""Bad inputs, generated: every config, task file and solution file ends in one clear line naming
the file or key, or is scored with its bad lines reported; never a traceback, never a silent zero.

Hypothesis mutates a valid config (wrong types, unknown keys, deleted keys, missing runs, invalid
names and checkpoint patterns, broken YAML) and writes JSONL files line by line from a menu of
good and bad lines (malformed JSON, not an object, missing or mistyped fields, duplicate ids,
non-UTF-8 bytes, blank lines, huge lines, empty files). Each case goes through the user's entry
point in-process: `ckpteval check`, `ckpteval score`, and the replay backend that turns solution
files into generation files; a few config mistakes also go through real Snakemake.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import run_snakemake, write_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpteval.backends.replay import replay_solutions
from ckpteval.checkers import MAX_COMPLETION_CHARS
from ckpteval.cli import main
from ckpteval.errors import UserError
from ckpteval.tasks import resolve_task

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ckpteval-fuzz-") as tmp:
        yield Path(tmp)


def _cli(*argv: str) -> tuple[int, str, str]:
    """`ckpteval ...` in-process: (exit status, stdout, stderr). A traceback would escape here."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("ckpteval: error: ") and "Traceback" not in err, err
    return lines[0]


# -------------------------------------------------------------------------------------- configs

BASE_CONFIG: dict[str, Any] = {
    "runs": {"demo": {"path": "run", "patterns": ["step_{step}"], "format": "auto"}},
    "tasks": {"arith": {}, "pyfunc": {"limit": 2, "sampling": ["greedy"]}},
    "sampling": {"greedy": {"temperature": 0.0, "max_new_tokens": 32, "n": 1}},
    "seeds": [42],
    "engine": {"gpu_memory_utilization": 0.2, "enforce_eager": True, "tensor_parallel_size": 1},
    "consolidate": {"smoke": "transformers", "dtype": "bfloat16"},
    "evaluate": {"workers": 2, "timeout": 5, "sandbox": "bwrap", "ks": [1]},
    "aggregate": {"title": "fuzz", "bootstrap": 10},
    "outdir": "results",
}


def _paths(node: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*prefix, key)
            yield from _paths(value, (*prefix, key))


def _get(node: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        node = node[key]
    return node


KEY_PATHS = sorted(_paths(BASE_CONFIG))
MAPPINGS = [(), *(p for p in KEY_PATHS if isinstance(_get(BASE_CONFIG, p), dict))]

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(min_size=1, max_size=5), st.integers(), max_size=2),
)
names = st.one_of(
    st.sampled_from(["", "-lead", "a/b", "has space", "ünï", "x" * 300, ".hidden"]),
    st.text(min_size=1, max_size=12),
)
patterns = st.lists(
    st.one_of(
        st.sampled_from(
            ["step_{step}", "{step}{step}", "ckpt", "{stepp}", "global_step{step}/x", "{step"]
        ),
        st.text(max_size=12),
    ),
    min_size=0,
    max_size=3,
)


@st.composite
def mutations(draw: st.DrawFn) -> tuple[str, tuple[str, ...], Any]:
    """(kind, path, value): one mistake made to the base config."""
    kind = draw(st.sampled_from(["set", "delete", "unknown_key", "rename", "patterns", "task"]))
    if kind == "set":
        return kind, draw(st.sampled_from(KEY_PATHS)), draw(junk)
    if kind == "delete":
        return kind, draw(st.sampled_from(KEY_PATHS)), None
    if kind == "unknown_key":
        key = draw(st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=2, max_size=10))
        return kind, draw(st.sampled_from(MAPPINGS)), key
    if kind == "rename":
        return kind, draw(st.sampled_from([("runs",), ("tasks",), ("sampling",)])), draw(names)
    if kind == "patterns":
        return kind, ("runs", "demo", "patterns"), draw(patterns)
    return (
        kind,
        ("tasks",),
        draw(st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=2, max_size=12)),
    )


def _mutate(config: dict[str, Any], kind: str, path: tuple[str, ...], value: Any) -> str:
    """Apply one mutation; returns a word the error line must contain to name the culprit."""
    if kind in ("set", "patterns"):
        _get(config, path[:-1])[path[-1]] = value
        return path[-1]
    if kind == "delete":
        del _get(config, path[:-1])[path[-1]]
        return path[-1]
    if kind == "unknown_key":
        key = value if value not in _get(config, path) else value + "_x"
        _get(config, path)[key] = 1
        return key
    if kind == "rename":
        mapping = _get(config, path)
        old = next(iter(mapping))
        mapping[value] = mapping.pop(old)
        if path == ("sampling",):  # what refers to the old name must follow, or that is the error
            config["tasks"]["pyfunc"]["sampling"] = [value]
        return path[0]
    config["tasks"][value] = {}
    return value


def _run_dir(base: Path) -> None:
    (base / "run" / "step_5").mkdir(parents=True)  # not a complete checkpoint: discovered as none


@settings(FUZZ, max_examples=80)
@given(mutation=mutations())
def test_a_config_mistake_is_one_line_naming_the_key(
    mutation: tuple[str, tuple[str, ...], Any],
) -> None:
    kind, path, value = mutation
    config = copy.deepcopy(BASE_CONFIG)
    culprit = _mutate(config, kind, path, value)
    with _workdir() as work, contextlib.chdir(work):
        _run_dir(work)
        (work / "config.yaml").write_text(yaml.safe_dump(config, allow_unicode=True))
        status, out, err = _cli("check", "--configfile", "config.yaml")
    if status == 0:
        assert "cells (checkpoint x task x variant)" in out and not err
        return
    assert status == 2, err
    line = _one_error_line(err)
    # Names the key (or, for a checkpoint pattern, the offending pattern itself).
    words = [culprit, *path, *(value if kind == "patterns" else [])]
    assert any(str(word)[:40] in line for word in words), (mutation, line)


@pytest.mark.parametrize(
    "tasks", [["arith"], "arith", 3, True], ids=["list", "string", "number", "true"]
)
def test_tasks_that_are_not_a_mapping_are_one_line(tasks: Any) -> None:
    config = {**copy.deepcopy(BASE_CONFIG), "tasks": tasks}
    with _workdir() as work, contextlib.chdir(work):
        _run_dir(work)
        (work / "config.yaml").write_text(yaml.safe_dump(config))
        status, _, err = _cli("check", "--configfile", "config.yaml")
    assert status == 2
    assert "config: tasks:" in _one_error_line(err)


@FUZZ
@given(
    text=st.one_of(
        st.text(max_size=200),
        st.sampled_from(
            [
                "runs: [1, 2\n",
                "runs: {a: 1}\n  b: 2\n",
                "- 1\n- 2\n",
                "42\n",
                "\t- x",
                "",
                "runs: !!python/object:os.system {}\n",
                "{1: 2, 3: 4}\n",
                "? [a]\n: b\n",
                "runs: &a {x: *a}\n",
                "\ufeffruns: {}\n",
            ]
        ),
    )
)
def test_a_broken_config_file_is_one_line_naming_it(text: str) -> None:
    with _workdir() as work, contextlib.chdir(work):
        (work / "broken.yaml").write_text(text, encoding="utf-8")
        status, _, err = _cli("check", "--configfile", "broken.yaml")
    assert status == 2, err
    line = _one_error_line(err)
    assert "broken.yaml" in line or line.startswith("ckpteval: error: config"), line


@pytest.mark.slow
@pytest.mark.parametrize(
    "mistake,expected",
    [
        (
            {"tasks": {"arith": {"limit": "ten"}}},
            r"config: tasks\.arith\.limit: 'ten' is not of type 'integer'",
        ),
        ({"evaluate": {"wrokers": 2}}, r"config: evaluate: .*'wrokers' is not a known key"),
        ({"runs": {}}, r"config: runs: \{\} should be non-empty"),
        (
            {"runs": {"demo": {"path": "run", "patterns": ["ckpt"]}}},
            r"config: runs\.demo\.patterns\.0: 'ckpt' must contain the placeholder \{step\}",
        ),
    ],
    ids=["wrong-type", "unknown-key", "no-runs", "pattern-without-step"],
)
def test_config_mistakes_through_snakemake_are_one_line(
    tmp_path: Path, mistake: dict[str, Any], expected: str
) -> None:
    _run_dir(tmp_path)
    config = copy.deepcopy(BASE_CONFIG)
    config["runs"]["demo"]["path"] = str(tmp_path / "run")
    config.update(mistake)
    write_config(tmp_path, config)
    proc = run_snakemake(tmp_path, "-n", timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in out, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("ckpteval: error:")]
    assert len(errors) == 1 and re.search(expected, errors[0]), out[-3000:]
    assert not (tmp_path / "results").exists()


# --------------------------------------------------------------------------- JSONL line menus


def _problem(i: int) -> dict[str, Any]:
    return {
        "task_id": f"p{i}",
        "question": f"What is {i} + 1?",
        "answer": f"{i} + 1 = {i + 1} #### {i + 1}",
    }


HUGE = "9" * (MAX_COMPLETION_CHARS + 10)


@st.composite
def sample_line(draw: st.DrawFn) -> tuple[str, bytes]:
    """(kind, raw line without newline). `good` lines must be scored; the rest reported."""
    i = draw(st.integers(0, 4))
    kind = draw(
        st.sampled_from(
            [
                "good",
                "good",
                "good",
                "malformed",
                "not_object",
                "no_task_id",
                "unknown_task",
                "completion_not_str",
                "non_utf8",
                "blank",
                "huge",
                "bad_sample_idx",
            ]
        )
    )
    row: Any = {
        "task_id": f"p{i}",
        "completion": draw(st.sampled_from([f"#### {i + 1}", f"#### {i}", "no idea"])),
    }
    if kind == "good":
        return kind, json.dumps(row).encode()
    if kind == "malformed":
        return kind, draw(
            st.sampled_from([b"{", b'{"task_id": "p1",', b"nan", b"{'single': 1}", b"\x00"])
        )
    if kind == "not_object":
        return kind, json.dumps(draw(st.sampled_from([[1, 2], "p1", 7, None]))).encode()
    if kind == "no_task_id":
        return kind, json.dumps({"completion": "#### 1"}).encode()
    if kind == "unknown_task":
        return kind, json.dumps({"task_id": "nope", "completion": "#### 1"}).encode()
    if kind == "completion_not_str":
        return kind, json.dumps(
            {"task_id": f"p{i}", "completion": draw(st.sampled_from([None, 5, ["#### 1"]]))}
        ).encode()
    if kind == "non_utf8":
        return kind, b'{"task_id": "p1", "completion": "\xff\xfe"}'
    if kind == "blank":
        return kind, draw(st.sampled_from([b"", b"   ", b"\t"]))
    if kind == "huge":
        return kind, json.dumps({"task_id": f"p{i}", "completion": HUGE}).encode()
    return kind, json.dumps({**row, "sample_idx": draw(st.sampled_from(["0", 1.5, True]))}).encode()


def _write_lines(path: Path, lines: list[tuple[str, bytes]], trailing_newline: bool) -> None:
    data = b"\n".join(raw for _, raw in lines)
    path.write_bytes(data + (b"\n" if trailing_newline and lines else b""))


@FUZZ
@given(lines=st.lists(sample_line(), max_size=12), trailing_newline=st.booleans())
def test_a_samples_file_is_scored_with_every_bad_line_reported(
    lines: list[tuple[str, bytes]], trailing_newline: bool
) -> None:
    with _workdir() as work:
        problems, samples, out = work / "problems.jsonl", work / "samples.jsonl", work / "out.jsonl"
        problems.write_text("".join(json.dumps(_problem(i)) + "\n" for i in range(5)))
        _write_lines(samples, lines, trailing_newline)
        status, stdout, err = _cli(
            "score",
            "gsm8k",
            "--problems",
            str(problems),
            "--samples",
            str(samples),
            "--out",
            str(out),
            "--workers",
            "1",
        )
        assert "Traceback" not in err
        content = [(n, kind) for n, (kind, _) in enumerate(lines, start=1) if kind != "blank"]
        if status != 0:
            assert status == 2, err
            line = _one_error_line(err)
            assert str(samples) in line, line
            assert not out.exists()
            return
        cell = json.loads(out.with_suffix(".json").read_text())
        scored = [json.loads(row) for row in out.read_text().splitlines()]
    assert cell["n_samples"] == len(scored) > 0  # never a silent zero: something was scored
    at_line = re.compile(re.escape(str(samples)) + r":(\d+): ")
    reported = {int(m.group(1)) for e in cell["input_errors"] if (m := at_line.match(e))}
    # Every line is either scored or reported by number; bad kinds are always reported.
    for number, kind in content:
        if kind not in ("good", "huge"):
            assert number in reported, (kind, number, cell["input_errors"])
    assert len(scored) + sum(1 for e in cell["input_errors"] if "too_large" not in e) == len(
        content
    ), (content, cell["input_errors"])
    for message in cell["input_errors"][:20]:
        assert f"ckpteval: warning: {message}" in err


@st.composite
def problem_line(draw: st.DrawFn) -> tuple[str, bytes]:
    i = draw(st.integers(0, 6))
    kind = draw(
        st.sampled_from(
            [
                "good",
                "good",
                "malformed",
                "no_task_id",
                "duplicate",
                "no_answer",
                "non_utf8",
                "blank",
                "huge",
                "not_object",
            ]
        )
    )
    if kind in ("good", "duplicate"):
        return kind, json.dumps(_problem(i)).encode()
    if kind == "malformed":
        return kind, b'{"task_id": "p1", "answer": '
    if kind == "no_task_id":
        return kind, json.dumps({"question": "?", "answer": "#### 1"}).encode()
    if kind == "no_answer":
        return kind, json.dumps({"task_id": f"q{i}", "question": "?"}).encode()
    if kind == "non_utf8":
        return kind, b'{"task_id": "p\xe9", "answer": "#### 1"}'
    if kind == "blank":
        return kind, b""
    if kind == "huge":
        return kind, json.dumps(
            {"task_id": f"h{i}", "question": "x" * 1_500_000, "answer": "#### 1"}
        ).encode()
    return kind, b"[1, 2]"


@FUZZ
@given(lines=st.lists(problem_line(), max_size=8))
def test_a_problems_file_is_accepted_or_one_line_naming_it(lines: list[tuple[str, bytes]]) -> None:
    with _workdir() as work:
        problems, samples, out = work / "problems.jsonl", work / "samples.jsonl", work / "out.jsonl"
        _write_lines(problems, lines, trailing_newline=True)
        samples.write_text(
            "".join(
                json.dumps({"task_id": f"p{i}", "completion": f"#### {i + 1}"}) + "\n"
                for i in range(7)
            )
        )
        status, _, err = _cli(
            "score",
            "gsm8k",
            "--problems",
            str(problems),
            "--samples",
            str(samples),
            "--out",
            str(out),
            "--workers",
            "1",
        )
    assert "Traceback" not in err
    if status == 0:
        return
    assert status == 2, err
    line = _one_error_line(err)
    ids = {json.loads(raw)["task_id"] for kind, raw in lines if kind == "no_answer"}
    assert (
        str(problems) in line or str(samples) in line or any(f"problem {i}:" in line for i in ids)
    ), line


# ------------------------------------------------------------------------ replay solution files

ARITH = resolve_task("arith", {"limit": 5})


@st.composite
def solution_line(draw: st.DrawFn) -> tuple[str, bytes]:
    i = draw(st.integers(0, 6))
    kind = draw(
        st.sampled_from(
            [
                "good",
                "good",
                "good",
                "malformed",
                "no_task_id",
                "unknown_task",
                "completion_not_str",
                "non_utf8",
                "blank",
                "beyond_limit",
                "sample_idx",
            ]
        )
    )
    if kind == "good":
        return kind, json.dumps({"task_id": f"arith/{i % 5}", "completion": " 7"}).encode()
    if kind == "beyond_limit":
        return kind, json.dumps({"task_id": "arith/15", "completion": " 7"}).encode()
    if kind == "malformed":
        return kind, b'{"task_id": "arith/1", "completion":'
    if kind == "no_task_id":
        return kind, json.dumps({"completion": " 7"}).encode()
    if kind == "unknown_task":
        return kind, json.dumps({"task_id": "pyfunc/1", "completion": " 7"}).encode()
    if kind == "completion_not_str":
        return kind, json.dumps({"task_id": "arith/1", "completion": {"text": "7"}}).encode()
    if kind == "non_utf8":
        return kind, b'{"task_id": "arith/1", "completion": "\xc3\x28"}'
    if kind == "blank":
        return kind, b" "
    return kind, json.dumps(
        {
            "task_id": "arith/2",
            "completion": " 7",
            "sample_idx": draw(st.sampled_from([0, 0, "1", -3])),
        }
    ).encode()


@FUZZ
@given(lines=st.lists(solution_line(), max_size=10))
def test_a_solutions_file_is_replayed_or_one_line_naming_it(lines: list[tuple[str, bytes]]) -> None:
    with _workdir() as work:
        source, out = work / "arith.jsonl", work / "gen" / "arith" / "greedy-s42.jsonl"
        _write_lines(source, lines, trailing_newline=True)
        try:
            stats = replay_solutions(source, ARITH, "greedy-s42", out, where="config: runs.fuzz")
        except UserError as exc:
            message = str(exc)
            assert "\n" not in message and str(source) in message, message
            assert not out.exists()
            return
        written = [json.loads(row) for row in out.read_text().splitlines()]
    good = [kind for kind, _ in lines if kind in ("good", "sample_idx")]
    assert stats["n_samples"] == len(written) > 0
    assert len(written) <= len(good)
    assert {w["task_id"] for w in written} <= {f"arith/{i}" for i in range(5)}


# ------------------------------------------------------------------- samples that stop a run

#: Each analysis of one sample must finish within this (seconds) on a text of `SAMPLE_CHARS`:
#: linear work takes milliseconds; the quadratic regexes and scans this guards against took
#: seconds to minutes (12,000 spaces: 49 s).
ANALYSIS_S = 2.0
SAMPLE_CHARS = 40_000

#: What a pathological sample is made of: whitespace runs, markers the checkers' patterns start
#: from (answer sentences, boxes, `use`/`enum`/`impl` heads, raw strings), brackets to nest.
PIECES = [
    " ", "\n", " \n", "\t", " \t", "1", "9" * 7, "a", "a ", "1, ", ", and ", " and ", "and ",
    "{", "}", "(", "[", "$", "\\", "\\boxed{", "\\boxed ", "\\text{ ", "\\frac", "x = ", "=", ".",
    ". ", "_{", "#", "####", "**", "fn ", "use ", "impl ", "enum ", "struct ", "for ", "'static ",
    "r#\"", "\"", "'", "//", "/*", "```", "```python\n", "```rust\n", "Answer: ",
    "The answer is ", "because ", " so", "as ", "#include", "if x:\n", "    ", "elif x == 1:\n",
    "def f(", "lambda: ", "print('ok')", "import os\n",
]  # fmt: skip


@st.composite
def hostile_text(draw: st.DrawFn) -> str:
    """A few runs of one piece each, up to `SAMPLE_CHARS` in all, in an answer-shaped frame."""
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        piece = draw(st.sampled_from(PIECES))
        parts.append(piece * draw(st.integers(1, SAMPLE_CHARS // 3 // len(piece))))
    frame = draw(
        st.sampled_from(["{}", "The answer is {}.", "\\boxed{{{}}}", "```rust\n{}\n```", "5{} cm"])
    )
    return frame.format("".join(parts))


def _timed(what: str, call: Any, *args: Any) -> Any:
    start = time.monotonic()
    out = call(*args)
    took = time.monotonic() - start
    assert took < ANALYSIS_S, f"{what} took {took:.1f} s"
    return out


_RUST = {
    "task_id": "r",
    "entry_point": "f",
    "prompt": "use std::collections::HashMap;\nfn f(x: i32) -> i32 {\n",
    "test": "#[cfg(test)]\nmod tests {\n    use super::*;\n    #[test]\n"
    "    fn t() {\n        assert_eq!(f(1), 1);\n    }\n}\n",
}
_PYTHON = {
    "task_id": "p",
    "prompt": "def f(x):\n",
    "test": "def check(c): pass",
    "entry_point": "f",
}
_MATH = {"task_id": "m", "answer": "3, 4"}


@pytest.fixture(scope="module")
def math_checker() -> Iterator[Any]:
    from ckpteval.checkers.math import MathChecker

    checker = MathChecker()
    checker._pool.start = lambda: 0.0  # type: ignore[method-assign]
    checker._pool.verify = lambda gold, answer, timeout: False  # type: ignore[method-assign]
    yield checker
    checker.close()


@settings(FUZZ, max_examples=60)
@given(text=hostile_text())
def test_no_sample_text_stops_or_stalls_an_analysis(text: str, math_checker: Any) -> None:
    """Every analysis the checkers run on a sample's text in-process (outside its sandbox's
    limits) returns a verdict or its parts, quickly, whatever the text: math extraction and
    comparison, the python program's assembly, parse and static scan, the rust unit's assembly
    and static scans, the stdio language detection."""
    _analyse(text, math_checker)


#: The runs that stalled an analysis before (seconds to minutes each), always tried.
KNOWN_STALLS = [
    " " * SAMPLE_CHARS,  # the unit, `and` and sentence-end patterns (12,000: 49 s)
    "The answer is " + " " * SAMPLE_CHARS + "x because",
    "\n" * SAMPLE_CHARS + "x",  # stdio's `#include` look-up
    "\\boxed{" * (SAMPLE_CHARS // 7),  # each unclosed box scanned to the end
    "5" + " so" * (SAMPLE_CHARS // 3),
    "use " * (SAMPLE_CHARS // 4),  # rust's `use ... as String` pattern
    'r#"' * (SAMPLE_CHARS // 3),  # rust's raw-string lexeme
    "Answer:\n" * (SAMPLE_CHARS // 8),  # each answer line read the rest of the text
    "\\boxed{1e100000000}",  # an exact Fraction of 10^(10^8)
]


@pytest.mark.parametrize("text", KNOWN_STALLS, ids=lambda t: repr(t[:12]))
def test_known_stalls_are_quick(text: str, math_checker: Any) -> None:
    _analyse(text, math_checker)


def _analyse(text: str, math_checker: Any) -> None:
    from ckpteval.checkers import Job, Verdict
    from ckpteval.checkers.extract import python_program
    from ckpteval.checkers.python import parse_program, static_hack
    from ckpteval.checkers.rust.checker import _make_unit
    from ckpteval.checkers.stdio import detect_program

    verdict = _timed("math", math_checker.check_one, Job("m", _MATH, text), 5.0)
    assert isinstance(verdict, Verdict)
    tree = _timed("python parse", parse_program, _timed("python", python_program, _PYTHON, text))
    if not isinstance(tree, Verdict):
        _timed("python static scan", static_hack, tree)
    _timed("rust", _make_unit, 0, Job("r", _RUST, text), 5.0)
    _timed("stdio", detect_program, text)


#: Reward function results no cell arithmetic survives, and ordinary ones.
scores = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.sampled_from([10**400, -(10**400), 10**4000, 1e308, -1e308, 1e15, 1e16, True, 0.5]),
)
rewards = st.one_of(
    scores, st.fixed_dictionaries({"score": scores}, optional={"acc": st.one_of(scores, st.text())})
)


@FUZZ
@given(values=st.lists(rewards, min_size=1, max_size=12))
def test_no_reward_value_stops_a_cell(values: list[Any]) -> None:
    """What a reward function returns is a score or a one-line reason, and the cell's reward
    metrics over the scores are finite numbers, whatever it returned."""
    from ckpteval.checkers.reward import as_score
    from ckpteval.evaluate import RewardTotals

    totals = RewardTotals()
    for value in values:
        score, info = as_score(value)
        if isinstance(score, str):
            assert score and "\n" not in score and len(score) < 300, score
            continue
        totals.add({"reward": score, "reward_info": info})
    for name, metric in totals.metrics().items():
        assert math.isfinite(metric["value"]) and math.isfinite(metric["stderr"]), (name, metric)
    totals.distribution()
