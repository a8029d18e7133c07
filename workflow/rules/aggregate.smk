# Every cell -> one tidy table, seed/config analysis, plots over training steps, an HTML report.
# With --keep-going a failed cell holds this rule back; `ckpteval aggregate` summarizes whatever
# cells exist and lists the missing ones.
# The aggregate job builds the summary in a staging directory; rule `summary` then publishes it
# to summary/ (hard links, each renamed into place). Snakemake deletes a failed job's outputs:
# a failed build loses only its staging directory, and the previous summary stays whole.
rule aggregate:
    input:
        cells=get_score_files,
    output:
        staged=directory(SUMMARY_STAGING),
    log:
        "logs/aggregate/aggregate.log",
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


# Every file of the summary is an output: a deleted one is published again from the build.
# `snakemake --report report.zip` collects the outputs marked report() with their captions.
# Each is update(): Snakemake removes a job's outputs before it runs and after it fails, which
# for this job took the previous summary with it (a killed or failed publication left no
# report). Kept instead, each file is replaced by its new version in one rename
# (ckpteval.summary.publish_summary), Snakemake restores the previous ones if the job fails
# (from its backup, .snakemake/backups), and a killed job, marked incomplete, runs again.
rule summary:
    input:
        staged=SUMMARY_STAGING,
    output:
        **{name: update(path) for name, path in get_training_curve_output().items()},
        parquet=update(f"{OUT}/summary/metrics.parquet"),
        csv=update(
            report(
                f"{OUT}/summary/metrics.csv", caption="../report/metrics.rst", category="Tables"
            )
        ),
        md=update(f"{OUT}/summary/metrics.md"),
        seeds=update(f"{OUT}/summary/seeds.csv"),
        configs=update(f"{OUT}/summary/configs.csv"),
        passk=update(f"{OUT}/summary/passk.csv"),
        errors=update(f"{OUT}/summary/errors.csv"),
        hacks=update(f"{OUT}/summary/hacks.csv"),
        truncation=update(f"{OUT}/summary/truncation.csv"),
        deltas=update(
            report(f"{OUT}/summary/deltas.csv", caption="../report/deltas.rst", category="Tables")
        ),
        flips=update(f"{OUT}/summary/flips.csv"),
        missing=update(f"{OUT}/summary/missing.csv"),
        summary_json=update(f"{OUT}/summary/summary.json"),
        plots=update(
            report(
                directory(f"{OUT}/summary/plots"),
                patterns=["{name}.png"],
                caption="../report/plots.rst",
                category="Plots",
            )
        ),
        report=update(
            report(
                f"{OUT}/summary/report.html", caption="../report/summary.rst", category="Summary"
            )
        ),
        report_files=directory(f"{OUT}/summary/report_files"),
    log:
        "logs/summary/summary.log",
    run:
        run_in_process(summary, input=input, output=output, log=log)
