# Generations for every checkpoint, by the run's backend (runs.<name>.backend):
# - vllm: rule `infer` (one per engine group: `infer_<group>`): one vLLM engine per job serves every
#   task and variant of the group on one leased GPU; a CUDA OOM is retried once with less memory.
# - openai: rule `endpoint` (`endpoint_<group>`): the same job against an OpenAI-compatible server;
#   no GPU here.
# - replay: rule `replay`, one job per generation file: existing solutions, validated and copied.
# Weightless runs (openai, replay) get a model card as models/{run}/{ckpt}.json instead of a
# consolidated model. Finished requests go to a content-addressed cache under {OUT}/cache, which
# is not a declared output: a killed or retried job resumes from it. An infer job's priority is
# its expected GPU seconds (ckpteval.schedule): the longest start first.
for _group in PLAN.engine_groups:
    if VLLM_RUNS:

        rule:
            name:
                infer_rule_name("infer", _group)
            input:
                model=f"{OUT}/models/{{run}}/{{ckpt}}",
                manifest=f"{OUT}/models/{{run}}/{{ckpt}}.json",
            output:
                generations=get_generation_outputs(_group),
                metas=get_generation_metas(_group),
            log:
                get_infer_log(_group),
            wildcard_constraints:
                run=runs_regex(VLLM_RUNS),
            params:
                jobs=group_jobs(_group),
                cache_dir=f"{OUT}/cache",
            resources:
                gpu=1,
                infer_attempt=get_infer_attempt,
                share_chunks=get_share_chunks,
            priority: get_infer_priority(_group)
            retries: 1
            script:
                "../scripts/infer.py"

    if OPENAI_RUNS:

        rule:
            name:
                infer_rule_name("endpoint", _group)
            input:
                manifest=f"{OUT}/models/{{run}}/{{ckpt}}.json",
            output:
                generations=get_generation_outputs(_group),
                metas=get_generation_metas(_group),
            log:
                get_infer_log(_group),
            wildcard_constraints:
                run=runs_regex(OPENAI_RUNS),
            params:
                jobs=group_jobs(_group),
                cache_dir=f"{OUT}/cache",
            script:
                "../scripts/infer.py"


# Tail assist (ckpteval.share): one job per GPU beyond the first, lowest priority, so Snakemake
# starts one only when every infer job already has a GPU. It helps the running infer job with the
# most work left: loads that checkpoint's model and generates its last chunks into the shared
# cache; it ends when no job has enough left to repay an engine load. Off with `assist: false`.
if VLLM_RUNS:

    rule assist:
        input:
            get_assist_inputs,
        output:
            record=f"{OUT}/assist/{{token}}/{{i}}.json",
        log:
            "logs/assist/{token}/{i}.log",
        wildcard_constraints:
            token=r"[0-9a-f]+",
            i=r"[0-9]+",
        params:
            cache_dir=f"{OUT}/cache",
            name=get_assist_name,
            grace_seconds=30,
        resources:
            gpu=1,
        priority: -1
        script:
            "../scripts/assist.py"


if REPLAY_RUNS:

    rule replay:
        input:
            solutions=get_solutions,
        output:
            generations=f"{OUT}/generations/{{run}}/{{ckpt}}/{{task}}/{{variant}}.jsonl",
            meta=f"{OUT}/generations/{{run}}/{{ckpt}}/{{task}}/{{variant}}.meta.json",
        log:
            "logs/replay/{run}/{ckpt}/{task}/{variant}.log",
        wildcard_constraints:
            run=runs_regex(REPLAY_RUNS),
        script:
            "../scripts/infer.py"


if OPENAI_RUNS or REPLAY_RUNS:

    rule model_card:
        output:
            manifest=f"{OUT}/models/{{run}}/{{ckpt}}.json",
        log:
            "logs/model_card/{run}/{ckpt}.log",
        wildcard_constraints:
            run=runs_regex(OPENAI_RUNS + REPLAY_RUNS),
        params:
            settings=get_model_card_settings,
        localrule: True
        script:
            "../scripts/infer.py"

    ruleorder: model_card > consolidate
