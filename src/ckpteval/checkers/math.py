"""The math checker: extract a final answer and compare it with the gold answer.

Where the answer is read is `ckpteval.checkers.math_extract` (the last `\\boxed{}`, else the last
answer statement or GSM8K `####` marker, else -- for problems with `answer_last_line: true` -- the
last line); how it is compared is `ckpteval.checkers.math_equiv` (exact numbers, lists, text and
units in-process, then math-verify). Each score line says which extraction and which equivalence
decided (`extraction`, `equivalence`). docs/evaluate.md, "Math answers", has the rules.

math-verify (sympy) can take unbounded time on hostile input and its own timeouts use
`signal.alarm` (main thread only). So it runs in helper processes, one per scoring thread, each
call under a wall-clock limit; a helper that overruns is killed and replaced, and the sample gets
`error_type: timeout`. Importing math-verify takes seconds, so one template process imports it
once, when a comparison first needs it, with that sample's clock stopped (the wait is charged to
no sample), and every helper is a fork of it (milliseconds): a sample's scoring ends within its
timeout plus `ALLOWANCE_S`, a helper's first call included. math-verify only parses (its
expression path hands sympy strings of digits and operators), so the helpers need no sandbox.

Registered twice: `math` and `gsm8k` (the same checker; GSM8K is the `####` case).
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ckpteval.checkers import Checker, Job, Prompting, Verdict, register, timeout_line
from ckpteval.checkers.math_equiv import as_number, equivalent
from ckpteval.checkers.math_extract import boxed, extract_answer, final_answers, gold_answer
from ckpteval.errors import UserError

__all__ = ["MathChecker", "as_number", "boxed", "extract_answer", "gold_answer"]

#: The problem field by which a task declares that a bare last line is an answer.
LAST_LINE_FIELD = "answer_last_line"
#: A final answer longer than this is wrong without being compared: no gold answer is near it,
#: and comparing (normalising, unit stripping, sympy) costs more than linear time in its length.
MAX_ANSWER_CHARS = 1000
#: A completion that states more different final answers than this is wrong without comparing
#: them (each would be compared with the gold, perhaps by math-verify).
MAX_FINAL_ANSWERS = 4
#: What a sample's scoring may take beyond its timeout: forking a helper from the warm template,
#: killing one that overran, and the in-process reading and comparing (linear in the sample).
ALLOWANCE_S = 1.0


class MathChecker(Checker):
    name = "math"
    #: 2: the extraction order and normalisation of docs/evaluate.md "Math answers".
    #: 3: hedges and sprays are lists, relations no value, ± two values, a base's digits alone.
    #: 4: units compared, numbers in words, sentences not lists, several final answers fail.
    version = "4"
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
        answers, how = final_answers(job.completion, last_line=last_line)
        answer = answers[-1] if answers else None
        extras = {"extracted": answer, "extraction": how, "equivalence": None, "gold": gold}

        def verdict(same: bool | None, why: str = "") -> Verdict:
            error = None if same else "timeout" if same is None else "wrong_answer"
            took = time.monotonic() - start
            return Verdict(bool(same), error, duration_s=took, extras=extras, stderr_tail=why)

        if answer is None:
            return Verdict(False, "no_answer", duration_s=time.monotonic() - start, extras=extras)
        if len(answers) > MAX_FINAL_ANSWERS:
            extras["equivalence"] = "several_answers"
            return verdict(False, f"{len(answers)} different final answers stated: not compared")
        longest = max(answers, key=len)
        if len(longest) > MAX_ANSWER_CHARS:
            extras["extracted"] = answer[:MAX_ANSWER_CHARS]
            why = f"a final answer has {len(longest)} characters (over {MAX_ANSWER_CHARS})"
            return verdict(False, why + ": not compared")
        deadline = start + timeout

        def verify(g: str, a: str) -> bool | None:
            nonlocal start, deadline
            waited = self._pool.start()  # math-verify's one import: no sample's time
            start, deadline = start + waited, deadline + waited
            return self._pool.verify(g, a, max(0.0, deadline - time.monotonic()))

        same, extras["equivalence"] = equivalent(gold, answer, verify)
        for other in answers[:-1] if same else ():  # several final answers: each must be right
            same, _ = equivalent(gold, other, verify)
            if same is False:
                extras["equivalence"] = "several_answers"
                listed = "; ".join(answers)
                return verdict(False, f"different final answers stated: {listed}"[:500])
            if same is None:
                break
        if same is None:
            return verdict(None, f"math-verify {timeout_line(timeout, timeout, timeout)}")
        if extras["equivalence"] == "unit+converted":
            return verdict(False, "the answer is the gold converted to another unit")
        if extras["equivalence"] == "too_large":
            return verdict(False, "a number is too large to read by value: compared as written")
        return verdict(same)

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
    """One math-verify process (a fork of the template) and its end of a socket pair."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock
        self.reader = sock.makefile("rb")


