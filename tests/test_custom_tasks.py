"""Tasks from the user's own problem files (`tasks.<name>.problems`), the public shapes of
stdin/stdout sets they are read from, and the bundled `stdio_demo` task: problems, prompts and
identity at parse time, mistakes as one line naming file and line, and real verdicts."""

from __future__ import annotations

import copy
import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ckpteval.config import build_tasks, validate_config
from ckpteval.errors import UserError
from ckpteval.evaluate import score_samples
from ckpteval.problems import normalise_stdio
from ckpteval.tasks import resolve_task

APLUSB = {
    "task_id": "aplusb",
    "question": "Print a + b.",
    "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}],
    "generated_tests": [{"input": f"{i} {i}\n", "output": f"{2 * i}\n"} for i in range(5)],
}


def _write(path: Path, rows: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _task(path: Path, **options: Any) -> Any:
    return resolve_task("cf", {"problems": str(path), "checker": "stdio", **options})


def test_a_stdio_problem_file_is_a_task(tmp_path: Path) -> None:
    task = _task(_write(tmp_path / "cf.jsonl", [APLUSB]), language="cpp")
    problems = task.problems()
    assert list(problems) == ["aplusb"] and task.kind == "generate" and task.checker == "stdio"
    assert problems["aplusb"]["solution_language"] == "cpp"
    prompt = task.render(problems["aplusb"])
    assert prompt.startswith("Print a + b.\n") and prompt.endswith(
        "C++17 program that reads "
        "the input from standard input "
        "and writes the answer to "
        "standard output.\n\n```cpp\n"
    )
    assert task.builtin.stop == ("```",) and task.builtin.max_new_tokens is None
    custom = _task(tmp_path / "cf.jsonl", prompt="Solve: {question} ({task_id})")
    assert custom.render(custom.problems()["aplusb"]) == "Solve: Print a + b. (aplusb)"
    assert custom.builtin.stop == ()  # under the user's own prompt, no stop of ours


def test_identity_follows_the_content_not_the_path_and_not_the_generated_test_cap(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path / "a" / "cf.jsonl", [APLUSB])
    moved = tmp_path / "b" / "cf.jsonl"
    moved.parent.mkdir()
    shutil.copy(path, moved)
    base = _task(path).config_hash()
    assert _task(moved).config_hash() == base
    capped = _task(path, max_generated_tests=2)
    assert capped.config_hash() == base  # a scores setting (contract row), not a generations one
    assert len(capped.problems()["aplusb"]["generated_tests"]) == 2
    assert "generated_tests" in _task(path, max_generated_tests=0).problems()["aplusb"]
    assert _task(path, max_generated_tests=0).problems()["aplusb"]["generated_tests"] == []
    assert _task(path, prompt="{question}").config_hash() != base
    assert _task(path, language="rust").config_hash() != base
    changed = copy.deepcopy(APLUSB)
    changed["tests"][0]["output"] = "3 \n"
    _write(path, [changed])
    assert _task(path).config_hash() != base


def test_gzip_and_directories_of_problem_files(tmp_path: Path) -> None:
    second = {**APLUSB, "task_id": "second"}
    (tmp_path / "set").mkdir()
    with gzip.open(tmp_path / "set" / "b.jsonl.gz", "wt") as handle:
        handle.write(json.dumps(second) + "\n")
    _write(tmp_path / "set" / "sub" / "a.jsonl", [APLUSB])
    assert sorted(_task(tmp_path / "set").problems()) == ["aplusb", "second"]


@pytest.mark.parametrize(
    "lines, expected",
    [
        (['{"task_id": "x", "tests": [', json.dumps(APLUSB)], r"cf\.jsonl:1: not valid JSON"),
        (
            [APLUSB, APLUSB],
            r"cf\.jsonl:2: duplicate problem id 'aplusb' \(first at .*cf\.jsonl:1\)",
        ),
        ([APLUSB, {"task_id": "y", "question": "q"}], r"cf\.jsonl:2: problem y: no tests"),
        (
            [{"task_id": "z", "tests": [{"input": "1"}]}],
            r"cf\.jsonl:1: problem z: `tests` test 1 is not an \{input, output\} object",
        ),
        ([{"question": "no id", "tests": APLUSB["tests"]}], r"cf\.jsonl:1: no problem id"),
        (
            [
                {
                    "task_id": "t",
                    "input_output": json.dumps({"fn_name": "f", "inputs": [], "outputs": []}),
                }
            ],
            r"cf\.jsonl:1: problem t: call-based \(fn_name 'f'\)",
        ),
        ([{**APLUSB, "time_limit": "soon"}], r"cf\.jsonl:1: problem aplusb: `time_limit` must be"),
    ],
)
def test_problem_file_mistakes_are_one_line_naming_file_and_line(
    tmp_path: Path, lines: list[Any], expected: str
) -> None:
    path = _write(tmp_path / "cf.jsonl", lines)
    with pytest.raises(UserError, match=expected) as caught:
        _task(path)
    assert "\n" not in str(caught.value)


def test_the_checkers_own_validation_runs_at_parse_time(tmp_path: Path) -> None:
    """A python problem without what the python checker needs fails when the config is parsed,
    naming the file and line, before any job."""
    path = _write(
        tmp_path / "he.jsonl",
        [
            {
                "task_id": "ok",
                "prompt": "def f():\n",
                "test": "assert f() == 1",
                "entry_point": "f",
            },
            {"task_id": "bad", "prompt": "def g():\n"},
        ],
    )
    config = {
        "runs": {"r": {"backend": "replay", "solutions": str(tmp_path)}},
        "tasks": {"he": {"problems": str(path), "checker": "python"}},
    }
    validate_config(config)
    with pytest.raises(
        UserError,
        match=r"he\.jsonl:2: problem bad: python problems need prompt, "
        r"test and entry_point .* missing test, entry_point",
    ):
        build_tasks(config)


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"checker": "gsm8k"}, r"config: tasks\.cf\.checker: a task with `problems` needs checker"),
        ({"checker": "math"}, r"math problems need an `answer`"),
        (
            {"checker": "stdio", "language": "rust", "prompt": "{statement}"},
            r"config: tasks\.cf\.prompt: problem 'aplusb' has no field 'statement'",
        ),
        (
            {"checker": "python", "language": "cpp"},
            r"config: tasks\.cf\.language: 'cpp' does not fit "
            r"checker python",
        ),
        ({"checker": "stdio", "harness": "gsm8k"}, r"config: tasks\.cf\.problems: an lm-eval"),
    ],
)
def test_config_mistakes_of_custom_tasks_name_the_key(
    tmp_path: Path, options: dict[str, Any], expected: str
) -> None:
    path = _write(tmp_path / "cf.jsonl", [APLUSB])
    with pytest.raises(UserError, match=expected):
        resolve_task("cf", {"problems": str(path), **options})


