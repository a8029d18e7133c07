"""The math checker: extract a final answer and compare it with the gold answer.

Answers are found, in order of precedence, after GSM8K's `#### `, in the last `\\boxed{}`, or after
"The (final) answer is". Gold answers are the text after `####` (GSM8K), the last `\\boxed{}`
(MATH), or the whole `answer` field.

Two answers that are both plain numbers (`1,234`, `$5`, `-0.50`, `3/4`, `25%`) are compared
exactly as rationals, in-process. Anything else goes to `math-verify` (sympy), which can take
unbounded time on hostile input and whose own timeouts use `signal.alarm` (main thread only). So it
runs in helper processes, one per scoring thread, each call under a wall-clock limit; a helper that
overruns is killed and replaced, and the sample gets `error_type: timeout`. math-verify only parses
(its expression path hands sympy strings of digits and operators), so the helpers need no sandbox.

Registered twice: `math` and `gsm8k` (the same checker; GSM8K is the `####` case).
"""

from __future__ import annotations

import json
import queue
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from ckpteval.checkers import Checker, Job, Verdict, register
from ckpteval.errors import UserError

_HASHES = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_IS = re.compile(r"(?i)the\s+(?:final\s+)?answer\s+is\s*:?\s*")
_NUMBER = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?")


def boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` (balanced braces), if any."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None


def gold_answer(problem: Mapping[str, Any]) -> str:
    """The reference answer of a problem record (`answer`, else `solution`, else `target`)."""
    raw = next(
        (str(problem[k]) for k in ("answer", "solution", "target") if problem.get(k) is not None),
        "",
    )
    if "####" in raw:
        after = raw.rsplit("####", 1)[1].strip()
        return after.splitlines()[0].strip() if after else ""
    return boxed(raw) or raw.strip()


def extract_answer(completion: str) -> tuple[str | None, str | None]:
    """(answer, how it was found) of a completion; (None, None) when it states no final answer."""
    match = _HASHES.search(completion)
    if match and match.group(1).strip():
        return match.group(1).strip(), "####"
    found = boxed(completion)
    if found:
        return found, "boxed"
    starts = list(_ANSWER_IS.finditer(completion))
    if starts:
        rest = completion[starts[-1].end() :].split("\n", 1)[0]
        answer = re.split(r"\.(?:\s|$)", rest, maxsplit=1)[0].strip().strip("$").strip()
        if answer:
            return answer, "answer_is"
    return None, None


def as_number(text: str) -> Fraction | None:
    """`text` as an exact rational if it is a plain number (currency, thousands separators, a
    trailing period or percent sign allowed), else None."""
    cleaned = (
        text.strip().strip("$").replace("\\$", "").replace(",", "").replace("\\%", "%").strip()
    )
    cleaned = cleaned.rstrip(".").strip()
    percent = cleaned.endswith("%")
    cleaned = cleaned.rstrip("%").strip()
    if not _NUMBER.fullmatch(cleaned):
        return None
    try:
        value = Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None
    return value / 100 if percent else value


class MathChecker(Checker):
    name = "math"
    version = "1"
    default_timeout = 5.0

    def __init__(self) -> None:
        self._pool = _VerifyPool()

    def validate_problem(self, task_id: str, problem: Mapping[str, Any]) -> None:
        if not gold_answer(problem):
            raise UserError(
                f"problem {task_id}: math problems need an `answer` (GSM8K '... #### N', "
                "a \\boxed{} solution, or the bare answer)"
            )

    def check_one(self, job: Job, timeout: float) -> Verdict:
        start = time.monotonic()
        gold = gold_answer(job.problem)
        answer, how = extract_answer(job.completion)
        extras = {"extracted": answer, "extraction": how, "gold": gold}
        if answer is None:
            return Verdict(False, "no_answer", duration_s=time.monotonic() - start, extras=extras)
        gold_num, answer_num = as_number(gold), as_number(answer)
        if gold_num is not None and answer_num is not None:
            same: bool | None = gold_num == answer_num
        elif _normal(gold) == _normal(answer):
            same = True
        else:
            same = self._pool.verify(gold, answer, timeout)
        duration = time.monotonic() - start
        if same is None:
            return Verdict(
                False,
                "timeout",
                duration_s=duration,
                extras=extras,
                stderr_tail=f"math-verify took longer than {timeout:g} s",
            )
        return Verdict(same, None if same else "wrong_answer", duration_s=duration, extras=extras)

    def reference_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        return [
            Job(task_id, problem, f"#### {gold_answer(problem)}")
            for task_id, problem in problems.items()
        ]

    def known_wrong_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        task_id, problem = next(iter(problems.items()))
        gold = gold_answer(problem)
        number = as_number(gold)
        wrong = str(number + 1) if number is not None else f"{gold} + 1"
        return [Job(task_id, problem, f"#### {wrong}"), Job(task_id, problem, "I do not know.")]

    def close(self) -> None:
        self._pool.close()


def _normal(text: str) -> str:
    return re.sub(r"\s+", "", text).strip("$").rstrip(".")


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


register("math", MathChecker)
register("gsm8k", MathChecker)

if __name__ == "__main__":
    _serve()
