"""Milliseconds per sample of a reward function: sandboxed (as ckpteval scores) vs in-process.

    python bench/reward.py [--samples 60] [--workers 1] [--timeout 10] [--exec]

Three reward functions, each scored on the same N samples (a third right, the rest wrong):

- `plain`: plain Python (a regex and integer arithmetic, the standard library only), as verl's
  gsm8k reward is;
- `sympy`: `import sympy`, the answer compared with `sympy.simplify(a - b) == 0`;
- `math_verify` (if installed): `from math_verify import parse, verify`, as verl's and open-r1's
  math rewards do.

Each function is timed these ways, each in a process of its own (none inherits another's
imports or caches); every way runs one sample at a time unless `--workers` says otherwise:

- `in-process`: import the file, call the function on every sample in a loop, as a trainer does
  (the first call's costs paid once, for the whole run);
- `warm fork`: import the file's packages, run the file and call the function on the warm
  zygote's fixed inputs (`WARM_CALLS`, never a sample's text), freeze the heap out of the cyclic
  collector as the zygote does, then fork once per sample and call it in the fork: what a
  fork-server would give, without a sandbox. Its difference to `in-process` is a fork's cost;
- `fork`: import the file's packages, fork once per sample, and run the file and call the
  function in the fork (as the sandbox does, without the sandbox). Its difference to
  `warm fork` is what a first call costs (the file's own code, lazy imports, parsers and caches
  built on first use);
- `no zygote`: ckpteval's checker, bwrap, batched as the evaluate job batches, each sample
  forked from the sandbox's driver (which imported the packages once per batch) and dropping to
  the sandbox's uid, limits, namespaces, cgroup and seccomp filter, then running the file (the
  path before warm zygotes, and the fallback). Its difference to `fork` is what isolation
  costs, per-batch start-up included;
- `sandboxed`: as ckpteval scores: the same, each sample forked from the batch's warm zygote
  (isolated once per batch, the file run and the function called once on a fixed input);
- `1 batch`: the same, all samples in one batch: its difference to `sandboxed` is what the
  evaluate job's batching costs (a sandbox start and the packages' import per batch);
- `exec` (with `--exec`, slow): each sample a fresh interpreter in the sandbox, imports included.

Verdicts (passed, score) of every way must be equal (exit status 1 if not). The target (issue
34): sandboxed within 10 ms a sample of in-process.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from ckpteval.checkers.reward import WARM_CALLS, as_score, preload_modules  # noqa: E402

FUNCTIONS = {
    "plain": """
import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    terms = re.findall(r"-?\\d+", solution_str)
    return float(bool(terms) and sum(int(t) for t in terms) == int(ground_truth))
""",
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
#: What each function needs installed.
NEEDS = {"plain": "re", "sympy": "sympy", "math_verify": "math_verify"}


def samples(n: int) -> list[tuple[dict, str]]:
    """(problem, completion): a right answer every third sample, else a wrong one."""
    out = []
    for i in range(n):
        problem = {"task_id": str(i), "ground_truth": str(i + 2), "question": f"{i} + 2?"}
        completion = f"{i} + 2" if i % 3 == 0 else f"{i} + 3"
        out.append((problem, f"${completion}$" if i % 2 else completion))
    return out


def _call(function, problem: dict, completion: str) -> tuple[bool, float | str]:
    """(passed, score) as the checker reads the function's value (pass_threshold 1.0)."""
    score, _ = as_score(
        function(
            data_source="",
            solution_str=completion,
            ground_truth=problem["ground_truth"],
            extra_info={},
        )
    )
    return (not isinstance(score, str) and score >= 1.0, score)


