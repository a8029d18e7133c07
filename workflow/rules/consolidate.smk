# Whatever a trainer wrote -> a verified HF directory vLLM loads, plus a manifest with the weights
# hash every later file is traced to. Raw checkpoint inputs are ancient(): a trainer touching a
# directory does not rerun the sweep.
rule consolidate:
    input:
        source=get_checkpoint_source,
    output:
        model=directory(f"{OUT}/models/{{run}}/{{ckpt}}"),
        manifest=f"{OUT}/models/{{run}}/{{ckpt}}.json",
    log:
        "logs/consolidate/{run}/{ckpt}.log",
    params:
        source=get_checkpoint_path,
        format=get_format,
        base_model=get_base_model,
        dtype=config["consolidate"]["dtype"],
        smoke=config["consolidate"]["smoke"],
        engine=config["engine"],
    resources:
        mem_mb=8000,
    script:
        "../scripts/consolidate.py"
