"""The four workflow steps as functions of a Snakemake job; `workflow/scripts/*.py` call these.

Each step function takes the job's `snakemake` object and calls one package function with plain
arguments. Every setting that changes a job's output comes from the job's identity param, decoded
by ckpteval.jobs; the config is read only for runtime knobs, through ckpteval.knobs.runtime
(tests/test_identity_bound.py checks both). `run_step` sends the process's stdout/stderr (including what C extensions and vLLM
print) to the job's log file, and turns a `UserError` into one line on the console and in the
log, with no traceback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ckpteval.contract import Identity
from ckpteval.errors import UserError
from ckpteval.io import sha256_file
from ckpteval.knobs import runtime


def run_step(step: Callable[[Any], None], smk: Any) -> None:
    """Run one step with its output going to the job's log; exit 1 with one line on UserError."""
    console = os.fdopen(os.dup(2), "w", buffering=1)
    log_path = Path(str(smk.log[0])) if smk.log else None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        force=True,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        _failpoint(step.__name__, smk)
        step(smk)
    except UserError as exc:
        message = f"ckpteval: error: {exc}"
        print(message, file=sys.stderr, flush=True)
        print(message + (f" (log: {log_path})" if log_path else ""), file=console, flush=True)
        sys.exit(1)


class StepFailed(Exception):
    """A step run inside Snakemake's process failed for a reason its user can act on; the
    message is the one line (Snakemake prints it as the job's error)."""


def run_in_process(step: Callable[[Any], None], **job: Any) -> None:
    """Run a light step inside Snakemake's own process (a `run:` block: no interpreter to start
    per job). Its output is not redirected (the process is Snakemake's): a `UserError` goes to
    the job's log as one line and fails the job with that line."""
    from types import SimpleNamespace

    smk = SimpleNamespace(**job)
    try:
        _failpoint(step.__name__, smk, kill=False)
        step(smk)
    except UserError as exc:
        message = f"ckpteval: error: {exc}"
        if smk.log:
            log_path = Path(str(smk.log[0]))
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with log_path.open("a") as handle:
                print(message, file=handle)
        raise StepFailed(message) from None


#: A fault-injection hook for the tests of what a failed or killed job may cost:
#: `CKPTEVAL_FAILPOINT=<step>@<run>/<ckpt>[/<task>][:kill]` (several, comma-separated) makes the
#: matching jobs crash with a traceback, or SIGKILL themselves, before doing anything (a step run
#: inside Snakemake's process only crashes).
FAILPOINT_ENV = "CKPTEVAL_FAILPOINT"


def _failpoint(name: str, smk: Any, *, kill: bool = True) -> None:
    specs = [spec for spec in os.environ.get(FAILPOINT_ENV, "").split(",") if spec]
    if not specs:
        return
    wildcards = dict(getattr(smk, "wildcards", {}).items())
    here = "/".join(str(wildcards[k]) for k in ("run", "ckpt", "task") if k in wildcards)
    for spec in specs:
        where, _, mode = spec.partition(":")
        step, _, prefix = where.partition("@")
        if step == name and (here + "/").startswith(prefix.rstrip("/") + "/" if prefix else ""):
            print(f"failpoint {spec}: this job fails on purpose", file=sys.stderr, flush=True)
            if mode == "kill" and kill:  # never Snakemake's own process (run_in_process)
                os.kill(os.getpid(), 9)
            raise RuntimeError(f"failpoint {spec}")


def consolidate(smk: Any) -> None:
    """A consolidate job: what the model is comes from its identity (ckpteval.jobs.ModelJob);
    how it is smoke-tested (engine, GPU, memory) are runtime knobs, which never rerun it."""
    from ckpteval.checkpoints import hash_source
    from ckpteval.consolidate import consolidate_checkpoint
    from ckpteval.gpus import Lease, lease_engine_device
    from ckpteval.jobs import ModelJob

    job = ModelJob.decode(smk.params.identity, smk.wildcards.run)
    source = Path(smk.input.source)
    record = {
        **job.identity.record(),
        "source_files": hash_source(source) if source.exists() else {},
    }
    smoke = runtime(smk.config, "consolidate.smoke")
    gpus = runtime(smk.config, "gpus")
    lease = lease_engine_device(gpus) if smoke == "vllm" else Lease(None, "none")
    try:
        consolidate_checkpoint(
            source,
            Path(smk.output.model),
            Path(smk.output.manifest),
            fmt=job.fmt,
            base_model=Path(smk.input.base_model) if smk.input.get("base_model") else None,
            dtype=job.dtype,
            smoke=smoke,
            engine_args=_smoke_engine_args(smk),
            record=record,
        )
    finally:
        lease.release()
    if "source_id" in smk.input.keys():
        # Leave the content identity file as the next parse would make it (the bytes are those
        # consolidated: older than the manifest), so that parse changes nothing on disk.
        from ckpteval.checkpoints import sync_source_identity

        sync_source_identity(source, Path(smk.input.source_id), Path(smk.output.manifest))


