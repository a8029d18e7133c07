"""The stdio checker: local sandboxed judging in three languages, checker programs, time limits as
CPU time, and a Piston client against tests/piston_standin.py, a loopback stand-in that validates
requests and runs programs as Piston does: same verdicts as locally, one line when Piston refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes import down_url
from piston_standin import PistonStandin, python_runtime

from ckpteval.checkers import Job, Verdict, get_checker
from ckpteval.checkers.stdio import PistonError, detect_program, outputs_match
from ckpteval.errors import UserError
from ckpteval.evaluate import score_samples

#: The verdicts of C++ and Rust programs: compiled here, or by the Piston stand-in.
pytestmark = pytest.mark.needs("g++", "rustc")

APLUSB = {
    "task_id": "aplusb",
    "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4\n", "output": "6\n"}],
    "generated_tests": [{"input": "1000000000000 1\n", "output": "1000000000001\n"}],
    "time_limit": 1,
    "memory_limit": 128,
    "canonical_solution": "a, b = map(int, input().split())\nprint(a + b)\n",
    "language": "python",
}
SPLIT = {  # many valid outputs: print two non-negative integers summing to n
    "task_id": "split",
    "tests": [{"input": "5\n", "output": "2 3\n"}, {"input": "0\n", "output": "0 0\n"}],
    "checker": "import sys\nn = int(open(sys.argv[1]).read())\ntry:\n"
    "    a, b = map(int, open(sys.argv[2]).read().split())\nexcept ValueError:\n"
    "    sys.exit(1)\nsys.exit(0 if a >= 0 and b >= 0 and a + b == n else 1)\n",
    "canonical_solution": "n = int(input())\nprint(n, 0)\n",
    "language": "python",
}
SWAP = {  # two tokens out: testlib's blanks (space, tab, CR, LF) separate them, nothing else
    "task_id": "swap",
    "tests": [{"input": "1 2\n", "output": "2 1\n"}],
    "canonical_solution": "a, b = input().split()\nprint(b, a)\n",
    "language": "python",
}
HALF_SECOND = {"task_id": "half", "tests": [{"input": "1 2\n", "output": "3\n"}], "time_limit": 0.5}
BURN = "import os, time\ndef burn(s):\n    while time.process_time() < s:\n        pass\n"
PY_OK = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
CPP_OK = (
    "```cpp\n#include <iostream>\nint main() { long long a, b; std::cin >> a >> b; "
    "std::cout << a + b << std::endl; }\n```"
)
RUST_OK = (
    "```rust\nuse std::io::Read;\nfn main() {\n    let mut s = String::new();\n"
    "    std::io::stdin().read_to_string(&mut s).unwrap();\n"
    "    let v: Vec<i64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();\n"
    '    println!("{}", v[0] + v[1]);\n}\n```'
)

CASES = [
    ("python", APLUSB, PY_OK, None),
    ("c++", APLUSB, CPP_OK, None),
    ("rust", APLUSB, RUST_OK, None),
    ("bare c++ is recognised", APLUSB, CPP_OK.strip("`").removeprefix("cpp\n"), None),
    (
        "wrong on a generated test (32-bit overflow)",
        APLUSB,
        "```cpp\n#include <iostream>\nint main() { int a, b; std::cin >> a >> b; std::cout << a + b; }\n```",
        "wrong_answer",
    ),
    ("c++ compile error", APLUSB, "```cpp\nint main( {\n```", "compile_error"),
    ("python syntax error", APLUSB, "```python\nprint(\n```", "compile_error"),
    ("runtime error", APLUSB, "```python\nraise SystemExit(3)\n```", "runtime_error"),
    ("timeout", APLUSB, "```python\nwhile True:\n    pass\n```", "timeout"),
    ("memory limit (python)", APLUSB, "```python\nx = bytearray(1 << 32)\n```", "memory_limit"),
    (
        "memory limit (c++)",
        APLUSB,
        "```cpp\n#include <vector>\nint main() { std::vector<char> v(1ull << 33); return v[7]; }\n```",
        "memory_limit",
    ),
    (
        "printing gigabytes",
        APLUSB,
        '```cpp\n#include <cstdio>\nint main() { for (;;) std::puts("xxxxxxxxxxxxxxxx"); }\n```',
        "output_limit",
    ),
    (
        "0.35 s of CPU within a 0.5 s limit",
        HALF_SECOND,
        f"```python\n{BURN}burn(0.35)\nprint(3)\n```",
        None,
    ),
    (
        "0.65 s of CPU over a 0.5 s limit",
        HALF_SECOND,
        f"```python\n{BURN}burn(0.65)\nprint(3)\n```",
        "timeout",
    ),
    (
        "CPU spent in a child it never reaps counts",
        HALF_SECOND,
        (
            f"```python\n{BURN}r, w = os.pipe()\nif os.fork() == 0:\n    burn(0.65)\n"
            "    os.write(w, b'x')\n    os._exit(0)\nos.read(r, 1)\nprint(3)\n```"
        ),
        "timeout",
    ),
    (
        "fork bomb",
        APLUSB,
        "```cpp\n#include <unistd.h>\nint main() { for (;;) fork(); }\n```",
        "timeout",
    ),
    (
        "reading the home directory",
        APLUSB,
        "```python\nprint(open('/root/.bashrc').read())\n```",
        "runtime_error",
    ),
    (
        "opening a socket",
        APLUSB,
        "```python\nimport socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\nprint(3)\n```",
        "runtime_error",
    ),
    (
        "checker accepts another valid split",
        SPLIT,
        "```python\nn = int(input())\nprint(0, n)\n```",
        None,
    ),
    (
        "checker rejects a wrong split",
        SPLIT,
        "```python\nn = int(input())\nprint(1, n)\n```",
        "wrong_answer",
    ),
    ("checker rejects garbage", SPLIT, "```python\nprint('hello')\n```", "wrong_answer"),
    (
        "tokens apart by tab, CR and newlines",
        SWAP,
        "```python\na, b = input().split()\nprint(f'\\r\\n{b}\\t\\r\\n{a}\\t')\n```",
        None,
    ),
    (
        "tokens joined by NBSP (no testlib blank)",
        SWAP,
        "```python\na, b = input().split()\nprint(f'{b}\\u00a0{a}')\n```",
        "wrong_answer",
    ),
    (
        "tokens joined by a vertical tab (no testlib blank)",
        SWAP,
        "```python\na, b = input().split()\nprint(f'{b}\\v{a}')\n```",
        "wrong_answer",
    ),
]


@pytest.fixture(scope="module")
def verdicts() -> dict[str, Verdict]:
    checker = get_checker("stdio", sandbox="bwrap")
    try:
        jobs = [Job(p["task_id"], p, completion) for _, p, completion, _ in CASES]
        return {
            name: v for (name, *_), v in zip(CASES, checker.check(jobs, workers=2), strict=True)
        }
    finally:
        checker.close()


@pytest.mark.parametrize("name,expected", [(c[0], c[3]) for c in CASES])
def test_local_verdict(verdicts: dict[str, Verdict], name: str, expected: str | None) -> None:
    verdict = verdicts[name]
    assert verdict.error_type == expected, verdict
    assert verdict.compile_ok == (expected != "compile_error")


def test_progress_is_reported(verdicts: dict[str, Verdict]) -> None:
    assert verdicts["python"].extras == {
        "tests_passed": 3,
        "tests_total": 3,
        "language": "python",
        "first_failed_test": None,
        "first_failed_set": None,
        "official_passed": True,
        "generated_passed": True,
    }
    overflow = verdicts["wrong on a generated test (32-bit overflow)"].extras
    assert overflow["tests_passed"] == 2
    assert (overflow["first_failed_set"], overflow["first_failed_test"]) == ("generated", 0)
    assert (overflow["official_passed"], overflow["generated_passed"]) == (True, False)
    assert verdicts["c++ compile error"].extras["official_passed"] is False
    assert verdicts["rust"].extras["language"] == "rust"


def test_output_comparison() -> None:
    assert outputs_match("1 2\n3\n", "1 2 3")
    assert outputs_match("1 2\n", "\r\n 1\t\t2\r\n\n")
    # only testlib's blanks (space, tab, CR, LF) separate tokens, not other Unicode spaces
    for joint in ("\u00a0", "\v", "\f", "\u3000", "\u2028", "\u0085", "\u2003"):
        assert not outputs_match("1 2", f"1{joint}2"), repr(joint)
        assert not outputs_match("1", f"1{joint}"), repr(joint)
    assert not outputs_match("1", "1 2")
    # without a declared float comparison, a decimal answer is as exact as any other token
    assert not outputs_match("0.3333333", "0.33333334")
    assert not outputs_match("2.5", "2.5000001")
    assert not outputs_match("10", "10.0000001")
    # a problem's `tolerance` declares one: numbers within it, absolute or relative
    assert outputs_match("0.3333333", "0.33333334", 1e-6)
    assert outputs_match("2", "2.0000001", 1e-6)
    assert outputs_match("1e9", "1000000001", 1e-6)
    assert not outputs_match("0.3333", "0.3334", 1e-6)
    assert not outputs_match("1.0", "nan", 1e-6) and not outputs_match("1.0", "1_0", 1e-6)
    assert detect_program("#include <cstdio>\nint main(){}").language == "cpp"
    assert detect_program("fn main() {}").language == "rust"
    assert detect_program("print(1)").language == "python"


MEAN = {  # an exact decimal answer: a wrong value one millionth off must fail
    "task_id": "mean",
    "tests": [{"input": "1 2\n", "output": "1.5\n"}, {"input": "2 2\n", "output": "2.0\n"}],
}


def test_tolerance_only_where_the_problem_declares_a_float_comparison() -> None:
    """Attack: an exact decimal answer (`1.5`) used to accept any value within 1e-6 of it
    because its token has a decimal point. Now only a problem's `tolerance` allows that."""
    close = "```python\na, b = map(int, input().split())\nprint((a + b) / 2 + 1e-7)\n```"
    exact = "```python\na, b = map(int, input().split())\nprint((a + b) / 2)\n```"
    floats = {**MEAN, "task_id": "mean-float", "tolerance": 1e-6}
    jobs = [Job("mean", MEAN, close), Job("mean", MEAN, exact), Job("mean-float", floats, close)]
    verdicts = _verdicts(jobs, sandbox="bwrap")
    assert [v.error_type for v in verdicts] == ["wrong_answer", None, None], verdicts


