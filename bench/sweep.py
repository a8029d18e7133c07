"""The demo's infer step with engine swapping on and off, from an empty cache, in one run.

Builds the demo run if needed (`python -m ckpteval.demo build`), then for `engine.swap: true` and
`false` in turn runs the demo config in its own working directory: first up to the consolidated
models (not timed), then the infer step up to the generation files (`--until generation`, timed
as a whole: what a user waits for). It prints, per side, the engine loads (distinct engines that
started), swaps, the infer step's wall time, the ratio of the two, and whether every generation
file is equal between the two sides.

    python bench/sweep.py                      # the demo: 5 checkpoints, one slot (profiles/local)
    python bench/sweep.py --tasks arith pyfunc # a subset of the demo's tasks
    python bench/sweep.py --cpu-linear onednn --dtype float32   # vLLM's oneDNN kernels, forced

`--cpu-linear` forces the CPU kernel of every engine (CKPTEVAL_CPU_LINEAR, docs/infer.md): oneDNN
keeps packed weight copies that each swap must rebuild; it builds them in fp32 on any x86-64 CPU
with AVX2 and in bf16 only with AVX-512.

Goal (issue: one engine per GPU slot per sweep): swap-on infer wall time at most 0.4x swap-off,
with identical generations.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from _workflow import snakemake

REPO = Path(__file__).resolve().parents[1]


def demo_config(tasks: list[str] | None, swap: bool, dtype: str | None = None) -> dict[str, Any]:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config = copy.deepcopy(config)
    for run in config["runs"].values():
        for key in ("path", "base_model"):
            if run.get(key):
                run[key] = str(REPO / run[key])
    if tasks:
        config["tasks"] = {name: config["tasks"].get(name, {}) for name in tasks}
    config["engine"]["swap"] = swap
    if dtype:
        config["engine"]["dtype"] = dtype
    return config


def measure(out: Path, tasks: list[str] | None, swap: bool, dtype: str | None) -> dict[str, Any]:
    work = out / ("swap-on" if swap else "swap-off")
    shutil.rmtree(work, ignore_errors=True)
    (work / "config").mkdir(parents=True)
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(demo_config(tasks, swap, dtype)))
    snakemake(work, "--until", "consolidate")
    seconds = snakemake(work, "--until", "generation")
    metas = [json.loads(p.read_text()) for p in (work / "results").rglob("*.meta.json")]
    swaps: dict[Any, int] = {}
    for meta in metas:
        if meta.get("engine_loads"):
            engine = meta.get("served_by")
            swaps[engine] = max(swaps.get(engine, 0), int(meta.get("swaps") or 0))
    return {
        "work": work,
        "seconds": seconds,
        "loads": len(swaps),
        "swaps": sum(swaps.values()),
        "cells": len(metas),
    }


def generations(work: Path) -> dict[str, str]:
    root = work / "results" / "generations"
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*.jsonl"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="*", help="a subset of the demo's tasks")
    parser.add_argument("--out", type=Path, default=Path("/tmp/ckpteval-bench-sweep"))
    parser.add_argument("--cpu-linear", choices=("auto", "onednn", "torch"), default="auto")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), help="the engine's dtype")
    args = parser.parse_args()
    os.environ["CKPTEVAL_CPU_LINEAR"] = args.cpu_linear  # the Snakemake jobs inherit it
    subprocess.run(
        [sys.executable, "-m", "ckpteval.demo", "build", "--out", str(REPO / "resources/demo")],
        check=True,
        capture_output=True,
    )
    on = measure(args.out, args.tasks, True, args.dtype)
    off = measure(args.out, args.tasks, False, args.dtype)
    dtype = args.dtype or "the config's"
    print(f"CPU linear kernels: {args.cpu_linear}; dtype: {dtype}")
    same = generations(on["work"]) == generations(off["work"])
    for name, side in (("swap on", on), ("swap off", off)):
        print(
            f"{name:9s} engine loads {side['loads']}, swaps {side['swaps']}, "
            f"infer step {side['seconds']:.1f} s, {side['cells']} generation files"
        )
    print(f"ratio swap-on / swap-off infer wall time: {on['seconds'] / off['seconds']:.2f}")
    print(f"every generation file equal: {same}")


if __name__ == "__main__":
    main()