def _load(source: Path):
    spec = importlib.util.spec_from_file_location(f"bench_{source.stem}", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_score


def _in_child(measure, *args) -> tuple[float, list]:
    """Run `measure(*args)` in a fork of this process (which never imports a function's
    packages nor calls one), so that no way inherits another's imports or warm caches."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.write(write, json.dumps(measure(*args)).encode())
        finally:
            os._exit(0)
    os.close(write)
    data = b"".join(iter(lambda: os.read(read, 1 << 20), b""))
    os.close(read)
    os.waitpid(pid, 0)
    seconds, outcome = json.loads(data)
    return seconds, [tuple(o) for o in outcome]


def _in_process(source: Path, n: int) -> tuple[float, list]:
    function = _load(source)
    start = time.perf_counter()
    outcome = [_call(function, p, c) for p, c in samples(n)]
    return time.perf_counter() - start, outcome


def _forked(source: Path, n: int, warm: bool) -> tuple[float, list]:
    for module in preload_modules(source.read_text(), source.parent):
        importlib.import_module(module)
    function = None
    if warm:  # the file run and the zygote's calls made, on fixed inputs, never a sample's text
        function = _load(source)
        for completion, truth in WARM_CALLS:
            try:
                _call(function, {"ground_truth": truth}, completion)
            except Exception:  # noqa: BLE001 - as the zygote's warm-up: errors ignored
                pass
        gc.freeze()
    start = time.perf_counter()
    outcome = []
    for problem, completion in samples(n):
        r, w = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(r)
            result = _call(function or _load(source), problem, completion)
            os.write(w, json.dumps(result).encode())
            os._exit(0)
        os.close(w)
        data = b"".join(iter(lambda fd=r: os.read(fd, 65536), b""))
        os.close(r)
        os.waitpid(child, 0)
        outcome.append(json.loads(data))
    return time.perf_counter() - start, outcome


def in_process(source: Path, n: int) -> tuple[float, list]:
    """One process, one import, every sample a call (timed after the import)."""
    return _in_child(_in_process, source, n)


def forked(source: Path, n: int, warm: bool = False) -> tuple[float, list]:
    """A process that imported the file's packages (`warm`: and ran the file and called the
    function on the zygote's fixed inputs) forks once per sample; the fork (cold: runs the file
    and) calls the function. No sandbox."""
    return _in_child(_forked, source, n, warm)


def sandboxed(
    source: Path,
    n: int,
    workers: int,
    timeout: float,
    exec_samples: bool,
    one_batch: bool = False,
    zygote: bool = True,
) -> tuple[float, list]:
    """ckpteval's checker, bwrap-sandboxed, batched as the evaluate job batches (`zygote`:
    each sample forked from the batch's warm zygote, as ckpteval scores; else from the driver)."""
    from ckpteval.checkers import Job, get_checker

    checker = get_checker("reward_function", reward_function=str(source), self_test="off: bench")
    checker.exec_samples = exec_samples
    if not zygote:
        checker._warm = lambda jobs, timeout: None
    if one_batch:
        checker.batch_size_for = lambda n_jobs, workers: n_jobs
    jobs = [Job(p["task_id"], p, c) for p, c in samples(n)]
    try:
        start = time.perf_counter()
        verdicts = checker.check(jobs, workers=workers, timeout=timeout)
        seconds = time.perf_counter() - start
    finally:
        checker.close()
    return seconds, [(v.passed, v.score if v.score is not None else v.error_type) for v in verdicts]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per sample")
    parser.add_argument("--exec", action="store_true", help="also time a fresh exec per sample")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    n, failed = args.samples, False
    print(f"{n} samples, {args.workers} worker(s) sandboxed; ms per sample (wall)")
    with tempfile.TemporaryDirectory(prefix="ckpteval-bench-reward-") as tmp:
        for name, code in FUNCTIONS.items():
            if importlib.util.find_spec(NEEDS[name]) is None:
                print(f"{name}: not installed, skipped")
                continue
            source = Path(tmp) / f"{name}_reward.py"
            source.write_text(code)
            ways = {
                "in-process": in_process(source, n),
                "warm fork": forked(source, n, warm=True),
                "fork": forked(source, n),
                "no zygote": sandboxed(source, n, args.workers, args.timeout, False, zygote=False),
                "sandboxed": sandboxed(source, n, args.workers, args.timeout, False),
                "1 batch": sandboxed(source, n, args.workers, args.timeout, False, True),
            }
            if args.exec:
                ways["exec"] = sandboxed(source, n, args.workers, args.timeout, True)
            reference = ways["in-process"][1]
            same = all(outcome == reference for _, outcome in ways.values())
            failed |= not same
            ms = {way: seconds / n * 1000 for way, (seconds, _) in ways.items()}
            print(
                f"{name:12s} "
                + "  ".join(f"{way} {value:8.2f}" for way, value in ms.items())
                + f"\n{'':12s} a fork {ms['warm fork'] - ms['in-process']:6.2f}"
                f"  first call {ms['fork'] - ms['warm fork']:7.2f}"
                f"  isolation {ms['no zygote'] - ms['fork']:7.2f}"
                f"  zygote saves {ms['no zygote'] - ms['sandboxed']:7.2f}"
                f"  sandboxed - in-process {ms['sandboxed'] - ms['in-process']:7.2f} (target <= 10)"
                f"; {sum(p for p, _ in reference)} passed, verdicts "
                f"{'equal' if same else 'DIFFER'}"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
