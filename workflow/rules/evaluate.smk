# CPU scoring outside the GPU job: sandboxed checkers for generated code, answer checking for math,
# lm-eval's per-sample metrics for harness tasks. Its identity param holds the evaluate settings
# the cell's checker reads and the task it scores against (ckpteval.contract): a changed timeout
# rescores, a changed worker count does not. The job reads them from that param alone
# (ckpteval.jobs), and its task's problem file, if it has one, as an input by content (ancient:
# a moved or touched file reruns nothing; new content changes the identity), and so are the files
# its checker's options name (a reward function: `checker_reward_function`).
rule evaluate:
    input:
        unpack(get_evaluate_inputs),
    output:
        samples=f"{OUT}/scores/{{run}}/{{ckpt}}/{{task}}/{{variant}}.jsonl",
        metrics=f"{OUT}/scores/{{run}}/{{ckpt}}/{{task}}/{{variant}}.json",
    log:
        "logs/evaluate/{run}/{ckpt}/{task}/{variant}.log",
    threads: config["evaluate"]["workers"]
    params:
        cell=get_cell,
        identity=get_scoring_identity,
    script:
        "../scripts/evaluate.py"
