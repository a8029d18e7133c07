# Parse-time facts: validate the config, discover checkpoints, resolve tasks; and the small named
# input/param functions the rules use. A user mistake stops here with one line, before any job.
import re
import sys
from pathlib import Path

from ckpteval.checkpoints import checkpoint_fingerprint
from ckpteval.config import build_plan, validate_config
from ckpteval.errors import UserError
from ckpteval.schedule import InferCosts

try:
    validate_config(config, Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml")
    PLAN = build_plan(config)
except UserError as _error:
    print(f"ckpteval: error: {_error}", file=sys.stderr)
    sys.exit(1)

OUT = PLAN.outdir
VLLM_RUNS = PLAN.runs_with_backend("vllm")
OPENAI_RUNS = PLAN.runs_with_backend("openai")
REPLAY_RUNS = PLAN.runs_with_backend("replay")
SUMMARY_FILES = ["metrics.parquet", "metrics.csv", "metrics.md", "seeds.csv", "configs.csv", "report.html"]


wildcard_constraints:
    run=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    ckpt=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    task=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    variant=r"[A-Za-z0-9_.]+-s[0-9]+",


def get_final_outputs(wildcards):
    # A shard (`--config shard=i/n`) scores its own checkpoints; an unsharded run aggregates all.
    if PLAN.shard is not None:
        return get_score_files(wildcards)
    return [f"{OUT}/summary/{name}" for name in SUMMARY_FILES]


def get_checkpoint_source(wildcards):
    return ancient(str(PLAN.checkpoint(wildcards.run, wildcards.ckpt).path))


def get_checkpoint_path(wildcards):
    return str(PLAN.checkpoint(wildcards.run, wildcards.ckpt).path)


def get_source_fingerprint(wildcards):
    """Names, sizes and mtimes of the checkpoint's files: a changed param reruns consolidate (and,
    through the new weights hash, everything downstream) when weights are overwritten in place,
    while the raw input itself stays ancient()."""
    return checkpoint_fingerprint(PLAN.checkpoint(wildcards.run, wildcards.ckpt).path)


def get_format(wildcards):
    ckpt = PLAN.checkpoint(wildcards.run, wildcards.ckpt)
    return "auto" if ckpt.is_base else PLAN.runs[wildcards.run].format


def get_base_model(wildcards):
    base = PLAN.runs[wildcards.run].base_model
    return str(base) if base else None


# ---- infer side: engine groups x backends (rules are defined per group in infer.smk)


def runs_regex(names):
    """A wildcard constraint matching exactly these run names."""
    return "|".join(re.escape(n) for n in names)


def group_jobs(group):
    """(task, variant) pairs one infer job of engine group `group` generates."""
    return [(t, v) for t in PLAN.engine_groups[group] for v in PLAN.task_variants[t]]


def infer_rule_name(prefix, group):
    """`infer` / `endpoint` for the default engine group, `<prefix>_<group>` for named ones."""
    return f"{prefix}_{group}" if group else prefix


def get_generation_outputs(group):
    return [f"{OUT}/generations/{{run}}/{{ckpt}}/{t}/{v}.jsonl" for t, v in group_jobs(group)]


def get_generation_metas(group):
    return [f"{OUT}/generations/{{run}}/{{ckpt}}/{t}/{v}.meta.json" for t, v in group_jobs(group)]


def get_infer_log(group):
    return f"logs/infer/{{run}}/{{ckpt}}{'.' + group if group else ''}.log"


INFER_COSTS = InferCosts(PLAN)


def get_infer_priority(group):
    """A job's priority is its expected GPU seconds (ckpteval.schedule): Snakemake starts the
    longest infer jobs first, so the last wave of a sweep is made of short ones."""
    pairs = group_jobs(group)

    def priority(wildcards):
        return float(f"{INFER_COSTS(wildcards.run, wildcards.ckpt, pairs):.6g}")

    return priority


def get_consolidate_priority(wildcards):
    """A checkpoint's consolidation goes as early as its infer jobs would: the sum of their
    expected GPU seconds, so the longest jobs are ready first."""
    return float(f"{sum(INFER_COSTS(wildcards.run, wildcards.ckpt, group_jobs(g)) for g in PLAN.engine_groups):.6g}")


def get_infer_attempt(wildcards, attempt):
    """Snakemake's attempt number: a retry after a CUDA OOM asks vLLM for less memory."""
    return attempt


def get_solutions(wildcards):
    run = PLAN.runs[wildcards.run]
    step = PLAN.checkpoint(wildcards.run, wildcards.ckpt).step
    return str(run.solutions_file(wildcards.task, wildcards.variant, step))


def get_model_card_settings(wildcards):
    """What a weightless run's model card records (a change reruns it and everything after)."""
    run = PLAN.runs[wildcards.run]
    if run.backend == "openai":
        return {"base_url": run.endpoint["base_url"], "model": run.endpoint["model"]}
    return {"solutions": run.solutions}


def get_cell(wildcards):
    ckpt = PLAN.checkpoint(wildcards.run, wildcards.ckpt)
    return {"run": wildcards.run, "ckpt": wildcards.ckpt, "step": ckpt.step,
            "task": wildcards.task, "variant": wildcards.variant, "is_baseline": ckpt.is_base}


def get_score_files(wildcards):
    return PLAN.score_files()
