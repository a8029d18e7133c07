# Parse-time facts: validate the config, discover checkpoints, resolve tasks; and the small named
# input/param functions the rules use. A user mistake stops here with one line, before any job.
import functools
import json
import os
import re
import sys
import time
from pathlib import Path

from ckpteval.chat_templates import missing_template_lines
from ckpteval.checkpoints import sync_s3_identity, sync_source_identity
from ckpteval.config import build_plan, resolve_path, sampling_configs, validate_config
from ckpteval.contract import (
    publish_identity,
    summary_identity,
)
from ckpteval.engine.gpus import engine_gpus
from ckpteval.engine.plan import EnginePlan, infer_rule_name
from ckpteval.engine.schedule import InferCosts
from ckpteval.errors import UserError
from ckpteval.freshness import Freshness
from ckpteval.io import sha256_json
from ckpteval.publish import TRACKERS
from ckpteval.selftest import separate, selftest_identity, verdict_path
from ckpteval.steps import generation, model_card, run_in_process, summary
from ckpteval.tasks import check_harness_names
from ckpteval.verbs import Verbs, damaged_json, redo_path

try:
    validate_config(config, Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml")
    PLAN = build_plan(config)
    if workflow.is_main_process:
        check_harness_names(PLAN.tasks, config["lm_eval"]["include_paths"])
except UserError as _error:
    print(f"ckpteval: error: {_error}", file=sys.stderr)
    sys.exit(1)

OUT = PLAN.outdir
FRESH = Freshness(PLAN)
# Where the aggregate job builds the summary (published to summary/ once complete), beside the
# engine jobs' staging/<run>/, named so that no run has it (run names start with a letter or digit).
SUMMARY_STAGING = f"{OUT}/staging/_summary"


# Every (task, variant) of a checkpoint: a cell is a checkpoint and one of these.
ALL_PAIRS = [(t, v) for t, vs in PLAN.task_variants.items() for v in vs]


if workflow.is_main_process:
    # Keep each checkpoint's content identity current (only new bytes move its mtime; a cache
    # keyed by content, the one file a parse may write), then say in words what this invocation
    # will redo for a changed setting, before Snakemake plans it.
    for _run in PLAN.runs.values():
        for _ckpt in _run.checkpoints:
            _manifest = FRESH.manifest_path(_run.name, _ckpt.name)
            if damaged_json(_manifest):
                print(f"ckpteval: warning: {_manifest} did not parse; rebuilt", file=sys.stderr)
        if _run.has_weights:
            for _ckpt in _run.checkpoints:
                _id_file = FRESH.source_id_path(_run.name, _ckpt.name)
                _id_file.parent.mkdir(parents=True, exist_ok=True)
                _manifest = FRESH.manifest_path(_run.name, _ckpt.name)
                if _ckpt.url:  # on S3: from the listing, nothing downloaded
                    sync_s3_identity(_ckpt, _id_file, _manifest)
                else:
                    sync_source_identity(_ckpt.path, _id_file, _manifest)
    for _line in [*PLAN.left_out, *PLAN.broken_lines(), *missing_template_lines(PLAN)]:
        print(f"ckpteval: warning: {_line}", file=sys.stderr)
    for _line in FRESH.explain(ALL_PAIRS):
        print(f"ckpteval: rerun: {_line}", file=sys.stderr)
# Checkpoints on S3 (runs.<name>.path: s3://...) are read through Snakemake's S3 storage plugin
# (snakemake-storage-plugin-s3): the consolidate job's inputs are the objects it needs, which
# Snakemake downloads under .snakemake/storage/s3/. Endpoint and credentials come from the
# environment (SNAKEMAKE_STORAGE_S3_*, else boto3's AWS_* chain), never from the config.
if any(c.url for r in PLAN.runs.values() for c in r.checkpoints):

    storage s3:
        provider="s3",


VLLM_RUNS = PLAN.runs_with_backend("vllm")
OPENAI_RUNS = PLAN.runs_with_backend("openai")
REPLAY_RUNS = PLAN.runs_with_backend("replay")


wildcard_constraints:
    run=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    ckpt=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    task=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    variant=r"[A-Za-z0-9_.]+-s[0-9]+",
    key=r"[0-9a-f]{16}",


def get_final_outputs(wildcards):
    # A shard (`--config shard=i/n`) scores its own checkpoints; an unsharded run aggregates all.
    # Every file of the summary is a target (Snakemake reruns a job for a missing output only
    # when that output is requested), so a deleted flips.csv or plots/ is published again; and
    # so is the aggregate job's build: after a failed build (its outputs deleted) the published
    # summary looks current, and only the missing build makes the next run rebuild it.
    # Assist jobs (if any GPU would otherwise idle at the sweep's end) are targets too.
    # Engine rounds and redo inputs with work to do are targets too (ckpteval.verbs).
    extra = [*ASSIST_RECORDS, *get_engine_targets(), *get_redo_targets()]
    if PLAN.shard is not None:
        return [*get_score_files(wildcards), *extra]
    return [*rules.aggregate.output, *rules.summary.output, *get_cell_files(), *extra]


def get_cell_files():
    """Every model card, generation file, meta and score cell of the plan: targets of `all`, so
    that a deleted one is made again (Snakemake reruns a job for a missing file only if a job
    it plans needs it, and nothing is planned once the summary is up to date)."""
    files = []
    for cell in PLAN.cells():
        base = f"{cell['run']}/{cell['ckpt']}/{cell['task']}/{cell['variant']}"
        files += [f"{OUT}/generations/{base}.jsonl", f"{OUT}/generations/{base}.meta.json"]
        files += [f"{OUT}/scores/{base}.json", f"{OUT}/models/{cell['run']}/{cell['ckpt']}.json"]
    return sorted(set(files))


def get_checkpoint_source(wildcards):
    ckpt = PLAN.checkpoint(wildcards.run, wildcards.ckpt)
    if ckpt.deleted:
        return []
    if ckpt.url:  # on S3: only the objects consolidation reads, downloaded by Snakemake
        return [
            ancient(storage.s3(f"{ckpt.url}/{o.rel}" if o.rel else ckpt.url)) for o in ckpt.objects
        ]
    return ancient(str(ckpt.path))


def get_source_identity_file(wildcards):
    """The checkpoint's content identity (ckpteval.checkpoints.sync_source_identity): its
    modification time moves only when the checkpoint's bytes do, so a touched or copied
    checkpoint reruns nothing and new bytes rerun its chain."""
    if PLAN.checkpoint(wildcards.run, wildcards.ckpt).deleted:
        return []
    return str(FRESH.source_id_path(wildcards.run, wildcards.ckpt))


def get_model_identity(wildcards):
    return FRESH.model_identity(wildcards.run, wildcards.ckpt).text


def get_base_model(wildcards):
    """The run's base model, an input the job reads but whose path and times rerun nothing
    (ancient; the `input` trigger is off): its content is in the identity param, so the same
    model elsewhere (a moved project) is the same job."""
    base = PLAN.runs[wildcards.run].base_model
    return ancient(str(base)) if base else []


# ---- infer side: engine groups x backends (rules are defined per group in infer.smk)


def runs_regex(names):
    """A wildcard constraint matching exactly these run names."""
    return "|".join(re.escape(n) for n in names)


#: This invocation, as its request files name it (an engine job chains only within it).
INVOCATION = f"{os.getpid()}-{time.time_ns()}"


@functools.cache
def verbs():
    """What this invocation was told to redo (-f, -R, -F): known once Snakemake builds its DAG,
    which is when the input functions below first run."""
    return Verbs.from_settings(
        getattr(workflow, "dag_settings", None), [r.name for r in workflow.rules]
    )


#: The engine jobs of this invocation: their cells, rounds, done and request files
#: (ckpteval.engine.plan; which cells each verb asks for: ckpteval.verbs).
ENGINES = EnginePlan(PLAN, FRESH, verbs, INVOCATION)


def group_jobs(group):
    """(task, variant) pairs one infer job of engine group `group` generates."""
    return ENGINES.group_jobs(group)


def staging_dir(group):
    """Where an engine job of `group` writes its checkpoint's cells (ckpteval.verbs)."""
    return ENGINES.staging_dir(group)


def engine_done(group):
    """An engine job's output: one done file per round (ckpteval.verbs), a name no file has when
    the workflow is parsed."""
    return f"{staging_dir(group)}.{{token}}.done"


def engine_log(group):
    suffix = f".{group}" if group else ""
    return f"logs/infer/{{run}}/{{ckpt}}{suffix}.{{token}}.log"


def get_engine_request_path(group):
    def request(wildcards):
        return ENGINES.request_file(group, wildcards)

    return request


def get_engine_targets():
    """The done files of the engine jobs with cells to (re)generate: targets of `all`."""
    return ENGINES.targets([*VLLM_RUNS, *OPENAI_RUNS])


def write_engine_requests(dag):
    """When the run starts (onstart): the request file of every engine job Snakemake runs."""
    ENGINES.write_requests(dag)


def get_generation_inputs(wildcards):
    """A cell's model card and, if this invocation (re)generates it, its engine job's done
    file (ckpteval.engine.plan.EnginePlan.generation_inputs)."""
    w = wildcards
    return ENGINES.generation_inputs(w.run, w.ckpt, w.task, w.variant)


@functools.cache
def redo_input(path):
    """The redo input of the job that makes `path`, a damaged file (ckpteval.verbs): a missing
    input made by rule `redo`, a target of `all`, so Snakemake reruns that job without the parse
    removing anything. A cluster job's own parse finds the one the main process planned (and
    rule `redo` made)."""
    root = Path(OUT) / "staging" / "redo"
    return str(redo_path(root, Path(path), fresh=workflow.is_main_process))


@functools.cache
def redo_file(path, *beside):
    """`path`'s redo input if it is damaged, else None."""
    return redo_input(path) if damaged_json(Path(path), *map(Path, beside)) else None


@functools.cache
def score_redo(run, ckpt, task, variant):
    """A score cell's redo input if it is damaged, else None (one read of the cell per parse,
    shared with the rerun explanation: ckpteval.freshness)."""
    if not FRESH.score_damaged(run, ckpt, task, variant):
        return None
    return redo_input(f"{OUT}/scores/{run}/{ckpt}/{task}/{variant}.json")


def model_redo(run, ckpt):
    return redo_file(f"{OUT}/models/{run}/{ckpt}.json")


def get_model_redo(wildcards):
    """A damaged model card's redo input (consolidate, model_card), or none."""
    found = model_redo(wildcards.run, wildcards.ckpt)
    return {"redo": found} if found else {}


def get_score_redo(wildcards):
    """A damaged score cell's redo input (evaluate), or none."""
    w = wildcards
    found = score_redo(w.run, w.ckpt, w.task, w.variant)
    return {"redo": found} if found else {}


def get_redo_targets():
    """Every redo input of this invocation (a damaged score cell or model card): targets of
    `all`. Reads each score cell once per parse, a read the rerun explanation shares."""
    found = [
        model_redo(run.name, c.name)
        for run in PLAN.runs.values()
        for c in run.checkpoints
        if not c.deleted
    ]
    found += [score_redo(c["run"], c["ckpt"], c["task"], c["variant"]) for c in PLAN.cells()]
    return sorted(f for f in found if f)


def get_evaluate_inputs(wildcards):
    """A cell's generation file and model card, its checker's files, its redo input if its
    score cell is damaged, its self-test verdict where one gates it, and its task's problem
    file if it has one: one input function, not five (Snakemake inspects each function's
    signature on every call, per cell)."""
    base = f"{wildcards.run}/{wildcards.ckpt}/{wildcards.task}/{wildcards.variant}"
    inputs = {
        "generations": f"{OUT}/generations/{base}.jsonl",
        "manifest": f"{OUT}/models/{wildcards.run}/{wildcards.ckpt}.json",
        **get_checker_files(wildcards),
        **get_score_redo(wildcards),
        **get_selftest_input(wildcards),
    }
    problems = get_problems_file(wildcards)
    if problems:
        inputs["problems"] = problems
    return inputs


@functools.cache
def selftest_of(run, task, variant):
    """The identity of the self-test that gates a cell's scoring (rule selftest,
    ckpteval.selftest), or None for a checker that self-tests in its evaluate job."""
    if not separate(PLAN.tasks[task].checker):
        return None
    return selftest_identity(FRESH.scoring_identity(run, task, variant))


@functools.cache
def selftest_identities():
    """(task, key) -> identity of every self-test of the plan: a selftest job's param."""
    found = {}
    for cell in PLAN.cells():
        identity = selftest_of(cell["run"], cell["task"], cell["variant"])
        if identity is not None:
            found[(cell["task"], identity.digest)] = identity
    return found


def get_selftest_identity(wildcards):
    return selftest_identities()[(wildcards.task, wildcards.key)].text


def get_selftest_input(wildcards):
    """A reward cell's self-test verdict, a plain input of every cell this invocation (re)scores
    (missing or damaged scores, a changed setting, new generations, a forced evaluate) and no
    input of a current one: a verdict not made yet, removed or forced never reruns a current
    cell, and a cell that is rescored always waits for a self-test Snakemake reruns. Never an
    `ancient` input: a self-test that Snakemake reruns (an interrupted one, incomplete) hides
    the own reasons of the jobs it feeds through an ancient input, so the rerun ran the
    self-test alone, said done and left the cells unscored (snakemake/snakemake#4166). A cell
    Snakemake rescores for a reason not named here (a newer generation file) self-tests in its
    evaluate job, as other checkers do."""
    w = wildcards
    identity = selftest_of(w.run, w.task, w.variant)
    if identity is None:
        return {}
    score = f"{OUT}/scores/{w.run}/{w.ckpt}/{w.task}/{w.variant}"
    if (
        not os.path.exists(f"{score}.json")
        or score_redo(w.run, w.ckpt, w.task, w.variant)
        or FRESH.score_change(w.run, w.ckpt, w.task, w.variant)
        or FRESH.stale(w.run, w.ckpt, w.task, w.variant)
        or verbs().forces_rule("evaluate")
        or verbs().forces_file(f"{score}.json", f"{score}.jsonl")
    ):
        return {"selftest": str(verdict_path(OUT, w.task, identity))}
    return {}


def get_generation_identity(wildcards):
    return FRESH.generation_identity(wildcards.run, wildcards.task, wildcards.variant).text


def get_task_options(wildcards):
    """A replay job's task options (those that define the task, no paths): its step checks
    them against the definition in its identity (ckpteval.jobs.CellJob)."""
    return json.dumps(PLAN.tasks[wildcards.task].identity_options(), sort_keys=True)


def get_scoring_identity(wildcards):
    return FRESH.scoring_identity(wildcards.run, wildcards.task, wildcards.variant).text


def get_training_curve_output():
    """`training_curve.csv` of the summary, when a run has `train_logs` (its curves beside the
    trainer's; ckpteval.aggregate.training)."""
    if any(run.get("train_logs") for run in config["runs"].values()):
        return {"training_curve": f"{OUT}/summary/training_curve.csv"}
    return {}


def get_summary_identity(wildcards):
    return summary_identity(config).text


def get_publish_identity(wildcards):
    return publish_identity(config).text


def get_publish_records():
    # One record per configured tracker; none configured: the job says so in one line.
    return [f"{OUT}/summary/published/{t}.json" for t in TRACKERS if config["publish"].get(t)]


INFER_COSTS = InferCosts(PLAN)

#: GPUs one engine job (infer, assist) asks for: its tensor parallelism (ckpteval.engine.gpus).
ENGINE_GPUS = engine_gpus(config["engine"])


def get_infer_priority(group):
    """A job's priority is its expected GPU seconds (ckpteval.engine.schedule): Snakemake starts the
    longest infer jobs first, so the last wave of a sweep is made of short ones."""

    def priority(wildcards):
        cells, _ = ENGINES.cells_and_round(wildcards.run, wildcards.ckpt, group)
        stale = [(c.task, c.variant) for c in cells]
        return float(f"{INFER_COSTS(wildcards.run, wildcards.ckpt, stale):.6g}")

    return priority


def get_consolidate_priority(wildcards):
    """A checkpoint's consolidation goes as early as its infer jobs would: the sum of their
    expected GPU seconds, so the longest jobs are ready first."""
    return float(
        f"{sum(INFER_COSTS(wildcards.run, wildcards.ckpt, group_jobs(g)) for g in PLAN.engine_groups):.6g}"
    )


# ---- tail assist (ckpteval.engine.assist): GPUs idle at a sweep's end help the infer jobs still running


@functools.cache
def pending_infer_checkpoints():
    """(run, ckpt) of vllm runs with a generation file still to write, as this Snakemake saw
    them when it first asked (once per process: every assist job's input is the same list)."""
    return [
        (run, c.name)
        for run in VLLM_RUNS
        for c in PLAN.runs[run].checkpoints
        if FRESH.stale_cells(run, c.name, ALL_PAIRS)
    ]


def assist_records():
    """One assist job per engine's worth of GPUs beyond the first (`resources: gpu` of the
    profile, ENGINE_GPUS each), when `assist` is on and some vllm checkpoint has generations to
    write; named by what is pending, so a later sweep gets fresh ones and a finished one none."""
    gpus = workflow.global_resources.get("gpu")
    count = int(gpus.value) // ENGINE_GPUS - 1 if gpus is not None and gpus.value else 0
    pending = pending_infer_checkpoints() if config.get("assist", True) and count > 0 else []
    if not pending:
        return []
    token = sha256_json(sorted(pending))[:12]
    return [f"{OUT}/assist/{token}/{i}.json" for i in range(count)]


ASSIST_RECORDS = assist_records()


def get_assist_inputs(wildcards):
    """An assist job starts once every pending checkpoint is consolidated: from then on, every
    infer job is ready and (higher priority) gets a GPU before any assist job does."""
    return [f"{OUT}/models/{run}/{ckpt}.json" for run, ckpt in pending_infer_checkpoints()]


def get_share_chunks(wildcards):
    """1 when this sweep has assist jobs: the infer job then publishes its chunks for them. A
    resource, not a param: whether a GPU was spare must not make Snakemake rerun the job later.
    A job re-run on a cluster node does not see the profile's global resources, so there it
    publishes whenever `assist` is on (a board is a few files)."""
    if workflow.is_main_process:
        return 1 if ASSIST_RECORDS else 0
    return 1 if config.get("assist", True) else 0


def get_assist_name(wildcards):
    return f"assist-{wildcards.token}-{wildcards.i}"


def get_infer_attempt(wildcards, attempt):
    """Snakemake's attempt number: a retry after a CUDA OOM asks vLLM for less memory."""
    return attempt


def get_solutions(wildcards):
    run = PLAN.runs[wildcards.run]
    step = PLAN.checkpoint(wildcards.run, wildcards.ckpt).step
    return [str(p) for p in run.solutions_files(wildcards.task, wildcards.variant, step)]


def get_model_card_settings(wildcards):
    """What a weightless run's model card records (a change reruns it and everything after)."""
    run = PLAN.runs[wildcards.run]
    if run.backend == "openai":
        return {"base_url": run.endpoint["base_url"], "model": run.endpoint["model"]}
    # The replayed files by content, not their path: a moved project keeps its model cards.
    step = PLAN.checkpoint(wildcards.run, wildcards.ckpt).step
    return {"solutions": PLAN.solutions_id(wildcards.run, step)}


def get_cell(wildcards):
    ckpt = PLAN.checkpoint(wildcards.run, wildcards.ckpt)
    return {
        "run": wildcards.run,
        "ckpt": wildcards.ckpt,
        "step": ckpt.step,
        "task": wildcards.task,
        "variant": wildcards.variant,
        "is_baseline": ckpt.is_base,
    }


@functools.cache
def kept_deleted_cells():
    """Score files of checkpoints whose source is gone, still valid for the current config:
    they stay in the summary (marked). A deleted checkpoint's cell that a changed setting
    outdated cannot be recomputed, and is left out with a warning."""
    kept = []
    for run, ckpts in PLAN.deleted.items():
        for ckpt in ckpts:
            for task, variants in PLAN.task_variants.items():
                for variant in variants:
                    path = Path(OUT) / "scores" / run / ckpt.name / task / f"{variant}.json"
                    if not path.exists():
                        continue
                    if FRESH.stale(run, ckpt.name, task, variant) or FRESH.score_change(
                        run, ckpt.name, task, variant
                    ):
                        print(
                            f"ckpteval: warning: run {run}: checkpoint {ckpt.name} was deleted; "
                            f"its {task} {variant} scores are outdated and left out",
                            file=sys.stderr,
                        )
                        continue
                    kept.append(str(path))
    return kept


def get_score_files(wildcards):
    return [*PLAN.score_files(), *kept_deleted_cells()]


def get_summary_inputs_digest(wildcards):
    """Which cells the summary holds: a cell that leaves the plan rebuilds it (Snakemake's
    `input` trigger, which would do the same, is off: see profiles/default)."""
    return sha256_json(sorted(get_score_files(wildcards)))[:16]


def get_final_checkpoints(wildcards):
    """`run/ckpt` of the final checkpoints (named without a step): labelled final in the report."""
    return PLAN.final_checkpoints()


def get_sampling_settings(wildcards):
    """The sampling configs by name (either form the config writes them in, resolved): the
    summary compares them with a trainer's validation settings (runs.<name>.train_logs)."""
    return {
        name: {
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_new_tokens": s.max_new_tokens,
            "n": s.n,
        }
        for name, s in sampling_configs(config["sampling"]).items()
    }


def get_waiting_checkpoints(wildcards):
    """Lines about checkpoints being written: the report lists them as waiting (without their
    age, so that the report is not rebuilt by the clock)."""
    return PLAN.waiting_lines(age=False)


def get_broken_checkpoints(wildcards):
    """Lines about checkpoints that look broken: the report shows them (and a change of them
    rebuilds it)."""
    return PLAN.broken_lines(age=False)


def get_deleted_checkpoints(wildcards):
    return sorted(f"{run}/{c.name}" for run, ckpts in PLAN.deleted.items() for c in ckpts)


def get_checker_files(wildcards):
    """The files a task's `checker:` mapping names (a reward function's), as inputs named
    `checker_<option>`: ancient, like the problem file (their content is in the identity)."""
    from ckpteval.contract import content_options

    spec = PLAN.tasks[wildcards.task]
    if not isinstance(spec.options.get("checker"), dict):
        return {}
    return {
        f"checker_{option}": ancient(str(spec.checker_file(option)))
        for option in content_options(spec.checker)
        if option in spec.options["checker"]
    }


def get_problems_file(wildcards):
    """The problem file of the cell's task (`tasks.<name>.problems`), or none: read by the
    evaluate job, which builds its own task only. Ancient: its path and mtime rerun nothing,
    its content is in the job's identity (`task.definition`)."""
    path = PLAN.tasks[wildcards.task].options.get("problems")
    return [] if path is None else ancient(str(resolve_path(str(path), Path.cwd())))
