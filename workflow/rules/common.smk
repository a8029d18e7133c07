# Parse-time facts: validate the config, discover checkpoints, resolve tasks; and the small named
# input/param functions the rules use. A user mistake stops here with one line, before any job.
import sys
from pathlib import Path

from ckpteval.checkpoints import checkpoint_fingerprint
from ckpteval.config import build_plan, validate_config
from ckpteval.errors import UserError

try:
    validate_config(config, Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml")
    PLAN = build_plan(config)
except UserError as _error:
    print(f"ckpteval: error: {_error}", file=sys.stderr)
    sys.exit(1)

OUT = PLAN.outdir
INFER_JOBS = [(task, variant) for task, variants in PLAN.task_variants.items() for variant in variants]
SUMMARY_FILES = ["metrics.parquet", "metrics.csv", "metrics.md", "seeds.csv", "configs.csv", "report.html"]


wildcard_constraints:
    run=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    ckpt=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    task=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    variant=r"[A-Za-z0-9_.]+-s[0-9]+",


def get_final_outputs(wildcards):
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


def get_generation_outputs():
    return [f"{OUT}/generations/{{run}}/{{ckpt}}/{t}/{v}.jsonl" for t, v in INFER_JOBS]


def get_generation_metas():
    return [f"{OUT}/generations/{{run}}/{{ckpt}}/{t}/{v}.meta.json" for t, v in INFER_JOBS]


def get_cell(wildcards):
    ckpt = PLAN.checkpoint(wildcards.run, wildcards.ckpt)
    return {"run": wildcards.run, "ckpt": wildcards.ckpt, "step": ckpt.step,
            "task": wildcards.task, "variant": wildcards.variant, "is_baseline": ckpt.is_base}


def get_score_files(wildcards):
    return [f"{OUT}/scores/{c['run']}/{c['ckpt']}/{c['task']}/{c['variant']}.json" for c in PLAN.cells()]