def model_card(smk: Any) -> None:
    """A weightless run's models/{run}/{ckpt}.json (rule `model_card`)."""
    from ckpteval.backends import model_card as card
    from ckpteval.io import write_json

    run = smk.wildcards.run
    identity = Identity.from_text(smk.params.identity)
    write_json(
        smk.output.manifest,
        {
            **card(run, identity.settings[f"runs.{run}.backend"], dict(smk.params.settings)),
            **identity.record(),
        },
    )


def replay(smk: Any) -> None:
    """One existing solutions file, validated and copied as a generation file (rule `replay`):
    its task built from the options its params carry, checked against its identity."""
    import json

    from ckpteval.backends.replay import replay_solutions
    from ckpteval.io import write_json
    from ckpteval.jobs import CellJob

    identity = Identity.from_text(smk.params.identity)
    cell = CellJob(
        identity,
        task=smk.wildcards.task,
        variant=smk.wildcards.variant,
        task_options=json.loads(smk.params.task),
        problems=str(smk.input.problems) if smk.input.problems else None,
    )
    sources = smk.input.solutions
    sources = [sources] if isinstance(sources, str) else list(sources)
    replay_solutions(
        [Path(p) for p in sources],
        cell.build_task(),
        smk.wildcards.variant,
        Path(smk.output.generations),
        where=f"config: runs.{smk.wildcards.run}",
    )
    write_json(Path(smk.output.meta), {**read_meta(Path(smk.output.meta)), **identity.record()})


def infer(smk: Any) -> None:
    """An engine job (rules `infer*`, `endpoint*`): generate the cells its request file names
    into its staging directory, write its round's done file (ckpteval.verbs), then, with
    `engine.swap`, go on to the next checkpoints of its run on the same engine (ckpteval.chain).
    Its settings come from the request file and its model's identity (ckpteval.jobs.EngineJob)."""
    from ckpteval.chain import claim, staged_current
    from ckpteval.verbs import write_done

    staging = Path(smk.params.staging)
    job = _engine_job(smk, Path(smk.params.request), Path(smk.input.manifest))
    model_hash = read_meta(Path(smk.input.manifest)).get("weights_sha256")
    invocation = _invocation(smk)
    with claim(staging, wait=True):  # a chain that went ahead may be generating them now
        _clear_staged(staging, {(c.task, c.variant) for c in job.cells})
        todo = [c for c in job.cells if not staged_current(staging, c, model_hash, invocation)]
        if len(todo) < len(job.cells):
            print(f"{len(job.cells) - len(todo)} cell(s) already staged by a chained engine")
        session = _engine_session(smk, job) if todo else contextlib.nullcontext(None)
        with session as engine:
            if todo:
                _generate(smk, engine, job, staging, todo, Path(smk.input.manifest))
            write_done(Path(smk.output.done), [(c.task, c.variant) for c in job.cells])
            if engine is not None and runtime(smk.config, "engine.swap") is not False:
                _chain(smk, engine, staging)


def _engine_job(smk: Any, request: Path, manifest: Path) -> Any:
    """The engine job a request file asks for (strict: one that does not parse is an error)."""
    from ckpteval.jobs import EngineJob
    from ckpteval.verbs import read_request_body

    body = read_request_body(request, strict=True)
    return EngineJob.decode(body, read_meta(manifest), smk.wildcards.run)


def _clear_staged(staging: Path, keep: set[tuple[str, str]]) -> None:
    """Drop what was staged for cells this job does not generate: a staged file is only ever
    for the current request."""
    for path in [*staging.glob("*/*.jsonl"), *staging.glob("*/*.meta.json")]:
        variant = path.name.removesuffix(".jsonl").removesuffix(".meta.json")
        if (path.parent.name, variant) not in keep:
            path.unlink(missing_ok=True)


