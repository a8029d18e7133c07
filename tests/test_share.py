"""Tail assist (ckpteval.engine.assist): the board protocol, and an infer job helped by an assist job.

The engine here is a slow deterministic fake (no GPU can run in CI and the point is the protocol);
tests/test_infer_vllm.py generates a published chunk with a real vLLM engine.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import run_snakemake, small_config, write_config
from test_schedule import _plan

from ckpteval.backends import Backend, Completion, Generation, Prompt, SamplingSpec
from ckpteval.config import build_tasks, validate_config
from ckpteval.engine.assist import (
    MAIN,
    Board,
    Offer,
    assist,
    boards_root,
    live_boards,
    offers,
    work_through,
    worth_helping,
)
from ckpteval.engine.generate import Job, _AssistEngine, run_infer
from ckpteval.io import write_json


class SlowEcho(Backend):
    """A deterministic fake engine taking `delay` seconds per prompt."""

    name = "fake"

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.prompts: list[str] = []

    @property
    def identity(self) -> dict[str, Any]:
        return {"backend": "fake"}

    def generate(self, prompts: list[Prompt], specs: list[SamplingSpec]) -> list[Generation]:
        time.sleep(self.delay * len(prompts))
        self.prompts += [str(p) for p in prompts]
        return [
            Generation(
                len(str(p)),
                tuple(
                    Completion(f" #### {(len(str(p)) + s.seed + k) % 97}", "stop", 3)
                    for k in range(s.n)
                ),
            )
            for p, s in zip(prompts, specs, strict=True)
        ]

    def harness_model(self) -> Any:
        raise AssertionError("no harness tasks here")


def _publish(root: Path, n: int, job: str = "r/step_1") -> Board:
    return Board.publish(root, job, {"chunk_cost": [10] * n}, [{"i": i} for i in range(n)])


def test_claims_are_exclusive_job_from_the_front_assistant_from_the_back(tmp_path: Path) -> None:
    board = _publish(tmp_path, 5)
    helper = Board.join(board.path, "a1")
    assert board.claim(0) and board.claim(0)  # its own chunk again: still its own
    assert helper.claim_last() == 4 and helper.claim_last() == 3
    assert not board.claim(4) and not helper.claim(0)
    assert board.unclaimed() == [1, 2] and board.claimant(3) == "a1"
    assert board.helpers() == 1 and board.alive("a1")
    helper.leave()
    assert not board.alive("a1") and board.helpers() == 0
    assert [b.path for b in live_boards(tmp_path)] == [board.path]
    board.leave()
    assert not board.path.exists() and list(live_boards(tmp_path)) == []


def _claim_and_die(path: str, ready: Any) -> None:
    helper = Board.join(Path(path), "a1")
    helper.claim_last()
    ready.set()
    time.sleep(60)  # killed here, before its chunk is done


def test_a_killed_assistants_chunk_is_taken_back_and_generated_by_the_job(tmp_path: Path) -> None:
    board = _publish(tmp_path, 4)
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_claim_and_die, args=(str(board.path), ready))
    proc.start()
    assert ready.wait(30)
    generated: list[int] = []

    def generate(i: int) -> None:
        if i == 0:  # the assistant dies while the job works on its first chunk
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()
        generated.append(i)
        board.mark_done(i, 0.1)

    assisted = work_through(board, range(4), generate, poll_seconds=0.05)
    assert assisted == [] and generated == [0, 1, 2, 3]
    assert board.claimant(3) == MAIN
    board.leave()


def test_a_failing_assistant_ends_cleanly_and_its_chunk_goes_back_to_the_job(
    tmp_path: Path,
) -> None:
    """An assist job whose engine fails (an OOM on a smaller GPU) records the error and exits 0:
    it is an optimisation, and the job generates the chunk it had claimed."""
    board = _publish(tmp_path, 6)

    class Failing:
        def generate_chunk(self, chunk: Any) -> int:
            raise RuntimeError("CUDA out of memory")

        def close(self) -> None:
            pass

    stats = assist(tmp_path, "a1", lambda b: Failing(), grace_seconds=0, poll_seconds=0.01)
    assert stats.error == "RuntimeError: CUDA out of memory" and stats.chunks == 0
    assert board.claimant(5) == "a1" and not board.alive("a1")
    generated: list[int] = []
    assert work_through(board, range(6), generated.append, poll_seconds=0.01) == []
    assert generated == [0, 1, 2, 3, 4, 5] and board.claimant(5) == MAIN
    board.leave()


def test_a_dead_jobs_board_is_not_offered_and_its_retry_replaces_it(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=_publish, args=(tmp_path, 4))
    proc.start()
    proc.join()
    stale = next(tmp_path.iterdir())
    assert (stale / "board.json").exists() and list(live_boards(tmp_path)) == []
    assert offers(tmp_path) == []
    retry = _publish(tmp_path, 4)
    assert not stale.exists() and [b.path for b in live_boards(tmp_path)] == [retry.path]
    retry.leave()


def test_offers_price_the_work_left_from_the_jobs_own_rate(tmp_path: Path) -> None:
    board = _publish(tmp_path, 10)
    (offer,) = offers(tmp_path)
    assert offer.remaining_seconds is None and offer.unclaimed == 10 and offer.helpers == 0
    assert worth_helping(offer, load_seconds=60)  # unmeasured: 10 chunks are enough to share
    for i in range(2):
        board.claim(i)
        board.mark_done(i, 5.0)
    board.report(load_seconds=20.0, engine_seconds=10.0, cost_done=20)  # 0.5 s per cost unit
    (offer,) = offers(tmp_path)
    assert offer.remaining_seconds == pytest.approx(8 * 10 * 0.5) and offer.share == pytest.approx(
        20
    )
    assert worth_helping(offer, load_seconds=10) and not worth_helping(offer, load_seconds=20)
    helper = Board.join(board.path, "a1")
    (offer,) = offers(tmp_path)
    assert offer.helpers == 1 and offer.share == pytest.approx(40 / 3)
    helper.leave()
    for i in range(2, 9):
        board.claim(i)
    assert offers(tmp_path) == []  # one chunk left: the job takes it sooner than an engine loads
    board.leave()


def test_a_job_still_loading_is_priced_at_the_other_jobs_rate(tmp_path: Path) -> None:
    """Offers are compared in one unit: a job with no rate yet gets the median of the others'."""
    measured = _publish(tmp_path, 10, job="r/step_1")
    measured.claim(0)
    measured.report(load_seconds=20.0, engine_seconds=60.0, cost_done=10)  # 6 s per cost unit
    loading = _publish(tmp_path, 28, job="r/step_2")  # nothing generated yet
    priced = {o.board.path: o for o in offers(tmp_path)}
    assert priced[measured.path].remaining_seconds == pytest.approx(9 * 10 * 6)
    assert priced[loading.path].remaining_seconds == pytest.approx(28 * 10 * 6)
    assert max(priced.values(), key=lambda o: o.share).board.path == loading.path
    measured.leave()
    loading.leave()


