# One vLLM engine per checkpoint serves every task and variant (one GPU, tensor parallel 1).
# Finished requests go to a content-addressed cache under {OUT}/cache, so a killed job resumes.
rule infer:
    input:
        model=f"{OUT}/models/{{run}}/{{ckpt}}",
        manifest=f"{OUT}/models/{{run}}/{{ckpt}}.json",
    output:
        generations=get_generation_outputs(),
        metas=get_generation_metas(),
    log:
        "logs/infer/{run}/{ckpt}.log",
    params:
        jobs=INFER_JOBS,
        cache_dir=f"{OUT}/cache",
    resources:
        gpu=1,
    script:
        "../scripts/infer.py"
