"""The infer step: one backend per job serves every task and variant of a checkpoint, resumably.

With the vLLM backend the engine loads at most once per job (and not at all when every request is
cached); lm-eval (harness) tasks run on it with lm-eval's own prompts, few-shot context, filters
and metrics, and ckpteval's generation tasks use the very same engine. Nothing is generated twice:
every finished chunk of requests is appended to a content-addressed cache

    <outdir>/cache/<model>/<task>.jsonl      one line per request: {key, task_id, ..., outputs}

where `<model>` is the manifest's weights hash (or a weightless model card's identity hash) and
`key` hashes the prompt (or lm-eval request), the sampling parameters with their seed, and the
backend's identity (engine version, dtype, context length). A killed job, a rerun after one
generation file was deleted, or a changed task regenerates only the requests that are missing. The
cache is not a declared output, so it survives Snakemake deleting a failed job's outputs.

Generation file schema (`generations/{run}/{ckpt}/{task}/{variant}.jsonl`), one line per
(problem, sample): task_id, sample_idx, prompt, completion, finish_reason, prompt_tokens,
completion_tokens; harness lines add target, filtered (per filter) and metrics (lm-eval's
per-sample values keyed `<metric>,<filter>`); code harness lines add `problem` (what the python
checker needs: prompt/test/entry_point or test_list, and the reference solution); lines of a
task with `reasoning` add answer, reasoning_tokens and truncated_reasoning, `completion` staying
the raw text and `finish_reason` being the answer's (ckpteval.reasoning). Beside it,
`{variant}.meta.json` records the backend and its arguments, versions, device, host, Slurm job,
timings (load; generation, for ckpteval tasks as their token share of the job's batch), token
counts, tokens/s, how many prompts came from the cache, and the chat template the prompts went
through (`chat_template: {source, sha256}`, ckpteval.chat_templates).

All ckpteval tasks and variants of a job are generated together, in chunks that mix them, and
those chunks ride along with lm-eval's own engine calls (`Backend.ride_along`): the engine sees
one batch instead of one per task, each ending with the engine draining on its longest sequences.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpteval.backends import (
    Backend,
    Generation,
    Prompt,
    SamplingSpec,
    cache_namespace,
    make_backend,
)
from ckpteval.chat_templates import TemplateUse, resolve, template_use
from ckpteval.config import Variant
from ckpteval.engine.assist import Board, Engine, boards_root, work_through
from ckpteval.engine.cache import cache_key, cache_row, read_cache, store_rows
from ckpteval.engine.gpus import Lease, engine_gpus, lease_engine_device
from ckpteval.environment import job_environment, versions
from ckpteval.errors import UserError
from ckpteval.io import read_json, sha256_json, write_json, write_jsonl
from ckpteval.plan.layout import generation_meta_of
from ckpteval.problems import earlier_turns
from ckpteval.reasoning import engine_spec, split, task_reasoning
from ckpteval.tasks import TaskSpec

log = logging.getLogger("ckpteval.engine.generate")

#: Each retry of a job that ran out of GPU memory asks vLLM for this fraction of the last attempt's
#: `gpu_memory_utilization` (0.8 -> 0.68 -> 0.58).
OOM_BACKOFF = 0.85


@dataclass(frozen=True)
class Job:
    """One (task, variant) of the checkpoint, and the files it must produce. `record` goes into
    the meta as it is (the workflow's identity of the cell: ckpteval.contract)."""

    task: TaskSpec
    variant: Variant
    out: Path
    record: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    #: The chat template its prompts go through (set by `run_infer` from the run's choice).
    chat: TemplateUse | None = field(default=None, hash=False, compare=False)

    @property
    def meta(self) -> Path:
        return generation_meta_of(self.out)

    @property
    def template(self) -> TemplateUse:
        """How its prompts are formatted; without a run's choice, as the task asks, through the
        tokenizer's own template."""
        return self.chat or TemplateUse(bool(self.task.options.get("chat_template")))


def gpu_memory_utilization(configured: float, attempt: int) -> float:
    """vLLM's memory fraction for Snakemake attempt `attempt` (1 = first try)."""
    return round(configured * OOM_BACKOFF ** max(0, attempt - 1), 4)


def engine_settings(engine_cfg: dict[str, Any], attempt: int) -> dict[str, Any]:
    """The engine section as attempt `attempt` runs it: a retry after a CUDA OOM asks for less."""
    settings = dict(engine_cfg)
    settings["gpu_memory_utilization"] = gpu_memory_utilization(
        float(settings["gpu_memory_utilization"]), attempt
    )
    if attempt > 1:
        log.warning(
            "attempt %d: engine.gpu_memory_utilization lowered to %s after a failure",
            attempt,
            settings["gpu_memory_utilization"],
        )
    return settings


@contextlib.contextmanager
def engine_session(
    run_cfg: dict[str, Any],
    model_dir: Path | None,
    engine_cfg: dict[str, Any],
    gpus: Sequence[int | str] | None,
    where: str,
) -> Iterator[tuple[Backend, Lease]]:
    """A device lease and a backend (its engine starts on first use) that outlive one
    checkpoint's `run_infer`: an engine job hands them to the checkpoints it chains to."""
    vllm = run_cfg.get("backend", "vllm") == "vllm"
    lease = lease_engine_device(gpus, engine_gpus(engine_cfg)) if vllm else Lease(None, "none")
    try:
        backend = make_backend(run_cfg, model_dir=model_dir, engine_cfg=engine_cfg, where=where)
        try:
            yield backend, lease
        finally:
            backend.close()
    finally:
        lease.release()


def run_infer(
    jobs: Sequence[Job],
    *,
    manifest_path: Path,
    model_dir: Path | None,
    run_cfg: dict[str, Any],
    engine_cfg: dict[str, Any],
    cache_dir: Path,
    gpus: Sequence[int | str] | None = None,
    include_paths: Sequence[str] = (),
    attempt: int = 1,
    where: str = "runs",
    backend: Backend | None = None,
    lease: Lease | None = None,
    share_as: str | None = None,
    template_check: Callable[[str | None], None] | None = None,
) -> dict[str, Any]:
    """Write every job's generation file and meta for one checkpoint; returns a summary.

    `run_cfg` is the run's config entry (its `backend`, `endpoint`, `chat_template`: a template
    file is read relative to the working directory); `attempt` is Snakemake's
    attempt number: a retry after a CUDA out-of-memory error asks vLLM for less memory. A
    `backend` given by the caller (bench/infer.py, an engine session made with
    `engine_settings(engine_cfg, attempt)`) is used as is and left open; so is a `lease`. With `share_as`
    (a name for this job), missing requests are published for assist jobs (ckpteval.engine.assist).
    `template_check` is given the resolved chat template's identity (a workflow job checks it
    against its cells' identities: ckpteval.jobs.EngineJob.check_template).
    """
    from ckpteval.harness import HarnessRunner

    manifest = read_json(manifest_path)
    cache = cache_dir / cache_namespace(manifest)
    own_backend, own_lease = backend is None, lease is None
    engine_cfg = engine_settings(engine_cfg, attempt)
    backend_name = run_cfg.get("backend", "vllm")
    if lease is None:
        vllm = backend_name == "vllm"
        lease = lease_engine_device(gpus, engine_gpus(engine_cfg)) if vllm else Lease(None, "none")
    log.info("backend %s; device: %s (%s)", backend_name, lease.device or "cpu", lease.how)
    if backend is None:
        backend = make_backend(run_cfg, model_dir=model_dir, engine_cfg=engine_cfg, where=where)
    meta_base = {
        "backend": backend.name,
        "model_dir": str(model_dir) if model_dir else None,
        "model_hash": manifest.get("weights_sha256"),
        "model_identity": manifest.get("identity_sha256"),
        "engine_args": engine_cfg,
        "device": job_environment(lease),
        "versions": versions(),
    }
    share = {"run_cfg": run_cfg, "model_dir": str(model_dir), "engine_cfg": engine_cfg}
    missing: MissingRequests | None = None
    try:
        jobs = _with_templates(jobs, run_cfg, backend, where, template_check)
        harness = HarnessRunner(backend, include_paths, chunk_size=int(engine_cfg["chunk_size"]))
        harness.preflight([job.task for job in jobs])
        batch = [
            prepare_requests(backend, harness, job, cache)
            for job in jobs
            if job.task.kind == "generate" or job.task.is_code_harness
        ]
        missing = MissingRequests(backend, batch, int(engine_cfg["chunk_size"]))
        if share_as and backend_name == "vllm" and len(missing.chunks) >= 2:
            share.update(identity=backend.identity, where=where)
            missing.publish(boards_root(cache_dir), share_as, share)
        done = _run_harness_jobs(backend, harness, jobs, missing, cache)
        done.update(_generate_batch(backend, batch, missing))
        for job in jobs:
            _write_meta(job, backend, meta_base, *done[id(job)])
    except Exception as exc:
        if is_cuda_oom(exc):
            raise _oom_error(engine_cfg, attempt) from None
        raise
    finally:
        if missing is not None and missing.board is not None:
            missing.board.leave()
        if own_backend:
            backend.close()
        if own_lease:
            lease.release()
    log.info("done: %d generation files, %d engine load(s)", len(jobs), backend.loads)
    return {"engine_loads": backend.loads, "load_seconds": backend.load_seconds}


def _with_templates(
    jobs: Sequence[Job],
    run_cfg: dict[str, Any],
    backend: Backend,
    where: str,
    check: Callable[[str | None], None] | None,
) -> list[Job]:
    """`jobs`, each with the chat template its prompts go through: the run's choice (resolved
    relative to the working directory, and given to `check`) for a task that asks for one."""
    choice = resolve(
        run_cfg.get("chat_template"),
        key=f"{where}.chat_template",
        base_dir=Path.cwd(),
        backend=run_cfg.get("backend", "vllm"),
    )
    if check is not None:
        check(choice.identity)
    return [
        dataclasses.replace(
            job, chat=template_use(choice, bool(job.task.options.get("chat_template")), backend)
        )
        for job in jobs
    ]


Done = dict[int, tuple[dict[str, Any], dict[str, Any]]]


def _run_harness_jobs(
    backend: Backend, harness: Any, jobs: Sequence[Job], missing: MissingRequests, cache: Path
) -> Done:
    """Run the lm-eval jobs; ckpteval's chunks ride along with lm-eval's engine calls (one
    engine batch, not two: each separate call ends draining the engine on its longest
    sequences). (stats, timings) per job id."""
    harness_jobs = [
        job for job in jobs if job.task.kind == "harness" and not job.task.is_code_harness
    ]
    if harness_jobs:
        for chunk in missing.chunks:
            backend.ride_along(
                chunk.prompts,
                chunk.specs,
                functools.partial(missing.finish, chunk),
                claim=functools.partial(missing.claim, chunk),
            )
    done: Done = {}
    for job in harness_jobs:
        started = time.time()
        before = backend.load_seconds + backend.ride_seconds
        stats = harness.run(job, cache / f"{job.task.name}.jsonl")
        spent = time.time() - started - (backend.load_seconds + backend.ride_seconds - before)
        done[id(job)] = stats, {"started_at": started, "generation_seconds": max(0.0, spent)}
    backend.drop_riders()
    return done


def _generate_batch(backend: Backend, batch: Sequence[Requests], missing: MissingRequests) -> Done:
    """Generate what no lm-eval call took along, then write each generation file."""
    started = time.time()
    missing.generate_rest(backend)
    batch_seconds = sum(req.seconds for req in batch)
    return {
        id(req.job): (
            _write_generations(req, backend),
            {
                "started_at": started,
                "generation_seconds": req.seconds,
                "batch_seconds": batch_seconds,
            },
        )
        for req in batch
    }


def _oom_error(engine_cfg: dict[str, Any], attempt: int) -> UserError:
    return UserError(
        f"CUDA out of memory with engine.gpu_memory_utilization "
        f"{engine_cfg['gpu_memory_utilization']} (attempt {attempt}); the rule retries once "
        "with less; if that fails too, lower engine.gpu_memory_utilization or "
        "engine.max_model_len"
    )


def run_assist(
    cache_dir: Path,
    name: str,
    *,
    gpus: Sequence[int | str] | None = None,
    grace_seconds: float = 30.0,
    count: int = 1,
) -> dict[str, Any]:
    """An assist job: on `count` leased GPUs (its rule's `gpu` resource: the engines' tensor
    parallelism), help the infer jobs still running (ckpteval.engine.assist)."""
    from ckpteval.engine.assist import assist

    lease = lease_engine_device(gpus, count)
    log.info("assist job %s; device: %s (%s)", name, lease.device or "cpu", lease.how)
    try:
        stats = assist(boards_root(cache_dir), name, _assist_engine, grace_seconds=grace_seconds)
    finally:
        lease.release()
    summary = {
        "boards": stats.boards,
        "chunks": stats.chunks,
        "requests": stats.requests,
        "engine_seconds": round(stats.engine_seconds, 3),
        "load_seconds": round(stats.load_seconds, 3),
        "error": stats.error,
        "device": job_environment(lease),
    }
    log.info(
        "assist job %s done: %d request(s) in %d chunk(s) for %d job(s)",
        name,
        stats.requests,
        stats.chunks,
        stats.boards,
    )
    return summary


class _AssistEngine(Engine):
    """An engine like the board's job's, generating its chunks into the same cache."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def generate_chunk(self, chunk: list[dict[str, Any]]) -> int:
        prompts = [item["prompt"] for item in chunk]
        specs = [
            SamplingSpec(**{**item["spec"], "stop": tuple(item["spec"]["stop"])}) for item in chunk
        ]
        generations = self.backend.generate(prompts, specs)
        store_rows(
            (Path(item["cache_file"]), cache_row(item["key"], item["task_id"], g))
            for item, g in zip(chunk, generations, strict=True)
        )
        return len(chunk)

    def close(self) -> None:
        self.backend.close()


def _assist_engine(board: Board) -> _AssistEngine | None:
    info = board.info
    backend = make_backend(
        info["run_cfg"],
        model_dir=Path(info["model_dir"]),
        engine_cfg=info["engine_cfg"],
        where=info.get("where", "runs"),
    )
    if sha256_json(backend.identity) != sha256_json(info["identity"]):
        log.warning(
            "%s: its engine differs from this node's (%s vs %s); not helping",
            info["job"],
            info["identity"],
            backend.identity,
        )
        backend.close()
        return None
    started = time.monotonic()
    backend.load()
    log.info("engine for %s loaded in %.1f s", info["job"], time.monotonic() - started)
    return _AssistEngine(backend)


def _write_meta(
    job: Job, backend: Backend, base: dict[str, Any], stats: dict[str, Any], timing: dict[str, Any]
) -> None:
    seconds = float(timing["generation_seconds"])
    tokens = stats.get("completion_tokens") or 0
    write_json(
        job.meta,
        {
            **base,
            "task": job.task.name,
            "variant": job.variant.name,
            "task_hash": job.task.config_hash(),
            "checker": job.task.checker,
            "chat_template": job.template.record,
            "backend_identity": backend.identity,
            "generation_bytes": job.out.stat().st_size if job.out.exists() else None,
            "engine_loads": backend.loads,
            "swaps": getattr(backend, "swaps", 0),
            "swap_seconds": round(getattr(backend, "swap_seconds", 0.0), 3),
            "served_by": getattr(backend, "served_by", None),
            "load_seconds": round(backend.load_seconds, 3),
            **{
                k: round(v, 3) if isinstance(v, float) and k != "started_at" else v
                for k, v in timing.items()
            },
            "tokens_per_s": round(tokens / seconds, 2) if seconds > 0 and tokens else None,
            "finished_at": time.time(),
            **stats,
            **job.record,
        },
    )


@dataclass
class Requests:
    """A generation job's requests (a ckpteval task, or an lm-eval code task) and, once
    generated or found in the cache, their rows. `seconds` is this job's share of the batch."""

    job: Job
    problems: dict[str, dict[str, Any]]
    prompts: dict[str, Prompt]
    spec: SamplingSpec
    cache_file: Path
    keys: dict[str, str]
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    n_cached: int = 0
    n_assisted: int = 0
    seconds: float = 0.0
    #: The task's own sampling (its stop strings and answer budget) when `spec`, what the engine
    #: is asked, differs from it: a reasoning task (ckpteval.reasoning.engine_spec).
    answer_spec: SamplingSpec | None = None

    @property
    def label(self) -> str:
        return f"{self.job.task.name} {self.job.variant.name}"


def prepare_requests(backend: Backend, harness: Any, job: Job, cache: Path) -> Requests:
    """Render a job's prompts and find which of them the cache already answers."""
    if job.task.is_code_harness:
        problems, prompts, answer_spec = harness.code_requests(job)
    else:
        problems = job.task.problems()
        prompts = render_prompts(backend, job, problems)
        answer_spec = sampling_spec(job)
    spec = engine_spec(answer_spec, task_reasoning(job.task.options))
    ident = backend.identity
    keys = {tid: cache_key(p, spec, ident) for tid, p in prompts.items()}
    cache_file = cache / f"{job.task.name}.jsonl"
    rows = read_cache(cache_file, set(keys.values()))
    n_cached = sum(1 for key in keys.values() if key in rows)
    log.info(
        "%s %s: %d prompts, %d cached, %d to generate",
        job.task.name,
        job.variant.name,
        len(prompts),
        n_cached,
        len(prompts) - n_cached,
    )
    return Requests(
        job,
        problems,
        prompts,
        spec,
        cache_file,
        keys,
        rows,
        n_cached,
        answer_spec=answer_spec if spec != answer_spec else None,
    )


@dataclass
class Chunk:
    """Up to `engine.chunk_size` missing requests, generated in one engine call and appended to
    the cache together. `items` are ((cache file, key), (the first job asking, task_id))."""

    items: list[tuple[tuple[Path, str], tuple[Requests, str]]]
    index: int = 0
    done: bool = False

    @property
    def prompts(self) -> list[Prompt]:
        return [req.prompts[tid] for _, (req, tid) in self.items]

    @property
    def specs(self) -> list[SamplingSpec]:
        return [req.spec for _, (req, _) in self.items]


class MissingRequests:
    """Every job's requests the cache does not answer, deduplicated and cut into chunks.

    Prompts are checked against the context length when this is built, so a prompt that cannot
    fit stops the job before the engine loads. Once `publish`ed, chunks are claimed before they
    are generated, so an assist job can take the last ones (ckpteval.engine.assist).
    """

    #: Seconds between looks at an assistant's chunks the job waits for.
    POLL_SECONDS = 0.5

    def __init__(self, backend: Backend, batch: Sequence[Requests], chunk_size: int) -> None:
        todo: dict[tuple[Path, str], tuple[Requests, str]] = {}
        self.waiting: list[tuple[Requests, str]] = []
        for req in batch:
            missing = {tid: key for tid, key in req.keys.items() if key not in req.rows}
            if missing:
                backend.check_prompts(
                    {tid: req.prompts[tid] for tid in missing},
                    req.spec.max_tokens,
                    req.job.task.name,
                )
            for tid, key in missing.items():
                todo.setdefault((req.cache_file, key), (req, tid))
                self.waiting.append((req, key))
        items = list(todo.items())
        self.total = len(items)
        self.chunks = [
            Chunk(items[i : i + chunk_size], index=n)
            for n, i in enumerate(range(0, len(items), chunk_size))
        ]
        self.rows: dict[tuple[Path, str], dict[str, Any]] = {}
        self.finished = 0
        self.board: Board | None = None
        self._backend = backend
        self._engine_seconds = 0.0
        self._cost_done = 0

    def publish(self, root: Path, name: str, info: dict[str, Any]) -> None:
        """Offer the chunks to assist jobs; `info` says how to load an engine like this one."""
        payloads = [
            [
                {
                    "cache_file": str(cache_file),
                    "key": key,
                    "task_id": tid,
                    "prompt": req.prompts[tid],
                    "spec": req.spec.as_dict(),
                }
                for (cache_file, key), (req, tid) in chunk.items
            ]
            for chunk in self.chunks
        ]
        self.board = Board.publish(
            root, name, {**info, "chunk_cost": [_cost(chunk) for chunk in self.chunks]}, payloads
        )
        log.info("%d chunks published for assist jobs (%s)", len(self.chunks), self.board.path)

    def claim(self, chunk: Chunk) -> bool:
        """Whether this job generates `chunk` (False: an assist job has it)."""
        return self.board is None or self.board.claim(chunk.index)

    def finish(self, chunk: Chunk, generations: Sequence[Generation], seconds: float) -> None:
        """Store a chunk's generations in the cache; `seconds` is its engine time, shared among
        its jobs by tokens generated."""
        rows = [
            cache_row(key, tid, g)
            for ((_, key), (_, tid)), g in zip(chunk.items, generations, strict=True)
        ]
        store_rows(
            (cache_file, row) for ((cache_file, _), _), row in zip(chunk.items, rows, strict=True)
        )
        self._account(chunk, rows, seconds)
        if self.board is not None:
            self.board.mark_done(chunk.index, seconds)
            self._engine_seconds += seconds
            self._cost_done += _cost(chunk)
            self.board.report(self._backend.load_seconds, self._engine_seconds, self._cost_done)

    def _account(
        self, chunk: Chunk, rows: Sequence[dict[str, Any]], seconds: float, assisted: bool = False
    ) -> None:
        tokens: dict[int, int] = {}
        jobs: dict[int, Requests] = {}
        for ((cache_file, key), (req, _)), row in zip(chunk.items, rows, strict=True):
            self.rows[(cache_file, key)] = row
            jobs[id(req)] = req
            tokens[id(req)] = tokens.get(id(req), 0) + sum(o["tokens"] or 1 for o in row["outputs"])
            if assisted:
                req.n_assisted += 1
        total = sum(tokens.values()) or 1
        for ident, req in jobs.items():
            req.seconds += seconds * tokens[ident] / total
        chunk.done = True
        self.finished += len(chunk.items)
        new_tokens = sum(o["tokens"] or 0 for row in rows for o in row["outputs"])
        log.info(
            "generated %d/%d requests (%s%s): %.1f tokens/s",
            self.finished,
            self.total,
            ", ".join(sorted({req.label for req in jobs.values()})),
            "; by an assist job" if assisted else "",
            new_tokens / max(seconds, 1e-9),
        )

    def generate_rest(self, backend: Backend) -> None:
        """Generate the chunks no earlier engine call or assist job took, wait for the assist
        jobs' (taking back those of one that died), then give every job its rows."""
        assisted = work_through(
            self.board,
            [c.index for c in self.chunks if not c.done],
            lambda i: self._generate(backend, self.chunks[i]),
            poll_seconds=self.POLL_SECONDS,
        )
        self._collect(assisted)
        for req, key in self.waiting:
            req.rows[key] = self.rows[(req.cache_file, key)]

    def _generate(self, backend: Backend, chunk: Chunk) -> None:
        t0 = time.monotonic()
        load_before = backend.load_seconds
        generations = backend.generate(chunk.prompts, chunk.specs)
        self.finish(
            chunk, generations, time.monotonic() - t0 - (backend.load_seconds - load_before)
        )

    def _collect(self, assisted: Sequence[tuple[int, float]]) -> None:
        """Account the chunks assist jobs generated, reading their rows from the cache."""
        wanted: dict[Path, set[str]] = {}
        for index, _ in assisted:
            for (cache_file, key), _ in self.chunks[index].items:
                wanted.setdefault(cache_file, set()).add(key)
        cached = {cache_file: read_cache(cache_file, keys) for cache_file, keys in wanted.items()}
        for index, seconds in assisted:
            chunk = self.chunks[index]
            try:
                rows = [cached[cache_file][key] for (cache_file, key), _ in chunk.items]
            except KeyError:
                raise RuntimeError(
                    f"an assist job marked chunk {index} done but the cache lacks "
                    "some of its requests"
                ) from None
            self._account(chunk, rows, seconds, assisted=True)


def _cost(chunk: Chunk) -> int:
    """A chunk's size for pricing the work left: samples x token budget."""
    return sum(req.spec.n * req.spec.max_tokens for _, (req, _) in chunk.items)


def render_prompts(
    backend: Backend, job: Job, problems: dict[str, dict[str, Any]]
) -> dict[str, Prompt]:
    """task_id -> prompt, through the job's chat template (`Job.template`) when it has one: the
    task's system prompt, a row's earlier turns (few-shot examples), then its own rendered
    question, as the trainer's `tokenizer.apply_chat_template(..., add_generation_prompt=True)`.
    A row with earlier turns cannot be plain: one line, not its turns silently dropped."""
    prompts: dict[str, Prompt] = {tid: job.task.render(p) for tid, p in problems.items()}
    use = job.template
    turns = {tid: earlier_turns(p) for tid, p in problems.items()}
    if not use.chat:
        _refuse_plain_turns(job, turns, use)
        return prompts
    system = job.task.options.get("system_prompt")
    return {
        tid: _render_chat(backend, job, tid, system, str(text), turns[tid])
        for tid, text in prompts.items()
    }


def _refuse_plain_turns(job: Job, turns: dict[str, list[dict[str, str]]], use: TemplateUse) -> None:
    """One line when a plain job (no chat template) meets a row with earlier turns."""
    multi = [tid for tid, earlier in turns.items() if earlier]
    if multi:
        raise UserError(
            f"{_problems_file(job)}: problem {multi[0]}: field prompt: {len(turns[multi[0]])} "
            f"earlier turns need a chat template, but task {job.task.name}'s prompts here are plain "
            f"(chat template: {use.record['source']}); give the run a chat_template"
        )


def _render_chat(
    backend: Backend,
    job: Job,
    tid: str,
    system: str | None,
    text: str,
    history: list[dict[str, str]],
) -> Prompt:
    """One prompt through the job's chat template; a template that raises (many refuse roles
    out of turn) is one line naming the problem file, the row and its field."""
    import jinja2

    try:
        return backend.render_chat(system, text, job.template.text, history)
    except jinja2.TemplateError as exc:
        raise UserError(
            f"{_problems_file(job)}: problem {tid}: field prompt: the chat template "
            f"({job.template.record['source']}) refuses these messages: {exc}"
        ) from None


def _problems_file(job: Job) -> str:
    """The task's problem file for messages (the task's name for a built-in task)."""
    return str(job.task.options.get("problems") or f"task {job.task.name}")


def sampling_spec(job: Job) -> SamplingSpec:
    """A ckpteval task's sampling: the variant's, with the task's stop strings and token budget
    (a reasoning task asks the engine for `ckpteval.reasoning.engine_spec` of it)."""
    s = job.variant.sampling
    b = job.task.builtin
    max_tokens = job.task.options.get("max_new_tokens") or min(
        s.max_new_tokens, b.max_new_tokens or s.max_new_tokens
    )
    return SamplingSpec(
        n=s.n,
        temperature=s.temperature,
        top_p=s.top_p,
        max_tokens=max_tokens,
        seed=job.variant.seed,
        stop=b.stop,
        include_stop_str_in_output=b.include_stop,
    )


def _write_generations(req: Requests, backend: Backend) -> dict[str, Any]:
    """Write a job's generation file from its cache rows; a reasoning task's lines add the
    answer cut from the raw completion (`ckpteval.reasoning.split`, with the backend's
    tokenizer counting reasoning tokens and keeping the answer within the task's own token
    budget) and the finish reason of that answer."""
    keep_problem = req.job.task.is_code_harness
    cfg = task_reasoning(req.job.task.options)
    answer_spec = req.answer_spec or req.spec

    def lines() -> Iterator[dict[str, Any]]:
        for tid, prompt in req.prompts.items():
            row = req.rows[req.keys[tid]]
            for idx, o in enumerate(row["outputs"]):
                line = {
                    "task_id": tid,
                    "sample_idx": idx,
                    "prompt": prompt,
                    "completion": o["text"],
                    "finish_reason": o["finish_reason"],
                    "prompt_tokens": row["prompt_tokens"],
                    "completion_tokens": o["tokens"],
                }
                if cfg is not None:
                    line.update(
                        split(
                            o["text"],
                            prompt=prompt,
                            cfg=cfg,
                            stops=answer_spec.stop,
                            include_stop=answer_spec.include_stop_str_in_output,
                            engine_finish=o["finish_reason"],
                            count_tokens=backend.count_tokens,
                            completion_tokens=o["tokens"],
                            answer_budget=answer_spec.max_tokens,
                            keep_tokens=backend.keep_tokens,
                        ).fields()
                    )
                if keep_problem:
                    line["problem"] = req.problems[tid]
                yield line

    n_lines = write_jsonl(req.job.out, lines())
    rows = [req.rows[key] for key in req.keys.values()]
    return {
        "n_problems": len(req.prompts),
        "n_samples": n_lines,
        "n_cached_prompts": req.n_cached,
        "n_generated_prompts": len(req.prompts) - req.n_cached,
        "n_assisted_prompts": req.n_assisted,
        "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in rows),
        "completion_tokens": sum(o["tokens"] or 0 for r in rows for o in r["outputs"]),
        "sampling": req.spec.as_dict(),
    }


def is_cuda_oom(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) is the GPU running out of memory, at load or later."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if (
            type(current).__name__ == "OutOfMemoryError"
            or "CUDA out of memory" in text
            or "less than desired GPU memory utilization" in text
        ):
            return True
        current = current.__cause__ or current.__context__
    return False
