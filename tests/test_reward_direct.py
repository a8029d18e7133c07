"""A reward sample scores as a direct call: a fresh process that imports the file and calls the
function once (docs/evaluate.md, "What a sample shares with the zygote").

Each test scores honest reward functions in the real sandbox, where every sample is a fork of
the batch's warm zygote, and compares each sample with that reference, run here in a process
of its own (`fresh_call`): results of any size, depth or number, generators made at import, a
thread pool or an event loop made at import, a memo the warm-up's calls would have filled, and
an import slower than a sample's timeout.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ckpteval.checkers import Job, Verdict, get_checker
from ckpteval.evaluate import score_samples

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

PROBLEM = {"task_id": "1", "ground_truth": "2", "question": "1 + 1?", "data_source": "t"}


def fresh_call(path: Path, completion: str) -> Any:
    """What the function returns in a fresh process that imported the file and called it once."""
    script = textwrap.dedent(
        """
        import importlib.util, json, sys
        spec = importlib.util.spec_from_file_location("reward", sys.argv[1])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        print(json.dumps(module.compute_score(**json.loads(sys.argv[2]))))
        """
    )
    call = {
        "data_source": "t",
        "solution_str": completion,
        "ground_truth": "2",
        "extra_info": {},
    }
    out = subprocess.run(
        [sys.executable, "-c", script, str(path), json.dumps(call)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def one_batch(
    tmp_path: Path, source: str, completions: list[str], timeout: float = 5.0
) -> tuple[Path, list[Verdict]]:
    """The reward file, and the verdicts of `completions` scored in one sandboxed batch."""
    path = tmp_path / "reward.py"
    path.write_text(source)
    checker = get_checker("reward_function", reward_function=str(path), self_test="off: a test")
    try:
        verdicts = checker.check_batch([Job("1", PROBLEM, c) for c in completions], timeout)
    finally:
        checker.close()
    return path, verdicts


#: Honest results no channel or metric used to take: the completion says which.
RESULTS = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    score = float(solution_str.split()[-1] == ground_truth)
    what = solution_str.split()[0]
    deep = []
    for _ in range(10_000):
        deep = [deep]
    return {
        "big": {"score": score, "tokens": 10**400, "negative": -(10**4000)},
        "deep": {"score": score, "tree": deep},
        "log": {"score": score, "log": "x" * 300_000},
        "keys": {**{f"k{i}": "v" * 1000 for i in range(5_000)}, "score": score},
        "wide": {"score": score, "items": list(range(100_000))},
        "plain": score,
    }[what]
"""