def _engine_knobs(smk: Any) -> dict[str, Any]:
    """The engine settings that change how fast or where it runs, not what it generates."""
    return {
        "gpu_memory_utilization": runtime(smk.config, "engine.gpu_memory_utilization"),
        "enforce_eager": runtime(smk.config, "engine.enforce_eager"),
        "chunk_size": runtime(smk.config, "engine.chunk_size"),
        "allow_tensor_parallel": runtime(smk.config, "engine.allow_tensor_parallel"),
    }


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
def _engine_session(smk: Any, job: Any) -> Iterator[Any]:
    """This job's device lease and backend, kept for the checkpoints it chains to; a CUDA OOM
    is retried once with less memory (oom_only_retries)."""
    from ckpteval.infer import engine_session, engine_settings

    run = smk.wildcards.run
    attempt = int(smk.resources.get("infer_attempt", 1))
    engine_cfg = {**_engine_knobs(smk), **job.numerics}
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
            yield {
                "backend": backend,
                "lease": lease,
                "attempt": attempt,
                "run_cfg": run_cfg,
                "engine_cfg": engine_cfg,
            }


def _generate(
    smk: Any,
    engine: dict[str, Any],
    job: Any,
    staging: Path,
    cells: list[Any],
    manifest: Path,
    *,
    own: bool = True,
) -> None:
    """Generate `cells` (ckpteval.jobs.CellJob, of engine job `job`) of the checkpoint whose
    model the engine holds into `staging`."""
    from ckpteval.infer import Job, run_infer
    from ckpteval.verbs import staged_paths

    run = smk.wildcards.run
    invocation = _invocation(smk)
    jobs = [
        Job(
            c.build_task(),
            c.build_variant(),
            staged_paths(staging, c.task, c.variant)[0],
            record={**c.identity.record(), "staged_for": invocation},
        )
        for c in cells
    ]
    staging.mkdir(parents=True, exist_ok=True)
    run_infer(
        jobs,
        manifest_path=manifest,
        model_dir=getattr(engine["backend"], "model_dir", None),
        run_cfg=engine["run_cfg"],
        engine_cfg=engine["engine_cfg"],  # run_infer applies the attempt's memory fraction
        cache_dir=Path(smk.params.cache_dir),
        include_paths=job.include_paths,
        attempt=engine["attempt"],
        where=f"config: runs.{run}",
        backend=engine["backend"],
        lease=engine["lease"],
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


def _chain(smk: Any, engine: dict[str, Any], staging: Path) -> None:
    """Serve the run's next checkpoints that have work in this invocation on this engine
    (ckpteval.chain): swap, check, generate, then look again, since checkpoints get consolidated
    meanwhile. Nothing of it can fail this job, whose own cells are done. A checkpoint whose
    swap fails is skipped (its own job tries it with a fresh engine; the next swap loads every
    weight again and is checked); a failed generation stops the chain, and the jobs of the
    checkpoints left start engines of their own. With nothing ready but checkpoints still being
    consolidated, it waits for them up to the seconds its own engine took to start: never longer
    than a fresh engine would cost."""
    from ckpteval.chain import scan
    from ckpteval.swap import engine_signature, swap_blocker

    backend = engine["backend"]
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


def _chain_one(smk: Any, engine: dict[str, Any], nxt: Any, signature: str) -> bool:
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


def _serve_next(smk: Any, engine: dict[str, Any], nxt: Any, signature: str) -> int:
    """Generate checkpoint `nxt`'s requested cells on this engine if its claim is free and its
    model config and tokenizer are the engine's; how many cells it generated."""
    from ckpteval.chain import claim, staged_current
    from ckpteval.swap import engine_signature

    with claim(nxt.staging, wait=False) as held:
        if not held:
            return 0
        if engine_signature(nxt.model_dir) != signature:
            print(
                f"chain: {nxt.run}/{nxt.ckpt} has another model config or tokenizer; "
                "its own job starts an engine for it"
            )
            return 0
        job = _engine_job(smk, nxt.request, nxt.manifest)
        model_hash = read_meta(nxt.manifest).get("weights_sha256")
        invocation = _invocation(smk)
        todo = [c for c in job.cells if not staged_current(nxt.staging, c, model_hash, invocation)]
        if todo:
            _swap(engine["backend"], nxt.model_dir)
            _generate(smk, engine, job, nxt.staging, todo, nxt.manifest, own=False)
        return len(todo)


class _SwapFailed(Exception):
    """A checkpoint's weights could not be loaded into the engine, or were not what it holds
    after the swap (ckpteval.swap): that checkpoint is left to its own job."""


def _swap(backend: Any, model_dir: Path) -> None:
    try:
        backend.swap(model_dir)
    except Exception as exc:  # noqa: BLE001 - a corrupt file, a failed check: one line
        raise _SwapFailed((str(exc).splitlines() or [type(exc).__name__])[0]) from exc


def read_meta(path: Path) -> dict[str, Any]:
    from ckpteval.io import read_json

    return read_json(path) if path.exists() else {}


def generation(smk: Any) -> None:
    """Move a cell's generation file and meta from its engine job's staging directory into
    place (rule `generation`; a rename: the file appears complete or not at all)."""
    from ckpteval.verbs import staged_paths, staging_of

    task, variant = smk.wildcards.task, smk.wildcards.variant
    done = getattr(smk.input, "done", None)
    if done is None:
        raise UserError(
            f"{smk.output.generations}: this run did not plan its engine job; run the workflow "
            "again (the next run plans it)"
        )
    staged, meta = staged_paths(staging_of(Path(done)), task, variant)
    if not staged.exists() or not meta.exists():
        raise UserError(
            f"{staged}: the engine job did not write this cell; run the workflow "
            "again (the next run plans its engine job)"
        )
    recorded, wanted = read_meta(meta).get("identity"), Identity.from_text(smk.params.identity)
    if recorded != wanted.digest:
        raise UserError(
            f"{staged}: staged for settings {recorded}, the config asks for "
            f"{wanted.digest}; run the workflow again"
        )
    Path(smk.output.generations).parent.mkdir(parents=True, exist_ok=True)
    os.replace(staged, smk.output.generations)
    os.replace(meta, smk.output.meta)


@contextlib.contextmanager
def oom_only_retries(log_path: Path, attempt: int) -> Iterator[None]:
    """Snakemake retries a failed infer job once (`retries: 1`): worth it after the GPU ran out
    of memory (the retry asks for less), not after any other failure, which would only fail
    again after another engine load. A failure is noted beside the job's log; a retry that
    finds a failure other than out-of-memory stops at once with that failure's own message."""
    from ckpteval.infer import is_cuda_oom
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


def assist(smk: Any) -> None:
    """An assist job: lend this GPU to the infer jobs still running (ckpteval.share)."""
    from ckpteval.infer import run_assist
    from ckpteval.io import write_json

    summary = run_assist(
        Path(smk.params.cache_dir),
        smk.params.name,
        gpus=runtime(smk.config, "gpus"),
        grace_seconds=float(smk.params.grace_seconds),
    )
    write_json(smk.output.record, summary)


def evaluate(smk: Any) -> None:
    """An evaluate job: its task and checker settings come from its identity
    (ckpteval.jobs.ScoringJob), and it builds that one task only; the worker count (threads)
    is the only other setting it sees."""
    from ckpteval.jobs import ScoringJob

    cell = dict(smk.params.cell)
    job = ScoringJob.decode(smk.params.identity, cell["task"])
    task = job.build_task(_optional_input(smk, "problems"))
    generations = Path(smk.input.generations)
    provenance = _score_provenance(cell, job, generations, Path(smk.input.manifest))
    files = {
        option: path
        for option in job.task_checker
        if (path := _optional_input(smk, f"checker_{option}")) is not None
    }
    scoring = {"workers": int(smk.threads), **job.scoring_kwargs(files)}
    if task.kind == "harness":
        from ckpteval.harness import score_harness_file

        score_harness_file(
            generations,
            Path(smk.output.samples),
            Path(smk.output.metrics),
            provenance=provenance,
            **scoring,
        )
        return
    from ckpteval.evaluate import read_samples, score_samples
    from ckpteval.selftest import read_verdict

    verdict = _optional_input(smk, "selftest")
    errors: list[str] = []
    score_samples(
        task.checker,
        task.problems(),
        read_samples(generations, errors),
        Path(smk.output.samples),
        Path(smk.output.metrics),
        provenance=provenance,
        input_errors=errors,
        passed_self_test=read_verdict(verdict) if verdict is not None else None,
        **scoring,
    )


def selftest(smk: Any) -> None:
    """A self-test job (ckpteval.selftest): the task's checker, built from the identity as an
    evaluate job builds it, checked on the task's problems. Passed, it records its verdict;
    failed, it leaves its one line beside for `ckpteval status` and fails alone."""
    from ckpteval.checkers import get_checker
    from ckpteval.contract import Identity
    from ckpteval.evaluate import DEFAULT_TIMEOUT_FACTOR, SelfTestError, run_self_test
    from ckpteval.jobs import ScoringJob
    from ckpteval.selftest import record, record_failure

    task_name = smk.wildcards.task
    job = ScoringJob.decode(smk.params.identity, task_name)
    task = job.build_task(_optional_input(smk, "problems"))
    files = {
        option: path
        for option in job.task_checker
        if (path := _optional_input(smk, f"checker_{option}")) is not None
    }
    scoring = job.scoring_kwargs(files)
    verdict = Path(smk.output.verdict)
    checker = get_checker(task.checker, **scoring["checker_options"])
    problems = task.problems()
    try:
        for task_id, problem in problems.items():
            checker.validate_problem(task_id, problem)
        report, _, run_s = run_self_test(
            checker,
            problems,
            workers=int(smk.threads),
            timeout=scoring["timeout"],
            timeout_factor=scoring.get("timeout_factor", DEFAULT_TIMEOUT_FACTOR),
        )
    except SelfTestError as exc:
        record_failure(verdict, str(exc))
        raise
    finally:
        checker.close()
    record(
        verdict,
        task_name,
        Identity.from_text(smk.params.identity),
        {"self_test": report, "run_s": run_s},
    )


def _optional_input(smk: Any, name: str) -> Path | None:
    """The job's input `name`, or None when the rule has none (an input function may give [])."""
    value = getattr(smk.input, name, None)
    return Path(str(value)) if value else None


def _score_provenance(
    cell: dict[str, Any], job: Any, generations: Path, manifest_path: Path
) -> dict[str, Any]:
    """What a score cell records of where it comes from: the cell, its variant, the model, the
    generation file, the chat template its prompts went through, and its identity (`scoring`,
    which ckpteval.freshness compares with the next parse's)."""
    from ckpteval.config import parse_variant
    from ckpteval.io import read_json

    sampling, seed = parse_variant(cell["variant"])
    provenance = {
        **cell,
        "sampling": sampling,
        "seed": seed,
        "model_hash": read_json(manifest_path).get("weights_sha256"),
        "generation_file": str(generations),
        "generation_sha256": sha256_file(generations),
        "scoring": job.identity.settings,
    }
    template = read_meta(generations.with_suffix(".meta.json")).get("chat_template")
    if template is not None:  # the chat template the prompts went through (infer._write_meta)
        provenance["chat_template"] = template
    return provenance


def aggregate(smk: Any) -> None:
    """The aggregate job: title, bootstrap and truncation threshold from its identity
    (ckpteval.jobs.SummaryJob); which cells, deleted and broken checkpoints from its params."""
    from ckpteval.jobs import SummaryJob
    from ckpteval.summary import build_summary

    job = SummaryJob.decode(smk.params.identity)
    build_summary(
        [Path(p) for p in smk.input.cells],
        Path(smk.output.parquet).parent,
        title=job.title,
        bootstrap=job.bootstrap,
        deleted=list(smk.params.deleted),
        broken=list(smk.params.broken),
        waiting=list(getattr(smk.params, "waiting", ())),
        finals=list(getattr(smk.params, "finals", ())),
        truncation_threshold=job.truncation_threshold,
        main_metric=job.main_metric,
        train_logs=job.train_logs,
        # the sampling configs by name, to compare with the trainer's validation settings: a
        # changed one regenerates its cells, which rebuilds the summary anyway
        sampling=dict(smk.config.get("sampling") or {}),
    )


def publish(smk: Any) -> None:
    """The `publish` target: the config's publish section as the job's identity holds it
    (ckpteval.jobs.PublishJob; a change of it reruns this job)."""
    from ckpteval.jobs import PublishJob
    from ckpteval.publish import format_report
    from ckpteval.publish import publish as send

    job = PublishJob.decode(smk.params.identity)
    reports = send(Path(smk.input.parquet).parent, job.section)
    for line in format_report(reports):
        print(line)


def _smoke_engine_args(smk: Any) -> dict[str, Any]:
    """The engine settings a vLLM smoke test takes from the config: knobs only. The others (such
    as `engine.dtype`) change generations, not the model: the smoke test runs the model in its
    own dtype and a short context (ckpteval.consolidate.smoke_check)."""
    return {
        "gpu_memory_utilization": runtime(smk.config, "engine.gpu_memory_utilization"),
        "enforce_eager": runtime(smk.config, "engine.enforce_eager"),
    }
