"""The engine side of a parse behind one object (ckpteval.engine.plan.EnginePlan): which cells
each engine job (re)generates, its round, and the generation jobs' edges to it. Reads only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from ckpteval.config import build_plan, validate_config
from ckpteval.engine.plan import EnginePlan
from ckpteval.freshness import Freshness
from ckpteval.plan.layout import CellKey
from ckpteval.verbs import Verbs


def _engines(tmp_path: Path) -> EnginePlan:
    for step in (10, 20):
        d = tmp_path / "run" / f"step_{step}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text("{}")
        save_file({"w": np.zeros(4, dtype=np.float32)}, str(d / "model.safetensors"))
    config = {
        "runs": {"demo": {"path": str(tmp_path / "run")}},
        "tasks": {"arith": {}, "pyfunc": {"engine_group": "code"}},
        "outdir": str(tmp_path / "results"),
        "consolidate": {"smoke": "none"},
    }
    validate_config(config)
    plan = build_plan(config, base_dir=tmp_path)
    return EnginePlan(plan, Freshness(plan), Verbs, "inv-1")  # nothing forced


class Wildcards(dict):
    """Snakemake's wildcards: a mapping whose entries are attributes too."""

    __getattr__ = dict.__getitem__


def _tree(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*")}


def test_a_new_sweep_plans_every_engine_job_and_writes_nothing(tmp_path: Path) -> None:
    engines = _engines(tmp_path)
    before = _tree(tmp_path)
    out = tmp_path / "results"
    assert sorted(engines.targets(["demo"])) == sorted(
        f"{out}/staging/demo/step_{s}/{g}.r1.done" for s in (10, 20) for g in ("main", "code")
    )
    assert engines.rules == {
        "infer": "",
        "endpoint": "",
        "infer_code": "code",
        "endpoint_code": "code",
    }
    inputs = engines.generation_inputs(CellKey("demo", "step_10", "pyfunc", "greedy-s42"))
    assert inputs == {
        "manifest": f"{out}/models/demo/step_10.json",
        "done": f"{out}/staging/demo/step_10/code.r1.done",
    }
    assert engines.request_file("code", Wildcards(run="demo", ckpt="step_10", token="r1")) == (
        f"{out}/staging/demo/step_10/code.r1.request.json"
    )
    assert _tree(tmp_path) == before  # planning read the files and wrote none


def test_a_round_already_on_disk_gives_the_next_token(tmp_path: Path) -> None:
    """An earlier round's done file is kept (it is that job's output): the next engine job of
    that checkpoint and group gets a name no file has."""
    staging = tmp_path / "results" / "staging" / "demo" / "step_20"
    staging.mkdir(parents=True)
    (staging / "main.r3.done").write_text("")
    engines = _engines(tmp_path)
    assert engines.done_file("demo", "step_20", "") == str(staging / "main.r4.done")
    assert engines.done_file("demo", "step_20", "code") == str(staging / "code.r1.done")
    assert engines.done_file("demo", "step_10", "").endswith("step_10/main.r1.done")