def test_a_result_of_any_size_depth_or_number_scores_its_sample(tmp_path: Path) -> None:
    """An extra key of 10**400 stopped the run (the cell's mean of it overflowed), a 300 KB log
    failed the sample (`Message too long`): each sample now gets the score a direct call
    returns, its other keys cut with a note where they would not fit, and the cell is made."""
    path = tmp_path / "reward.py"
    path.write_text(RESULTS)
    kinds = ["big", "deep", "log", "keys", "wide", "plain"]
    completions = [f"{kind} {answer}" for kind in kinds for answer in ("2", "3")]
    samples = [
        {"task_id": "1", "sample_idx": i, "completion": c} for i, c in enumerate(completions)
    ]
    cell = score_samples(
        "reward_function",
        {"1": PROBLEM},
        samples,
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        workers=1,
        timeout=5.0,
        ks=[1],
        checker_options={"reward_function": str(path), "self_test": "off: a test"},
    )
    lines = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    by = {completions[line["sample_idx"]]: line for line in lines}
    spec = importlib.util.spec_from_file_location("results_reward", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # a pure function: called directly, here
    for completion in completions:
        value = module.compute_score("t", completion, "2", {})
        expected = value["score"] if isinstance(value, dict) else value
        line = by[completion]
        assert (line["reward"], line["error_type"]) == (
            expected,
            None if expected == 1.0 else "wrong_answer",
        ), (completion, line)
    info = {c.split()[0]: by[c]["reward_info"] for c in completions if c.endswith("2")}
    assert info["big"] == {
        "tokens": {"__unplain__": "int", "digits": 401},
        "negative": {"__unplain__": "int", "digits": 4001},
    }
    assert info["deep"]["tree"] == [[[{"__unplain__": "list"}]]]
    assert info["log"]["log"].endswith("... (cut: 300000 characters)")
    assert len(info["log"]["log"]) < 2100
    assert info["keys"] == {"reward_info_cut": info["keys"]["reward_info_cut"]}
    assert "dropped" in info["keys"]["reward_info_cut"]
    assert info["wide"]["items"][-1] == "__cut__: 99900 more items"
    assert cell["metrics"]["reward_mean"]["value"] == 0.5


#: Generators made at import: two from the OS's entropy, three from fixed seeds.
GENERATORS = """
import random
import numpy

UNSEEDED = random.Random()
UNSEEDED_NUMPY = numpy.random.default_rng()
SEEDED = random.Random(7)
SEEDED_NUMPY = numpy.random.default_rng(7)
random.seed(11)


class Sampler:
    def __init__(self):
        self.rng = random.Random()


SAMPLER = Sampler()


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {
        "score": float(solution_str == ground_truth),
        "unseeded": UNSEEDED.random(),
        "unseeded_numpy": float(UNSEEDED_NUMPY.random()),
        "attribute": SAMPLER.rng.random(),
        "seeded": SEEDED.random(),
        "seeded_numpy": float(SEEDED_NUMPY.random()),
        "global": random.random(),
    }
"""


def test_generators_made_at_import_draw_as_in_a_fresh_process(tmp_path: Path) -> None:
    """A fork of one zygote gave every sample the same draws of a generator the import seeded
    from the OS (no two fresh processes do), and the warm-up's calls had advanced the seeded
    ones: now each unseeded one is reseeded in each fork, and each seeded one draws what a
    fresh process draws, the global `random` too (CPython reseeds it at a fork)."""
    path, verdicts = one_batch(tmp_path, GENERATORS, ["2", "3", "2", "x"])
    infos = [v.extras["reward_info"] for v in verdicts]
    direct = fresh_call(path, "2")
    for key in ("unseeded", "unseeded_numpy", "attribute"):
        assert len({info[key] for info in infos}) == len(infos), (key, infos)
    for key in ("seeded", "seeded_numpy", "global"):
        assert all(abs(info[key] - direct[key]) < 1e-12 for info in infos), (key, infos, direct)
    assert [v.score for v in verdicts] == [1.0, 0.0, 1.0, 0.0]


#: A thread pool made at import: no thread yet (a pool starts them on its first task).
POOL = """
from concurrent.futures import ThreadPoolExecutor

POOL = ThreadPoolExecutor(max_workers=2)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return POOL.submit(lambda: float(solution_str == ground_truth)).result(timeout=3)
"""

#: An event loop made at import holds descriptors (its selector, its self-pipe).
LOOP = """
import asyncio

LOOP = asyncio.new_event_loop()


async def judge(answer, truth):
    await asyncio.sleep(0)
    return float(answer == truth)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return LOOP.run_until_complete(judge(solution_str, ground_truth))
"""


#: A helper thread the first call starts and keeps (a flusher, a watchdog): it outlives the
#: warm-up's module, which no fork has.
KEEPER = """
import threading

STARTED = []


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if not STARTED:
        STARTED.append(threading.Thread(target=threading.Event().wait, daemon=True))
        STARTED[0].start()
    return float(solution_str == ground_truth)
"""


@pytest.mark.parametrize(
    ("source", "gone"),
    [
        (POOL, None),
        (LOOP, "the file's import leaves 3 descriptor(s) open, which no fork has"),
        (KEEPER, "its warm-up left 1 Python thread(s) running"),
    ],
    ids=["pool", "loop", "keeper"],
)
def test_a_thread_pool_or_event_loop_made_at_import_scores_as_a_direct_call(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, source: str, gone: str | None
) -> None:
    """The warm-up's calls started the pool's threads, which no fork has (right answers scored
    0.0 after a 3 s wait), and a fork has none of the zygote's descriptors (the loop's: `Bad
    file descriptor`). The samples' module is imported after the warm-up and never called, so
    its pool has no thread yet; an import that leaves descriptors open gets no zygote, and
    each sample imports the file itself, with one line in the log saying why. The pool keeps
    its zygote: its workers end when the warm-up's module is collected (before 12-03 that was
    left to whenever a full collection came, and the zygote was refused for "1 Python
    thread(s) running"); a thread a call started and keeps still costs the zygote, after a
    bounded wait."""
    completions = ["2", "3", "2"]
    path, verdicts = one_batch(tmp_path, source, completions)
    assert [v.score for v in verdicts] == [fresh_call(path, c) for c in completions]
    assert [v.error_type for v in verdicts] == [None, "wrong_answer", None]
    if gone is None:
        assert "warm zygote gone" not in caplog.text, caplog.text
    else:
        assert f"warm zygote gone ({gone})" in caplog.text, caplog.text


#: A memo, a call counter and a setting taken from the first call: what a warm-up's calls fill.
MEMO = """
import functools

CALLS = []
FIRST = {}


@functools.lru_cache(maxsize=None)
def parse(text):
    return text.strip()


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    CALLS.append(solution_str)
    FIRST.setdefault("answer", solution_str)
    return {
        "score": float(parse(solution_str) == parse(ground_truth)),
        "cached": parse.cache_info().currsize,
        "calls": len(CALLS),
        "first": FIRST["answer"],
    }
"""


def test_the_warm_ups_calls_leave_nothing_a_sample_sees(tmp_path: Path) -> None:
    """The zygote's warm-up calls (on fixed inputs) filled the memo, counted calls and set the
    first-call setting every sample then saw (`cached` 47, `calls` 41, `first` "0"): each
    sample's module is now one no call has reached."""
    completions = ["2", " 2 ", "3"]
    path, verdicts = one_batch(tmp_path, MEMO, completions)
    for completion, verdict in zip(completions, verdicts):
        direct = fresh_call(path, completion)
        assert {"score": verdict.score, **verdict.extras["reward_info"]} == direct


#: An import of 2.5 s: longer than a sample's wall clock (1.6 s at a 0.8 s timeout).
SLOW_IMPORT = """
import time

time.sleep(2.5)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)
"""


def test_a_slow_import_is_paid_once_and_charged_to_no_sample(tmp_path: Path) -> None:
    """The zygote had a sample's wall clock to import and warm up; past it each sample imported
    the file itself, and every one timed out. Seconds, not tenths: the import must outlast a
    sample's wall clock by more than a loaded machine's jitter (the zygote imports it twice)."""
    completions = ["2", "3", "2"]
    _, verdicts = one_batch(tmp_path, SLOW_IMPORT, completions, timeout=0.8)
    assert [(v.score, v.error_type) for v in verdicts] == [
        (1.0, None),
        (0.0, "wrong_answer"),
        (1.0, None),
    ]
    assert all(v.duration_s < 0.8 for v in verdicts)