def test_bundled_problems_that_need_a_tolerance_declare_it() -> None:
    """stdio_demo/3 asks for a mean "within 1e-6": it declares the tolerance, and a right answer
    printed with other digits than the reference still passes."""
    from ckpteval.tasks import resolve_task

    problem = resolve_task("stdio_demo", {}).problems()["stdio_demo/3"]
    assert problem["tolerance"] == 1e-6
    sample = (
        "```python\ninput()\nxs = list(map(int, input().split()))\nprint(sum(xs) / len(xs))\n```"
    )
    wrong = "```python\ninput()\nxs = list(map(int, input().split()))\nprint(sum(xs) / len(xs) + 1e-4)\n```"
    verdicts = _verdicts(
        [Job("stdio_demo/3", problem, c) for c in (sample, wrong)], sandbox="bwrap"
    )
    assert [v.error_type for v in verdicts] == [None, "wrong_answer"], verdicts


def test_unencodable_text_is_replaced_and_flagged_not_fatal() -> None:
    """Attack: a lone surrogate (what a JSON `\\udc80` escape decodes to) in a completion used
    to abort writing the source file, and with it the whole run. It is replaced by U+FFFD and
    the verdict says how many were, in every language, beside samples without one."""
    rust = RUST_OK.replace("fn main() {", "fn main() { // \udc80\udc81")
    cases = [
        (PY_OK.replace("print(a + b)", "print(a + b)  # \udc80"), None),
        (CPP_OK.replace("int main()", "// \udc80\nint main()"), None),
        (rust, None),
        ("```python\nprint('\udc80')\n```", "wrong_answer"),
        (PY_OK, None),
    ]
    verdicts = _verdicts([Job("aplusb", APLUSB, c) for c, _ in cases], sandbox="bwrap")
    assert [v.error_type for v in verdicts] == [e for _, e in cases], verdicts
    assert [v.extras.get("unencodable_chars") for v in verdicts] == [1, 1, 2, 1, None]


