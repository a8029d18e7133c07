# ckpteval: evaluate every checkpoint of LLM training runs.
#   consolidate -> infer (GPU) -> evaluate (CPU) -> aggregate
# Layout and file contracts: README.md; every config key: config/README.md.
import gc

from snakemake.utils import min_version

min_version("9.0")

# Planning makes a few objects per file of every job, and Python's cycle collector, at its default
# threshold (a pass every 700 allocations), walked them ~1,750 times in a dry run of 100 x 20
# cells: about a tenth of its CPU. A pass every 10,000 allocations walks them ~500 times, and
# the process peaks at the same memory (reference counting frees nearly all of it). A full pass
# (every 10 of the older passes by default) walks the whole plan: at 1,000 x 20 cells 5 of them
# took 5.1 s of a 58 s dry run, and a new sweep's dry run grew faster than its cells. One every
# 100 older passes (about 10 million allocations) leaves none in planning (same peak memory,
# 1.1 GB) and still collects cycles in a scheduler that runs for days.
gc.set_threshold(10_000, 10, 100)


# The embedded demo's config, unless the user gives their own: `--configfile mine.yaml` replaces
# it (Snakemake would otherwise merge the user's keys into the demo's runs and tasks).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


# A Snakemake killed with SIGKILL leaves its locks in .snakemake/locks/, and every later run would
# refuse to start until `snakemake --unlock`. The main process claims the working directory at
# parse time and clears locks that no live Snakemake of this workflow holds; incomplete outputs
# stay marked, so --rerun-incomplete (profiles/default) redoes the killed jobs.
if workflow.is_main_process:
    import sys

    from ckpteval.status import claim_workdir, say_live_sweep_plainly

    _stale = claim_workdir()
    say_live_sweep_plainly()  # a dry run beside a live sweep: no "Error:" line for a good plan
    _stale_locks = [p for p in _stale if p.name.endswith(".lock")]
    if _stale_locks:
        print(
            f"ckpteval: removed {len(_stale_locks)} stale Snakemake lock file(s) left by a killed "
            "run",
            file=sys.stderr,
        )
    if len(_stale_locks) < len(_stale):
        print(
            "ckpteval: removed .snakemake/backups/, left by a job a killed run did not finish "
            "(that job runs again)",
            file=sys.stderr,
        )


include: "workflow/rules/common.smk"
include: "workflow/rules/consolidate.smk"
include: "workflow/rules/infer.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/publish.smk"


localrules:
    all,
    aggregate,
    summary,
    publish,


rule all:
    default_target: True
    input:
        get_final_outputs,
