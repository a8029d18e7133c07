"""A reward batch's samples fork from one warm zygote (ckpteval.sandbox_driver.zygote, "Warm
zygotes"): nothing a sample leaves reaches the next, none can reach the zygote, and the zygote
never sees a sample's text. One batch of attacks between honest neighbours, one reward file;
each assertion names the guard it proves (a zygote without it fails here)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from conftest import as_nobody_json
from reach import REACH

from ckpteval.checkers import Job, Verdict, get_checker
from ckpteval.checkers.reward import WARM_CALLS

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

#: A reward function whose completion says what the sample does; it reports what its process
#: saw. `SEEN` records every call made in this process before the sample's own: kept on `sys`,
#: which the zygote's two imports of the file share (its warm-up calls the first; a sample, the
#: second, which no call reached).
ATTACKS = (
    r"""
import ctypes, gc, os, signal, socket, string, sys, threading, time

SEEN = sys.__dict__.setdefault("ckpteval_seen", [])
STATE = "original"
libc = ctypes.CDLL(None, use_errno=True)


def refused(call):
    try:
        return call() == -1
    except OSError:
        return True


def plant():
    global STATE
    STATE = "changed"
    string.capwords = lambda *a, **k: "patched"  # a module every sample imports
    out = {}
    for path in ("/tmp/x", "/dev/shm/x", "x", "/tmp/d/e/f"):
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            open(path, "w").write("answer 42")
            os.symlink("/etc", path + ".link")
            out[path] = "written"
        except OSError:
            out[path] = "refused"
    out["shm"] = "refused" if libc.shmget(0x4b45, 4096, 0o1666) == -1 else "made"
    for top in ("/tmp/locked", "/dev/shm/locked"):  # what its owner can open again, no one else
        try:
            os.makedirs(top + "/in")
            open(top + "/in/f", "w").write("answer 42")
            os.chmod(top + "/in", 0)
            os.chmod(top, 0)
            out[top] = "written"
        except OSError:
            out[top] = "refused"
    if os.fork() == 0:  # a stray: double fork, new session, an abstract socket held open
        os.setsid()
        if os.fork() == 0:
            s = socket.socket(socket.AF_UNIX)
            s.bind("\0ckpteval-zygote-stray")
            s.listen()
            time.sleep(30)
        os._exit(0)
    time.sleep(0.2)
    return out


def look():
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("\0ckpteval-zygote-stray")
        stray = True
    except OSError:
        stray = False
    return {
        "left": [
            p
            for p in ("/tmp/x", "/dev/shm/x", "x", "/tmp/d", "/tmp/x.link", "/tmp/locked", "/dev/shm/locked")
            if os.path.lexists(p)
        ],
        "state": STATE, "capwords": string.capwords("a b"), "stray": stray,
    }


def attack_zygote():
    z = os.getppid()
    out = {
        "kill": refused(lambda: os.kill(z, signal.SIGKILL)),
        "killpg": refused(lambda: os.killpg(z, signal.SIGKILL)),
        "kill -1": refused(lambda: os.kill(-1, signal.SIGKILL)),
        "ptrace": libc.ptrace(16, z, None, None) == -1,
    }
    for what in ("mem", "environ"):
        try:
            open(f"/proc/{z}/{what}", "rb").read(1)
            out[what] = False
        except OSError:
            out[what] = True
    opened = 0
    for fd in range(64):
        try:
            os.close(os.open(f"/proc/{z}/fd/{fd}", os.O_RDONLY))
            opened += 1
        except OSError:
            pass
    out["fd"] = opened == 0
    return out


def keyring():
    add_key, keyctl = (217, 219) if os.uname().machine == "aarch64" else (248, 250)
    return {
        "add_key": libc.syscall(add_key, b"user", b"k", b"v", 1, ctypes.c_int(-3)) == -1,
        "join": libc.syscall(keyctl, 1, None) == -1,
    }


def search(marker):
    found = 0
    for obj in gc.get_objects():
        items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
        try:
            found += sum(1 for v in items if isinstance(v, str) and marker in v)
        except Exception:
            pass
    return {"found": found}


