"""The math checker: extract a final answer and compare it with the gold answer.

Where the answer is read is `ckpteval.checkers.math_extract` (the last `\\boxed{}`, else the last
answer statement or GSM8K `####` marker, else -- for problems with `answer_last_line: true` -- the
last line); how it is compared is `ckpteval.checkers.math_equiv` (exact numbers, lists, text and
units in-process, then math-verify). Each score line says which extraction and which equivalence
decided (`extraction`, `equivalence`). docs/evaluate.md, "Math answers", has the rules.

math-verify (sympy) can take unbounded time on hostile input and its own timeouts use
`signal.alarm` (main thread only). So it runs in helper processes, one per scoring thread, each
call under a wall-clock limit; a helper that overruns is killed and replaced, and the sample gets
`error_type: timeout`. math-verify only parses (its expression path hands sympy strings of digits
and operators), so the helpers need no sandbox.

Registered twice: `math` and `gsm8k` (the same checker; GSM8K is the `####` case).
"""

from __future__ import annotations

import json
import queue
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ckpteval.checkers import Checker, Job, Prompting, Verdict, register, timeout_line
from ckpteval.checkers.math_equiv import as_number, equivalent
from ckpteval.checkers.math_extract import boxed, extract_answer, gold_answer
from ckpteval.errors import UserError

__all__ = ["MathChecker", "as_number", "boxed", "extract_answer", "gold_answer"]

#: The problem field by which a task declares that a bare last line is an answer.
LAST_LINE_FIELD = "answer_last_line"
#: A final answer longer than this is wrong without being compared: no gold answer is near it,
#: and comparing (normalising, unit stripping, sympy) costs more than linear time in its length.
MAX_ANSWER_CHARS = 1000


class MathChecker(Checker):
    name = "math"
    #: 2: the extraction order and normalisation of docs/evaluate.md "Math answers".
    #: 3: hedges and sprays are lists, relations no value, ± two values, a base's digits alone.
    version = "3"
    default_timeout = 5.0
    reads = ("evaluate.timeout",)

    def __init__(self) -> None:
        self._pool = _VerifyPool()

    @classmethod
    def normalise_problem(cls, row: Mapping[str, Any]) -> dict[str, Any]:
        """A MATH line's `problem` is its `question`."""
        out = dict(row)
        if "question" not in out and isinstance(row.get("problem"), str):
            out["question"] = row["problem"]
        return out

    @classmethod
    def default_prompt(
        cls, problems: Sequence[Mapping[str, Any]], language: str | None, task: str
    ) -> Prompting:
        from ckpteval.prompts import MATH_PROMPT, render_template

        def render(problem: dict[str, Any]) -> str:
            return render_template(MATH_PROMPT, problem, None, where=task)

        return Prompting(render, ("\nQuestion:",))

    @classmethod
    def check_problem(cls, task_id: str, problem: Mapping[str, Any]) -> None:
        if not gold_answer(problem):
            raise UserError(
                f"problem {task_id}: math problems need an `answer` (GSM8K '... #### N', "
                "a \\boxed{} solution, or the bare answer)"
            )

    def check_one(self, job: Job, timeout: float) -> Verdict:
        start = time.monotonic()
        gold = gold_answer(job.problem)
        last_line = bool(job.problem.get(LAST_LINE_FIELD))
        answer, how = extract_answer(job.completion, last_line=last_line)
        extras = {"extracted": answer, "extraction": how, "equivalence": None, "gold": gold}
        if answer is None:
            return Verdict(False, "no_answer", duration_s=time.monotonic() - start, extras=extras)
        if len(answer) > MAX_ANSWER_CHARS:
            extras["extracted"] = answer[:MAX_ANSWER_CHARS]
            why = f"the final answer has {len(answer)} characters (over {MAX_ANSWER_CHARS})"
            return Verdict(
                False,
                "wrong_answer",
                duration_s=time.monotonic() - start,
                extras=extras,
                stderr_tail=why + ": not compared",
            )
        deadline = start + timeout

        def verify(g: str, a: str) -> bool | None:
            return self._pool.verify(g, a, max(0.0, deadline - time.monotonic()))

        same, extras["equivalence"] = equivalent(gold, answer, verify)
        duration = time.monotonic() - start
        if same is None:
            return Verdict(
                False,
                "timeout",
                duration_s=duration,
                extras=extras,
                stderr_tail=f"math-verify {timeout_line(timeout, timeout, timeout)}",
            )
        return Verdict(same, None if same else "wrong_answer", duration_s=duration, extras=extras)

    def reference_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        return [
            Job(task_id, problem, _stated(gold_answer(problem)))
            for task_id, problem in problems.items()
        ]

    def known_wrong_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        task_id, problem = next(iter(problems.items()))
        gold = gold_answer(problem)
        number = as_number(gold)
        wrong = str(number + 1) if number is not None else f"{gold} + 1"
        return [Job(task_id, problem, _stated(wrong)), Job(task_id, problem, "I do not know.")]

    def close(self) -> None:
        self._pool.close()


