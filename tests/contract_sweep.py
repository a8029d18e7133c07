"""The finished sweep of the rerun-contract tests, shared by tests/test_contract.py (a moved
project, file events), tests/test_contract_verbs.py (every Snakemake verb run for real) and
tests/test_contract_walk.py (every key of the schema changed in turn under `snakemake -n`). The
sweep runs once per pytest run (`shared_sweep`: the first module to ask builds it under a file
lock, in the directory all pytest-xdist workers share); each module works on a copy of its own,
so the three long modules still run on separate workers side by side. This file also holds what
they share besides: the dry run and the jobs that regenerate a set of cells."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import socket
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import dry_snakemake, exclusive, run_snakemake, why_failed
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


def endpoint_on(port: int) -> FakeEndpoint:
    """A FakeEndpoint on loopback `port` (0: a free one), bound with SO_REUSEPORT: the endpoint
    URL is part of the endpoint run's identity, so every copy of the shared sweep serves it at the
    URL it was built with; two workers may do so at once (the answers are a function of the
    request, so which of them answers does not matter)."""

    class Shared(FakeEndpoint):
        def server_bind(self) -> None:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            self.server_address = ("127.0.0.1", port)
            super().server_bind()

    return Shared()


@contextmanager
def shared_sweep(demo_dir: Path, factory: pytest.TempPathFactory, name: str) -> Iterator[Sweep]:
    """A copy of this pytest run's finished sweep in a new directory `name`, and its endpoint.

    The copy keeps every byte and modification time (`shutil.copy2`: real copies, not hard
    links, since tests write files of their sweep in place); its config names the copy's paths,
    so it is also a moved project, which must plan nothing (checked here, before any test). The
    sweep is built in a directory that is renamed afterwards, so each copy is a moved project's
    twin; a checkpoint a test deletes in its copy counts as deleted whether or not the recorded
    source path exists (tests/test_final_names.py checks a copy whose original remains)."""
    base = factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    origin, done = root / "contract-sweep", root / "contract-sweep.done"
    with exclusive(root / "contract-sweep.lock"):
        if not done.exists():
            build = root / "contract-sweep.build"
            for half_done in (build, origin):  # of a build that failed
                shutil.rmtree(half_done, ignore_errors=True)
            build.mkdir()
            with finished_sweep(demo_dir, build, endpoint_on(0)) as built:
                port = int(built.endpoint.server_address[1])
            build.rename(origin)
            done.write_text(json.dumps({"port": port, "built_in": str(build)}))
        recorded = json.loads(done.read_text())
        work = factory.mktemp(name)
        shutil.copytree(origin, work, symlinks=True, dirs_exist_ok=True)
    port = recorded["port"]
    text = (work / "sweep.yaml").read_text().replace(recorded["built_in"], str(work))
    (work / "sweep.yaml").write_text(text)
    config = yaml.safe_load(text)
    full = copy.deepcopy(config)
    validate_config(full)
    with endpoint_on(port) as endpoint:
        sweep = Sweep(work, config, full, endpoint)
        assert planned(sweep, config, "copied") == Counter(), "a copied sweep plans nothing"
        yield sweep


@contextmanager
def finished_sweep(demo_dir: Path, work: Path, server: FakeEndpoint) -> Iterator[Sweep]:
    """Run the sweep in `work` (copies of two demo checkpoints and the base model, `server` as
    the endpoint run's server) and hand it over finished; the server stops when the block ends."""
    steps = sorted((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    for name, ckpt in zip(VLLM_CKPTS, (steps[0], steps[-1])):  # copies: later tests touch,
        shutil.copytree(ckpt, work / "run" / name)  # replace and delete them
    shutil.copytree(demo_dir / "base", work / "base")
    with server as endpoint:
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
        assert proc.returncode == 0, why_failed(proc, work)
        full = copy.deepcopy(config)
        validate_config(full)
        yield Sweep(work, config, full, endpoint)


def planned(
    sweep: Sweep, config: dict[str, Any], name: str = "variant", *args: str
) -> Counter[str]:
    """Jobs per rule that `snakemake -n --configfile <config> ARGS` plans (the target `all` left
    out)."""
    return dry_run(sweep, config, name, *args)[0]


def dry_run(
    sweep: Sweep, config: dict[str, Any], name: str, *args: str
) -> tuple[Counter[str], str]:
    """(jobs per rule, what the dry run printed) of `snakemake -n --configfile <config> ARGS`
    (a verb and its targets), in a forked process (conftest.dry_snakemake: the walk alone makes
    ~100 of them)."""
    path = sweep.work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = dry_snakemake(sweep.work, "-n", "--configfile", str(path), *args)
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
#: The jobs that rebuild the summary: the aggregate job's build, rule summary's publication of it.
SUMMARY_JOBS = Counter({"aggregate": 1, "summary": 1})


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
    return jobs + Counter({"generation": len(cells), "evaluate": len(cells)}) + SUMMARY_JOBS


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