def test_offer_share_with_unknown_rate_counts_chunks(tmp_path: Path) -> None:
    board = _publish(tmp_path, 3)
    few = Offer(board, None, 3, 0)
    assert not worth_helping(few, 1.0) and worth_helping(Offer(board, None, 4, 0), 1.0)
    assert not worth_helping(Offer(board, None, 5, 1), 1.0)
    board.leave()


# ------------------------------------------------------------------- an infer job and its helper


def _jobs(tmp_path: Path, out: Path) -> tuple[list[Job], Path, dict[str, Any]]:
    config = {
        "runs": {"r": {"path": str(tmp_path)}},
        "outdir": str(tmp_path),
        "tasks": {"arith": {"limit": 24}, "pyfunc": {"limit": 8}},
        "sampling": {"greedy": {"max_new_tokens": 32}, "hot": {"temperature": 0.7, "n": 2}},
    }
    validate_config(config)
    tasks, variants, task_variants = build_tasks(config)
    jobs = [
        Job(tasks[t], variants[v], out / t / f"{v}.jsonl")
        for t, vs in task_variants.items()
        for v in vs
    ]
    manifest = tmp_path / "step_1.json"
    write_json(manifest, {"weights_sha256": "ab" * 32})
    return jobs, manifest, {**config["engine"], "chunk_size": 4}


