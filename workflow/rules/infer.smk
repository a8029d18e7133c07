# Generations for every checkpoint, by the run's backend (runs.<name>.backend):
# - vllm: rule `infer` (one per engine group: `infer_<group>`): one vLLM engine per job serves the
#   checkpoint's cells of the group that this invocation (re)generates, on one leased GPU (as
#   many as engine.tensor_parallel_size when engine.allow_tensor_parallel is on); a CUDA
#   OOM is retried once with less memory, any other failure is not retried. It writes them into
#   its staging directory and one done file for its round ({token}), and rule `generation` moves
#   each cell's file into place. Which cells, and why every Snakemake verb (-f, -R, -F, a deleted
#   file) plans a chain that runs without rerunning the neighbours and without the parse writing
#   anything: ckpteval.verbs. The engine jobs' request files are written when a run starts.
# - openai: rule `endpoint` (`endpoint_<group>`): the same job against an OpenAI-compatible server;
#   no GPU here.
# - replay: rule `replay`, one job per generation file: existing solutions, validated and copied.
# Weightless runs (openai, replay) get a model card as models/{run}/{ckpt}.json instead of a
# consolidated model. Finished requests go to a content-addressed cache under {OUT}/cache
# (ckpteval.engine.cache), which is not a declared output: a killed or retried job resumes from it. An
# infer job's priority is its expected GPU seconds (ckpteval.engine.schedule): the longest start first.
for _group in PLAN.engine_groups:
    if VLLM_RUNS:

        rule:
            name:
                infer_rule_name("infer", _group)
            input:
                model=LAYOUT.model_dir("{run}", "{ckpt}"),
                manifest=LAYOUT.manifest("{run}", "{ckpt}"),
            output:
                done=ENGINES.done_template(_group),
            log:
                ENGINES.log_template(_group),
            wildcard_constraints:
                run=runs_regex(VLLM_RUNS),
                token=r"r[0-9]+",
            priority: get_infer_priority(_group)
            retries: 1
            resources:
                gpu=ENGINE_GPUS,
                infer_attempt=get_infer_attempt,
                share_chunks=get_share_chunks,
            params:
                staging=ENGINES.staging_dir(_group),
                request=get_engine_request_path(_group),
                cache_dir=LAYOUT.cache(),
            script:
                "../scripts/infer.py"

    if OPENAI_RUNS:

        rule:
            name:
                infer_rule_name("endpoint", _group)
            input:
                manifest=LAYOUT.manifest("{run}", "{ckpt}"),
            output:
                done=ENGINES.done_template(_group),
            log:
                ENGINES.log_template(_group),
            wildcard_constraints:
                run=runs_regex(OPENAI_RUNS),
                token=r"r[0-9]+",
            params:
                staging=ENGINES.staging_dir(_group),
                request=get_engine_request_path(_group),
                cache_dir=LAYOUT.cache(),
            script:
                "../scripts/infer.py"


# The request file of every engine job a run will run (never in a dry run): ckpteval.verbs.
onstart:
    ENGINES.write_requests(workflow.dag)


# A cell's generation file and meta, moved into place from its engine job's staging directory.
# Its done-file input is ancient unless this invocation regenerates the cell (common.smk): an
# up-to-date cell's job is never planned, whatever its neighbours do. Its identity param names the settings it was made with. Two renames: it
# runs inside Snakemake's own process (`run:`), with no interpreter to start per cell.
if VLLM_RUNS or OPENAI_RUNS:

    rule generation:
        input:
            unpack(get_generation_inputs),
        output:
            generations=LAYOUT.generation(WILDCARDS),
            meta=LAYOUT.generation_meta(WILDCARDS),
        log:
            "logs/generation/{run}/{ckpt}/{task}/{variant}.log",
        wildcard_constraints:
            run=runs_regex([*VLLM_RUNS, *OPENAI_RUNS]),
        localrule: True
        params:
            identity=get_generation_identity,
        run:
            run_in_process(
                generation,
                input=input,
                output=output,
                params=params,
                wildcards=wildcards,
                log=log,
            )


# Tail assist (ckpteval.engine.assist): one job per GPU beyond the first, lowest priority, so Snakemake
# starts one only when every infer job already has a GPU. It helps the running infer job with the
# most work left: loads that checkpoint's model and generates its last chunks into the shared
# cache; it ends when no job has enough left to repay an engine load. Off with `assist: false`.
if VLLM_RUNS:

    rule assist:
        input:
            get_assist_inputs,
        output:
            record=LAYOUT.assist_record("{token}", "{i}"),
        log:
            "logs/assist/{token}/{i}.log",
        wildcard_constraints:
            token=r"[0-9a-f]+",
            i=r"[0-9]+",
        priority: -1
        resources:
            gpu=ENGINE_GPUS,
        params:
            cache_dir=LAYOUT.cache(),
            name="assist-{token}-{i}",
            grace_seconds=30,
        script:
            "../scripts/assist.py"


if REPLAY_RUNS:

    rule replay:
        input:
            solutions=get_solutions,
            # The model the generations stand for (recorded in the meta, as an engine job does).
            manifest=LAYOUT.manifest("{run}", "{ckpt}"),
            problems=get_problems_file,
            # A stale cell Snakemake would not redo by itself (SweepPlan.replay_redo).
            redo=get_replay_redo,
        output:
            generations=LAYOUT.generation(WILDCARDS),
            meta=LAYOUT.generation_meta(WILDCARDS),
        log:
            "logs/replay/{run}/{ckpt}/{task}/{variant}.log",
        wildcard_constraints:
            run=runs_regex(REPLAY_RUNS),
        params:
            identity=get_generation_identity,
            task=get_task_options,
            # This cell's files by content: new bytes replay and rescore this cell alone.
            solutions=get_solutions_id,
        script:
            "../scripts/replay.py"


# A weightless run's model card: a few lines of JSON, written inside Snakemake's own process
# (`run:`), as `generation` is: an interpreter per card cost ~0.8 s each.
if OPENAI_RUNS or REPLAY_RUNS:

    rule model_card:
        input:
            unpack(get_model_redo),
        output:
            manifest=LAYOUT.manifest("{run}", "{ckpt}"),
        log:
            "logs/model_card/{run}/{ckpt}.log",
        wildcard_constraints:
            run=runs_regex([*OPENAI_RUNS, *REPLAY_RUNS]),
        localrule: True
        params:
            settings=get_model_card_settings,
            identity=get_model_identity,
        run:
            run_in_process(
                model_card,
                output=output,
                params=params,
                wildcards=wildcards,
                log=log,
            )

    ruleorder: model_card > consolidate


# A damaged score cell or model card is redone through a redo input (ckpteval.verbs): a file
# named for the damage, made here and asked for by `all`, so the job that makes the damaged
# file runs again without the parse removing anything.
rule redo:
    output:
        LAYOUT.redo("{key}"),
    log:
        "logs/redo/{key}.log",
    wildcard_constraints:
        key=r"[0-9a-f]+(\.[0-9]+)?",
    localrule: True
    shell:
        "touch {output} > {log} 2>&1"
