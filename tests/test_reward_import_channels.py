"""A reward file's import cannot carry one sample's text into another's result through the warm
zygote (docs/evaluate.md, "What the file's import can and cannot carry from one sample to the
next").

The zygote runs the file's import, so whatever that import leaves in the zygote's process is in
every sample forked from it. Each reward file here leaves one channel there and then tries, in
each sample, to read what the sample before wrote into it (or what the zygote read of it) and to
write its own text for the next: a read-only shared mapping made writable, SysV objects reached
by id, at-fork hooks, the zygote made dumpable again (for /proc/<zygote>/mem), a thread, a signal
handler and a profile function. Each sample's result must be what a fresh process that imports
the file and calls it once returns (`fresh_call`): nothing carried. The zygote either leaves the
channel out (at-fork hooks are dropped) or is not used (each sample then imports the file
itself, and the log says why in one line). Each case is one real sandboxed batch (a few seconds
under load): the channels live in the zygote's process, which only the real sandbox makes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import as_nobody_json
from test_reward_direct import fresh_call, one_batch
from test_reward_zygote import AS_NOBODY

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

#: Each file's compute_score returns {"score", "carried"}: `carried` is what it found of another
#: sample's text ("" in a fresh process), which it could as well turn into any score.
SCORE = """

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    carried = carry(solution_str)
    return {"score": float(solution_str.split()[-1] == ground_truth), "carried": carried}
"""

#: (a) A read-only shared mapping: the check before forking looked only for writable ones, and
#: `mprotect` makes it writable in each sample.
READ_ONLY_SHARED = """
import ctypes, mmap

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
AREA = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED | mmap.MAP_ANONYMOUS, -1, 0)


def carry(text):
    libc.mprotect(ctypes.c_void_p(AREA), 4096, mmap.PROT_READ | mmap.PROT_WRITE)
    before = ctypes.string_at(AREA, 256).split(b"\\0")[0].decode()
    ctypes.memmove(AREA, text.encode()[:255] + b"\\0", min(len(text), 255) + 1)
    libc.mprotect(ctypes.c_void_p(AREA), 4096, mmap.PROT_READ)  # as the check saw it
    return before
"""

#: (b) A SysV shared memory segment and a message queue made at import, reached by id: the
#: samples' filter refuses making IPC objects, not using those the import made.
SYSV = """
import ctypes

libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
IPC_CREAT, IPC_NOWAIT = 0o1000, 0o4000
SEGMENT = libc.shmget(0, 4096, IPC_CREAT | 0o600)
QUEUE = libc.msgget(0, IPC_CREAT | 0o600)


class Message(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_long), ("text", ctypes.c_char * 256)]


def carry(text):
    area = libc.shmat(SEGMENT, None, 0)
    before = ctypes.string_at(area, 256).split(b"\\0")[0].decode()
    ctypes.memmove(area, text.encode()[:255] + b"\\0", min(len(text), 255) + 1)
    libc.shmdt(ctypes.c_void_p(area))  # no mapping left for a check to see
    message = Message()
    if libc.msgrcv(QUEUE, ctypes.byref(message), 256, 0, IPC_NOWAIT) > 0:
        before += message.text.decode()
    message = Message(1, text.encode()[:255])
    libc.msgsnd(QUEUE, ctypes.byref(message), 256, IPC_NOWAIT)
    return before
"""

#: (c) At-fork hooks: `before` runs in the zygote with the next sample's files open (it reads
#: each job and keeps it, so every later fork has it); `after_in_child` runs in each sample
#: before the sample's own seccomp filter, where it may still make a SysV segment by key.
AT_FORK = """
import ctypes, os

libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
JOBS = []
AREA = []


def read_jobs():
    for name in os.listdir("/proc/self/fd"):
        try:
            data = os.pread(int(name), 1 << 16, 0)
        except OSError:
            continue
        if data.startswith(b'{"reward_file"'):
            JOBS.append(data.decode("utf-8", "replace"))


def segment():
    found = libc.shmget(0x4B4B, 4096, 0o1600)
    if found != -1:
        AREA.append(libc.shmat(found, None, 0))


os.register_at_fork(before=read_jobs, after_in_child=segment)


def carry(text):
    seen = [job for job in JOBS if text not in job]
    if AREA:
        seen.append(ctypes.string_at(AREA[0], 256).split(b"\\0")[0].decode())
        ctypes.memmove(AREA[0], text.encode()[:255] + b"\\0", min(len(text), 255) + 1)
    return "".join(seen)
"""

#: (d) The zygote made dumpable again: a sample (its uid) writes the zygote's memory through
#: /proc/<zygote>/mem, and every later fork has what it wrote.
DUMPABLE = """
import ctypes, os

ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
BOX = ctypes.create_string_buffer(256)
ZYGOTE = os.getpid()


def carry(text):
    before = BOX.value.decode()
    try:
        with open(f"/proc/{ZYGOTE}/mem", "r+b", buffering=0) as memory:
            memory.seek(ctypes.addressof(BOX))
            memory.write(text.encode()[:255] + b"\\0")
    except OSError:
        pass
    return before
