"""The stdio checker: local sandboxed judging in three languages, checker programs, and a Piston
client against a small Piston-shaped server on 127.0.0.1 that really runs the programs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes import FakePiston, down_url, piston_ok

from ckpteval.checkers import Job, Verdict, get_checker
from ckpteval.checkers.stdio import PistonError, detect_program, outputs_match
from ckpteval.evaluate import score_samples

APLUSB = {"task_id": "aplusb", "tests": [{"input": "1 2\n", "output": "3\n"},
                                         {"input": "10 -4\n", "output": "6\n"}],
          "generated_tests": [{"input": "1000000000000 1\n", "output": "1000000000001\n"}],
          "time_limit": 1, "memory_limit": 128,
          "canonical_solution": "a, b = map(int, input().split())\nprint(a + b)\n", "language": "python"}
SPLIT = {  # many valid outputs: print two non-negative integers summing to n
    "task_id": "split", "tests": [{"input": "5\n", "output": "2 3\n"}, {"input": "0\n", "output": "0 0\n"}],
    "checker": "import sys\nn = int(open(sys.argv[1]).read())\ntry:\n"
               "    a, b = map(int, open(sys.argv[2]).read().split())\nexcept ValueError:\n"
               "    sys.exit(1)\nsys.exit(0 if a >= 0 and b >= 0 and a + b == n else 1)\n",
    "canonical_solution": "n = int(input())\nprint(n, 0)\n", "language": "python"}
HALF_SECOND = {"task_id": "half", "tests": [{"input": "1 2\n", "output": "3\n"}], "time_limit": 0.5}
BURN = "import os, time\ndef burn(s):\n    while time.process_time() < s:\n        pass\n"
PY_OK = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
CPP_OK = ("```cpp\n#include <iostream>\nint main() { long long a, b; std::cin >> a >> b; "
          "std::cout << a + b << std::endl; }\n```")
RUST_OK = ("```rust\nuse std::io::Read;\nfn main() {\n    let mut s = String::new();\n"
           "    std::io::stdin().read_to_string(&mut s).unwrap();\n"
           "    let v: Vec<i64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();\n"
           "    println!(\"{}\", v[0] + v[1]);\n}\n```")

CASES = [
    ("python", APLUSB, PY_OK, None),
    ("c++", APLUSB, CPP_OK, None),
    ("rust", APLUSB, RUST_OK, None),
    ("bare c++ is recognised", APLUSB, CPP_OK.strip("`").removeprefix("cpp\n"), None),
    ("wrong on a generated test (32-bit overflow)", APLUSB,
     "```cpp\n#include <iostream>\nint main() { int a, b; std::cin >> a >> b; std::cout << a + b; }\n```",
     "wrong_answer"),
    ("c++ compile error", APLUSB, "```cpp\nint main( {\n```", "compile_error"),
    ("python syntax error", APLUSB, "```python\nprint(\n```", "compile_error"),
    ("runtime error", APLUSB, "```python\nraise SystemExit(3)\n```", "runtime_error"),
    ("timeout", APLUSB, "```python\nwhile True:\n    pass\n```", "timeout"),
    ("memory limit (python)", APLUSB, "```python\nx = bytearray(1 << 32)\n```", "memory_limit"),
    ("memory limit (c++)", APLUSB,
     "```cpp\n#include <vector>\nint main() { std::vector<char> v(1ull << 33); return v[7]; }\n```",
     "memory_limit"),
    ("printing gigabytes", APLUSB, "```cpp\n#include <cstdio>\nint main() { for (;;) std::puts(\"xxxxxxxxxxxxxxxx\"); }\n```",
     "output_limit"),
    ("0.35 s of CPU within a 0.5 s limit", HALF_SECOND,
     f"```python\n{BURN}burn(0.35)\nprint(3)\n```", None),
    ("0.65 s of CPU over a 0.5 s limit", HALF_SECOND,
     f"```python\n{BURN}burn(0.65)\nprint(3)\n```", "timeout"),
    ("CPU spent in a child it never reaps counts", HALF_SECOND,
     f"```python\n{BURN}r, w = os.pipe()\nif os.fork() == 0:\n    burn(0.65)\n"
     "    os.write(w, b'x')\n    os._exit(0)\nos.read(r, 1)\nprint(3)\n```", "timeout"),
    ("fork bomb", APLUSB, "```cpp\n#include <unistd.h>\nint main() { for (;;) fork(); }\n```", "timeout"),
    ("reading the home directory", APLUSB,
     "```python\nprint(open('/root/.bashrc').read())\n```", "runtime_error"),
    ("opening a socket", APLUSB,
     "```python\nimport socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\nprint(3)\n```",
     "runtime_error"),
    ("checker accepts another valid split", SPLIT, "```python\nn = int(input())\nprint(0, n)\n```", None),
    ("checker rejects a wrong split", SPLIT, "```python\nn = int(input())\nprint(1, n)\n```",
     "wrong_answer"),
    ("checker rejects garbage", SPLIT, "```python\nprint('hello')\n```", "wrong_answer"),
]


@pytest.fixture(scope="module")
def verdicts() -> dict[str, Verdict]:
    checker = get_checker("stdio", sandbox="bwrap")
    try:
        jobs = [Job(p["task_id"], p, completion) for _, p, completion, _ in CASES]
        return {name: v for (name, *_), v in zip(CASES, checker.check(jobs, workers=2), strict=True)}
    finally:
        checker.close()


@pytest.mark.parametrize("name,expected", [(c[0], c[3]) for c in CASES])
def test_local_verdict(verdicts: dict[str, Verdict], name: str, expected: str | None) -> None:
    verdict = verdicts[name]
    assert verdict.error_type == expected, verdict
    assert verdict.compile_ok == (expected != "compile_error")


def test_progress_is_reported(verdicts: dict[str, Verdict]) -> None:
    assert verdicts["python"].extras == {"tests_passed": 3, "tests_total": 3, "language": "python"}
    assert verdicts["wrong on a generated test (32-bit overflow)"].extras["tests_passed"] == 2
    assert verdicts["rust"].extras["language"] == "rust"


def test_output_comparison() -> None:
    assert outputs_match("1 2\n3\n", "1 2 3")
    assert outputs_match("0.3333333", "0.33333334")
    assert not outputs_match("0.3333", "0.3334")
    assert not outputs_match("1", "1 2")
    assert not outputs_match("10", "10.0000001")  # an integer answer is exact
    assert detect_program("#include <cstdio>\nint main(){}").language == "cpp"
    assert detect_program("fn main() {}").language == "rust"
    assert detect_program("print(1)").language == "python"


# ---------------------------------------------------------------------- Piston (fake, loopback)

def test_piston_backend_judges_like_local() -> None:
    jobs = [Job("aplusb", APLUSB, PY_OK), Job("aplusb", APLUSB, "print(4)"),
            Job("aplusb", APLUSB, "raise ValueError('x')"), Job("aplusb", APLUSB, "while True: pass"),
            Job("split", SPLIT, "n = int(input())\nprint(0, n)\n")] * 2
    with FakePiston() as piston:
        checker = get_checker("stdio", endpoint=piston.url, piston_concurrency=2)
        verdicts = checker.check(jobs, workers=4)
    assert [v.error_type for v in verdicts[:5]] == [None, "wrong_answer", "runtime_error", "timeout", None]
    assert [v.error_type for v in verdicts[:5]] == [v.error_type for v in verdicts[5:]]
    assert 1 <= piston.max_active <= 2  # bounded concurrency


def test_piston_retries_transient_failures() -> None:
    def refuse_two(number: int, request: dict[str, Any]) -> tuple[int, bytes]:
        return (503, b'{"message": "overloaded"}') if number <= 2 else piston_ok(number, request)

    with FakePiston(refuse_two) as piston:
        checker = get_checker("stdio", endpoint=piston.url, piston_retries=3)
        verdict = checker.check([Job("aplusb", APLUSB, PY_OK)], workers=1)[0]
    assert verdict.passed
    assert len(piston.times) == 3 + 2  # 2 refused + 3 tests


def test_piston_down_fails_the_run_not_the_samples(tmp_path: Path) -> None:
    with pytest.raises(PistonError, match="failed after 2 attempts"):
        score_samples("stdio", {"aplusb": APLUSB}, [{"task_id": "aplusb", "completion": PY_OK}],
                      tmp_path / "o.jsonl", tmp_path / "o.json", workers=1,
                      checker_options={"endpoint": down_url(), "piston_retries": 1})
    assert not (tmp_path / "o.json").exists()
