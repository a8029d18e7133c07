# CPU scoring outside the GPU job: sandboxed checkers for generated code, answer checking for math,
# lm-eval's per-sample metrics for harness tasks. Its identity param holds the evaluate settings
# the cell's checker reads and the task it scores against (ckpteval.contract): a changed timeout
# rescores, a changed worker count does not. The job reads them from that param alone
# (ckpteval.jobs), and its task's problem file, if it has one, as an input by content (ancient:
# a moved or touched file reruns nothing; new content changes the identity), and so are the files
# its checker's options name (a reward function: `checker_reward_function`). A cell of a task whose
# checker runs code (python, rust, stdio, a reward function) that is (re)scored waits for its task's
# self-test job (rule selftest, below).
rule evaluate:
    input:
        unpack(get_evaluate_inputs),
    output:
        samples=LAYOUT.score_samples(WILDCARDS),
        metrics=LAYOUT.score(WILDCARDS),
    log:
        "logs/evaluate/{run}/{ckpt}/{task}/{variant}.log",
    threads: config["evaluate"]["workers"]
    params:
        cell=get_cell,
        identity=get_scoring_identity,
    script:
        "../scripts/evaluate.py"


# A code task's self-test, apart from its scoring (ckpteval.selftest): Snakemake removes a job's
# outputs before it runs, so a self-test failing inside the evaluate job took the cell's previous
# scores with it. This job fails alone, and the evaluate jobs that wait for it never start. Its
# output is named by the digest of its identity, so a changed function or setting is a verdict
# not made yet, and the same configuration finds its old one. It runs once per configuration, not
# once per cell: a Python or Rust self-test runs every problem's reference solution.
rule selftest:
    input:
        unpack(get_checker_files),
        unpack(get_selftest_redo),
        problems=get_problems_file,
    output:
        verdict=LAYOUT.selftest_verdict("{task}", "{key}"),
    log:
        "logs/selftest/{task}.{key}.log",
    threads: config["evaluate"]["workers"]
    params:
        identity=get_selftest_identity,
    script:
        "../scripts/selftest.py"
