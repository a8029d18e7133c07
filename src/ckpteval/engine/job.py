"""One engine job, as rule `infer` (and `infer_<group>`, `endpoint*`) runs it: read its request,
lease its GPUs, start one engine with its `EngineSettings`, generate its cells into its staging
directory, write its round's done file, then chain to its run's next checkpoints.

Every setting that changes its output comes from its request file and its model's identity
(ckpteval.jobs.EngineJob); the config is read only for runtime knobs (ckpteval.knobs.runtime,
held to it by tests/test_identity_bound.py).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpteval.errors import UserError
from ckpteval.io import read_meta
from ckpteval.knobs import runtime
from ckpteval.plan.layout import staged_paths


@dataclass(frozen=True)
class EngineSettings:
    """An engine's settings, built once per job: `numerics` change what it generates and come
    from the cells' identities (dtype, max_model_len, tensor_parallel_size: the same for every
    cell of the job); the rest are runtime knobs that change how fast or where it runs; the
    attempt (Snakemake's) lowers the memory fraction after a CUDA OOM."""

    numerics: Mapping[str, Any]
    gpu_memory_utilization: float
    enforce_eager: bool
    chunk_size: int
    allow_tensor_parallel: bool
    attempt: int = 1

    @classmethod
    def of_job(cls, smk: Any, job: Any) -> EngineSettings:
        """The settings of engine job `job` (ckpteval.jobs.EngineJob) run by `smk`."""
        return cls(
            numerics=dict(job.numerics),
            gpu_memory_utilization=runtime(smk.config, "engine.gpu_memory_utilization"),
            enforce_eager=runtime(smk.config, "engine.enforce_eager"),
            chunk_size=runtime(smk.config, "engine.chunk_size"),
            allow_tensor_parallel=runtime(smk.config, "engine.allow_tensor_parallel"),
            attempt=int(smk.resources.get("infer_attempt", 1)),
        )

    def as_dict(self) -> dict[str, Any]:
        """The engine section the backends and ckpteval.engine.generate read, as configured
        (`generate.engine_settings` applies the attempt's memory fraction)."""
        return {
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "enforce_eager": self.enforce_eager,
            "chunk_size": self.chunk_size,
            "allow_tensor_parallel": self.allow_tensor_parallel,
            **self.numerics,
        }


@dataclass(frozen=True)
class EngineSession:
    """A started engine job's engine, kept for the checkpoints it chains to: the backend (its
    engine loads on first use and swaps weights, ckpteval.engine.swap), the GPUs it leased, and
    what every generation on it is run with (the run's backend settings, the engine section,
    Snakemake's attempt)."""

    backend: Any
    lease: Any = None
    attempt: int = 1
    run_cfg: Mapping[str, Any] = field(default_factory=dict)
    engine_cfg: Mapping[str, Any] = field(default_factory=dict)


def run_engine_job(smk: Any) -> None:
    """An engine job (rules `infer*`, `endpoint*`): generate the cells its request file names
    into its staging directory, write its round's done file (ckpteval.verbs), then, with
    `engine.swap`, go on to the next checkpoints of its run on the same engine (ckpteval.engine.chain).
    Its settings come from the request file and its model's identity (ckpteval.jobs.EngineJob)."""
    from ckpteval.engine.chain import claim, staged_current
    from ckpteval.verbs import write_done

    staging = Path(smk.params.staging)
    run, ckpt = smk.wildcards.run, smk.wildcards.ckpt
    job = _engine_job(run, ckpt, Path(smk.params.request), Path(smk.input.manifest))
    model_hash = read_meta(Path(smk.input.manifest)).get("weights_sha256")
    invocation = _invocation(smk)
    with claim(staging, wait=True):  # a chain that went ahead may be generating them now
        _clear_staged(staging, {(c.key.task, c.key.variant) for c in job.cells})
        todo = [c for c in job.cells if not staged_current(staging, c, model_hash, invocation)]
        if len(todo) < len(job.cells):
            print(f"{len(job.cells) - len(todo)} cell(s) already staged by a chained engine")
        session = _engine_session(smk, job) if todo else contextlib.nullcontext(None)
        with session as engine:
            if todo:
                _generate(smk, engine, job, staging, todo, Path(smk.input.manifest))
            write_done(Path(smk.output.done), [(c.key.task, c.key.variant) for c in job.cells])
            if engine is not None and runtime(smk.config, "engine.swap") is not False:
                _chain(smk, engine, staging)


def _engine_job(run: str, ckpt: str, request: Path, manifest: Path) -> Any:
    """The engine job a request file of a checkpoint asks for (strict: one that does not parse
    is an error)."""
    from ckpteval.jobs import EngineJob
    from ckpteval.verbs import read_request_body

    body = read_request_body(request, strict=True)
    return EngineJob.decode(body, read_meta(manifest), run, ckpt)


def _clear_staged(staging: Path, keep: set[tuple[str, str]]) -> None:
    """Drop what was staged for cells this job does not generate: a staged file is only ever
    for the current request."""
    kept = {path for task, variant in keep for path in staged_paths(staging, task, variant)}
    for pattern in staged_paths(staging, "*", "*"):
        for path in staging.glob(str(pattern.relative_to(staging))):
            if path not in kept:
                path.unlink(missing_ok=True)


def _endpoint_knobs(smk: Any, job: Any) -> dict[str, Any]:
    """An endpoint's request knobs (the served model comes from the model card's identity)."""
    if job.served["backend"] != "openai":
        return {}
    knobs = {
        "api_key_env": runtime(smk.config, f"runs.{smk.wildcards.run}.endpoint.api_key_env"),
        "concurrency": runtime(smk.config, f"runs.{smk.wildcards.run}.endpoint.concurrency"),
        "retries": runtime(smk.config, f"runs.{smk.wildcards.run}.endpoint.retries"),
        "timeout": runtime(smk.config, f"runs.{smk.wildcards.run}.endpoint.timeout"),
    }
    return {key: value for key, value in knobs.items() if value is not None}


@contextlib.contextmanager
def _engine_session(smk: Any, job: Any) -> Iterator[EngineSession]:
    """This job's device lease and backend, kept for the checkpoints it chains to; a CUDA OOM
    is retried once with less memory (oom_only_retries)."""
    from ckpteval.engine.generate import engine_session, engine_settings

    run = smk.wildcards.run
    engine = EngineSettings.of_job(smk, job)
    attempt, engine_cfg = engine.attempt, engine.as_dict()
    run_cfg = job.run_cfg(_endpoint_knobs(smk, job))
    settings = engine_settings(engine_cfg, attempt)
    model = Path(smk.input.model) if "model" in smk.input.keys() else None
    gpus = runtime(smk.config, "gpus")
    with oom_only_retries(Path(str(smk.log[0])), attempt):
        with engine_session(run_cfg, model, settings, gpus, f"config: runs.{run}") as (
            backend,
            lease,
        ):
            group = Path(smk.params.staging).name
            backend.served_by = f"{run}/{smk.wildcards.ckpt}:{group} (pid {os.getpid()})"
            yield EngineSession(backend, lease, attempt, run_cfg, engine_cfg)


def _generate(
    smk: Any,
    engine: EngineSession,
    job: Any,
    staging: Path,
    cells: list[Any],
    manifest: Path,
    *,
    own: bool = True,
) -> None:
    """Generate `cells` (ckpteval.jobs.CellJob, of engine job `job`) of the checkpoint whose
    model the engine holds into `staging`."""
    from ckpteval.engine.generate import Job, run_infer

    run = smk.wildcards.run
    invocation = _invocation(smk)
    jobs = [
        Job(
            c.build_task(),
            c.build_variant(),
            staged_paths(staging, c.key.task, c.key.variant)[0],
            record={**c.identity.record(), "staged_for": invocation},
        )
        for c in cells
    ]
    staging.mkdir(parents=True, exist_ok=True)
    run_infer(
        jobs,
        manifest_path=manifest,
        model_dir=getattr(engine.backend, "model_dir", None),
        run_cfg=dict(engine.run_cfg),
        engine_cfg=dict(engine.engine_cfg),  # run_infer applies the attempt's memory fraction
        cache_dir=Path(smk.params.cache_dir),
        include_paths=job.include_paths,
        attempt=engine.attempt,
        where=f"config: runs.{run}",
        backend=engine.backend,
        lease=engine.lease,
        template_check=job.check_template,
        share_as=f"{run}/{smk.wildcards.ckpt}:{staging.name}"
        if own and int(smk.resources.get("share_chunks", 0))
        else None,
    )


def _invocation(smk: Any) -> Any:
    """The Snakemake invocation this job belongs to, as its request file names it: a staged
    cell counts only for the invocation that staged it (an older one is a leftover)."""
    from ckpteval.io import read_json

    return read_json(smk.params.request).get("invocation")


def _chain(smk: Any, engine: EngineSession, staging: Path) -> None:
    """Serve the run's next checkpoints that have work in this invocation on this engine
    (ckpteval.engine.chain): swap, check, generate, then look again, since checkpoints get consolidated
    meanwhile. Nothing of it can fail this job, whose own cells are done. A checkpoint whose
    swap fails is skipped (its own job tries it with a fresh engine; the next swap loads every
    weight again and is checked); a failed generation stops the chain, and the jobs of the
    checkpoints left start engines of their own. With nothing ready but checkpoints still being
    consolidated, it waits for them up to the seconds its own engine took to start: never longer
    than a fresh engine would cost."""
    from ckpteval.engine.chain import scan
    from ckpteval.engine.swap import engine_signature, swap_blocker

    backend = engine.backend
    if not hasattr(backend, "swap") or backend.model_dir is None:
        return
    blocker = swap_blocker(Path(backend.model_dir))
    if blocker:
        print(f"chain: off for this engine: {blocker}; each checkpoint gets an engine of its own")
        return
    signature = engine_signature(Path(backend.model_dir))
    wait_until = time.monotonic() + float(getattr(backend, "load_seconds", 0.0))
    done: set[str] = set()
    where = (staging.parents[3], smk.wildcards.run, smk.wildcards.ckpt, staging.name)
    while True:
        ready, pending = scan(*where, _invocation(smk))
        ready = [c for c in ready if c.ckpt not in done]
        if not ready:
            if pending and time.monotonic() < wait_until:
                time.sleep(CHAIN_POLL_SECONDS)
                continue
            if pending:
                print(
                    f"chain: {', '.join(pending)} not consolidated in time; their jobs serve them"
                )
            return
        nxt = ready[0]
        done.add(nxt.ckpt)
        if not _chain_one(smk, engine, nxt, signature):
            return


#: How often a chain waiting for a consolidation looks again.
CHAIN_POLL_SECONDS = 2.0


def _chain_one(smk: Any, engine: EngineSession, nxt: Any, signature: str) -> bool:
    """Serve one checkpoint of the chain; False when the chain must stop."""
    try:
        served = _serve_next(smk, engine, nxt, signature)
    except _SwapFailed as exc:  # the next swap reloads every weight and is checked again
        print(f"chain: cannot serve {nxt.run}/{nxt.ckpt}: {exc}; its own job tries it alone")
        return True
    except Exception as exc:  # noqa: BLE001 - a failed generation: its own job takes over
        print(f"chain: stopped at {nxt.run}/{nxt.ckpt}: {exc}; its own job starts a fresh engine")
        return False
    if served:
        print(f"chain: served {nxt.run}/{nxt.ckpt} ({served} cell(s)) on this engine")
    return True


def _serve_next(smk: Any, engine: EngineSession, nxt: Any, signature: str) -> int:
    """Generate checkpoint `nxt`'s requested cells on this engine if its claim is free and its
    model config and tokenizer are the engine's; how many cells it generated."""
    from ckpteval.engine.chain import claim, staged_current
    from ckpteval.engine.swap import engine_signature

    with claim(nxt.staging, wait=False) as held:
        if not held:
            return 0
        if engine_signature(nxt.model_dir) != signature:
            print(
                f"chain: {nxt.run}/{nxt.ckpt} has another model config or tokenizer; "
                "its own job starts an engine for it"
            )
            return 0
        job = _engine_job(nxt.run, nxt.ckpt, nxt.request, nxt.manifest)
        model_hash = read_meta(nxt.manifest).get("weights_sha256")
        invocation = _invocation(smk)
        todo = [c for c in job.cells if not staged_current(nxt.staging, c, model_hash, invocation)]
        if todo:
            _swap(engine.backend, nxt.model_dir)
            _generate(smk, engine, job, nxt.staging, todo, nxt.manifest, own=False)
        return len(todo)


class _SwapFailed(Exception):
    """A checkpoint's weights could not be loaded into the engine, or were not what it holds
    after the swap (ckpteval.engine.swap): that checkpoint is left to its own job."""


def _swap(backend: Any, model_dir: Path) -> None:
    try:
        backend.swap(model_dir)
    except Exception as exc:  # noqa: BLE001 - a corrupt file, a failed check: one line
        raise _SwapFailed((str(exc).splitlines() or [type(exc).__name__])[0]) from exc


@contextlib.contextmanager
def oom_only_retries(log_path: Path, attempt: int) -> Iterator[None]:
    """Snakemake retries a failed infer job once (`retries: 1`): worth it after the GPU ran out
    of memory (the retry asks for less), not after any other failure, which would only fail
    again after another engine load. A failure is noted beside the job's log; a retry that
    finds a failure other than out-of-memory stops at once with that failure's own message."""
    from ckpteval.engine.generate import is_cuda_oom
    from ckpteval.io import write_json

    note = log_path.with_name(log_path.name + ".failure.json")
    if attempt <= 1:
        note.unlink(missing_ok=True)
    elif note.exists():
        failure = read_meta(note)
        if not failure.get("oom"):
            raise UserError(
                f"not retried (attempt {attempt}): the last attempt failed with "
                f"an error that is not out-of-memory: {failure.get('message')}"
            )
    try:
        yield
    except BaseException as exc:
        oom = is_cuda_oom(exc) or (isinstance(exc, UserError) and "out of memory" in str(exc))
        message = (str(exc).splitlines() or [type(exc).__name__])[0]
        write_json(note, {"oom": oom, "message": message, "attempt": attempt})
        raise