def _infer(tmp_path: Path, out: Path, backend: Backend, share_as: str | None) -> None:
    jobs, manifest, engine = _jobs(tmp_path, out)
    run_infer(
        jobs,
        manifest_path=manifest,
        model_dir=None,
        run_cfg={"backend": "vllm"},
        engine_cfg=engine,
        cache_dir=out / "cache",
        backend=backend,
        share_as=share_as,
    )


def _files(out: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*.jsonl"))
        if "cache" not in p.parts
    }


def test_an_assisted_job_writes_what_it_would_alone_and_generates_each_request_once(
    tmp_path: Path,
) -> None:
    alone = tmp_path / "alone"
    _infer(tmp_path, alone, SlowEcho(), share_as=None)

    helped = tmp_path / "helped"
    root = boards_root(helped / "cache")
    helper_engine = SlowEcho(delay=0.02)
    stats: list[Any] = []
    thread = threading.Thread(
        target=lambda: stats.append(
            assist(
                root,
                "a1",
                lambda board: _AssistEngine(helper_engine),
                default_load_seconds=0.0,
                grace_seconds=3,
                poll_seconds=0.02,
            )
        )
    )
    thread.start()
    job_engine = SlowEcho(delay=0.02)
    _infer(tmp_path, helped, job_engine, share_as="r/step_1")
    thread.join(60)

    assert _files(helped) == _files(alone)  # the same generation files, byte for byte
    (done,) = stats
    assert done.boards == 1 and done.chunks >= 1 and done.requests == len(helper_engine.prompts)
    # Every request was generated once, by one of the two engines.
    requests = sum(
        json.loads(p.read_text())["n_generated_prompts"] for p in alone.rglob("*.meta.json")
    )
    assert requests > 40 and len(job_engine.prompts) + len(helper_engine.prompts) == requests
    cache_lines = [
        json.loads(line)
        for f in (helped / "cache").rglob("*.jsonl")
        for line in f.read_text().splitlines()
    ]
    assert len(cache_lines) == len({row["key"] for row in cache_lines}) == requests
    metas = [json.loads(p.read_text()) for p in helped.rglob("*.meta.json")]
    assert sum(m["n_assisted_prompts"] for m in metas) == len(helper_engine.prompts)
    assert sum(m["n_generated_prompts"] for m in metas) == requests
    # The assistant's engine seconds count in the jobs' generation_seconds (what the next
    # sweep's priorities are learnt from): both engines take 0.02 s a prompt.
    assert sum(m["generation_seconds"] for m in metas) >= 0.9 * 0.02 * requests
    assert list(live_boards(root)) == [] and not any(root.iterdir())  # the job removed its board


# ------------------------------------------------------------------- the workflow's assist jobs


def _up_to_date(plan: Any, run: str, ckpt: str) -> None:
    """What a finished consolidate job and infer job leave for a checkpoint: a manifest with the
    model's identity and its source's hashes, and every cell's generation file with the meta
    that records its identity (ckpteval.freshness then calls nothing of it stale)."""
    from ckpteval.checkpoints import hash_source
    from ckpteval.contract import generation_identity, model_identity

    out = Path(plan.outdir)
    (out / "models" / run / ckpt).mkdir(parents=True, exist_ok=True)
    write_json(
        out / "models" / run / f"{ckpt}.json",
        {
            **model_identity(plan, run, ckpt).record(),
            "weights_sha256": "w",
            "source_files": hash_source(plan.checkpoint(run, ckpt).path),
        },
    )
    for task, variants in plan.task_variants.items():
        for variant in variants:
            gen = out / "generations" / run / ckpt / task / f"{variant}.jsonl"
            gen.parent.mkdir(parents=True, exist_ok=True)
            gen.write_text("")
            write_json(
                gen.with_suffix(".meta.json"),
                {
                    **generation_identity(plan, run, task, variant).record(),
                    "model_hash": "w",
                    "model_identity": None,
                },
            )


