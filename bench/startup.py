"""Fixed costs per process: what a workflow invocation, a `script:` job and an engine process pay
before their first piece of work, in CPU seconds (user + system) and wall seconds.

1. `snakemake -n` on a small config (the demo run, three tasks): the parse, plugin discovery and
   the DAG, in a fresh interpreter, like every `snakemake`, `ckpteval` verb and Slurm job;
2. a `script:` job's Python: interpreter start and `from ckpteval.steps import ...`;
3. an engine process, phase by phase: `import vllm`, `from vllm import LLM`, lm-eval's vLLM
   wrapper (inside `ckpteval.engine.heap.engine_imports`, as the infer job imports them), the
   engine start through ckpteval's backend (`VllmBackend.lm`, what the infer job does) and a
   first generation, with the time spent in Python's garbage collector counted apart.

Each is measured `--repeat` times in fresh processes; the smallest figure is printed (the others
are noise from a shared machine). CPU seconds are the steadier figure on a busy machine.

    python bench/startup.py [--repeat 3] [--only parse|script|engine] [--model DIR]

`--model` is a Hugging Face model directory (default: the demo's last checkpoint, built by
`python -m ckpteval.demo build` into a temporary directory if not given).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONUNBUFFERED": "1"}

ENGINE_PROBE = r"""
import gc, json, resource, sys, time
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
gc_seconds = [0.0]
_started = [0.0]
def _gc(phase, info):
    if phase == "start":
        _started[0] = time.perf_counter()
    else:
        gc_seconds[0] += time.perf_counter() - _started[0]
gc.callbacks.append(_gc)
phases = {}
def mark(name, since):
    phases[name] = {"wall": time.perf_counter() - since[0], "cpu": cpu() - since[1]}
    since[:] = [time.perf_counter(), cpu()]
since = [time.perf_counter(), cpu()]
phases["interpreter"] = {"wall": 0.0, "cpu": cpu()}
try:  # the imports as the infer job makes them (a ckpteval from before engine/heap.py: plain)
    from ckpteval.engine.heap import engine_imports
except ImportError:
    from contextlib import nullcontext as engine_imports
with engine_imports():
    import vllm
    mark("import vllm", since)
    from vllm import LLM, SamplingParams
    mark("from vllm import LLM", since)
    from lm_eval.models.vllm_causallms import VLLM
    mark("lm-eval's VLLM wrapper", since)
from pathlib import Path
from ckpteval.backends.vllm import VllmBackend
backend = VllmBackend(Path(sys.argv[1]), {"dtype": "float32", "max_model_len": 512, "seed": 42,
    "tensor_parallel_size": 1, "gpu_memory_utilization": 0.15, "enforce_eager": True})
before_gc = gc_seconds[0]
backend.lm
mark("engine start (VllmBackend.lm)", since)
phases["engine start (VllmBackend.lm)"]["gc"] = gc_seconds[0] - before_gc
backend.lm.model.generate(["1+1="], SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)
mark("first generation", since)
phases["total"] = {"wall": sum(p["wall"] for p in phases.values()), "cpu": cpu(),
    "gc": gc_seconds[0]}
print("PHASES " + json.dumps(phases))
"""

SCRIPT_PROBE = (
    "from ckpteval.steps import aggregate, consolidate, evaluate, infer, run_step  # noqa\n"
)


def child_cpu(cmd: list[str], **kwargs: object) -> tuple[float, float, str]:
    """Run `cmd` to its end: (wall seconds, its CPU seconds, its stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, check=True, **kwargs)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def parse(model_run: Path, repeat: int) -> None:
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = {
            "runs": {"demo": {"path": str(model_run)}},
            "tasks": {"arith": {}, "arith_harness": {"limit": 10}, "pyfunc": {"limit": 3}},
            "sampling": {"greedy": {"temperature": 0.0, "max_new_tokens": 48}},
        }
        (work / "config").mkdir()
        (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))
        cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]
        cmd += ["--directory", str(work), "--profile", str(REPO / "profiles" / "local"), "-n"]
        runs = [child_cpu(cmd, cwd=REPO)[:2] for _ in range(repeat)]
    print(f"snakemake -n, small config:   {_best(runs)}")


def script(repeat: int) -> None:
    runs = [child_cpu([sys.executable, "-c", SCRIPT_PROBE])[:2] for _ in range(repeat)]
    print(f"script: job's imports:        {_best(runs)}")


def engine(model: Path, repeat: int) -> None:
    results = []
    for _ in range(repeat):
        out = child_cpu([sys.executable, "-c", ENGINE_PROBE, str(model)])[2]
        line = next(x for x in out.splitlines() if x.startswith("PHASES "))
        results.append(json.loads(line.removeprefix("PHASES ")))
    best = min(results, key=lambda r: r["total"]["cpu"])
    print("engine process (the run with the least CPU):")
    for name, phase in best.items():
        gc_note = f", {phase['gc']:.2f} s of it in gc" if "gc" in phase else ""
        print(f"  {name:32s} {phase['cpu']:6.2f} s CPU {phase['wall']:6.2f} s wall{gc_note}")


def _best(runs: list[tuple[float, float]]) -> str:
    wall = min(r[0] for r in runs)
    cpu = min(r[1] for r in runs)
    return f"{cpu:5.2f} s CPU {wall:5.2f} s wall (best of {len(runs)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=("parse", "script", "engine"))
    parser.add_argument("--model", type=Path, help="an HF model directory (default: the demo's)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from ckpteval.demo import build

            build(Path(tmp) / "demo", echo=lambda line: None)
            model = sorted((Path(tmp) / "demo" / "run").glob("step_*"))[-1]
        if args.only in (None, "parse"):
            parse(model.parent, args.repeat)
        if args.only in (None, "script"):
            script(args.repeat)
        if args.only in (None, "engine"):
            engine(model, args.repeat)


if __name__ == "__main__":
    main()