def burn():
    for _ in range(2):
        threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()
    time.sleep(60)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    before = list(SEEN)
    SEEN.append([solution_str, ground_truth])
    what, _, arg = solution_str.partition(" ")
    info = {"before": before, "zygote": os.getppid()}
    if what == "plant":
        info.update(plant())
    elif what == "look":
        info.update(look())
    elif what == "attack":
        info.update(attack_zygote())
    elif what == "keyring":
        info.update(keyring())
    elif what == "search":
        info.update(search(arg[::-1]))
    elif what == "peek":
        info.update(reach(arg[::-1].encode()))  # tests/reach.py
    elif what == "burn":
        burn()
    elif what == "abort":
        os.abort()
    elif what == "segv":
        ctypes.string_at(0)
    return {"score": float(what == ground_truth), **info}
"""
    + REACH
)

#: (completion, ground truth) of one batch: attacks between honest samples.
BATCH = [
    ("right", "right"),
    ("plant secret-AAAA", "gt-BBBB"),
    ("look", "x"),
    ("attack", "x"),
    ("right", "right"),
    ("keyring", "x"),
    ("search AAAA-terces", "x"),
    ("search BBBB-tg", "x"),
    ("peek CCCC-tg", "x"),
    ("next", "gt-CCCC"),  # its job is open in the driver while the one before runs
    ("burn", "x"),
    ("right", "right"),
    ("abort", "x"),
    ("wrong", "right"),
    ("segv", "x"),
    ("look", "x"),
    ("right", "right"),
]


#: Run by `nobody` (rootless bwrap: the zygote, its samples and the driver share one uid): the
#: batch's verdicts as JSON.
AS_NOBODY = """
import json, os, sys, tempfile
from pathlib import Path
from ckpteval.checkers import Job, Verdict, get_checker

data = json.load(open(sys.argv[1]))
folder = Path(tempfile.mkdtemp())
(folder / "reward.py").write_text(data["source"])
checker = get_checker("reward_function", reward_function=str(folder / "reward.py"),
                      self_test="off: a test")
jobs = [Job(str(i), {"task_id": str(i), "question": "q", "ground_truth": gt}, c)
        for i, (c, gt) in enumerate(data["batch"])]
try:
    verdicts = checker.check_batch(jobs, 2.0)
finally:
    checker.close()
print(json.dumps([[v.passed, v.error_type, v.score, v.extras] for v in verdicts]))
"""


@pytest.fixture(scope="module", params=["root", "rootless"])
def verdicts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The batch's verdicts, run by root (the sandbox's uid split) and by `nobody` (rootless)."""
    if request.param == "rootless":
        return _as_nobody()
    return _verdicts(tmp_path_factory.mktemp("fn"), ATTACKS, BATCH)


def _as_nobody(source: str = ATTACKS, batch: list[tuple[str, str]] = BATCH) -> list[Any]:
    """The verdicts of `batch` scored by the function in `source`, run by `nobody`."""
    with tempfile.TemporaryDirectory(prefix="ckpteval-rootless-") as tmp:  # not root's tmp_path
        work = Path(tmp)
        os.chmod(work, 0o755)
        (work / "run.py").write_text(AS_NOBODY)
        (work / "data.json").write_text(json.dumps({"source": source, "batch": batch}))
        rows = as_nobody_json(work / "run.py", str(work / "data.json"), cwd=work, tmpdir="/tmp")
    return [
        Verdict(passed, error, score=score, extras=extras) for passed, error, score, extras in rows
    ]


def _info(verdicts: list[Any], completion: str, nth: int = 0) -> dict[str, Any]:
    found = [v for (c, _), v in zip(BATCH, verdicts) if c == completion]
    return found[nth].extras["reward_info"]


def test_every_sample_forks_from_one_warm_zygote_that_saw_only_the_fixed_input(
    verdicts: list[Any],
) -> None:
    """Guards: the warm-up call's input is fixed (no sample's text), and each sample is a fork of
    the zygote, not of a previous sample (nothing a sample called reaches the next)."""
    scored = [v for v in verdicts if "reward_info" in v.extras]
    assert len(scored) >= 10
    zygotes = {v.extras["reward_info"]["zygote"] for v in scored}
    assert len(zygotes) == 1  # none of the attacks killed it: no fallback to the driver
    for verdict in scored:
        assert verdict.extras["reward_info"]["before"] == [list(call) for call in WARM_CALLS]


