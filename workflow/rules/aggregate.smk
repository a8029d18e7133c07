# Every cell -> one tidy table, seed/config analysis, plots over training steps, an HTML report.
rule aggregate:
    input:
        cells=get_score_files,
    output:
        parquet=f"{OUT}/summary/metrics.parquet",
        csv=f"{OUT}/summary/metrics.csv",
        md=f"{OUT}/summary/metrics.md",
        seeds=f"{OUT}/summary/seeds.csv",
        configs=f"{OUT}/summary/configs.csv",
        report=f"{OUT}/summary/report.html",
    log:
        "logs/aggregate/aggregate.log",
    params:
        summary_dir=f"{OUT}/summary",
    script:
        "../scripts/aggregate.py"