def test_codecontests_and_apps_and_openr1_shapes_are_read_directly() -> None:
    codecontests = {
        "name": "1548_A. Web of Lies",
        "description": "Count the vulnerable nobles.",
        "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
        "private_tests": {"input": ["2 2\n"], "output": ["4\n"]},
        "generated_tests": {"input": ["0 0\n", "7 1\n"], "output": ["0\n", "8\n"]},
        "time_limit": {"seconds": 2, "nanos": 500000000},
        "memory_limit_bytes": 268435456,
    }
    cc = normalise_stdio(codecontests)
    assert cc["tests"] == [{"input": "1 2\n", "output": "3\n"}, {"input": "2 2\n", "output": "4\n"}]
    assert [t["output"] for t in cc["generated_tests"]] == ["0\n", "8\n"]
    assert (cc["time_limit"], cc["memory_limit"]) == (2.5, 256)
    apps = {
        "problem_id": 4005,
        "question": "Add them.",
        "difficulty": "introductory",
        "input_output": json.dumps({"inputs": ["1 2\n", ["3 4"]], "outputs": ["3\n", ["7"]]}),
        "time_limit": "1 second",
        "memory_limit": "256 megabytes",
    }
    ap = normalise_stdio(apps)
    assert ap["tests"] == [{"input": "1 2\n", "output": "3\n"}, {"input": "3 4\n", "output": "7\n"}]
    assert (ap["time_limit"], ap["memory_limit"]) == (1.0, 256)
    openr1 = {
        "id": "1/A",
        "official_tests": [{"input": "1 2\n", "output": "3\n"}],
        "checker": '#include "testlib.h"\nint main(int c, char* v[]) {}\n',
        "time_limit": 1.0,
        "memory_limit": 256.0,
    }
    o1 = normalise_stdio(openr1)
    assert o1["checker"]["language"] == "cpp" and o1["tests"] == openr1["official_tests"]
    assert o1["memory_limit"] == 256


