"""Score samples with a reward function that imports a heavy package: per-sample exec vs preload.

    python bench/reward.py [--samples 200] [--workers 1] [--timeout 10]

Two reward functions, each scored on the same N samples (a third right, the rest wrong) in the
bwrap sandbox, batched as the evaluate job batches them:

- `sympy`: `import sympy`, the answer compared with `sympy.simplify(a - b) == 0`;
- `math_verify` (if installed): `from math_verify import parse, verify`, as verl's and open-r1's
  math rewards do.

Each function is scored twice: the old path (each sample a fresh `python -I -B runner.py` exec'd
in the batch's sandbox, importing the package itself: `RewardFunctionChecker.exec_samples`) and
the new one (the sandbox's driver imports the package once per batch, each sample a fork of it).
Both keep one process per sample. Prints seconds per sample and the ratio; the verdicts of the
two paths must be equal (exit status 1 if not).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

FUNCTIONS = {
    "sympy": """
import sympy


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    try:
        return float(sympy.simplify(sympy.sympify(solution_str) - sympy.sympify(ground_truth)) == 0)
    except (sympy.SympifyError, TypeError):
        return 0.0
""",
    "math_verify": """
from math_verify import parse, verify


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(verify(parse(f"${ground_truth}$"), parse(solution_str)))
""",
}


def samples(n: int) -> list[tuple[dict, str]]:
    """(problem, completion): a right answer every third sample, else a wrong one."""
    out = []
    for i in range(n):
        problem = {"task_id": str(i), "ground_truth": str(i + 2), "question": f"{i} + 2?"}
        completion = f"{i} + 2" if i % 3 == 0 else f"{i} + 3"
        out.append((problem, f"${completion}$" if i % 2 else completion))
    return out


def score(source: Path, n: int, workers: int, timeout: float, exec_samples: bool):
    """(seconds, verdicts) of scoring `n` samples with the reward function in `source`."""
    from ckpteval.checkers import Job, get_checker

    checker = get_checker("reward_function", reward_function=str(source), self_test="off: bench")
    checker.exec_samples = exec_samples
    jobs = [Job(p["task_id"], p, c) for p, c in samples(n)]
    try:
        start = time.monotonic()
        verdicts = checker.check(jobs, workers=workers, timeout=timeout)
        return time.monotonic() - start, verdicts
    finally:
        checker.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per sample")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    failed = False
    with tempfile.TemporaryDirectory(prefix="ckpteval-bench-reward-") as tmp:
        for name, code in FUNCTIONS.items():
            if importlib.util.find_spec(name) is None:
                print(f"{name}: not installed, skipped")
                continue
            source = Path(tmp) / f"{name}_reward.py"
            source.write_text(code)
            old_s, old = score(source, args.samples, args.workers, args.timeout, True)
            new_s, new = score(source, args.samples, args.workers, args.timeout, False)
            outcome = [(v.passed, v.error_type, v.score) for v in old]
            same = outcome == [(v.passed, v.error_type, v.score) for v in new]
            failed |= not same
            passed = sum(v.passed for v in new)
            print(
                f"{name}: {args.samples} samples, {args.workers} worker(s): "
                f"per-sample exec {old_s / args.samples:.3f} s/sample, "
                f"preloaded {new_s / args.samples:.3f} s/sample, "
                f"ratio {old_s / new_s:.1f}x; {passed} passed; "
                f"verdicts {'equal' if same else 'DIFFER'}"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
