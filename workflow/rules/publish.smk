# Optional target, never part of `all`: each checkpoint's metrics at its training step to the
# experiment trackers of the config's `publish` section (W&B, TensorBoard, MLflow; docs/publish.md).
# Run it by name, `snakemake --profile profiles/local publish`, or by one of its files. Its ledgers
# under summary/published/ make it idempotent: only new or changed points are sent.
rule publish:
    input:
        parquet=LAYOUT.summary("metrics.parquet"),
    output:
        records=SWEEP.publish_records(),
    log:
        "logs/publish/publish.log",
    params:
        identity=get_publish_identity,
    script:
        "../scripts/publish.py"