"""

#: Code the import leaves running in the zygote, where each sample's job arrives (a descriptor
#: the zygote passes on): a thread started by the warm-up's import only (the second import finds
#: it running), a signal handler on a 1 ms interval timer, a profile function. Each keeps what
#: it reads of a job; every later fork has it.
READER = """
import os, signal, sys, threading, time

JOBS = sys.__dict__.setdefault("ckpteval_jobs", [])


def read_jobs(*_):
    for name in os.listdir("/proc/self/fd"):
        try:
            data = os.pread(int(name), 1 << 16, 0)
        except OSError:
            continue
        if data.startswith(b'{"reward_file"') and data.decode() not in JOBS:
            JOBS.append(data.decode("utf-8", "replace"))


def carry(text):
    signal.setitimer(signal.ITIMER_REAL, 0)  # a fresh process would die of it at its exit
    return "".join(job for job in JOBS if text not in job)
"""

THREAD = (
    READER
    + """

def watch():
    while True:
        read_jobs()
        time.sleep(0.0005)


if not sys.__dict__.get("ckpteval_watching"):
    sys.ckpteval_watching = True
    threading.Thread(target=watch, daemon=True).start()
"""
)

#: (A fork has no interval timer: the zygote's fires in the zygote alone.)
SIGNAL = (
    READER
    + """
signal.signal(signal.SIGALRM, read_jobs)
signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
"""
)

PROFILE = (
    READER
    + """
sys.setprofile(lambda frame, event, arg: read_jobs() if event == "c_return" else None)
"""
)

CHANNELS = {
    "read-only shared mapping": (READ_ONLY_SHARED, "its warm-up left a shared mapping"),
    "SysV objects by id": (SYSV, "its warm-up left SysV IPC objects (shm, msg)"),
    "at-fork hooks": (AT_FORK, None),
    "dumpable zygote": (DUMPABLE, "its warm-up left the zygote dumpable"),
    # The thread starts at the warm-up's first import only (the file checks a flag it set):
    # the import's check names it, before its `listdir` descriptor could be counted instead.
    "thread": (THREAD, "the file's import leaves threads Thread-"),
    "signal handler": (SIGNAL, "its warm-up left a signal handler of its own"),
    "profile function": (PROFILE, "its warm-up left a trace or profile function"),
}


@pytest.mark.parametrize("channel", list(CHANNELS))
def test_an_import_cannot_carry_one_samples_text_into_the_next(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, channel: str
) -> None:
    """Each sample scores as a fresh process: nothing of an earlier sample's text (`secret`)
    in a later one's result. A channel the zygote cannot drop costs it the zygote, saying why;
    one it drops (the import's at-fork hooks) keeps it."""
    source, refusal = CHANNELS[channel]
    completions = ["secret-AAAA 2", "probe 3", "probe 2"]
    path, verdicts = one_batch(tmp_path, source + SCORE, completions)
    for completion, verdict in zip(completions, verdicts):
        assert verdict.error_type in (None, "wrong_answer"), (completion, verdict)
        result = {"score": verdict.score, **verdict.extras["reward_info"]}
        assert result == fresh_call(path, completion), (completion, result)
    if refusal:
        assert refusal in caplog.text, caplog.text
    else:
        assert "warm zygote gone" not in caplog.text, caplog.text


@pytest.mark.parametrize("channel", ["dumpable zygote", "at-fork hooks"])
def test_rootless_an_import_cannot_carry_one_samples_text_into_the_next(channel: str) -> None:
    """The same as `nobody` (rootless bubblewrap), where the driver, the zygote and its samples
    share one uid: a dumpable zygote would be open to every sample."""
    source, _ = CHANNELS[channel]
    completions = ["secret-AAAA 2", "probe 3", "probe 2"]
    with tempfile.TemporaryDirectory(prefix="ckpteval-rootless-") as tmp:  # not root's tmp_path
        work = Path(tmp)
        os.chmod(work, 0o755)
        (work / "run.py").write_text(AS_NOBODY)
        batch = [(completion, "2") for completion in completions]
        (work / "data.json").write_text(json.dumps({"source": source + SCORE, "batch": batch}))
        rows = as_nobody_json(work / "run.py", str(work / "data.json"), cwd=work, tmpdir="/tmp")
    results = [{"score": score, **extras["reward_info"]} for _, _, score, extras in rows]
    assert [r["carried"] for r in results] == ["", "", ""], results
    assert [r["score"] for r in results] == [1.0, 0.0, 1.0]


#: Honest: a matrix product whose BLAS library starts a native thread pool in the warm-up's
#: calls (OpenBLAS, with more than one core). Those threads run none of the file's code.
BLAS = """
import numpy

MATRIX = numpy.ones((300, 300))


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str == ground_truth), "total": float((MATRIX @ MATRIX).sum())}
"""


def test_a_blas_thread_pool_started_by_the_warm_up_keeps_the_zygote(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Native threads in the zygote (no Python state) do not cost it the zygote, Python ones do
    (the `thread` channel above): refusing both cost every BLAS-using function its zygote."""
    completions = ["2", "3"]
    path, verdicts = one_batch(tmp_path, BLAS, completions)
    results = [{"score": v.score, **v.extras["reward_info"]} for v in verdicts]
    assert results == [fresh_call(path, c) for c in completions]
    assert "warm zygote gone" not in caplog.text, caplog.text