def _assist_blocks(workdir: Path, *args: str) -> list[str]:
    result = run_snakemake(workdir, "-n", "--cores", "1", *args, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return [b for b in (result.stdout + result.stderr).split("\n\n") if "rule assist:" in b]


@pytest.mark.slow
def test_snakemake_adds_one_assist_job_per_spare_gpu_while_generations_are_missing(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "work"
    plan = _plan(tmp_path, workdir / "results")
    config = {k: plan.config[k] for k in ("runs", "tasks", "sampling")}
    write_config(workdir, config)

    blocks = _assist_blocks(workdir, "--resources", "gpu=3")
    assert len(blocks) == 2
    for block in blocks:
        assert re.search(r"priority: -1\b", block)  # below every infer job's
        # It waits for every pending checkpoint's consolidation.
        inputs = re.search(r"input: (.*)", block).group(1)
        assert sorted(re.findall(r"models/(\w+)/(\w+)\.json", inputs)) == [
            ("big", "step_100"),
            ("small", "step_100"),
            ("small", "step_200"),
        ]
    assert _assist_blocks(workdir, "--resources", "gpu=1") == []  # one GPU: nothing to lend

    # Once a checkpoint's generations are up to date it is not pending; once none is, no assist
    # job. (A generation file without the meta that says what it was made with is not.)
    out = workdir / "results" / "generations" / "small" / "step_100" / "arith" / "greedy-s42.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")
    assert len(_assist_blocks(workdir, "--resources", "gpu=3")) == 2
    for run, ckpt in (("small", "step_100"), ("small", "step_200"), ("big", "step_100")):
        _up_to_date(plan, run, ckpt)
    blocks = _assist_blocks(workdir, "--resources", "gpu=3")
    assert blocks == []

    write_config(workdir, {**config, "assist": False})
    shutil.rmtree(workdir / "results" / "generations" / "big")
    assert _assist_blocks(workdir, "--resources", "gpu=3") == []
    write_config(workdir, config)
    (block, _) = _assist_blocks(workdir, "--resources", "gpu=3")
    assert re.findall(r"models/(\w+)/(\w+)\.json", re.search(r"input: (.*)", block).group(1)) == [
        ("big", "step_100")
    ]


@pytest.mark.slow
def test_a_sweep_with_a_spare_gpu_runs_an_assist_job_beside_the_infer_job(
    demo_dir: Path, tmp_path: Path
) -> None:
    """Real Snakemake, real vLLM on CPU: `--resources gpu=2` gives one infer job and one assist
    job; whoever generated what, every file is complete and the counts agree."""
    run = tmp_path / "run"
    run.mkdir()
    step = min((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    (run / step.name).symlink_to(step)
    config = small_config(
        run,
        tasks={"arith": {}},
        engine={"gpu_memory_utilization": 0.15, "enforce_eager": True, "chunk_size": 2},
    )
    write_config(tmp_path, config)
    proc = run_snakemake(tmp_path, "--resources", "gpu=2", timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (log,) = (tmp_path / "logs" / "assist").rglob("0.log")
    done = re.search(
        r"assist job \S+ done: (\d+) request\(s\) in (\d+) chunk\(s\)", log.read_text()
    )
    assert done, log.read_text()[-3000:]
    gen = tmp_path / "results" / "generations" / "demo" / step.name / "arith"
    meta = json.loads((gen / "greedy-s42.meta.json").read_text())
    assert meta["n_generated_prompts"] == 20 and meta["n_assisted_prompts"] == int(done.group(1))
    assert len((gen / "greedy-s42.jsonl").read_text().splitlines()) == 20
    (record,) = (tmp_path / "results" / "assist").rglob("0.json")  # what the assist job did
    assert json.loads(record.read_text())["requests"] == int(done.group(1))
    assert not any((tmp_path / "results" / "cache" / ".boards").iterdir())
    assert (tmp_path / "results" / "summary" / "metrics.csv").exists()
    # Nothing left to generate: a rerun plans no assist job and no work.
    again = run_snakemake(tmp_path, "-n", "--resources", "gpu=2")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