def _stated(answer: str) -> str:
    """A completion stating `answer`: GSM8K's marker for a number, a box otherwise."""
    return f"#### {answer}" if as_number(answer) is not None else f"\\boxed{{{answer}}}"


class _Helper:
    """One math-verify process; `fresh` until its first answer (it first imports sympy)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ckpteval.checkers.math"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.fresh = True

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class _VerifyPool:
    """math-verify helper processes; each call borrows one, a call that overruns kills it."""

    #: Grace for a fresh helper's imports (seconds of sympy loading are not the sample's time).
    STARTUP_S = 60.0

    def __init__(self) -> None:
        self._idle: queue.SimpleQueue[_Helper] = queue.SimpleQueue()
        self._all: list[_Helper] = []
        self._lock = threading.Lock()

    def verify(self, gold: str, answer: str, timeout: float) -> bool | None:
        """True/False, or None if math-verify did not answer within `timeout` seconds."""
        try:
            helper = self._idle.get_nowait()
        except queue.Empty:
            helper = _Helper()
            with self._lock:
                self._all.append(helper)
        stdin, stdout = helper.proc.stdin, helper.proc.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(json.dumps({"gold": gold, "answer": answer}).encode() + b"\n")
            stdin.flush()
        except BrokenPipeError:
            raise RuntimeError(
                "math-verify helper exited at start (is math-verify installed?)"
            ) from None
        deadline = time.monotonic() + timeout + (self.STARTUP_S if helper.fresh else 0.0)
        ready, _, _ = select.select([stdout], [], [], max(0.0, deadline - time.monotonic()))
        line = stdout.readline() if ready else b""
        if not line:
            helper.kill()
            if ready:
                raise RuntimeError(
                    f"math-verify helper exited with status {helper.proc.returncode}"
                )
            return None
        helper.fresh = False
        self._idle.put(helper)
        return bool(json.loads(line)["equal"])

    def close(self) -> None:
        with self._lock:
            for helper in self._all:
                helper.kill()
            self._all.clear()


def _serve() -> None:
    """Helper process: one JSON request per line on stdin, one `{"equal": bool}` per line out."""
    import logging

    logging.disable(logging.WARNING)
    from math_verify import parse, verify

    for line in sys.stdin:
        request = json.loads(line)
        try:
            gold = parse(f"\\boxed{{{request['gold']}}}", parsing_timeout=None)
            answer = parse(f"\\boxed{{{request['answer']}}}", parsing_timeout=None)
            equal = bool(gold and answer and verify(gold, answer, timeout_seconds=None))
        except Exception:  # noqa: BLE001 - sympy raises anything on odd input: not equal
            equal = False
        sys.stdout.write(json.dumps({"equal": equal}) + "\n")
        sys.stdout.flush()


class Gsm8kChecker(MathChecker):
    """The math checker under the name of GSM8K's built-in task (its `####` case)."""

    name = "gsm8k"
    for_problem_files = False


register("math", MathChecker)
register("gsm8k", Gsm8kChecker)

if __name__ == "__main__":
    _serve()