# ------------------------------------------------------- Piston (the stand-in on loopback)

BURNING = {"task_id": "burning", "tests": [{"input": "1 2\n", "output": "3\n"}], "time_limit": 0.5}
#: <cstdio> compiles in a tenth of <iostream>'s CPU time: Piston's compile stage has a 10 s wall
#: clock, which a loaded machine can make an <iostream> or rustc compile miss.
CPP_STDIO_OK = (
    "```cpp\n#include <cstdio>\nint main() { long long a, b; "
    'if (scanf("%lld %lld", &a, &b) != 2) return 1; printf("%lld\\n", a + b); }\n```'
)
#: One problem set, every kind of verdict: both backends must agree on each.
SAME_VERDICTS = [
    ("python", APLUSB, PY_OK, None),
    ("c++", APLUSB, CPP_STDIO_OK, None),
    ("wrong answer", APLUSB, "```python\nprint(4)\n```", "wrong_answer"),
    ("runtime error", APLUSB, "```python\nraise ValueError('x')\n```", "runtime_error"),
    ("c++ compile error", APLUSB, "```cpp\nint main( {\n```", "compile_error"),
    ("0.7x the CPU limit", BURNING, f"```python\n{BURN}burn(0.35)\nprint(3)\n```", None),
    ("1.3x the CPU limit", BURNING, f"```python\n{BURN}burn(0.65)\nprint(3)\n```", "timeout"),
    ("endless loop", BURNING, "```python\nwhile True:\n    pass\n```", "timeout"),
    ("sleeper", BURNING, "```python\nimport time\ntime.sleep(30)\n```", "timeout"),
    ("checker accepts", SPLIT, "```python\nn = int(input())\nprint(0, n)\n```", None),
    ("checker rejects", SPLIT, "```python\nn = int(input())\nprint(1, n)\n```", "wrong_answer"),
]


