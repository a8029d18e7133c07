"""score_samples streams: the same files as the scorer that held everything in memory, chunk by
chunk, for a mixed input (malformed lines, every kind of bad sample, too-large completions,
problems without samples, compile and answer checkers)."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from ckpteval.checkers import MAX_COMPLETION_CHARS, Checker, Job, Verdict, register
from ckpteval.evaluate import read_samples, score_samples
from ckpteval.sandbox import isolation

#: Files written by the scorer before it streamed (`git show 27ecd4a:src/ckpteval/evaluate.py`),
#: for `golden_input` scored by the deterministic checkers below.
GOLDEN = Path(__file__).resolve().parent / "data" / "evaluate_golden"

_KINDS = {
    "ok": (True, None, True),
    "wa": (False, "wrong_answer", True),
    "ce": (False, "compile_error", False),
    "rt": (False, "runtime_error", True),
    "to": (False, "timeout", True),
}


class _Deterministic(Checker):
    """Verdicts decided by the completion's first word, with fixed durations, stderr, extras and
    reward hacks (some wrong answers and crashes): what a real checker's output looks like, minus
    the timing noise."""

    name = "golden-compiles-test-double"
    compiles = True

    def check_one(self, job: Job, timeout: float) -> Verdict:
        kind = job.completion.split()[0] if job.completion.split() else "rt"
        passed, error, compiled = _KINDS.get(kind, _KINDS["rt"])
        words = len(job.completion.split())
        hack = (
            "always_equal_object"
            if kind == "wa" and words % 3 == 0
            else "exit_before_tests"
            if kind == "rt" and words % 4 == 0
            else None
        )
        return Verdict(
            passed,
            error,
            compile_ok=compiled if self.compiles else None,
            duration_s=len(job.completion) / 997,
            stderr_tail="" if passed else f"{error} in «{job.task_id}»\n",
            extras={"words": words},
            hack=hack,
        )

    def reference_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        return [Job(task_id, p, "ok reference") for task_id, p in problems.items()]

    def known_wrong_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        task_id, problem = next(iter(problems.items()))
        return [Job(task_id, problem, "wa known-wrong")]


class _DeterministicAnswers(_Deterministic):
    name = "golden-answers-test-double"
    compiles = False


register(_Deterministic.name, _Deterministic)
register(_DeterministicAnswers.name, _DeterministicAnswers)


def golden_input(path: Path) -> dict[str, dict[str, Any]]:
    """Write the mixed samples file; return its problems (`p6` gets no sample)."""
    rng = random.Random(8)
    problems = {f"p{i}": {"i": i} for i in range(7)}
    lines: list[bytes] = []
    next_idx = {t: 0 for t in problems}
    for j in range(400):
        task_id = f"p{rng.randrange(6)}"
        kind = rng.choice(["ok", "ok", "ok", "wa", "ce", "rt", "to"])
        sample: dict[str, Any] = {
            "task_id": task_id,
            "completion": f"{kind} " + "w " * rng.randrange(9),
        }
        if rng.random() < 0.7:
            sample["sample_idx"] = next_idx[task_id]
        next_idx[task_id] += 1
        lines.append(json.dumps(sample).encode())
        if j % 37 == 5:
            lines.append(rng.choice([b"{not json", b"[1, 2]", b"\xff\xfe not utf-8", b"   "]))
        if j % 41 == 7:
            lines.append(
                json.dumps(
                    rng.choice(
                        [
                            {"completion": "ok"},
                            {"task_id": "", "completion": "ok"},
                            {"task_id": "nope", "completion": "ok"},
                            {"task_id": "p1", "completion": 5},
                            {"task_id": "p2", "completion": "ok", "sample_idx": True},
                            {"task_id": "p3", "completion": "ok", "sample_idx": "2"},
                            {"task_id": "p0", "completion": "wa duplicate", "sample_idx": 0},
                        ]
                    )
                ).encode()
            )
        if j in (100, 300):
            lines.append(
                json.dumps(
                    {
                        "task_id": "p4",
                        "sample_idx": 1000 + j,
                        "completion": "ok" + "x" * MAX_COMPLETION_CHARS,
                    }
                ).encode()
            )
    path.write_bytes(b"\n".join(lines) + b"\n")
    return problems


def _score(checker: str, tmp: Path, **kwargs: Any) -> dict[str, Any]:
    problems = golden_input(tmp / "samples.jsonl")
    errors = ["earlier: an error the caller already found"]
    return score_samples(
        checker,
        problems,
        read_samples(tmp / "samples.jsonl", errors),
        tmp / "out.jsonl",
        tmp / "out.json",
        workers=2,
        ks=[1, 2, 5, 1000],
        provenance={"run": "golden"},
        input_errors=errors,
        **kwargs,
    )


@pytest.mark.parametrize("checker", [_Deterministic.name, _DeterministicAnswers.name])
@pytest.mark.parametrize("chunk_size", [1, 7, 1024])
def test_streamed_files_equal_those_of_the_in_memory_scorer(
    checker: str, chunk_size: int, tmp_path: Path
) -> None:
    cell = _score(checker, tmp_path, chunk_size=chunk_size)
    name = checker.removesuffix("-test-double")
    here = str(tmp_path).encode()  # the golden files name the samples file `<tmp>/samples.jsonl`
    assert (tmp_path / "out.jsonl").read_bytes().replace(here, b"<tmp>") == (
        GOLDEN / f"{name}.jsonl"
    ).read_bytes()
    expected = json.loads((GOLDEN / f"{name}.json").read_text())
    written = json.loads((tmp_path / "out.json").read_bytes().replace(here, b"<tmp>"))
    assert written["timeouts"]["calibrated_problems"] == 0  # the doubles report no run times
    for volatile in ("duration_s", "timeouts"):  # wall time; the timeout calibration is new
        expected.pop(volatile, None)
        written.pop(volatile)
    for host in ("sandbox_mode", "sandbox_uncounted"):  # this host's: root or not, its cgroups
        assert written.pop(host, None) == isolation(expected["sandbox"]).get(host)
    assert json.dumps(written, indent=2, sort_keys=True) == json.dumps(
        expected, indent=2, sort_keys=True
    )
    assert written["input_errors"][0].startswith("earlier:") and len(written["input_errors"]) == 19
    assert cell["metrics"] == written["metrics"]
    assert (
        not list(tmp_path.glob(".out.jsonl.*.tmp"))
        and not (tmp_path / "out.jsonl.partial").exists()
    )


class _DiesOnRequest(_Deterministic):
    """Its infrastructure fails on a completion starting with `die`."""

    name = "dies-on-request-test-double"

    def check_one(self, job: Job, timeout: float) -> Verdict:
        if job.completion.startswith("die"):
            raise RuntimeError("the sandbox went away")
        return super().check_one(job, timeout)


register(_DiesOnRequest.name, _DiesOnRequest)


def test_a_failure_midway_leaves_no_output_and_keeps_the_finished_chunks(tmp_path: Path) -> None:
    samples = [
        {"task_id": "p0", "sample_idx": i, "completion": "ok" if i != 7 else "die"}
        for i in range(10)
    ]
    out = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError, match="went away"):
        score_samples(
            _DiesOnRequest.name,
            {"p0": {}},
            samples,
            out,
            tmp_path / "out.json",
            workers=1,
            chunk_size=3,
        )
    assert not out.exists() and not (tmp_path / "out.json").exists()
    assert not list(tmp_path.glob(".out.jsonl.*.tmp"))  # the half-written file is gone
    partial = (tmp_path / "out.jsonl.partial").read_text().splitlines()
    assert len(partial) == 7  # samples 0-6, checked before 7 failed: kept for the rerun
    samples[7]["completion"] = "ok again"  # another completion: a new verdict, not a reused one
    cell = score_samples(
        _DiesOnRequest.name,
        {"p0": {}},
        samples,
        out,
        tmp_path / "out.json",
        workers=1,
        chunk_size=3,
    )
    assert cell["self_test"]["reused_verdicts"] == 7 and cell["n_samples"] == 10
    assert not (tmp_path / "out.jsonl.partial").exists()


class _SlowFirst(_Deterministic):
    """Its `ok slow` sample waits (up to 2 s) until its `ok last` sample has been checked: it
    passes if it stopped waiting then, and times out otherwise."""

    name = "slow-first-test-double"

    def __init__(self) -> None:
        self.last_checked = threading.Event()

    def check_one(self, job: Job, timeout: float) -> Verdict:
        if job.completion == "ok slow":
            return Verdict(True) if self.last_checked.wait(2) else Verdict(False, "timeout")
        if job.completion == "ok last":
            self.last_checked.set()
        return super().check_one(job, timeout)


register(_SlowFirst.name, _SlowFirst)


def _score_p0(
    checker: str, samples: list[dict[str, Any]], tmp: Path, *, workers: int, chunk_size: int
) -> dict[str, Any]:
    """`score_samples` of samples of one problem, p0, into `tmp`."""
    return score_samples(
        checker,
        {"p0": {}},
        samples,
        tmp / "out.jsonl",
        tmp / "out.json",
        workers=workers,
        chunk_size=chunk_size,
    )


def test_a_slow_sample_does_not_hold_up_the_next_chunks(tmp_path: Path) -> None:
    """While one worker waits on the first sample, the other checks the samples of the chunks
    after it: a scorer that finished each chunk before starting the next would wait out the 2 s
    (the last sample is three chunks away)."""
    samples = [
        {"task_id": "p0", "completion": c}
        for c in ["ok slow", *(f"wa {i}" for i in range(10)), "ok last"]
    ]
    cell = _score_p0(_SlowFirst.name, samples, tmp_path, workers=2, chunk_size=4)
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(line["sample_idx"], line["error_type"]) for line in lines] == [
        (0, None),
        *((i, "wrong_answer") for i in range(1, 11)),
        (11, None),
    ]
    assert cell["error_types"] == {"wrong_answer": 10}


def test_duplicates_are_found_in_any_order() -> None:
    from ckpteval.evaluate import _SeenIndices

    rng = random.Random(3)
    for _ in range(500):
        seen, reference = _SeenIndices(), set()
        for _ in range(rng.randrange(40)):
            pair = (rng.choice("ab"), rng.randint(-3, 12))
            assert seen.add(*pair) == (pair not in reference), pair
            reference.add(pair)


class _Batched(_Deterministic):
    """Checks in batches of up to 64 that are worth starting full (as a reward sandbox's are):
    records the size of each batch it is given."""

    name = "batched-test-double"
    window_per_worker = 64
    sizes: list[int] = []

    def batch_size_for(self, n_jobs: int, workers: int) -> int:
        return max(1, min(64, -(-n_jobs // workers)))

    def check_batch(self, jobs: Any, timeout: float) -> list[Verdict]:
        type(self).sizes.append(len(jobs))
        return [self.check_one(job, timeout) for job in jobs]


register(_Batched.name, _Batched)


def test_a_window_holds_a_full_batch_per_worker_of_a_checker_that_asks(tmp_path: Path) -> None:
    """8 workers and a window of 32 samples would give batches of 4; the checker's
    `window_per_worker` widens the window to 8 x 64, so every batch is full until the input
    ends, and what is left then is shared among the 8 workers, not left to one in a last full
    batch (the reward checker asks two batches of 1,024 a worker, `RewardFunctionChecker`)."""
    samples = [{"task_id": "p0", "completion": "ok"} for _ in range(2000)]
    _Batched.sizes = []
    cell = _score_p0(_Batched.name, samples, tmp_path, workers=8, chunk_size=32)
    assert cell["error_types"] == {}
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 2000
    assert _Batched.sizes[:2] == [1, 1]  # the self-test: a reference, a known-wrong sample
    sizes = sorted(_Batched.sizes[2:], reverse=True)  # recorded as the workers took them up
    assert sum(sizes) == 2000, sizes
    short = next(i for i, n in enumerate(sizes) if n < 64)  # 2000 is no multiple of 64
    rest = sizes[short:]
    assert short >= 8 and sizes[:short] == [64] * short, sizes
    assert max(rest) == rest[0] == -(-sum(rest) // 8) and len(rest) <= 8, sizes