def test_a_codecontests_file_is_judged_on_its_official_then_generated_tests(tmp_path: Path) -> None:
    """A CodeContests-shaped file end to end: a solution wrong only on a generated test fails
    there, and says so (first_failed_test within the generated set)."""
    path = _write(
        tmp_path / "cc.jsonl",
        [
            {
                "name": "sum",
                "description": "Print a + b.",
                "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
                "private_tests": {"input": ["2 2\n"], "output": ["4\n"]},
                "generated_tests": {"input": ["0 0\n", "70 1\n"], "output": ["0\n", "71\n"]},
            }
        ],
    )
    task = _task(path)
    right = "a, b = map(int, input().split())\nprint(a + b)\n"
    small = "a, b = map(int, input().split())\nprint(a + b if a < 50 else 0)\n"
    cell = score_samples(
        "stdio",
        task.problems(),
        [
            {"task_id": "sum", "completion": f"```python\n{right}```"},
            {"task_id": "sum", "completion": small},
            {"task_id": "sum", "completion": "print(3)"},
        ],
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        workers=2,
        checker_options={"sandbox": "bwrap"},
    )
    lines = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [(x["passed"], x["first_failed_set"], x["first_failed_test"]) for x in lines] == [
        (True, None, None),
        (False, "generated", 1),
        (False, "official", 1),
    ]
    assert [(x["official_passed"], x["generated_passed"]) for x in lines] == [
        (True, True),
        (True, False),
        (False, None),
    ]
    assert cell["metrics"]["official_tests_pass_rate"]["value"] == pytest.approx(2 / 3)
    assert cell["metrics"]["generated_tests_pass_rate"]["value"] == pytest.approx(1 / 2)
    capped = _task(path, max_generated_tests=1)  # the failing generated test is capped away
    score_samples(
        "stdio",
        capped.problems(),
        [{"task_id": "sum", "completion": small}],
        tmp_path / "c.jsonl",
        tmp_path / "c.json",
        workers=1,
        checker_options={"sandbox": "bwrap"},
    )
    assert json.loads((tmp_path / "c.jsonl").read_text())["passed"] is True


def test_the_bundled_stdio_demo_passes_its_self_test_and_judges_right_from_wrong(
    tmp_path: Path,
) -> None:
    """stdio_demo by name: its reference solutions pass (the checker program of the problem with
    several right answers accepts another right answer), wrong ones fail."""
    task = resolve_task("stdio_demo", {})
    problems = task.problems()
    assert len(problems) == 5 and any("checker" in p for p in problems.values())
    assert all(p.get("generated_tests") for p in problems.values())
    cell = score_samples(
        "stdio",
        problems,
        [
            {"task_id": "stdio_demo/2", "completion": "n = int(input())\nprint(n, 0)\n"},
            {"task_id": "stdio_demo/2", "completion": "n = int(input())\nprint(n, 1)\n"},
            {
                "task_id": "stdio_demo/3",
                "completion": "input()\nxs = list(map(int, input().split()))"
                "\nprint(sum(xs) / len(xs) + 1e-9)\n",
            },
        ],
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        workers=2,
        checker_options={"sandbox": "bwrap"},
    )
    assert cell["self_test"]["references_passed"] == 5
    lines = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [x["passed"] for x in lines] == [True, False, True]


def _replay_plan(tmp_path: Path, solutions: str, tasks: dict[str, Any]) -> Any:
    from ckpteval.config import build_plan

    config = {
        "outdir": str(tmp_path / "results"),
        "runs": {"r": {"backend": "replay", "solutions": solutions}},
        "tasks": tasks,
    }
    validate_config(config)
    return build_plan(config, tmp_path)