def _verdicts(jobs: list[Job], **options: Any) -> list[Verdict]:
    checker = get_checker("stdio", **options)
    try:
        return checker.check(jobs, workers=2)
    finally:
        checker.close()


def test_piston_with_its_default_limits_judges_like_the_local_sandbox() -> None:
    jobs = [Job(p["task_id"], p, completion) for _, p, completion, _ in SAME_VERDICTS]
    expected = [e for *_, e in SAME_VERDICTS]
    local = _verdicts(jobs)
    with PistonStandin() as piston:
        remote = _verdicts(jobs, endpoint=piston.url, piston_concurrency=2)
    assert [v.error_type for v in local] == expected, local
    assert [v.error_type for v in remote] == expected, remote
    assert [v.compile_ok for v in remote] == [v.compile_ok for v in local]
    assert 1 <= piston.max_active <= 2  # bounded concurrency
    assert piston.runtime_requests == 1  # asked once per checker
    first = piston.requests[0]
    assert (first["compile_timeout"], first["compile_cpu_time"]) == (10000, 10000)
    limits = {(r["run_cpu_time"], r["run_timeout"]) for r in piston.requests}
    assert limits == {(1000, 3000), (500, 3000), (2000, 3000)}  # CPU: the limit; wall: the most


def test_piston_refusing_a_limit_is_one_line_naming_it() -> None:
    """A server configured below Piston's defaults refuses requests within them: one line that
    names the limit and the key to set, no retry, no verdict."""
    with (
        PistonStandin(limits={"run_timeout": 2000}) as piston,
        pytest.raises(PistonError) as caught,
    ):
        _verdicts([Job("aplusb", APLUSB, PY_OK)], endpoint=piston.url)
    assert str(caught.value) == (
        f"piston at {piston.url} refused run_timeout=3000: cannot exceed the configured limit of "
        "2000; set evaluate.piston_limits.run_timeout to at most 2000 (or raise "
        "PISTON_RUN_TIMEOUT on the server)"
    )
    assert len(piston.requests) == 1
    with PistonStandin(limits={"run_timeout": 2000}) as piston:  # configured to match: accepted
        verdicts = _verdicts(
            [Job("aplusb", APLUSB, PY_OK)], endpoint=piston.url, piston_limits={"run_timeout": 2000}
        )
    assert verdicts[0].passed and {r["run_timeout"] for r in piston.requests} == {2000}


def test_the_old_60_s_compile_timeout_is_refused_by_the_stand_in() -> None:
    """What every request used to send: the stand-in refuses it as Piston does."""
    with (
        PistonStandin() as piston,
        pytest.raises(
            PistonError,
            match="refused compile_timeout=60000: cannot exceed the configured limit of 10000",
        ),
    ):
        _verdicts(
            [Job("aplusb", APLUSB, CPP_OK)],
            endpoint=piston.url,
            piston_limits={"compile_timeout": 60000},
        )


