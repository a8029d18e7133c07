# Parse-time facts and the rules' input functions, each one line over the sweep's plan
# (ckpteval.plan: `Layout` spells every path under outdir, `SweepPlan` decides every edge, and
# both are unit-tested without Snakemake). What only Snakemake expresses is added here: `ancient`
# for inputs read by content, `storage.s3` for checkpoints on S3. A user mistake stops here with
# one line, before any job.
import sys
from pathlib import Path

from snakemake.common import get_function_params, overwrite_function_params

from ckpteval.chat_templates import missing_template_lines
from ckpteval.config import build_plan, validate_config
from ckpteval.contract import publish_identity
from ckpteval.engine.gpus import engine_gpus
from ckpteval.engine.plan import infer_rule_name
from ckpteval.errors import UserError
from ckpteval.plan.layout import WILDCARDS, CellKey
from ckpteval.plan.snakemake_speed import check_scripts_once_per_rule
from ckpteval.plan.sweep import ByContent, SweepPlan, runs_regex
from ckpteval.steps import generation, model_card, run_in_process, summary
from ckpteval.tasks import check_harness_names
from ckpteval.verbs import Verbs

check_scripts_once_per_rule()

try:
    validate_config(config, Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml")
    PLAN = build_plan(config)
    if workflow.is_main_process:
        check_harness_names(PLAN.tasks, config["lm_eval"]["include_paths"])
except UserError as _error:
    print(f"ckpteval: error: {_error}", file=sys.stderr)
    sys.exit(1)

# What this invocation was told to redo (-f, -R, -F) is known once Snakemake builds its DAG,
# which is when the input functions first run.
SWEEP = SweepPlan(
    PLAN,
    verbs=lambda: Verbs.from_settings(
        getattr(workflow, "dag_settings", None), [r.name for r in workflow.rules]
    ),
    main=workflow.is_main_process,
)
LAYOUT = SWEEP.layout
ENGINES = SWEEP.engines
SUMMARY_STAGING = LAYOUT.summary_staging()
VLLM_RUNS = PLAN.runs_with_backend("vllm")
OPENAI_RUNS = PLAN.runs_with_backend("openai")
REPLAY_RUNS = PLAN.runs_with_backend("replay")
#: GPUs one engine job (infer, assist) asks for: its tensor parallelism (ckpteval.engine.gpus).
ENGINE_GPUS = engine_gpus(config["engine"])
_GPUS = workflow.global_resources.get("gpu")
#: Tail assist: GPUs idle at a sweep's end help the infer jobs still running (infer.smk).
ASSIST_RECORDS = SWEEP.assist_records(
    int(_GPUS.value) if _GPUS is not None and _GPUS.value else 0,
    ENGINE_GPUS,
    config.get("assist", True),
)

if workflow.is_main_process:
    # Keep each checkpoint's content identity current, then say in words what this invocation
    # will redo for a changed setting, before Snakemake plans it.
    for _line in SWEEP.damaged_manifests():
        print(f"ckpteval: warning: {_line}", file=sys.stderr)
    SWEEP.sync_source_identities()
    for _line in [*PLAN.left_out, *PLAN.broken_lines(), *missing_template_lines(PLAN)]:
        print(f"ckpteval: warning: {_line}", file=sys.stderr)
    for _line in SWEEP.rerun_lines():
        print(f"ckpteval: rerun: {_line}", file=sys.stderr)
# Checkpoints on S3 are read through Snakemake's S3 storage plugin: the consolidate job's inputs
# are the objects it needs, downloaded under .snakemake/storage/s3/. Endpoint and credentials
# come from the environment (SNAKEMAKE_STORAGE_S3_*, else boto3's AWS_* chain), never the config.
if SWEEP.has_s3():

    storage s3:
        provider="s3",


wildcard_constraints:
    run=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    ckpt=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    task=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    variant=r"[A-Za-z0-9_.]+-s[0-9]+",
    key=r"[0-9a-f]{16}",


def aged(inputs):
    """Inputs the plan reads by content (ckpteval.plan.sweep.ByContent) as `ancient`; the plan's
    None for no input as none (a list would reach the job as a list)."""
    if inputs is None:
        return []
    if isinstance(inputs, dict):  # a None inside (a param's value) stays None
        return {k: v if v is None else aged(v) for k, v in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        return [v if v is None else aged(v) for v in inputs]
    return ancient(str(inputs)) if isinstance(inputs, ByContent) else inputs


def signed(function):
    """An input, params or resource function whose signature Snakemake reads once: it inspects
    a function's signature twice on every call, per job (7% of a new sweep's dry run)."""
    overwrite_function_params(function, get_function_params(function))
    return function


def per_checkpoint(ask):
    """An input function: the plan's answer for the job's checkpoint."""
    return signed(lambda wildcards: aged(ask(wildcards.run, wildcards.ckpt)))


def per_cell(ask):
    return signed(lambda wildcards: aged(ask(CellKey.of(wildcards))))


def per_task(ask):
    return signed(lambda wildcards: aged(ask(wildcards.task)))


def per_sweep(ask):
    return signed(lambda wildcards: aged(ask()))


@signed
def get_final_outputs(wildcards):
    # A shard (`--config shard=i/n`) scores its own checkpoints; an unsharded run aggregates all.
    # Every file of the summary, every cell's meta and score, the aggregate job's build, assist
    # records, engine rounds and redo inputs with work to do are targets: Snakemake reruns a job
    # for a missing output only when that output is requested (ckpteval.verbs).
    extra = [*ASSIST_RECORDS, *SWEEP.engine_targets(), *SWEEP.redo_targets()]
    if PLAN.shard is not None:
        return [*SWEEP.score_files(), *extra]
    return [*rules.aggregate.output, *rules.summary.output, *SWEEP.cell_files(), *extra]


@signed
def get_checkpoint_source(wildcards):
    sources = SWEEP.checkpoint_source(wildcards.run, wildcards.ckpt)
    if PLAN.checkpoint(wildcards.run, wildcards.ckpt).url:  # on S3: downloaded by Snakemake
        return [ancient(storage.s3(url)) for url in sources]
    return ancient(sources[0]) if sources else []


def get_engine_request_path(group):
    return signed(lambda wildcards: ENGINES.request_file(group, wildcards))


def get_infer_priority(group):
    return signed(lambda wildcards: SWEEP.infer_priority(wildcards.run, wildcards.ckpt, group))


@signed
def get_infer_attempt(wildcards, attempt):
    """Snakemake's attempt number: a retry after a CUDA OOM asks vLLM for less memory."""
    return attempt


@signed
def get_share_chunks(wildcards):
    """1 when this sweep has assist jobs (a resource, not a param: a spare GPU must not rerun
    the job). A job re-run on a cluster node does not see the profile's resources."""
    if workflow.is_main_process:
        return 1 if ASSIST_RECORDS else 0
    return 1 if config.get("assist", True) else 0


@signed
def get_selftest_identity(wildcards):
    return SWEEP.selftest_identity(wildcards.task, wildcards.key)


@signed
def get_selftest_redo(wildcards):
    return SWEEP.selftest_redo_input(wildcards.task, wildcards.key)


# consolidate, model_card
get_source_identity_file = per_checkpoint(SWEEP.source_identity_file)
get_model_identity = per_checkpoint(SWEEP.model_identity)
get_base_model = per_checkpoint(lambda run, ckpt: SWEEP.base_model(run))
get_model_redo = per_checkpoint(SWEEP.model_redo_input)
get_model_card_settings = per_checkpoint(SWEEP.model_card_settings)
get_consolidate_priority = per_checkpoint(SWEEP.consolidate_priority)
# infer, generation, replay, assist
get_generation_inputs = per_cell(ENGINES.generation_inputs)
get_generation_identity = per_cell(SWEEP.generation_identity)
get_solutions = per_cell(SWEEP.solutions)
get_solutions_id = per_cell(SWEEP.solutions_id)
get_replay_redo = per_cell(SWEEP.replay_redo)
get_task_options = per_task(SWEEP.task_options)
get_assist_inputs = per_sweep(SWEEP.assist_inputs)
# evaluate (one input function, not five: Snakemake inspects each one's signature per cell)
get_evaluate_inputs = per_cell(SWEEP.evaluate_inputs)
get_cell = per_cell(SWEEP.cell_params)
get_scoring_identity = per_cell(SWEEP.scoring_identity)
# selftest
get_checker_files = per_task(SWEEP.checker_files)
get_problems_file = per_task(SWEEP.problems_file)
# aggregate (no age in the waiting lines: the clock must not rebuild the report), publish
get_score_files = per_sweep(SWEEP.score_files)
get_summary_redo = per_sweep(lambda: {"redo": r} if (r := SWEEP.summary_redo()) else {})
get_aggregate_redo = per_sweep(SWEEP.aggregate_redo)
get_summary_inputs_digest = per_sweep(lambda: SWEEP.aggregate_params()["cells"])
get_summary_identity = per_sweep(lambda: SWEEP.aggregate_params()["identity"])
get_deleted_checkpoints = per_sweep(lambda: SWEEP.aggregate_params()["deleted"])
get_broken_checkpoints = per_sweep(lambda: SWEEP.aggregate_params()["broken"])
get_waiting_checkpoints = per_sweep(lambda: SWEEP.aggregate_params()["waiting"])
get_final_checkpoints = per_sweep(lambda: SWEEP.aggregate_params()["finals"])
get_sampling_settings = per_sweep(lambda: SWEEP.aggregate_params()["sampling"])
get_publish_identity = per_sweep(lambda: publish_identity(config).text)