def test_what_a_sample_leaves_is_gone_for_the_next(verdicts: list[Any]) -> None:
    """Guards: /tmp (and its symlinks, without following them) emptied after each sample, a
    stray (double fork, setsid) killed, module globals and patches die with the fork, SysV IPC
    refused (it would outlive the sample in the zygote's IPC namespace)."""
    planted = _info(verdicts, "plant secret-AAAA")
    assert planted["/tmp/x"] == "written" and planted["/tmp/d/e/f"] == "written"
    assert planted["/tmp/locked"] == "written"  # a directory only its owner can reopen
    assert planted["shm"] == "refused"
    for nth in (0, 1):
        seen = _info(verdicts, "look", nth)
        assert seen["left"] == [] and seen["stray"] is False
        assert seen["state"] == "original" and seen["capwords"] == "A B"
    assert Path("/etc/passwd").exists()  # the cleanup followed no planted symlink


def _kernel_collapses() -> bool:
    """Whether this kernel backs anonymous memory with huge pages on MADV_COLLAPSE (6.1+, THP
    not `never`): asked of a 4 MiB mapping of this process."""
    import ctypes
    import mmap

    region = mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.write(b"x" * len(region))
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    aligned = -(-base // (2 << 20)) * (2 << 20)
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.madvise(ctypes.c_void_p(aligned), ctypes.c_size_t(2 << 20), 25) == 0


#: A reward function with a warm heap of ~16 MB (sympy's or math_verify's is larger): an 8 MiB
#: buffer (one mapping, so it holds whole aligned 2 MiB ranges wherever it lands) and a list of
#: strings; each sample reports how much of its memory is in huge pages, writes its number into
#: both and reads what the sample before it would have written.
BALLAST = r"""
BUFFER = bytearray(b"-" * (8 << 20))
BALLAST = [str(i) * 3 for i in range(150_000)]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    huge = -1
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("AnonHugePages:"):
            huge = int(line.split()[1])
    mine, before = int(solution_str), int(ground_truth)
    BALLAST[mine] = "written by a sample"
    BUFFER[mine * 4096] = ord("w")
    untouched = BALLAST[before] == ground_truth * 3 and BUFFER[before * 4096] == ord("-")
    return {"score": float(untouched), "huge_kb": huge}
"""


def test_a_long_batchs_zygote_forks_from_huge_pages_and_its_samples_stay_apart(
    tmp_path: Path,
) -> None:
    """Guard: a zygote serving 64 samples or more collapses its heap into huge pages before its
    first fork (a fork then copies one page-table entry per 2 MiB): its samples inherit them,
    and a page one writes is still its own (each writes where the next reads)."""
    if not _kernel_collapses():
        pytest.skip("this kernel has no MADV_COLLAPSE (Linux 6.1+) or THP is `never`")
    (tmp_path / "reward.py").write_text(BALLAST)
    checker = get_checker(
        "reward_function", reward_function=str(tmp_path / "reward.py"), self_test="off: a test"
    )
    jobs = [
        Job(str(i), {"task_id": str(i), "question": "q", "ground_truth": str(n)}, str(n + 1))
        for i, n in enumerate(range(1000, 1064))  # above the warm-up's numbers
    ]
    try:
        verdicts = checker.check_batch(jobs, 5.0)
    finally:
        checker.close()
    assert [v.passed for v in verdicts] == [True] * 64  # sample i+1 never sees i's writes
    huge = [v.extras["reward_info"]["huge_kb"] for v in verdicts]
    assert all(kb >= 4096 for kb in huge), huge  # the buffer's whole 2 MiB ranges, at least


def test_a_sample_cannot_reach_the_zygote(verdicts: list[Any]) -> None:
    """Guards: the samples' seccomp filter protects the zygote's pid (kill, killpg, kill -1),
    the zygote is not dumpable (no ptrace, no /proc/<zygote>/mem, fd, environ)."""
    assert _info(verdicts, "attack") == {
        **_info(verdicts, "attack"),
        **dict.fromkeys(("kill", "killpg", "kill -1", "ptrace", "mem", "fd", "environ"), True),
    }


def test_keyrings_are_refused_to_the_zygotes_samples(verdicts: list[Any]) -> None:
    """Guard: the zygote's own seccomp filter (inherited by every fork) refuses keyrings."""
    assert _info(verdicts, "keyring")["add_key"] is True
    assert _info(verdicts, "keyring")["join"] is True


def test_no_sample_finds_anothers_text_in_its_memory(verdicts: list[Any]) -> None:
    """Guard: each sample reads its own job from its own stdin; the zygote never holds one."""
    assert _info(verdicts, "search AAAA-terces")["found"] == 0  # an earlier completion
    assert _info(verdicts, "search BBBB-tg")["found"] == 0  # an earlier ground truth


def test_no_sample_reads_the_next_ones_job_the_driver_opened_ahead(verdicts: list[Any]) -> None:
    """Guards: the driver opens the next sample's files while a sample runs (`_Zygote._prepare`);
    they are the driver's (another uid, or not dumpable rootless): no descriptor of the driver or
    the zygote opens through /proc, and the next ground truth is nowhere a sample can read.
    Nor is there any other process to go through: bubblewrap runs the driver as pid 1
    (`--as-pid-1`). Its own init, there before, was dumpable and, rootless, of the samples' uid:
    a sample could trace it, write its memory, open its descriptors and, through its root, the
    driver's results file, to forge any verdict."""
    peeked = _info(verdicts, "peek CCCC-tg")
    assert peeked["found"] == 0
    assert peeked["opened"] == [] and peeked["written"] == [], peeked


def test_timeouts_and_crashes_fail_alone(verdicts: list[Any]) -> None:
    """Guards: CPU of a sample's threads counts to it (timeout) and not to the next; a sample
    that aborts or segfaults fails alone; honest neighbours keep their verdicts."""
    outcome = {c: (v.passed, v.error_type) for (c, _), v in zip(BATCH, verdicts)}
    assert outcome["burn"] == (False, "timeout")
    assert outcome["abort"][1] == "reward_error" and outcome["segv"][1] == "reward_error"
    assert outcome["wrong"] == (False, "wrong_answer")
    honest = [v for (c, _), v in zip(BATCH, verdicts) if c == "right"]
    assert [(v.passed, v.score) for v in honest] == [(True, 1.0)] * 4


#: A reward file whose import maps shared memory (what multiprocessing's locks do): every fork of
#: a zygote would share it, a channel from one sample to the next.
SHARED_MAPPING = """
import mmap, os

SHARED = mmap.mmap(-1, 4096)  # anonymous and shared: a fork writes what its siblings read


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    seen = SHARED[:64].rstrip(b"\\0").decode()
    SHARED[:64] = solution_str.encode().ljust(64, b"\\0")
    return {"score": 0.0, "seen": seen, "parent": os.getppid()}
"""


def _reward_infos(
    tmp_path: Path, source: str, completions: list[str], timeout: float
) -> list[dict[str, Any]]:
    """The `reward_info` of each completion, scored in one batch by the function in `source`."""
    (tmp_path / "reward.py").write_text(source)
    checker = get_checker(
        "reward_function", reward_function=str(tmp_path / "reward.py"), self_test="off: a test"
    )
    jobs = [
        Job(str(i), {"task_id": str(i), "question": "q", "ground_truth": "x"}, completion)
        for i, completion in enumerate(completions)
    ]
    try:
        return [v.extras["reward_info"] for v in checker.check_batch(jobs, timeout)]
    finally:
        checker.close()


def test_a_warm_up_that_maps_shared_memory_gets_no_zygote(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Guard: the zygote refuses to serve when its warm-up left a shared writable mapping (each
    sample then runs the file in a fork of the driver, as without zygotes)."""
    infos = _reward_infos(tmp_path, SHARED_MAPPING, [f"secret-{i}" for i in range(3)], 2.0)
    assert [info["seen"] for info in infos] == ["", "", ""]
    assert "shared mapping" in caplog.text  # the fallback says why, once


def test_the_check_after_emptying_sees_any_leftover_and_follows_no_link(tmp_path: Path) -> None:
    """What the driver compares after emptying a zygote's shared directories (a difference ends
    the zygote: fail closed): every entry on the directory's device, nested and locked ones too,
    symlinks listed but not followed."""
    from ckpteval.sandbox_driver.zygote import _empty_dir, _tree

    shared = tmp_path / "shared"
    shared.mkdir()
    fd = os.open(shared, os.O_RDONLY | os.O_DIRECTORY)
    try:
        dev = os.fstat(fd).st_dev
        baseline = _tree(fd, dev)
        assert [path for path, *_ in baseline] == ["."]  # the directory itself: its mode, owner
        (shared / "a" / "b").mkdir(parents=True)
        (shared / "a" / "b" / "f").write_text("answer 42")
        (shared / "link").symlink_to("/etc")
        os.chmod(shared / "a" / "b", 0)
        left = {path: kind for path, kind, *_ in _tree(fd, dev)}
        if os.geteuid() == 0:  # the driver's case: root reads a directory whatever its mode
            assert left["a/b/f"] == 0o100000
        else:  # a user who is not root cannot: the unreadable directory is a leftover too
            assert left["a/b/"] == "unreadable"
        assert left["link"] == 0o120000
        assert not any(path.startswith("link/") for path in left)  # /etc not walked
        _empty_dir(fd, dev)
        if os.geteuid() != 0:  # what it could not empty stays in sight: the zygote would end
            assert ("a/b/", "unreadable", 0, -1, -1) in _tree(fd, dev)
            os.chmod(shared / "a" / "b", 0o700)
            _empty_dir(fd, dev)
        assert _tree(fd, dev) == baseline
        assert Path("/etc/passwd").exists()
        (shared / "late").write_text("x")  # what an emptying that failed would leave
        assert _tree(fd, dev) != baseline
        _empty_dir(fd, dev)
        os.chmod(shared, 0o500)  # the directory's own mode (rootless, a sample owns it)
        assert _tree(fd, dev) != baseline
    finally:
        os.close(fd)


#: A reward function whose "mess" sample does to the directories every sample shares what their
#: owner may (rootless, each sample is: the user namespace's one uid): /tmp made read-only and
#: its times set (a message to the next sample), its cover (its cwd's parent: the work
#: directory's tmpfs) made private. Each sample reports what it sees of them (and of /dev/shm,
#: read-only) first.
SHARED_DIRS = r"""
import os

SHARED = ("/tmp", "/dev/shm", os.path.dirname(os.getcwd()))


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str not in ("look", "mess"):  # the zygote's warm-up: it leaves /tmp as it was
        return 0.0
    seen = {}
    for path in SHARED:
        st = os.stat(path)
        seen[path] = [oct(st.st_mode & 0o7777), st.st_uid, st.st_atime_ns, st.st_mtime_ns]
    done = {}
    if solution_str == "mess":
        calls = [
            ("chmod /tmp", lambda: os.chmod("/tmp", 0o500)),
            ("utime /tmp", lambda: os.utime("/tmp", (1111111, 2222222))),
            ("chmod cover", lambda: os.chmod(SHARED[2], 0o700)),
        ]
        for what, call in calls:
            try:
                call()
                done[what] = "done"
            except OSError as exc:
                done[what] = exc.strerror
    try:
        with open("/tmp/mine", "w") as handle:
            handle.write("x")
        writes = True
    except OSError:
        writes = False
    return {"score": 0.0, "seen": seen, "done": done, "writes": writes, "zygote": os.getppid()}
"""


@pytest.mark.parametrize("who", ["root", "rootless"])
def test_the_shared_directories_modes_and_times_come_back_for_the_next_sample(
    who: str, tmp_path: Path
) -> None:
    """Guard: after each sample the driver gives /tmp, /dev/shm and the covers (and their
    skeleton directories) the mode and times they had before the first sample. As root a sample
    may not change them (another uid); rootless it may (it owns them), and before this guard the
    next sample found /tmp 0500 (not writable: sabotage) with the times the sample chose (a
    64-bit channel). The zygote still serves (restored, not just failed closed)."""
    batch = [("look", "x"), ("mess", "x"), ("look", "x")]
    if who == "root":
        infos = [v.extras["reward_info"] for v in _verdicts(tmp_path, SHARED_DIRS, batch)]
    else:
        infos = [v.extras["reward_info"] for v in _as_nobody(SHARED_DIRS, batch)]
    first, mess, after = infos
    # what the guard is for: the sample may change them (rootless, which a user who is not
    # root gets for "root" too)
    if who == "rootless" or os.geteuid() != 0:
        assert set(mess["done"].values()) == {"done"}, mess["done"]
    else:
        assert "done" not in mess["done"].values(), mess["done"]
    assert first["seen"]["/tmp"][0] == "0o1777"
    assert after["seen"] == first["seen"] == mess["seen"]
    assert first["writes"] and after["writes"]
    assert len({info["zygote"] for info in infos}) == 1


def _verdicts(folder: Path, source: str, batch: list[tuple[str, str]]) -> list[Any]:
    """The verdicts of `batch` ((completion, ground truth) pairs), scored as root by `source`."""
    (folder / "reward.py").write_text(source)
    checker = get_checker(
        "reward_function", reward_function=str(folder / "reward.py"), self_test="off: a test"
    )
    jobs = [
        Job(str(i), {"task_id": str(i), "question": "q", "ground_truth": gt}, completion)
        for i, (completion, gt) in enumerate(batch)
    ]
    try:
        return checker.check_batch(jobs, 2.0)
    finally:
        checker.close()


#: A slow reward function (1 s a call): all the warm-up's calls would take longer than the
#: zygote may take to get ready (a sample's wall clock, 6 s at a 3 s timeout). Seconds, not
#: tenths: the zygote's start (bubblewrap, imports) must fit in the margin on a loaded machine
#: (two calls fit in the budget: ready ~2 s after the start, 4 s before the deadline).
SLOW = """
import os, sys, time

SEEN = sys.__dict__.setdefault("ckpteval_seen", [])  # shared by the zygote's two imports


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    before = list(SEEN)
    SEEN.append([solution_str, ground_truth])
    time.sleep(1.0)
    return {"score": 1.0, "before": before, "zygote": os.getppid()}
"""


def test_a_slow_functions_warm_up_stops_in_time_and_its_zygote_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Guard: no warm-up call starts after half the per-sample timeout, so a slow function still
    gets its zygote (its samples fork from it, after the calls that fitted) instead of the batch
    falling back to forking each sample from the driver."""
    infos = _reward_infos(tmp_path, SLOW, ["sample-0", "sample-1"], 3.0)
    assert "warm zygote gone" not in caplog.text
    assert len({info["zygote"] for info in infos}) == 1
    warmed = [list(call) for call in WARM_CALLS]
    for info in infos:
        assert 1 <= len(info["before"]) < len(WARM_CALLS)
        assert info["before"] == warmed[: len(info["before"])]


def test_a_batch_mixing_timeouts_keeps_every_samples_result(tmp_path: Path) -> None:
    """Guard: samples with another timeout (another zygote key: the self-test's references and
    its known-wrong sample) run the usual way between the zygote's; the zygote's last result,
    written while the next sample runs, is written before one of those runs and at the end."""
    (tmp_path / "reward.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    print('checking', solution_str)\n"
        "    return float(solution_str == ground_truth)\n"
    )
    checker = get_checker(
        "reward_function", reward_function=str(tmp_path / "reward.py"), self_test="off: a test"
    )
    plan = [("a", "a", 20.0), ("b", "b", 20.0), ("c", "x", None)]  # the self-test's shape
    jobs = [
        Job(str(i), {"task_id": str(i), "ground_truth": gt}, completion, timeout=timeout)
        for i, (completion, gt, timeout) in enumerate(plan)
    ]
    try:
        verdicts = checker.check(jobs, workers=1, timeout=5.0)
    finally:
        checker.close()
    assert [(v.passed, v.error_type) for v in verdicts] == [
        (True, None),
        (True, None),
        (False, "wrong_answer"),
    ]
