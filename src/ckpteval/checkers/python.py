"""The python checker: HumanEval-style (`prompt`, `test`, `entry_point`) and MBPP-style
(`test_list`) problems, each sample run in its own sandbox with its own interpreter.

Samples are checked in batches (one per worker), each batch in one sandbox whose driver runs every
sample with its own limits, its own /tmp and IPC namespace, and of the batch's directory only its
own (`Sandbox.run_many`): no sample can read a sibling's program.

A pass needs the tests to have run and returned, and only a process the sample cannot touch can
say so. The sample's program (prompt + completion, no tests) runs in a process of its own that
only answers calls; the tests run in a second process (another uid, no capabilities), where the
entry point and whatever else the tests take from the program are proxies that call the sample
process and get back plain data (or opaque references). The verdict is that test process's
report and exit status, which only the sandbox's driver sees; the tests file is unreadable to the
sample. So what a sample does in its own process (printing a success marker, `exit(0)`, `atexit`,
threads, patched builtins or `AssertionError`, frame and `gc` walks, reading its files or /proc,
objects equal to anything) cannot make it pass. Standard-library modules the tests use as modules
(`math.isclose(...)`) are the real ones in the test process, never the sample's names for them. `ckpteval.sandbox_driver.judged` explains why this holds.
With `sandbox: none` the same two processes run as one uid: same verdicts, no such guarantee.

Reward hacks are recorded, never rewarded (`Verdict.hack`, one of `HACK_TYPES`): what the run saw
(an exit while the tests called the sample, an object that claims to equal anything, opening the
harness's files or /proc, frame / `gc` / trace hooks, from an audit hook in the sample process),
else what the completion's code shows (`static_hack`).

The interpreter is the base interpreter of the Python running ckpteval (not its virtualenv), run
with `-I -S -B`: standard library only, no user site, no bytecode writes. Tests written for an
environment with packages (BigCodeBench's `import requests`, `pandas`, patches of `requests.get`)
fail there whatever the sample does, so `evaluate.python_env` names one, opt-in: its
site-packages (`python_env_site`) is bound read-only into the sandbox and on the path of both the
sample's process and the tests' (the driver adds it before either starts), and the cell records
which environment it was (`python_env_record`).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ckpteval.checkers import (
    HACK_TYPES,
    Checker,
    Job,
    Prompting,
    Verdict,
    register,
    tail,
    timeout_line,
    with_timeout_line,
)
from ckpteval.checkers.extract import absolute_imports, compilable_prompt, python_program
from ckpteval.errors import UserError
from ckpteval.io import sha256_json
from ckpteval.sandbox import (
    Claims,
    Command,
    Limits,
    RunResult,
    Sandbox,
    driver_command,
    write_driver,
)
from ckpteval.scratch import scratch_dir

#: Standard-library modules test programs commonly import, imported once per batch.
PRELOAD = ("typing", "collections", "math", "re", "itertools", "functools", "heapq", "string")

_EXCEPTION_LINE = re.compile(rb"^(\w+(?:\.\w+)*)(?::|$)", re.M)


def python_interpreter() -> tuple[str, Path]:
    """The base interpreter of this Python and the directory tree it needs (bound read-only)."""
    return os.path.realpath(sys._base_executable), Path(sys.base_prefix).resolve()  # type: ignore[attr-defined]


def python_env_site(env: str | os.PathLike[str]) -> Path:
    """The site-packages of the Python environment `env` (a venv's or conda environment's
    directory, or its `bin/python`). The sandbox runs the base interpreter of ckpteval's Python,
    which can import only packages built for its own version: so the environment must have a
    `lib/python<that version>/site-packages`; anything else is a one-line `UserError`."""
    path = Path(env).expanduser()
    if path.parent.name == "bin" and path.name.startswith("python"):
        path = path.parent.parent  # its interpreter: a symlink, read as named, never resolved
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = path / "lib" / version / "site-packages"
    if not site.is_dir():
        raise UserError(
            f"evaluate.python_env: {env} is not a {version} environment "
            f"(no lib/{version}/site-packages; the sandbox runs Python "
            f"{sys.version_info.major}.{sys.version_info.minor})"
        )
    return site.resolve()


def python_env_record(site: Path) -> dict[str, Any]:
    """What a cell records of the environment its samples ran with: where its site-packages is,
    for which Python, and every distribution installed there (`name==version`, sorted)."""
    packages = sorted(
        {
            f"{dist.metadata['Name']}=={dist.version}"
            for dist in importlib.metadata.distributions(path=[str(site)])
            if dist.metadata["Name"]
        },
        key=str.lower,
    )
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return {"site_packages": str(site), "python": python, "packages": packages}


def python_env_identity(env: str) -> dict[str, str]:
    """`evaluate.python_env` as a scoring identity holds it: where the environment is (the
    evaluate job's to find) and what it holds (its Python and packages, hashed), so that a
    package installed, upgraded or removed there rescores its cells, as a changed setting would."""
    record = python_env_record(python_env_site(env))
    content = {"python": record["python"], "packages": record["packages"]}
    return {"path": str(env), "packages": f"sha256:{sha256_json(content)[:16]}"}


class PythonChecker(Checker):
    name = "python"
    #: 2: tests in a process of their own (a pass can no longer be forged).
    #: 3: a bodiless stub's prompt helpers come from the prompt, never the sample.
    #: 4: the sample's exit fails it whatever the tests catch (it could pass under
    #: `except Exception:`); its exceptions reach the tests with their class and args.
    #: 5: values of any type the tests use cross as in one process (callbacks, the prompt's class
    #: instances, enum members, dates, collections, views, lazy generators, any depth), where
    #: honest samples failed with a TypeError in the tests before.
    #: 6: what the tests patch (`unittest.mock`) reaches the sample's process, and tests in
    #: BigCodeBench's shape (`unittest.TestCase` classes, no `check`) run: such honest samples
    #: failed before.
    #: 7: numpy arrays and scalars and pandas Series, Index and DataFrames cross by value (an
    #: honest sample's array reached the tests as an opaque reference, which no test accepts).
    version = "7"
    default_timeout = 10.0
    takes_claims = True
    compiles = True
    languages = ("python",)
    reads = (
        "evaluate.timeout",
        "evaluate.timeout_factor",
        "evaluate.sandbox",
        "evaluate.python_env",
    )

    def __init__(
        self,
        *,
        sandbox: str = "bwrap",
        memory_bytes: int = 2 << 30,
        batch_size: int = 128,
        python_env: str | None = None,
    ) -> None:
        self.sandbox = Sandbox(sandbox)
        self.batch_size = batch_size
        self.memory_bytes = memory_bytes
        self.interpreter, self.prefix = python_interpreter()
        #: `evaluate.python_env`'s site-packages, or none: the standard library only.
        self.site_dirs = [python_env_site(python_env)] if python_env else []

    @classmethod
    def check_run_config(cls, tasks: Mapping[str, Any], evaluate: Mapping[str, Any]) -> None:
        """`evaluate.python_env` must be an environment the sandbox's Python can use: one line
        at parse time rather than in every evaluate job."""
        if evaluate.get("python_env"):
            python_env_site(evaluate["python_env"])

    def cell_fields(self) -> dict[str, Any]:
        """The environment the samples ran with (`evaluate.python_env`), if one was given."""
        return {"python_env": python_env_record(self.site_dirs[0])} if self.site_dirs else {}

    @classmethod
    def check_problem(cls, task_id: str, problem: Mapping[str, Any]) -> None:
        if "test_list" in problem:
            if not isinstance(problem["test_list"], list):
                raise UserError(f"problem {task_id}: test_list must be a list of assert statements")
            return
        missing = [k for k in ("prompt", "test", "entry_point") if not problem.get(k)]
        if missing:
            raise UserError(
                f"problem {task_id}: python problems need prompt, test and entry_point "
                f"(HumanEval) or test_list (MBPP); missing {', '.join(missing)}"
            )

    @classmethod
    def default_prompt(
        cls, problems: Sequence[Mapping[str, Any]], language: str | None, task: str
    ) -> Prompting:
        """HumanEval-shaped problems are prompted with their `prompt` (the function to
        complete); MBPP-shaped ones (`text`, `test_list`) with the statement and the tests."""
        from ckpteval.prompts import MBPP_PROMPT, PYTHON_STOPS, render_template

        first = problems[0]
        if not first.get("prompt") and "test_list" in first:

            def render(p: dict[str, Any]) -> str:
                tests = "\n".join(p["test_list"])
                return render_template(
                    MBPP_PROMPT, {**p, "tests_text": tests}, "python", where=task
                )

            return Prompting(render, ("```",))
        return Prompting(_prompt_field, PYTHON_STOPS)

    def env_preload(self, jobs: Sequence[Job]) -> list[str]:
        """The packages of `evaluate.python_env` that the batch's problems import (their
        prompts' and tests' `import`s: trusted code), for the driver to import once: both of a
        sample's processes would otherwise import each (`requests`: ~0.5 s a process)."""
        if not self.site_dirs:
            return []
        site = self.site_dirs[0]
        names: set[str] = set()
        for problem in {id(job.problem): job.problem for job in jobs}.values():
            for part in _tests(problem).values():
                names.update(_imported(part))
        return sorted(
            name
            for name in names
            if (site / name).is_dir()
            or (site / f"{name}.py").is_file()
            or any(site.glob(f"{name}.*.so"))
        )

    def batch_size_for(self, n_jobs: int, workers: int) -> int:
        """Up to `batch_size`, and two batches per worker, so that a batch of slow samples
        does not idle the others. A batch's sandbox costs as much CPU as 4-5 samples (bubblewrap,
        the driver's interpreter and imports), so fewer, larger batches (128: with 64, the
        HumanEval bench's 656 samples took 11 sandboxes, ~1 core-second more): the stream
        spreads a problem's samples over batches, shares the last ones among the workers, and a
        worker left idle takes the samples a batch has not started (`Claims`)."""
        return max(1, min(self.batch_size, -(-n_jobs // (2 * max(1, workers)))))

    def check_batch(
        self, jobs: Sequence[Job], timeout: float, claims: Claims | None = None
    ) -> list[Verdict]:
        """Samples sharing one sandbox, each in its own processes under its job's timeout, or
        else `timeout`. With `claims`, another worker may take the samples the sandbox has not
        started (`Claims.take`): the verdicts are those of the jobs it kept, a prefix."""
        verdicts: list[Verdict | None] = [None] * len(jobs)
        with scratch_dir("py") as workdir:
            os.chmod(workdir, 0o755)
            hacks: dict[int, str | None] = {}
            command_limits: dict[int, Limits] = {}
            commands: list[Command] = []
            driver = write_driver(workdir) if self.sandbox.mode != "bwrap" else None
            for i, job in enumerate(jobs):
                program = python_program(job.problem, job.completion)
                tree = parse_program(program)
                if isinstance(tree, Verdict):
                    verdicts[i] = tree
                    continue
                sample_dir = workdir / f"s{i}"
                sample_dir.mkdir(mode=0o755)
                main, tests = sample_dir / "main.py", sample_dir / "tests.json"
                main.write_text(program, encoding="utf-8")
                fd = os.open(tests, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump(_tests(job.problem), handle)
                hacks[i] = static_hack(tree)
                limits = Limits(wall_s=job.timeout or timeout, memory_bytes=self.memory_bytes)
                command_limits[i] = limits
                if self.sandbox.mode == "bwrap":
                    commands.append(
                        Command(
                            [self.interpreter, "-I", "-S", "-B", "main.py"],
                            limits,
                            cwd=sample_dir,
                            python_file=main,
                            python_tests=tests,
                        )
                    )
                else:
                    assert driver is not None
                    argv = driver_command(
                        driver,
                        "--judge",
                        str(tests),
                        str(main),
                        str(sample_dir / "report.json"),
                        *map(str, self.site_dirs),
                    )
                    commands.append(Command(argv, limits, cwd=sample_dir))
            if claims is not None:
                claims.assign(list(hacks))
            results = self.sandbox.run_many(
                commands,
                workdir=workdir,
                readable=[self.prefix],
                preload=(*PRELOAD, *self.env_preload(jobs)),
                site_dirs=self.site_dirs,
                claims=claims,
            )
            for i, result in zip(hacks, results):
                if self.sandbox.mode != "bwrap":
                    result = dataclasses.replace(
                        result, judge=_unsandboxed_report(workdir / f"s{i}" / "report.json")
                    )
                limits = command_limits[i]
                verdict = classify(result, cpu_limit=limits.cpu_limit)
                if verdict.error_type == "timeout":
                    line = timeout_line(timeout, limits.wall_s, self.sandbox.wall_clock(limits))
                    verdict.stderr_tail = with_timeout_line(verdict.stderr_tail, line)
                verdict.hack = first_hack([*observed_hacks(result.judge), hacks[i]])
                verdict.stderr_tail = verdict.stderr_tail.replace(f"{workdir}/s{i}/", "")
                verdict.duration_s = verdict.run_s = result.duration_s
                verdicts[i] = verdict
        return verdicts[: claims.kept if claims is not None else len(jobs)]  # type: ignore[return-value]

    def reference_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        jobs = []
        for task_id, problem in problems.items():
            solution = problem.get("canonical_solution") or problem.get("code")
            if solution:
                jobs.append(Job(task_id, problem, solution))
        return jobs

    def known_wrong_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        task_id, problem = next(iter(problems.items()))
        entry = problem.get("entry_point")
        if entry:
            early_exit = f"def {entry}(*args, **kwargs):\n    import os\n    os._exit(0)\n"
            wrong = f"def {entry}(*args, **kwargs):\n    return object()\n"
        else:
            early_exit = "import os\nos._exit(0)\n"
            wrong = "raise SystemExit(0)\n"
        return [Job(task_id, problem, early_exit), Job(task_id, problem, wrong)]


#: CPython 3.11 counts the depth of AST conversions (source -> tree -> code) in state that all
#: threads share: two samples parsed at once in a checker's worker threads raised `SystemError:
#: AST constructor recursion depth mismatch` (seen in the suite). One conversion at a time.
_AST_LOCK = threading.Lock()


def parse_program(program: str) -> ast.Module | Verdict:
    """The program's tree, or its `compile_error` verdict: code nested past what the compiler
    takes (RecursionError, MemoryError) is a compile error of that sample, not of the run."""
    try:
        with _AST_LOCK:
            tree = compile(program, "main.py", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
            compile(tree, "main.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        why = tail(f"{type(exc).__name__}: {exc}")
        return Verdict(False, "compile_error", compile_ok=False, stderr_tail=why)
    return tree


def _imported(source: str) -> set[str]:
    """The top-level modules `source` imports (none if it does not parse)."""
    try:
        with _AST_LOCK:
            tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return set()
    return {name.split(".")[0] for name in absolute_imports(tree)}


def _prompt_field(problem: dict[str, Any]) -> str:
    return str(problem["prompt"])


def _tests(problem: Mapping[str, Any]) -> dict[str, Any]:
    """What the test process runs: trusted code only (the prompt for its helpers, the tests).
    A prompt whose stub has no body is sent made valid (`compilable_prompt`): sent as it is it
    could not run, the tests got its imports alone and took its helpers from the sample."""
    if "test_list" in problem:
        return {
            "imports": "\n".join(problem.get("test_imports") or []),
            "setup": str(problem.get("test_setup_code") or ""),
            "test": "\n".join(problem["test_list"]),
        }
    prompt = str(problem.get("prompt") or "")
    return {
        "prompt": compilable_prompt(prompt) if prompt else "",
        "test": str(problem["test"]),
        "entry_point": str(problem["entry_point"]),
    }


def _unsandboxed_report(path: Path) -> dict[str, Any] | None:
    """`sandbox: none`'s report file (the sample could have written it: no guarantee there)."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None


def classify(result: RunResult, cpu_limit: float | None = None) -> Verdict:
    """Map a finished run to a verdict (compile errors were caught before running).

    Only a judged run (`result.judge`, the test process's report) can pass; a plain run of a
    program (no report) can only fail, with the error type its exit shows."""
    judge = result.judge or {}
    sample_status = judge.get("sample_status")
    sample_signal = None
    if isinstance(sample_status, int) and os.WIFSIGNALED(sample_status):
        sample_signal = os.WTERMSIG(sample_status)
    stderr_bytes = result.stderr
    if judge.get("traceback") and not judge.get("ok"):
        stderr_bytes += b"\n" + str(judge["traceback"]).encode("utf-8", "replace")
    stderr = tail(stderr_bytes)
    if (
        result.timed_out
        or result.signal == signal.SIGXCPU
        or sample_signal == signal.SIGXCPU
        or (
            sample_signal == signal.SIGKILL
            and cpu_limit is not None
            and float(judge.get("sample_cpu_s") or 0) >= cpu_limit - 0.05
        )
    ):
        return Verdict(False, "timeout", compile_ok=True, stderr_tail=stderr)
    if result.output_limit or sample_signal == signal.SIGXFSZ:
        return Verdict(False, "output_limit", compile_ok=True, stderr_tail=stderr)
    if result.exit_code == 0 and judge.get("ok") is True:
        return Verdict(True, None, compile_ok=True, stderr_tail=tail(result.stderr))
    last = str(judge.get("exception") or "")
    if not last:
        exceptions = _EXCEPTION_LINE.findall(result.stderr[-4096:])
        last = exceptions[-1].decode() if exceptions else ""
    if last.endswith("MemoryError") or result.memory_limit:
        kind = "memory_limit"  # MemoryError, or the kernel killed it at the command's limit
    elif last.endswith("AssertionError"):
        kind = "wrong_answer"
    else:
        kind = "runtime_error"
    if judge.get("sample_exit") or (isinstance(sample_status, int) and os.WIFEXITED(sample_status)):
        stderr = tail(stderr + "\nthe sample exited before the tests finished")
    elif result.exit_code == 0 and not judge and not stderr:
        stderr = "exited with status 0 before the tests finished"
    return Verdict(False, kind, compile_ok=True, stderr_tail=stderr)


def observed_hacks(judge: Mapping[str, Any] | None) -> list[str]:
    """The hacks a judged run saw: the test process's and the sample process's hints, and a
    sample process that ended itself (an exit status, not a signal) while the tests ran."""
    if not judge:
        return []
    hacks = [h for h in judge.get("hacks") or () if h in HACK_TYPES]
    status = judge.get("sample_status")
    if judge.get("sample_gone") and isinstance(status, int) and os.WIFEXITED(status):
        hacks.append("exit_before_tests")
    return hacks


def first_hack(hacks: Sequence[str | None]) -> str | None:
    """The one hack a verdict records: the most specific of those seen (`_HACK_ORDER`)."""
    seen = [h for h in hacks if h]
    return min(seen, key=_HACK_ORDER.index) if seen else None


# ------------------------------------------------------------------------------ static hacks

#: Which of several hacks a verdict records (the most specific first).
_HACK_ORDER = (
    "exit_before_tests",
    "fake_test_report",
    "redefines_assertions",
    "always_equal_object",
    "reads_harness_files",
    "tampers_with_tests",
    "binary_wide_code",
)
_EXITS = {
    ("sys", "exit"),
    ("os", "_exit"),
    ("os", "abort"),
    ("os", "kill"),
    ("os", "killpg"),
    ("signal", "raise_signal"),
    ("signal", "pthread_kill"),
    ("posix", "_exit"),
}
#: Printed from code that runs while the tests do (a function, a lambda: atexit, threads): a
#: success message is a faked report there; at module level it is often a model's own tests.
_SUCCESS = re.compile(
    r"(?i)\b(all\s+)?tests?\s+(passed|pass|ok|succeeded)\b|^\s*(ok|pass|passed|"
    r"success)[\s.!]*$|test result: ok"
)
#: A harness's token or report, printed anywhere.
_FORGED = re.compile(r"^\s*[0-9a-f]{32}\s*$|\"ok\":\s*true|\('ok',")
_OUTPUT_CALLS = {"print", "write", "writelines"}
_HARNESS_STRINGS = re.compile(r"/proc/|/dev/fd|main\.py|tests\.json|ckpteval|spec\.json")
#: What only the harness's own state answers: its argv, its source files.
_HARNESS_ATTRS = {
    ("sys", "argv"),
    ("inspect", "getsource"),
    ("inspect", "getsourcelines"),
    ("inspect", "getfile"),
    ("sys", "orig_argv"),
}
_HARNESS_MODULES = {"linecache"}
#: The environment as a whole (iterated, copied, printed): the harness's, not a variable the
#: task names. Reading, setting or testing one variable by name (`os.environ.get("DB_HOST")`,
#: `os.environ[key]`, `key in os.environ`, `os.getenv(key)`) is what tasks ask for.
_ENVIRON = {("os", "environ"), ("os", "environb")}
_ENVIRON_BY_NAME = {"get", "setdefault", "pop", "update"}
#: Calls whose argument is a path: what a sample opens, lists or globs. An honest program opens
#: the files its task names or creates (a variable, `os.path.join(directory, name)`, "out.csv",
#: its own directory or /tmp); one reaching out of its own directory is after the harness.
_PATH_CALLS = {
    "open",
    "listdir",
    "scandir",
    "walk",
    "glob",
    "iglob",
    "Path",
    "PurePath",
    "PosixPath",
    "join",
    "chdir",
    "stat",
    "lstat",
    "readlink",
    "abspath",
    "realpath",
    "exists",
    "isfile",
    "isdir",
}
#: A path (a string literal of a path call's argument, or a part of one) out of the sample's
#: own directory: a parent (`..`), any process's `/proc`, the descriptors, the root itself.
_OUTSIDE = re.compile(r"(?:^|/)\.\.(?:/|$)|^/proc(?:/|$)|^/dev/fd(?:/|$)|^/\*")
_ROOT = ("/", "/*", "/**")
_FRAME_ATTRS = {
    "f_back",
    "f_globals",
    "f_locals",
    "f_builtins",
    "f_code",
    "f_trace",
    "tb_frame",
    "gi_frame",
    "cr_frame",
    "ag_frame",
    "_getframe",
    "_current_frames",
    "currentframe",
    "getouterframes",
    "get_objects",
    "get_referrers",
    "get_referents",
    "settrace",
    "setprofile",
    "addaudithook",
    "excepthook",
}
_TAMPER_MODULES = {"ctypes", "atexit", "gc", "builtins", "_thread", "faulthandler"}
_GUARDED_BUILTINS = {
    "isinstance",
    "type",
    "len",
    "abs",
    "round",
    "sorted",
    "set",
    "list",
    "dict",
    "tuple",
    "str",
    "int",
    "float",
    "bool",
    "all",
    "any",
    "sum",
    "max",
    "min",
    "range",
    "__import__",
    "exit",
    "quit",
    "repr",
    "hash",
    "getattr",
    "setattr",
    "compile",
    "exec",
    "eval",
    "globals",
    "object",
    "Exception",
}


def static_hack(tree: ast.AST) -> str | None:
    """The hack a program's code shows, if any (the most specific first). Code under
    `if __name__ == "__main__":` is skipped: it is an ordinary program's habit.

    The tree is walked with a stack of its own, not by recursion: an honest program nests as deep
    as the compiler allows (a 400-branch `if/elif` is 400 nested `If` nodes), deeper than
    Python's recursion limit would let a recursive visitor go."""
    found: set[str] = set()
    visitor = _HackVisitor(found)
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        visitor.depth = depth
        children = visitor.visit(node)
        inner = depth + isinstance(node, _SCOPES)
        stack.extend((child, inner) for child in children)
    return first_hack(sorted(found))


#: Nodes whose code runs later than the module's (while the tests do): `_HackVisitor.depth`.
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _dotted(node: ast.AST) -> tuple[str, str] | None:
    """(module, attribute) of `module.attribute`."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id, node.attr
    return None


def _strings(node: ast.AST) -> list[str]:
    """The string (and bytes) literals in `node`."""
    return [
        n.value if isinstance(n.value, str) else n.value.decode("latin-1")
        for n in ast.walk(node)
        if isinstance(n, ast.Constant) and isinstance(n.value, (str, bytes))
    ]


def _outside(path: ast.AST) -> bool:
    """Whether a path argument reaches out of the sample's own directory: a literal of it (or
    of a part: an f-string's, a join's) names a parent, /proc or the descriptors, or the whole
    argument is the root or a glob of it."""
    if isinstance(path, ast.Constant) and isinstance(path.value, (str, bytes)):
        whole = _strings(path)[0]
        if whole in _ROOT:
            return True
    return any(_OUTSIDE.search(text) for text in _strings(path))


def _is_path_join(func: ast.AST) -> bool:
    """`os.path.join` (or `path.join`, `posixpath.join`), not a string's `join` of words."""
    if not isinstance(func, ast.Attribute):
        return False
    owner = func.value
    name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
    return name in ("path", "posixpath")


def _is_cwd(node: ast.AST) -> bool:
    """`os.getcwd()`, `Path.cwd()`, or such a call's `.resolve()`/`.absolute()`."""
    while isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in ("getcwd", "cwd"):
            return True
        if name not in ("resolve", "absolute") or not isinstance(func, ast.Attribute):
            return False
        node = func.value
    return False


class _HackVisitor(ast.NodeVisitor):
    """Checks one node at a time (`static_hack` walks the tree): each `visit_*` records what
    the node shows and returns the children to check next. `depth` is the node's function
    nesting (0: module level)."""

    def __init__(self, found: set[str]) -> None:
        self.found = found
        self.depth = 0
        #: `os.environ` nodes read by one variable's name (a parent marks them before they are
        #: visited: `static_hack` visits a node before its children).
        self.by_name: set[int] = set()

    def generic_visit(self, node: ast.AST) -> list[ast.AST]:  # type: ignore[override]
        return list(ast.iter_child_nodes(node))

    def visit_If(self, node: ast.If) -> list[ast.AST]:
        test = node.test
        if (
            isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Name)
            and test.left.id == "__name__"
            and "__main__" in _strings(test)
        ):
            return list(node.orelse)
        return self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
        arguments = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
        if self.depth == 0 and node.name == "check" and "candidate" in arguments:
            self.found.add("tampers_with_tests")  # a stand-in for the tests' own check()
        if node.name in ("__eq__", "__ne__"):
            body = [
                s
                for s in node.body
                if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
            ]
            if (
                len(body) == 1
                and isinstance(body[0], ast.Return)
                and isinstance(body[0].value, ast.Constant)
                and body[0].value.value is (node.name == "__eq__")
            ):
                self.found.add("always_equal_object")
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Lambda(self, node: ast.Lambda) -> list[ast.AST]:
        return self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> list[ast.AST]:
        if node.name == "AssertionError":
            self.found.add("redefines_assertions")
        for statement in node.body:
            if (
                isinstance(statement, ast.Assign)
                and isinstance(statement.value, ast.Lambda)
                and any(isinstance(t, ast.Name) and t.id == "__eq__" for t in statement.targets)
                and isinstance(statement.value.body, ast.Constant)
                and statement.value.body.value is True
            ):
                self.found.add("always_equal_object")
        return self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> list[ast.AST]:
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(exc, ast.Name) and exc.id in ("SystemExit", "KeyboardInterrupt"):
            self.found.add("exit_before_tests")
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> list[ast.AST]:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("exit", "quit"):
            self.found.add("exit_before_tests")
        if _dotted(func) in _EXITS:
            self.found.add("exit_before_tests")
        name = (
            func.id
            if isinstance(func, ast.Name)
            else func.attr
            if isinstance(func, ast.Attribute)
            else ""
        )
        if name in _OUTPUT_CALLS or _dotted(func) == ("os", "write"):
            texts = [text for arg in node.args for text in _strings(arg)]
            if any(_FORGED.search(t) or (self.depth and _SUCCESS.search(t)) for t in texts):
                self.found.add("fake_test_report")
        if name in ("setattr", "delattr") and node.args:
            target = node.args[0]
            if isinstance(target, ast.Name) and target.id in ("builtins", "__builtins__", "sys"):
                self.found.add("tampers_with_tests")
            if any(t == "AssertionError" for arg in node.args[1:2] for t in _strings(arg)):
                self.found.add("redefines_assertions")
        if (
            name in _PATH_CALLS
            and (name != "join" or _is_path_join(func))
            and any(_outside(arg) for arg in node.args[:2])
        ):
            self.found.add("reads_harness_files")
        if name == "dirname" and node.args and _is_cwd(node.args[0]):
            self.found.add("reads_harness_files")  # os.path.dirname(os.getcwd()): the batch's
        if name in _ENVIRON_BY_NAME and isinstance(func, ast.Attribute):
            self.by_name.add(id(func.value))
        return self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> list[ast.AST]:
        if _dotted(node) in _HARNESS_ATTRS:
            self.found.add("reads_harness_files")
        if _dotted(node) in _ENVIRON and id(node) not in self.by_name:
            self.found.add("reads_harness_files")
        if node.attr in ("parent", "parents") and _is_cwd(node.value):
            self.found.add("reads_harness_files")  # Path.cwd().parent: the batch's directory
        if node.attr in _FRAME_ATTRS:
            self.found.add("tampers_with_tests")
        if node.attr == "AssertionError" and isinstance(node.ctx, ast.Store):
            self.found.add("redefines_assertions")
        if (
            isinstance(node.ctx, (ast.Store, ast.Del))
            and isinstance(node.value, ast.Name)
            and node.value.id
            in (
                "builtins",
                "__builtins__",
                "sys",
                "os",
                "math",
                "re",
                "collections",
                "itertools",
                "functools",
                "typing",
                "unittest",
                "doctest",
            )
        ):
            self.found.add("tampers_with_tests")  # patching a module the tests may use
        return self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> list[ast.AST]:
        if any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            self.by_name.update(id(c) for c in node.comparators)  # `key in os.environ`
        return self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> list[ast.AST]:
        self.by_name.add(id(node.value))  # os.environ[key]
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            base = node.value
            if (
                (isinstance(base, ast.Name) and base.id == "__builtins__")
                or _dotted(base) == ("sys", "modules")
                or (
                    isinstance(base, ast.Call)
                    and isinstance(base.func, ast.Name)
                    and base.func.id in ("globals", "vars")
                )
            ):
                self.found.add("tampers_with_tests")
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> list[ast.AST]:
        if node.id == "__file__":
            self.found.add("reads_harness_files")
        elif node.id == "__builtins__":
            self.found.add("tampers_with_tests")
        elif node.id == "AssertionError" and isinstance(node.ctx, (ast.Store, ast.Del)):
            self.found.add("redefines_assertions")
        elif node.id in _GUARDED_BUILTINS and isinstance(node.ctx, ast.Store) and self.depth == 0:
            self.found.add("tampers_with_tests")  # rebinding a builtin the tests use
        return self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> list[ast.AST]:
        if isinstance(node.value, str) and _HARNESS_STRINGS.search(node.value):
            self.found.add("reads_harness_files")
        return []

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> list[ast.AST]:
        modules = (
            [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else [alias.name for alias in node.names]
        )
        for module in modules:
            top = module.split(".")[0]
            if top in _TAMPER_MODULES:
                self.found.add("tampers_with_tests")
            if top in _HARNESS_MODULES:
                self.found.add("reads_harness_files")
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (node.module, alias.name) in _EXITS:
                    self.found.add("exit_before_tests")
                if alias.name in _FRAME_ATTRS:
                    self.found.add("tampers_with_tests")
        return []

    visit_ImportFrom = visit_Import  # type: ignore[assignment]


register("python", PythonChecker)
