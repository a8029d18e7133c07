# Every cell -> one tidy table, seed/config analysis, plots over training steps, an HTML report.
# `snakemake --report report.zip` collects the outputs marked report() with their captions.
# With --keep-going a failed cell holds this rule back; `ckpteval aggregate` summarizes whatever
# cells exist and lists the missing ones.
rule aggregate:
    input:
        cells=get_score_files,
    output:
        parquet=f"{OUT}/summary/metrics.parquet",
        csv=report(f"{OUT}/summary/metrics.csv", caption="../report/metrics.rst", category="Tables"),
        md=f"{OUT}/summary/metrics.md",
        seeds=f"{OUT}/summary/seeds.csv",
        configs=f"{OUT}/summary/configs.csv",
        passk=f"{OUT}/summary/passk.csv",
        errors=f"{OUT}/summary/errors.csv",
        hacks=f"{OUT}/summary/hacks.csv",
        truncation=f"{OUT}/summary/truncation.csv",
        deltas=report(
            f"{OUT}/summary/deltas.csv", caption="../report/deltas.rst", category="Tables"
        ),
        flips=f"{OUT}/summary/flips.csv",
        missing=f"{OUT}/summary/missing.csv",
        summary_json=f"{OUT}/summary/summary.json",
        plots=report(
            directory(f"{OUT}/summary/plots"),
            patterns=["{name}.png"],
            caption="../report/plots.rst",
            category="Plots",
        ),
        report=report(
            f"{OUT}/summary/report.html", caption="../report/summary.rst", category="Summary"
        ),
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
