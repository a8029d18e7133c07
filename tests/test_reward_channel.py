"""A reward sample's result only the runner can write, and its expected output nothing it runs
can read (issue 37 item 3). A code reward runs the completion in a process of its own (a fork,
or a fresh interpreter); the completion tries every way to the runner's result channel and to
the answers: inherited descriptors, the runner's descriptors through /proc, the job's files, the
problems beside the reward function. Real checker, real sandbox; correct neighbours in the same
batch keep their verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpteval.checkers import Job, get_checker
from ckpteval.checkers.reward import RewardFunctionChecker

SECRET = "SECRET-ANSWER-4711"

#: A code reward: runs the completion (in a fork, or a fresh interpreter) and scores 1.0 when
#: what it prints holds the ground truth; "honest" completions just print an answer.
CODE_REWARD = """
import os, subprocess, sys


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str.startswith("#fork"):
        pid = os.fork()
        if pid == 0:
            try:
                exec(solution_str, {"__name__": "__main__"})
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        return 0.0
    run = subprocess.run([sys.executable, "-I", "-c", solution_str], capture_output=True,
                         text=True, timeout=20)
    return 1.0 if ground_truth in run.stdout else 0.0
"""

#: Write a passing result on every descriptor the completion can reach, then kill the runner so
#: that it never writes its own.
FORGE_INHERITED = """#fork
import os, signal, socket, stat
forged = b'{"value": 1.0}'
for fd in range(3, 64):
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            socket.socket(fileno=fd).send(forged)
        else:
            os.write(fd, forged)
    except OSError:
        pass
os.kill(os.getppid(), signal.SIGKILL)
"""
#: From a fresh interpreter (no inherited descriptor): the runner's own, through /proc.
FORGE_THROUGH_PROC = """
import glob, os, signal, socket
forged = b'{"value": 1.0}'
parent = os.getppid()
for link in glob.glob(f"/proc/{parent}/fd/*"):
    try:
        fd = os.open(link, os.O_WRONLY)
        os.write(fd, forged)
    except OSError:
        pass
os.kill(parent, signal.SIGKILL)
"""
#: Look for the ground truth wherever a job's data might be, and print what it finds.
READ_ANSWERS = """
import glob, os
found = []
paths = glob.glob("*") + glob.glob("../*/*") + glob.glob(f"/proc/{os.getppid()}/fd/*")
paths += [os.path.join(BESIDE, "problems.jsonl"), "/dev/stdin"]
for path in paths:
    try:
        with open(path, errors="replace") as handle:
            found.append(handle.read(1 << 20))
    except OSError:
        pass
print("".join(found))
"""


@pytest.fixture
def checker(tmp_path: Path) -> RewardFunctionChecker:
    folder = tmp_path / "fn"
    folder.mkdir()
    (folder / "reward.py").write_text(CODE_REWARD)
    (folder / "problems.jsonl").write_text(f'{{"question": "?", "answer": "{SECRET}"}}\n')
    made = get_checker(
        "reward_function", reward_function=str(folder / "reward.py"), self_test="off: a test"
    )
    assert isinstance(made, RewardFunctionChecker)
    return made


def score(checker: RewardFunctionChecker, completions: list[str]) -> list[tuple[bool, str]]:
    problem = {"task_id": "1", "ground_truth": SECRET, "question": "?"}
    try:
        verdicts = checker.check_batch([Job("1", problem, c) for c in completions], 20.0)
    finally:
        checker.close()
    return [(v.passed, v.error_type) for v in verdicts]


HONEST_RIGHT = f"print({SECRET!r})"
HONEST_WRONG = "print('no idea')"


def test_a_completion_cannot_forge_the_runners_result(
    checker: RewardFunctionChecker, tmp_path: Path
) -> None:
    verdicts = score(checker, [HONEST_RIGHT, FORGE_INHERITED, HONEST_WRONG, FORGE_THROUGH_PROC])
    assert verdicts[0] == (True, None)
    assert verdicts[2][0] is False
    for forged in (verdicts[1], verdicts[3]):
        assert forged[0] is False and forged[1] == "reward_error", verdicts


def test_a_completion_cannot_read_its_answer(
    checker: RewardFunctionChecker, tmp_path: Path
) -> None:
    beside = tmp_path / "fn"
    snoop = f"BESIDE = {str(beside)!r}\n" + READ_ANSWERS
    verdicts = score(checker, [HONEST_RIGHT, snoop, HONEST_WRONG, snoop])
    assert verdicts[0] == (True, None)
    assert verdicts[1][0] is False and verdicts[3][0] is False, verdicts
    assert verdicts[2][0] is False