def test_a_directory_per_checkpoint_of_solution_files(tmp_path: Path) -> None:
    """model_solution_r/checkpoint_<step>/ with any number of JSONL files, found recursively;
    with several tasks, each task's files under <task>/ (or <task>.jsonl)."""
    root = tmp_path / "model_solution_r"
    line = [{"task_id": "stdio_demo/0", "completion": "print(1)"}]
    _write(root / "checkpoint_10" / "a.jsonl", line)
    _write(root / "checkpoint_10" / "deep" / "er" / "b.jsonl", line)
    _write(root / "checkpoint_30" / "c.jsonl", line)
    (root / "checkpoint_40").mkdir()  # nothing written yet: not a checkpoint
    plan = _replay_plan(tmp_path, str(root), {"stdio_demo": {}})
    run = plan.runs["r"]
    assert [(c.name, c.step) for c in run.checkpoints] == [("step_10", 10), ("step_30", 30)]
    assert run.solutions_files("stdio_demo", "greedy-s42", 10) == [
        root / "checkpoint_10" / "a.jsonl",
        root / "checkpoint_10" / "deep" / "er" / "b.jsonl",
    ]
    same = _replay_plan(tmp_path, str(root / "checkpoint_{step}"), {"stdio_demo": {}})
    assert [c.name for c in same.runs["r"].checkpoints] == ["step_10", "step_30"]

    two = {"stdio_demo": {}, "pyfunc": {}}
    with pytest.raises(
        UserError,
        match=r"runs\.r\.solutions: no solutions of task stdio_demo in "
        r".*checkpoint_10 \(with several tasks: ",
    ):
        _replay_plan(tmp_path, str(root), two)
    _write(root / "checkpoint_10" / "stdio_demo" / "x.jsonl", line)
    _write(root / "checkpoint_10" / "pyfunc.jsonl", [{"task_id": "pyfunc/0", "completion": ""}])
    plan = _replay_plan(tmp_path, str(root), two)
    assert [c.name for c in plan.runs["r"].checkpoints] == ["step_10"]
    assert plan.runs["r"].solutions_files("pyfunc", "greedy-s42", 10) == [
        root / "checkpoint_10" / "pyfunc.jsonl"
    ]
    assert plan.runs["r"].solutions_files("stdio_demo", "greedy-s42", 10) == [
        root / "checkpoint_10" / "stdio_demo" / "x.jsonl"
    ]


def test_the_old_solutions_forms_still_work(tmp_path: Path) -> None:
    _write(tmp_path / "sol" / "stdio_demo.jsonl", [{"task_id": "stdio_demo/0", "completion": ""}])
    plan = _replay_plan(tmp_path, str(tmp_path / "sol"), {"stdio_demo": {}})
    assert plan.runs["r"].solutions_files("stdio_demo", "greedy-s42", 0) == [
        tmp_path / "sol" / "stdio_demo.jsonl"
    ]
    _write(
        tmp_path / "p" / "s5" / "stdio_demo.jsonl", [{"task_id": "stdio_demo/0", "completion": ""}]
    )
    plan = _replay_plan(
        tmp_path, str(tmp_path / "p" / "s{step}" / "{task}.jsonl"), {"stdio_demo": {}}
    )
    assert [c.name for c in plan.runs["r"].checkpoints] == ["step_5"]


def test_a_problem_piston_cannot_judge_is_refused_at_parse_time(tmp_path: Path) -> None:
    from ckpteval.config import build_plan

    path = _write(tmp_path / "cf.jsonl", [{**APLUSB, "time_limit": 5}])
    config = {
        "outdir": str(tmp_path / "results"),
        "runs": {"r": {"backend": "replay", "solutions": str(tmp_path / "sol/{task}.jsonl")}},
        "tasks": {"cf": {"problems": str(path), "checker": "stdio"}},
        "evaluate": {"piston_url": "http://127.0.0.1:9"},
    }
    _write(tmp_path / "sol" / "cf.jsonl", [{"task_id": "aplusb", "completion": ""}])
    validate_config(config)
    with pytest.raises(
        UserError,
        match=r"config: tasks\.cf: problem aplusb: time_limit 5\.0 s is "
        r"over what Piston at http://127\.0\.0\.1:9 allows",
    ):
        build_plan(config, tmp_path)
    config["evaluate"]["piston_limits"] = {"run_timeout": 6000, "run_cpu_time": 6000}
    assert build_plan(config, tmp_path).tasks["cf"].checker == "stdio"


