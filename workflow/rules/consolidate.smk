# Whatever a trainer wrote -> a verified HF directory vLLM loads, plus a manifest with the weights
# hash every later file is traced to. Raw checkpoint inputs are ancient(): a trainer touching a
# directory does not rerun the sweep; weights rewritten in place change the fingerprint param,
# which reruns this job, and the new weights hash reruns what depends on it. Its priority follows
# its infer jobs' expected GPU seconds (common.smk), so the longest checkpoints are ready first.
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
        fingerprint=get_source_fingerprint,
    resources:
        gpu=1 if config["consolidate"]["smoke"] == "vllm" else 0,
    priority: get_consolidate_priority
    script:
        "../scripts/consolidate.py"
