# Whatever a trainer wrote -> a verified HF directory vLLM loads, plus a manifest with the weights
# hash every later file is traced to. The raw checkpoint is ancient(): its modification time says
# nothing. What reruns this job is its content identity file (sources/{run}/{ckpt}.json,
# kept at parse time: its mtime moves only when the checkpoint's bytes change) or its identity
# param (the settings that change the model: ckpteval.contract; the job reads its format, base
# model and dtype from it, ckpteval.jobs). Its priority follows its infer
# jobs' expected GPU seconds (common.smk), so the longest checkpoints are ready first.
rule consolidate:
    input:
        unpack(get_model_redo),
        source=get_checkpoint_source,
        source_id=get_source_identity_file,
        base_model=get_base_model,
    output:
        model=directory(LAYOUT.model_dir("{run}", "{ckpt}")),
        manifest=LAYOUT.manifest("{run}", "{ckpt}"),
    log:
        "logs/consolidate/{run}/{ckpt}.log",
    priority: get_consolidate_priority
    resources:
        gpu=1 if config["consolidate"]["smoke"] == "vllm" else 0,
    params:
        identity=get_model_identity,
    script:
        "../scripts/consolidate.py"