def test_a_checker_program_by_path_and_a_float_tolerance(tmp_path: Path) -> None:
    """The problem file names its checker program by a path relative to itself; a problem's
    `tolerance` replaces the default 1e-6 for decimal outputs."""
    (tmp_path / "checkers").mkdir()
    (tmp_path / "checkers" / "even.py").write_text(
        "import sys\nx = int(open(sys.argv[2]).read())\nsys.exit(0 if x % 2 == 0 else 1)\n"
    )
    path = _write(
        tmp_path / "cf.jsonl",
        [
            {
                "task_id": "even",
                "question": "Print an even number.",
                "tests": [{"input": "\n", "output": "2\n"}],
                "checker": {"language": "python", "path": "checkers/even.py"},
            },
            {
                "task_id": "third",
                "question": "Print 1/3.",
                "tolerance": 1e-2,
                "tests": [{"input": "\n", "output": "0.3333\n"}],
            },
        ],
    )
    problems = _task(path).problems()
    assert "sys.exit" in problems["even"]["checker"]["source"]
    score_samples(
        "stdio",
        problems,
        [
            {"task_id": "even", "completion": "print(40)"},
            {"task_id": "even", "completion": "print(3)"},
            {"task_id": "third", "completion": "print(0.33)"},
            {"task_id": "third", "completion": "print(0.3)"},
        ],
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        workers=2,
        checker_options={"sandbox": "bwrap"},
    )
    lines = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [x["passed"] for x in lines] == [True, False, True, False]
    with pytest.raises(UserError, match=r"cf\.jsonl:1: problem t: tolerance must be a number"):
        _task(_write(tmp_path / "cf.jsonl", [{**APLUSB, "task_id": "t", "tolerance": "big"}]))


@pytest.mark.needs("g++")
def test_the_bundled_stdio_task_in_another_language(tmp_path: Path) -> None:
    task = resolve_task("stdio_demo", {"language": "cpp", "limit": 1})
    problem = task.problems()["stdio_demo/0"]
    assert problem["solution_language"] == "cpp"
    assert task.render(problem).endswith(
        "Write a C++17 program that reads the input from "
        "standard input and writes the answer to standard "
        "output.\n\n```cpp\n"
    )
    assert task.config_hash() != resolve_task("stdio_demo", {"limit": 1}).config_hash()
    cpp = (
        "#include <iostream>\nint main() { long long a, b; std::cin >> a >> b; "
        "std::cout << a + b << std::endl; }\n"
    )
    score_samples(
        "stdio",
        task.problems(),
        [
            {"task_id": "stdio_demo/0", "completion": cpp},
            {
                "task_id": "stdio_demo/0",
                "completion": f"```python\nprint(1)\n```\n```cpp\n{cpp}```",
            },
        ],
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        workers=2,
        checker_options={"sandbox": "bwrap"},
    )
    lines = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [(x["passed"], x["language"]) for x in lines] == [(True, "cpp"), (True, "cpp")]


def test_a_math_task_declares_that_a_last_line_is_an_answer(tmp_path: Path) -> None:
    """`answer_last_line` reaches the math checker on each scored record, changes scores only
    (not the task's identity, so no regeneration), and is refused where no math checker reads it."""
    path = _write(tmp_path / "m.jsonl", [{"task_id": "m0", "question": "2+2?", "answer": "4"}])
    plain = resolve_task("m", {"problems": str(path), "checker": "math"})
    declared = resolve_task(
        "m", {"problems": str(path), "checker": "math", "answer_last_line": True}
    )
    assert declared.config_hash() == plain.config_hash()
    assert declared.problems()["m0"]["answer_last_line"] is True
    assert "answer_last_line" not in plain.problems()["m0"]
    samples = [{"task_id": "m0", "sample_idx": 0, "completion": "Adding up:\n4"}]
    scored = [
        score_samples(
            "math",
            task.problems(),
            samples,
            tmp_path / f"{i}.jsonl",
            tmp_path / f"{i}.json",
            workers=1,
        )
        for i, task in enumerate((plain, declared))
    ]
    assert [cell["metrics"]["pass@1"]["value"] for cell in scored] == [0.0, 1.0]
    assert resolve_task("arith", {"answer_last_line": True}).problems()["arith/0"][
        "answer_last_line"
    ]
    with pytest.raises(UserError, match=r"tasks\.pyfunc\.answer_last_line: only math tasks"):
        resolve_task("pyfunc", {"answer_last_line": True})
    with pytest.raises(UserError, match=r"tasks\.g\.answer_last_line: only ckpteval's own"):
        resolve_task("g", {"harness": "gsm8k", "answer_last_line": True})