def test_a_language_piston_lacks_is_one_line() -> None:
    with PistonStandin(runtimes=[python_runtime()]) as piston, pytest.raises(PistonError) as caught:
        _verdicts([Job("aplusb", APLUSB, CPP_OK)], endpoint=piston.url)
    assert str(caught.value) == (
        f"piston at {piston.url}: no c++ runtime installed (installed: py, py3, python, python3, "
        "python3.12); install it (piston ppman install c++) or use the local sandbox"
    )
    assert piston.requests == []


def test_problems_piston_cannot_judge_as_they_ask_are_one_line() -> None:
    """A time limit over run_cpu_time, or an expected output longer than output_max_size, would
    change verdicts if capped or compared: a `UserError` before anything runs."""
    checker = get_checker("stdio", endpoint=down_url())
    slow = {**APLUSB, "time_limit": 4}
    with pytest.raises(
        UserError,
        match=r"problem slow: time_limit 4 s is over what Piston at .* "
        r"allows \(run_cpu_time 3000 ms\); raise it on the server "
        r"\(PISTON_RUN_CPU_TIME\) and in evaluate.piston_limits",
    ):
        checker.validate_problem("slow", slow)
    long = {"tests": [{"input": "", "output": "1 " * 600}]}
    with pytest.raises(
        UserError,
        match="test 1 expects 1200 characters of output, over Piston's output_max_size of 1024",
    ):
        checker.validate_problem("long", long)
    checker.validate_problem("aplusb", APLUSB)
    roomy = get_checker(
        "stdio",
        endpoint=down_url(),
        piston_limits={"run_cpu_time": 5000, "run_timeout": 10000, "output_max_size": 65536},
    )
    roomy.validate_problem("slow", slow)
    roomy.validate_problem("long", long)
    with pytest.raises(UserError, match="evaluate.piston_limits: unknown key"):
        get_checker("stdio", endpoint=down_url(), piston_limits={"run_time": 1})


def test_a_configured_timeout_over_pistons_limit_is_capped_not_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`evaluate.timeout` (10 s by default) is no problem's own limit: capped at run_cpu_time."""
    free = {"task_id": "free", "tests": [{"input": "1 2\n", "output": "3\n"}]}
    with PistonStandin() as piston:
        checker = get_checker("stdio", endpoint=piston.url)
        try:
            verdict = checker.check([Job("free", free, PY_OK)], workers=1, timeout=10)[0]
        finally:
            checker.close()
    assert verdict.passed, verdict
    assert [(r["run_cpu_time"], r["run_timeout"]) for r in piston.requests] == [(3000, 3000)]
    assert "timeouts above 3 s (evaluate.piston_limits) are capped" in caplog.text


def test_output_over_output_max_size_is_an_output_limit() -> None:
    """Piston kills a program at output_max_size characters (status OL)."""
    with PistonStandin() as piston:
        verdict = _verdicts([Job("aplusb", APLUSB, "print('3 ' * 1000)")], endpoint=piston.url)[0]
    assert verdict.error_type == "output_limit", verdict


def test_an_input_over_pistons_body_limit_is_one_line() -> None:
    huge = {
        "task_id": "huge",
        "tests": [{"input": "1 " * 60_000, "output": "1\n"}],
        "time_limit": 1,
    }
    with (
        PistonStandin() as piston,
        pytest.raises(
            PistonError,
            match=r"refused the request \(HTTP 400\): "
            r"PayloadTooLargeError: request entity too large",
        ),
    ):
        _verdicts([Job("huge", huge, PY_OK)], endpoint=piston.url)


def test_piston_retries_transient_failures() -> None:
    def refuse_two(number: int, request: Any, piston: Any) -> tuple[int, bytes]:
        return (503, b'{"message": "overloaded"}') if number <= 2 else piston()

    with PistonStandin(refuse_two) as piston:
        verdict = _verdicts([Job("aplusb", APLUSB, PY_OK)], endpoint=piston.url, piston_retries=3)[
            0
        ]
    assert verdict.passed
    assert len(piston.times) == 3 + 2  # 2 refused + 3 tests


def test_piston_down_fails_the_run_not_the_samples(tmp_path: Path) -> None:
    with pytest.raises(PistonError, match="failed after 2 attempts"):
        score_samples(
            "stdio",
            {"aplusb": APLUSB},
            [{"task_id": "aplusb", "completion": PY_OK}],
            tmp_path / "o.jsonl",
            tmp_path / "o.json",
            workers=1,
            checker_options={"endpoint": down_url(), "piston_retries": 1},
        )
    assert not (tmp_path / "o.json").exists()
