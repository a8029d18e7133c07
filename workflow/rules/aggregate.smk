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


# Every file of the summary is an output: a deleted one is published again from the build, and
# so is a deleted plot (inside the plots directory) through a redo input (ckpteval.plan.sweep).
# `snakemake --report report.zip` collects the outputs marked report() with their captions.
rule summary:
    input:
        unpack(get_summary_redo),
        staged=SUMMARY_STAGING,
    output:
        **SWEEP.summary_outputs(),
        parquet=LAYOUT.summary("metrics.parquet"),
        csv=report(
            LAYOUT.summary("metrics.csv"), caption="../report/metrics.rst", category="Tables"
        ),
        md=LAYOUT.summary("metrics.md"),
        seeds=LAYOUT.summary("seeds.csv"),
        configs=LAYOUT.summary("configs.csv"),
        passk=LAYOUT.summary("passk.csv"),
        errors=LAYOUT.summary("errors.csv"),
        hacks=LAYOUT.summary("hacks.csv"),
        truncation=LAYOUT.summary("truncation.csv"),
        deltas=report(
            LAYOUT.summary("deltas.csv"), caption="../report/deltas.rst", category="Tables"
        ),
        flips=LAYOUT.summary("flips.csv"),
        missing=LAYOUT.summary("missing.csv"),
        summary_json=LAYOUT.summary("summary.json"),
        plots=report(
            directory(LAYOUT.summary("plots")),
            patterns=["{name}.png"],
            caption="../report/plots.rst",
            category="Plots",
        ),
        report=report(
            LAYOUT.summary("report.html"), caption="../report/summary.rst", category="Summary"
        ),
    log:
        "logs/summary/summary.log",
    run:
        run_in_process(summary, input=input, output=output, log=log)
