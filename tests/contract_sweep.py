"""The finished sweep of the rerun-contract tests, shared by tests/test_contract.py (a moved
project, every Snakemake verb run for real, file events) and tests/test_contract_walk.py (every
key of the schema changed in turn under `snakemake -n`). Each module runs its own sweep, so that
pytest-xdist can give the two long modules to two workers; this file holds what they share: the
sweep, the dry run and the jobs that regenerate a set of cells."""

from __future__ import annotations

import copy
import re
import shutil
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from conftest import dry_snakemake, run_snakemake
from test_infer_backends import FakeEndpoint

from ckpteval.config import validate_config

TASKS = {"arith": {}, "pyfunc": {"limit": 2}, "arith_harness": {"limit": 4}}
KINDS = {
    "arith": ("generate", "gsm8k"),
    "pyfunc": ("generate", "python"),
    "arith_harness": ("harness", "harness"),
}
VLLM_CKPTS = ("step_100", "step_400")


@dataclass
class Sweep:
    work: Path
    config: dict[str, Any]
    full: dict[str, Any]  # the same config with every default written out
    endpoint: FakeEndpoint


@contextmanager
def finished_sweep(demo_dir: Path, work: Path) -> Iterator[Sweep]:
    """Run the sweep in `work` (copies of two demo checkpoints and the base model, an endpoint
    on loopback) and hand it over finished; the endpoint stops when the block ends."""
    steps = sorted((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    for name, ckpt in zip(VLLM_CKPTS, (steps[0], steps[-1])):  # copies: later tests touch,
        shutil.copytree(ckpt, work / "run" / name)  # replace and delete them
    shutil.copytree(demo_dir / "base", work / "base")
    with FakeEndpoint() as endpoint:
        config = {
            "runs": {
                "demo": {"path": str(work / "run"), "base_model": str(work / "base")},
                "ep": {
                    "backend": "openai",
                    "step": 7,
                    "endpoint": {"base_url": endpoint.base_url, "model": "tiny"},
                },
            },
            "tasks": TASKS,
            "sampling": {"greedy": {"temperature": 0.0, "max_new_tokens": 32}},
            "engine": {"gpu_memory_utilization": 0.15, "enforce_eager": True},
            "consolidate": {"smoke": "none"},
            "evaluate": {"workers": 2, "timeout": 10},
        }
        (work / "sweep.yaml").write_text(yaml.safe_dump(config))
        proc = run_snakemake(work, "--configfile", str(work / "sweep.yaml"))
        assert proc.returncode == 0, proc.stderr[-4000:]
        full = copy.deepcopy(config)
        validate_config(full)
        yield Sweep(work, config, full, endpoint)


def planned(sweep: Sweep, config: dict[str, Any], name: str = "variant") -> Counter[str]:
    """Jobs per rule that `snakemake -n --configfile <config>` plans (the target `all` left out)."""
    return dry_run(sweep, config, name)[0]


def dry_run(sweep: Sweep, config: dict[str, Any], name: str) -> tuple[Counter[str], str]:
    """(jobs per rule, what the dry run printed) of `snakemake -n --configfile <config>`, in a
    forked process (conftest.dry_snakemake: the walk alone makes ~100 of them)."""
    path = sweep.work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = dry_snakemake(sweep.work, "-n", "--configfile", str(path))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    if "Nothing to be done" in out:
        return Counter(), out
    table = out.split("Job stats:", 1)[1].split("total", 1)[0]
    return Counter(
        {
            rule: int(n)
            for rule, n in re.findall(r"^(\w+)\s+(\d+)\s*$", table, re.M)
            if rule not in ("all", "job")
        }
    ), out


# Cells of the sweep: (run, ckpt, task, sampling, backend).
CELLS = [
    (run, ckpt, task, "greedy", backend)
    for run, backend, ckpts in (("demo", "vllm", VLLM_CKPTS), ("ep", "openai", ("step_7",)))
    for ckpt in ckpts
    for task in TASKS
]
ENGINE_RULE = {"vllm": "infer", "openai": "endpoint"}


def chain(cells: list[tuple[str, ...]], *, model: bool = False) -> Counter[str]:
    """The jobs that regenerate `cells` (and rebuild their models if `model`), then rescore and
    summarize them."""
    if not cells:
        return Counter()
    jobs: Counter[str] = Counter()
    for _run, _ckpt, backend in {(c[0], c[1], c[4]) for c in cells}:
        jobs[ENGINE_RULE[backend]] += 1
        if model:
            jobs["consolidate" if backend == "vllm" else "model_card"] += 1
    return jobs + Counter({"generation": len(cells), "evaluate": len(cells), "aggregate": 1})


def cell_files(step: str, cells: list[tuple[str, ...]]) -> set[str]:
    """Paths under results/ of the `step` ("generations" or "scores") files of `cells`."""
    return {
        f"{step}/{run}/{ckpt}/{task}/{sampling}-s42.{ext}"
        for run, ckpt, task, sampling, _ in cells
        for ext in (("jsonl", "meta.json") if step == "generations" else ("jsonl", "json"))
    }


def results_state(work: Path) -> dict[str, tuple[bytes, int]]:
    """(bytes, mtime) of every generation, score and model-card file under results/."""
    root = work / "results"
    paths = [
        *(root / "generations").rglob("*.json*"),
        *(root / "scores").rglob("*.json*"),
        *(root / "models").glob("*/*.json"),
    ]
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in paths}