class _VerifyPool:
    """math-verify helper processes: each call borrows one, a call that overruns kills it.

    Helpers are forks of one template process that imported math-verify (and parsed once, which
    builds its grammar) before `start` returned: a new helper costs a fork, never an import, so
    the first call of a helper is under the same limit as any other. The template forks and
    kills on request over a control socket (SOCK_SEQPACKET: one message per request), and reaps
    a helper only when told to kill it, so a pid it is told about is always its own child."""

    #: Seconds the template may take to import math-verify before scoring stops as broken.
    IMPORT_LIMIT_S = 120.0

    def __init__(self) -> None:
        self._idle: queue.SimpleQueue[_Helper] = queue.SimpleQueue()
        self._live: dict[int, _Helper] = {}
        self._lock = threading.Lock()  # the control socket and `_live`
        self._starting = threading.Lock()
        self._template: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None

    def start(self) -> float:
        """Start the template and wait until it can fork helpers; the seconds this call waited
        (for the import, or for another thread's call that started it), 0 once it is ready."""
        if self._control is not None:
            return 0.0
        began = time.monotonic()
        with self._starting:
            if self._control is not None:
                return time.monotonic() - began
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            with theirs:
                self._template = subprocess.Popen(
                    [sys.executable, "-m", "ckpteval.checkers.math"],
                    stdin=theirs.fileno(),
                    stdout=subprocess.DEVNULL,
                )
            ours.settimeout(self.IMPORT_LIMIT_S)
            try:
                ready = ours.recv(64)
            except TimeoutError:
                ready = b""
            if ready != b"ready":
                ours.close()
                self._template.kill()
                self._template.wait()
                raise RuntimeError(
                    "math-verify helper did not start (is math-verify installed?): "
                    f"status {self._template.returncode}"
                )
            ours.settimeout(None)
            self._control = ours
        return time.monotonic() - began

    def _request(self, message: bytes, fds: Sequence[int] = ()) -> bytes:
        assert self._control is not None
        if fds:
            socket.send_fds(self._control, [message], list(fds))
        else:
            self._control.send(message)
        reply = self._control.recv(64)
        if not reply:
            raise RuntimeError("the math-verify template process exited")
        return reply

    def _spawn(self) -> _Helper:
        self.start()
        ours, theirs = socket.socketpair()
        with theirs, self._lock:
            helper = _Helper(int(self._request(b"spawn", [theirs.fileno()])), ours)
            self._live[helper.pid] = helper
        return helper

    def _kill(self, helper: _Helper) -> None:
        helper.reader.close()
        helper.sock.close()
        with self._lock:
            if self._live.pop(helper.pid, None) is not None and self._control is not None:
                self._request(b"kill %d" % helper.pid)

    def verify(self, gold: str, answer: str, timeout: float) -> bool | None:
        """True/False, or None if math-verify did not answer within `timeout` seconds. A helper
        that dies on an input (sympy can crash on some) is replaced; the answer is then False."""
        try:
            helper = self._idle.get_nowait()
        except queue.Empty:
            helper = self._spawn()
        try:
            helper.sock.sendall(json.dumps({"gold": gold, "answer": answer}).encode() + b"\n")
            ready, _, _ = select.select([helper.sock], [], [], max(0.0, timeout))
            line = helper.reader.readline() if ready else b""
        except OSError:
            ready, line = [helper.sock], b""
        if not line:
            self._kill(helper)
            return False if ready else None
        self._idle.put(helper)
        return bool(json.loads(line)["equal"])

    def close(self) -> None:
        with self._starting:
            for helper in list(self._live.values()):
                self._kill(helper)
            if self._control is not None:
                self._control.close()
                self._control = None
            if self._template is not None:
                self._template.wait()
                self._template = None
            self._idle = queue.SimpleQueue()


#: Comparisons the template makes before it is ready: the first of each kind builds parsers
#: and fills sympy's caches (seconds in all), which every fork then inherits.
_WARM_UP = (
    ("\\frac{1}{2}", "0.5"),
    ("x^2+2x+1", "(x+1)^2"),
    ("\\frac{\\sqrt{3}}{2}", "\\sqrt{3}/2"),
    ("\\frac{\\pi}{2}", "\\pi/2"),
    ("[2,5)", "[2, 5)"),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("3+4i", "4i+3"),
    ("y=2x+3", "y=3+2x"),
    ("x>2", "(2,\\infty)"),
)


def _template() -> None:
    """The template process: import math-verify, warm it, say `ready`, then fork a helper for
    each `spawn` (with the helper's socket attached) and kill and reap one on `kill <pid>`,
    until the control socket (stdin) closes; then kill the helpers left."""
    import logging

    logging.disable(logging.WARNING)
    from math_verify import parse, verify

    for gold, answer in _WARM_UP:  # no helper pays for the parser or sympy's first calls
        _equal(parse, verify, gold, answer)
    control = socket.socket(fileno=0)
    control.send(b"ready")
    children: set[int] = set()
    while True:
        message, fds, _, _ = socket.recv_fds(control, 64, 1)
        if not message:
            break
        if message == b"spawn":
            pid = os.fork()
            if pid == 0:
                control.close()
                _serve(socket.socket(fileno=fds[0]), parse, verify)
                os._exit(0)
            os.close(fds[0])
            children.add(pid)
            control.send(b"%d" % pid)
        elif message.startswith(b"kill "):
            pid = int(message.split()[1])
            if pid in children:
                _reap(pid)
                children.discard(pid)
            control.send(b"ok")
    for pid in children:
        _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


def _serve(sock: socket.socket, parse: Any, verify: Any) -> None:
    """A helper: one JSON request per line, one `{"equal": bool}` per line back."""
    reader = sock.makefile("rb")
    for line in reader:
        request = json.loads(line)
        equal = _equal(parse, verify, request["gold"], request["answer"])
        sock.sendall(json.dumps({"equal": equal}).encode() + b"\n")


def _equal(parse: Any, verify: Any, gold: str, answer: str) -> bool:
    try:
        g = parse(f"\\boxed{{{gold}}}", parsing_timeout=None)
        a = parse(f"\\boxed{{{answer}}}", parsing_timeout=None)
        return bool(g and a and verify(g, a, timeout_seconds=None))
    except Exception:  # noqa: BLE001 - sympy raises anything on odd input: not equal
        return False


class Gsm8kChecker(MathChecker):
    """The math checker under the name of GSM8K's built-in task (its `####` case)."""

    name = "gsm8k"
    for_problem_files = False


register("math", MathChecker)
register("gsm8k", Gsm8kChecker)

if __name__ == "__main__":
    _template()
