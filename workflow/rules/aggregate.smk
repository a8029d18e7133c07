# Every cell -> one tidy table, seed/config analysis, plots over training steps, an HTML report.
# With --keep-going a failed cell holds this rule back; `ckpteval aggregate` summarizes whatever
# cells exist and lists the missing ones.
# The aggregate job builds the summary in a staging directory; rule `summary` then publishes it
# to summary/ (hard links, each renamed into place). Snakemake deletes a failed job's outputs:
# a failed build loses only its staging directory, and the previous summary stays whole.
rule aggregate:
    input:
        # its params changed while Snakemake has no record of its last build (SweepPlan)
        unpack(get_aggregate_redo),
        cells=get_score_files,
    output:
        staged=directory(SUMMARY_STAGING),
    log:
        "logs/aggregate/aggregate.log",
    # the report reads cells in this many processes, while the job builds its tables
    threads: config["evaluate"]["workers"]
    params:
        identity=get_summary_identity,
        cells=get_summary_inputs_digest,
        deleted=get_deleted_checkpoints,
        broken=get_broken_checkpoints,
        waiting=get_waiting_checkpoints,
        finals=get_final_checkpoints,
        sampling=get_sampling_settings,
    script:
        "../scripts/aggregate.py"


# Every file of the summary is an output: a deleted one is published again from the build, and
# so is a deleted plot (inside the plots directory) through a redo input (ckpteval.plan.sweep).
# `snakemake --report report.zip` collects the outputs marked report() with their captions.
# Each is update(): Snakemake removes a job's outputs before it runs and after it fails, which
# for this job took the previous summary with it (a killed or failed publication left no
# report). Kept instead, each file is replaced by its new version in one rename
# (ckpteval.summary.publish_summary), Snakemake restores the previous ones if the job fails
# (from its backup, .snakemake/backups), and a killed job, marked incomplete, runs again.
rule summary:
    input:
        unpack(get_summary_redo),
        staged=SUMMARY_STAGING,
    output:
        **{name: update(path) for name, path in SWEEP.summary_outputs().items()},
        parquet=update(LAYOUT.summary("metrics.parquet")),
        csv=update(
            report(
                LAYOUT.summary("metrics.csv"), caption="../report/metrics.rst", category="Tables"
            )
        ),
        md=update(LAYOUT.summary("metrics.md")),
        seeds=update(LAYOUT.summary("seeds.csv")),
        configs=update(LAYOUT.summary("configs.csv")),
        passk=update(LAYOUT.summary("passk.csv")),
        errors=update(LAYOUT.summary("errors.csv")),
        hacks=update(LAYOUT.summary("hacks.csv")),
        truncation=update(LAYOUT.summary("truncation.csv")),
        deltas=update(
            report(LAYOUT.summary("deltas.csv"), caption="../report/deltas.rst", category="Tables")
        ),
        flips=update(LAYOUT.summary("flips.csv")),
        missing=update(LAYOUT.summary("missing.csv")),
        summary_json=update(LAYOUT.summary("summary.json")),
        plots=update(
            report(
                directory(LAYOUT.summary("plots")),
                patterns=["{name}.png"],
                caption="../report/plots.rst",
                category="Plots",
            )
        ),
        report=update(
            report(
                LAYOUT.summary("report.html"), caption="../report/summary.rst", category="Summary"
            )
        ),
        report_files=update(directory(LAYOUT.summary("report_files"))),
    log:
        "logs/summary/summary.log",
    run:
        run_in_process(summary, input=input, output=output, log=log)
