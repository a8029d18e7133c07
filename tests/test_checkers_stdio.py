"""The stdio checker: local sandboxed judging in three languages, checker programs, and a Piston
client against a small Piston-shaped server on 127.0.0.1 that really runs the programs."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

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


# ------------------------------------------------------------------------------ fake Piston

class FakePiston(ThreadingHTTPServer):
    """Piston's API on loopback, running Python programs for real; can fail on demand."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _PistonHandler)
        self.fail_next = 0
        self.requests = 0
        self.active = 0
        self.max_active = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _PistonHandler(BaseHTTPRequestHandler):
    server: FakePiston

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path == "/api/v2/runtimes":
            self._reply(200, [{"language": "python", "version": "3.9.4", "aliases": ["py"]},
                              {"language": "python", "version": "3.10.0", "aliases": ["py", "python3"]}])
        else:
            self._reply(404, {"message": "not found"})

    def do_POST(self) -> None:  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.requests += 1
            if self.server.fail_next > 0:
                self.server.fail_next -= 1
                self._reply(503, {"message": "overloaded"})
                return
            self.server.active += 1
            self.server.max_active = max(self.server.max_active, self.server.active)
        try:
            assert request["language"] == "python" and request["version"] == "3.10.0"
            run = _execute(request["files"][0]["content"], request["stdin"], request["run_timeout"] / 1000)
        finally:
            with self.server.lock:  # before replying: the client may send its next call at once
                self.server.active -= 1
        self._reply(200, {"language": "python", "version": "3.10.0", "run": run})


def _execute(code: str, stdin: str, timeout: float) -> dict[str, Any]:
    try:
        done = subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"stdout": "", "stderr": "", "output": "", "code": None, "signal": "SIGKILL",
                "status": "TO", "message": "Timeout"}
    return {"stdout": done.stdout, "stderr": done.stderr, "output": done.stdout + done.stderr,
            "code": done.returncode, "signal": None,
            **({"status": "RE", "message": "Runtime error"} if done.returncode else {})}


@pytest.fixture()
def piston() -> Iterator[FakePiston]:
    server = FakePiston()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_piston_backend_judges_like_local(piston: FakePiston) -> None:
    checker = get_checker("stdio", endpoint=piston.url, piston_concurrency=2)
    jobs = [Job("aplusb", APLUSB, PY_OK), Job("aplusb", APLUSB, "print(4)"),
            Job("aplusb", APLUSB, "raise ValueError('x')"), Job("aplusb", APLUSB, "while True: pass"),
            Job("split", SPLIT, "n = int(input())\nprint(0, n)\n")] * 2
    verdicts = checker.check(jobs, workers=4)
    assert [v.error_type for v in verdicts[:5]] == [None, "wrong_answer", "runtime_error", "timeout", None]
    assert [v.error_type for v in verdicts[:5]] == [v.error_type for v in verdicts[5:]]
    assert 1 <= piston.max_active <= 2  # bounded concurrency


def test_piston_retries_transient_failures(piston: FakePiston) -> None:
    piston.fail_next = 2
    checker = get_checker("stdio", endpoint=piston.url, piston_retries=3)
    verdict = checker.check([Job("aplusb", APLUSB, PY_OK)], workers=1)[0]
    assert verdict.passed
    assert piston.requests == 3 + 2  # 2 refused + 3 tests


def test_piston_down_fails_the_run_not_the_samples(tmp_path: Path) -> None:
    server = FakePiston()
    url = server.url
    server.server_close()  # nothing listens there any more
    with pytest.raises(PistonError, match="failed after 2 attempts"):
        score_samples("stdio", {"aplusb": APLUSB}, [{"task_id": "aplusb", "completion": PY_OK}],
                      tmp_path / "o.jsonl", tmp_path / "o.json", workers=1,
                      checker_options={"endpoint": url, "piston_retries": 1})
    assert not (tmp_path / "o.json").exists()
