"""The four workflow steps as functions of a Snakemake job; `workflow/scripts/*.py` call these.

Each step function takes the job's `snakemake` object and calls one package function with plain
arguments. Every setting that changes a job's output comes from the job's identity param, decoded
by ckpteval.jobs; the config is read only for runtime knobs, through ckpteval.knobs.runtime
(tests/test_identity_bound.py checks both). `run_step` sends the process's stdout/stderr (including what C extensions and vLLM
print) to the job's log file, and turns a `UserError` into one line on the console and in the
log, with no traceback.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ckpteval.contract import Identity
from ckpteval.errors import UserError
from ckpteval.io import read_meta, sha256_file
from ckpteval.knobs import runtime
from ckpteval.plan.layout import generation_meta_of


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


def _s3_identity(smk: Any) -> dict[str, Any] | None:
    """The S3 listing identity the parse wrote for this checkpoint (ckpteval.s3), or None."""
    if "source_id" not in smk.input.keys():
        return None
    try:
        data = json.loads(Path(smk.input.source_id).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("s3") else None


def _source_path(source: Any, s3_id: dict[str, Any] | None = None) -> Path:
    """The checkpoint to consolidate: one path, or (a checkpoint on S3) the root of the local
    copies of the objects it needs, which Snakemake's storage put under one directory. The root
    is a copy's path less the object's name within the checkpoint (the listing identity's
    `files`): the objects needed may all lie below it (a verl checkpoint needs only `actor/`)."""
    if isinstance(source, str):
        return Path(source)
    files = [Path(f).as_posix() for f in source]
    for rel in (s3_id or {}).get("files") or {}:
        for local in files:
            if rel and local.endswith("/" + rel):
                return Path(local[: -len(rel) - 1])
    return Path(os.path.commonpath(files)) if len(files) > 1 else Path(files[0])


def consolidate(smk: Any) -> None:
    """A consolidate job: what the model is comes from its identity (ckpteval.jobs.ModelJob);
    how it is smoke-tested (engine, GPU, memory) are runtime knobs, which never rerun it."""
    from ckpteval.checkpoints import hash_source
    from ckpteval.consolidate import consolidate_checkpoint
    from ckpteval.engine.gpus import Lease, lease_engine_device
    from ckpteval.jobs import ModelJob

    job = ModelJob.decode(smk.params.identity, smk.wildcards.run)
    s3_id = _s3_identity(smk)
    source = _source_path(smk.input.source, s3_id)
    record = {
        **job.identity.record(),
        "source_files": s3_id["files"] if s3_id else hash_source(source) if source.exists() else {},
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
            origin=s3_id["source"] if s3_id else None,
        )
    finally:
        lease.release()
    if s3_id:
        from ckpteval.checkpoints import settle_s3_identity

        settle_s3_identity(Path(smk.input.source_id), Path(smk.output.manifest))
    elif "source_id" in smk.input.keys():
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
    from ckpteval.plan.layout import CellKey

    identity = Identity.from_text(smk.params.identity)
    cell = CellJob(
        CellKey.of(smk.wildcards),
        identity,
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
    # The model the file stands for is the run's model card (no weights): recorded as an engine
    # job records its model, so a parse finds the cell generated by that model.
    card = read_meta(Path(smk.input.manifest))
    model = {
        "model_hash": card.get("weights_sha256"),
        "model_identity": card.get("identity_sha256"),
        # as an engine job records it: a truncated copy is then damaged (ckpteval.freshness)
        "generation_bytes": Path(smk.output.generations).stat().st_size,
        # what was replayed, by content: new bytes make this cell stale (ckpteval.freshness)
        "solutions_id": smk.params.solutions,
    }
    write_json(
        Path(smk.output.meta), {**read_meta(Path(smk.output.meta)), **model, **identity.record()}
    )


def infer(smk: Any) -> None:
    """An engine job (rules `infer*`, `endpoint*`): ckpteval.engine.job."""
    from ckpteval.engine.job import run_engine_job

    run_engine_job(smk)


def generation(smk: Any) -> None:
    """Move a cell's generation file and meta from its engine job's staging directory into
    place (rule `generation`; a rename: the file appears complete or not at all)."""
    from ckpteval.plan.layout import staged_paths, staging_of

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


def assist(smk: Any) -> None:
    """An assist job: lend this GPU to the infer jobs still running (ckpteval.engine.assist)."""
    from ckpteval.engine.generate import run_assist
    from ckpteval.io import write_json

    summary = run_assist(
        Path(smk.params.cache_dir),
        smk.params.name,
        gpus=runtime(smk.config, "gpus"),
        grace_seconds=float(smk.params.grace_seconds),
        count=int(smk.resources.get("gpu", 1)),
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
    from ckpteval.evaluate import DEFAULT_TIMEOUT_FACTOR, SelfTestError, self_test_verdict
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
    try:
        outcome = self_test_verdict(
            checker,
            task.problems(),
            workers=int(smk.threads),
            timeout=scoring["timeout"],
            timeout_factor=scoring.get("timeout_factor", DEFAULT_TIMEOUT_FACTOR),
        )
    except SelfTestError as exc:
        record_failure(verdict, str(exc))
        raise
    finally:
        checker.close()
    record(verdict, task_name, Identity.from_text(smk.params.identity), outcome)


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
        # the model card's bytes, as Snakemake records its input's checksum: a card rewritten
        # alike (`-f` on it, a touch) reruns nothing (ckpteval.freshness)
        "manifest_sha256": sha256_file(manifest_path),
        "generation_file": str(generations),
        "generation_sha256": sha256_file(generations),
        "scoring": job.identity.settings,
    }
    template = read_meta(generation_meta_of(generations)).get("chat_template")
    if template is not None:  # the chat template the prompts went through (infer._write_meta)
        provenance["chat_template"] = template
    return provenance


def aggregate(smk: Any) -> None:
    """The aggregate job: build the summary into its staging directory (rule `summary` publishes
    it once complete). Title, bootstrap and truncation threshold from its identity
    (ckpteval.jobs.SummaryJob); which cells, deleted and broken checkpoints from its params."""
    from ckpteval.jobs import SummaryJob
    from ckpteval.summary import build_summary

    job = SummaryJob.decode(smk.params.identity)
    build_summary(
        [Path(p) for p in smk.input.cells],
        Path(smk.output.staged),
        title=job.title,
        bootstrap=job.bootstrap,
        deleted=list(smk.params.deleted),
        broken=list(smk.params.broken),
        waiting=list(getattr(smk.params, "waiting", ())),
        finals=list(getattr(smk.params, "finals", ())),
        truncation_threshold=job.truncation_threshold,
        main_metric=job.main_metric,
        train_logs=job.train_logs,
        # the sampling configs by name, to compare with the trainer's validation settings (a
        # param: a changed one regenerates its cells, which rebuilds the summary anyway)
        sampling=dict(getattr(smk.params, "sampling", None) or {}),
        # beside the staging directory, which Snakemake empties before each build
        report_cache=Path(smk.output.staged).parent / "_report_cache",
        report_workers=smk.threads,  # the rule's threads: what the job was given, no more
    )
    # what it was built with: a parse that finds other params and no record of this job in
    # .snakemake/ builds again (ckpteval.plan.sweep.SweepPlan.aggregate_redo)
    from ckpteval.io import write_json
    from ckpteval.plan.layout import SUMMARY_PARAMS

    named = smk.params  # Snakemake's Namedlist (a plain namespace when called directly)
    params = dict(named.items()) if hasattr(named, "items") else dict(vars(named))
    write_json(Path(smk.output.staged) / SUMMARY_PARAMS, params)


def summary(smk: Any) -> None:
    """Rule `summary`: the aggregate job's complete build in place under summary/
    (ckpteval.summary.publish_summary)."""
    from ckpteval.summary import publish_summary

    publish_summary(Path(smk.input.staged), [Path(p) for p in smk.output])


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
