# Parse-time facts and the rules' input functions: one line each over the sweep's plan
# (ckpteval.plan: `Layout` spells every path under outdir, `SweepPlan` decides every edge; both
# are unit-tested without Snakemake). What only Snakemake expresses is added here: `ancient` for
# inputs read by content, `storage.s3` for checkpoints on S3. A user mistake stops here with one
# line, before any job.
import re
import sys
from pathlib import Path

from ckpteval.chat_templates import missing_template_lines
from ckpteval.config import build_plan, validate_config
from ckpteval.contract import publish_identity, summary_identity
from ckpteval.engine.gpus import engine_gpus
from ckpteval.engine.plan import infer_rule_name
from ckpteval.errors import UserError
from ckpteval.plan.layout import WILDCARDS, CellKey
from ckpteval.plan.sweep import ByContent, SweepPlan
from ckpteval.steps import generation, model_card, run_in_process, summary
from ckpteval.tasks import check_harness_names
from ckpteval.verbs import Verbs

try:
    validate_config(config, Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml")
    PLAN = build_plan(config)
    if workflow.is_main_process:
        check_harness_names(PLAN.tasks, config["lm_eval"]["include_paths"])
except UserError as _error:
    print(f"ckpteval: error: {_error}", file=sys.stderr)
    sys.exit(1)

# What this invocation was told to redo (-f, -R, -F): known once Snakemake builds its DAG, which
# is when the input functions first run.
SWEEP = SweepPlan(
    PLAN,
    verbs=lambda: Verbs.from_settings(
        getattr(workflow, "dag_settings", None), [r.name for r in workflow.rules]
    ),
    main=workflow.is_main_process,
)
LAYOUT = SWEEP.layout
SUMMARY_STAGING = LAYOUT.summary_staging()
VLLM_RUNS = PLAN.runs_with_backend("vllm")
OPENAI_RUNS = PLAN.runs_with_backend("openai")
REPLAY_RUNS = PLAN.runs_with_backend("replay")
#: GPUs one engine job (infer, assist) asks for: its tensor parallelism (ckpteval.engine.gpus).
ENGINE_GPUS = engine_gpus(config["engine"])

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
    """Inputs the plan reads by content (ckpteval.plan.sweep.ByContent) as `ancient`."""
    if isinstance(inputs, dict):
        return {k: aged(v) for k, v in inputs.items()}
    if isinstance(inputs, list):
        return [aged(v) for v in inputs]
    return ancient(str(inputs)) if isinstance(inputs, ByContent) else inputs


def get_final_outputs(wildcards):
    # A shard (`--config shard=i/n`) scores its own checkpoints; an unsharded run aggregates all.
    # Every file of the summary, every cell's files, the aggregate job's build, assist records,
    # engine rounds and redo inputs with work to do are targets: Snakemake reruns a job for a
    # missing output only when that output is requested (ckpteval.verbs).
    extra = [*ASSIST_RECORDS, *SWEEP.engine_targets(), *SWEEP.redo_targets()]
    if PLAN.shard is not None:
        return [*SWEEP.score_files(), *extra]
    return [*rules.aggregate.output, *rules.summary.output, *SWEEP.cell_files(), *extra]


def get_checkpoint_source(w):
    sources = SWEEP.checkpoint_source(w.run, w.ckpt)
    if PLAN.checkpoint(w.run, w.ckpt).url:
        return [ancient(storage.s3(url)) for url in sources]
    return [ancient(path) for path in sources]


def get_source_identity_file(w):
    return SWEEP.source_identity_file(w.run, w.ckpt)


def get_model_identity(w):
    return SWEEP.fresh.model_identity(w.run, w.ckpt).text


def get_base_model(w):
    return aged(SWEEP.base_model(w.run))


def get_model_redo(w):
    found = SWEEP.model_redo(w.run, w.ckpt)
    return {"redo": found} if found else {}


def get_model_card_settings(w):
    return SWEEP.model_card_settings(w.run, w.ckpt)


def get_consolidate_priority(w):
    return SWEEP.consolidate_priority(w.run, w.ckpt)


# ---- infer side: engine groups x backends (rules are defined per group in infer.smk)


def runs_regex(names):
    """A wildcard constraint matching exactly these run names."""
    return "|".join(re.escape(n) for n in names)


def staging_dir(group):
    return SWEEP.engines.staging_dir(group)


def engine_done(group):
    """An engine job's output: one done file per round, a name no file has at parse time."""
    return f"{staging_dir(group)}.{{token}}.done"


def engine_log(group):
    return f"logs/infer/{{run}}/{{ckpt}}{f'.{group}' if group else ''}.{{token}}.log"


def get_engine_request_path(group):
    return lambda w: SWEEP.engines.request_file(group, w)


def get_infer_priority(group):
    return lambda w: SWEEP.infer_priority(w.run, w.ckpt, group)


def write_engine_requests(dag):
    SWEEP.engines.write_requests(dag)


def get_generation_inputs(w):
    return SWEEP.engines.generation_inputs(w.run, w.ckpt, w.task, w.variant)


def get_generation_identity(w):
    return SWEEP.fresh.generation_identity(w.run, w.task, w.variant).text


def get_solutions(w):
    return SWEEP.solutions(CellKey.of(w))


def get_task_options(w):
    return SWEEP.task_options(w.task)


def get_infer_attempt(wildcards, attempt):
    """Snakemake's attempt number: a retry after a CUDA OOM asks vLLM for less memory."""
    return attempt


# ---- tail assist: GPUs idle at a sweep's end help the infer jobs still running
_GPUS = workflow.global_resources.get("gpu")
ASSIST_RECORDS = SWEEP.assist_records(
    int(_GPUS.value) if _GPUS is not None and _GPUS.value else 0,
    ENGINE_GPUS,
    config.get("assist", True),
)


def get_assist_inputs(w):
    return SWEEP.assist_inputs()


def get_assist_name(w):
    return f"assist-{w.token}-{w.i}"


def get_share_chunks(w):
    """1 when this sweep has assist jobs (a resource, not a param: a spare GPU must not rerun
    the job). A job re-run on a cluster node does not see the profile's resources."""
    if workflow.is_main_process:
        return 1 if ASSIST_RECORDS else 0
    return 1 if config.get("assist", True) else 0


# ---- evaluate and its self-tests


def get_evaluate_inputs(w):
    # one input function, not five: Snakemake inspects each function's signature per cell
    return aged(SWEEP.evaluate_inputs(CellKey.of(w)))


def get_cell(w):
    return SWEEP.cell_params(CellKey.of(w))


def get_scoring_identity(w):
    return SWEEP.fresh.scoring_identity(w.run, w.task, w.variant).text


def get_selftest_identity(w):
    return SWEEP.selftest_identity(w.task, w.key).text


def get_checker_files(w):
    return aged(SWEEP.checker_files(w.task))


def get_problems_file(w):
    return aged([p] if (p := SWEEP.problems_file(w.task)) else [])


# ---- aggregate, summary, publish


def get_score_files(w):
    return SWEEP.score_files()


def get_summary_inputs_digest(w):
    return SWEEP.summary_cells_digest()


def get_summary_identity(w):
    return summary_identity(config).text


def get_final_checkpoints(w):
    return PLAN.final_checkpoints()


def get_sampling_settings(w):
    return SWEEP.sampling_settings()


def get_waiting_checkpoints(w):
    return PLAN.waiting_lines(age=False)  # no age: the clock must not rebuild the report


def get_broken_checkpoints(w):
    return PLAN.broken_lines(age=False)


def get_deleted_checkpoints(w):
    return SWEEP.deleted_checkpoints()


def get_publish_identity(w):
    return publish_identity(config).text
