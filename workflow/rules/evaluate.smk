# CPU scoring outside the GPU job: sandboxed checkers for generated code, answer checking for math,
# lm-eval's per-sample metrics for harness tasks.
rule evaluate:
    input:
        generations=f"{OUT}/generations/{{run}}/{{ckpt}}/{{task}}/{{variant}}.jsonl",
        manifest=f"{OUT}/models/{{run}}/{{ckpt}}.json",
    output:
        samples=f"{OUT}/scores/{{run}}/{{ckpt}}/{{task}}/{{variant}}.jsonl",
        metrics=f"{OUT}/scores/{{run}}/{{ckpt}}/{{task}}/{{variant}}.json",
    log:
        "logs/evaluate/{run}/{ckpt}/{task}/{variant}.log",
    params:
        cell=get_cell,
    threads: config["evaluate"]["workers"]
    script:
        "../scripts/evaluate.py"
