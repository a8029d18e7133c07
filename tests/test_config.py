"""Config validation, checkpoint discovery and task resolution: every mistake is one clear line."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import path_without
from safetensors.numpy import save_file

from ckpteval.checkpoints import discover_checkpoints, pattern_regex
from ckpteval.cli import main
from ckpteval.config import build_plan, validate_config
from ckpteval.errors import UserError


def _ckpt(run: Path, name: str, complete: bool = True) -> Path:
    d = run / name
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    weights = {"w": np.zeros(4, dtype=np.float32)}
    save_file(weights, str(d / "model.safetensors"))
    if not complete:  # a trainer mid-write: the file is shorter than its header says
        data = (d / "model.safetensors").read_bytes()
        (d / "model.safetensors").write_bytes(data[:-4])
    return d


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    for name in ("step_100", "step_20", "checkpoint-300"):
        _ckpt(run, name)
    _ckpt(run, "step_400", complete=False)  # still being written
    (run / "logs").mkdir()
    (run / "step_x").mkdir()
    return run


def _config(run_dir: Path, **extra: Any) -> dict[str, Any]:
    return {"runs": {"r1": {"path": str(run_dir)}}, "tasks": {"arith": None}, **extra}


def test_defaults_are_filled_and_checkpoints_ordered_by_step(run_dir: Path) -> None:
    config = _config(run_dir)
    validate_config(config)
    assert config["engine"]["max_model_len"] == 4096
    assert config["engine"]["gpu_memory_utilization"] == 0.8
    assert config["engine"]["seed"] == 42
    assert config["seeds"] == [42]
    plan = build_plan(config)
    ckpts = plan.runs["r1"].checkpoints
    assert [(c.name, c.step) for c in ckpts] == [
        ("step_20", 20),
        ("step_100", 100),
        ("checkpoint-300", 300),
    ]
    assert plan.task_variants == {"arith": ("greedy-s42",)}
    assert len(plan.cell_keys) == 3


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda c: c["runs"]["r1"].update(path=5),
            "config: runs.r1.path: 5 is not of type 'string'",
        ),
        (lambda c: c.update(bogus=1), "config: (top level): Additional properties are not allowed"),
        (
            lambda c: c["runs"]["r1"].update(patterns=["ckpt"]),
            "must contain the placeholder {step}",
        ),
        (lambda c: c.update(engine={"gpu_memory_utilization": 2}), "engine.gpu_memory_utilization"),
        (lambda c: c.update(seeds=[]), "config: seeds:"),
        (lambda c: c.pop("tasks"), "'tasks' is a required property"),
        # the aggregate job could not build a summary with it: one line before any job
        (lambda c: c.update(aggregate={"bootstrap": 0}), "config: aggregate.bootstrap: 0 is less"),
    ],
)
def test_schema_errors_are_one_line_naming_the_key(
    run_dir: Path, mutate: Any, expected: str
) -> None:
    config = _config(run_dir)
    mutate(config)
    with pytest.raises(UserError) as err:
        validate_config(config)
    message = str(err.value)
    assert expected in message
    assert "\n" not in message


def test_missing_run_dir_and_unknown_task_name_the_key(run_dir: Path, tmp_path: Path) -> None:
    config = _config(tmp_path / "nope")
    validate_config(config)
    with pytest.raises(UserError, match=r"runs\.r1\.path: .*nope is not a directory"):
        build_plan(config)
    config = _config(run_dir)
    config["tasks"] = {"gsm9k": {}}
    validate_config(config)
    with pytest.raises(UserError, match=r"tasks\.gsm9k: unknown task; built-in tasks are .*arith"):
        build_plan(config)


def test_harness_tasks_sampling_and_tensor_parallel(run_dir: Path) -> None:
    config = _config(
        run_dir,
        tasks={"gsm8k": {"harness": "gsm8k", "num_fewshot": 5}, "arith": {"sampling": ["hot"]}},
        sampling={"greedy": {}, "hot": {"temperature": 0.6, "n": 4}},
        seeds=[1, 2],
    )
    validate_config(config)
    plan = build_plan(config)
    assert plan.tasks["gsm8k"].kind == "harness"
    # Greedy decoding runs once (labelled with engine.seed); sampled configs once per seed.
    assert plan.task_variants["gsm8k"] == ("greedy-s42", "hot-s1", "hot-s2")
    assert plan.task_variants["arith"] == ("hot-s1", "hot-s2")
    config["engine"]["seed"] = 7
    assert build_plan(config).task_variants["gsm8k"] == ("greedy-s7", "hot-s1", "hot-s2")
    bad = copy.deepcopy(config)
    bad["tasks"]["arith"]["sampling"] = ["cold"]
    with pytest.raises(UserError, match=r"tasks\.arith\.sampling: 'cold' is not a sampling config"):
        build_plan(bad)
    config["engine"] = {"tensor_parallel_size": 2}
    validate_config(config)
    with pytest.raises(UserError, match="tensor_parallel_size: 2 > 1 changes scores"):
        build_plan(config)


def test_discovery_marker_duplicate_steps_and_patterns(run_dir: Path) -> None:
    assert pattern_regex("global_step{step}").match("global_step12").group(1) == "12"
    assert pattern_regex("step_{step}").match("step_12x") is None
    (run_dir / "step_100" / "DONE").write_text("")
    found = discover_checkpoints(run_dir, ["step_{step}"], marker="DONE")
    assert [c.name for c in found] == ["step_100"]
    _ckpt(run_dir, "checkpoint-100")
    with pytest.raises(UserError, match="checkpoint-100 and step_100 are both step 100"):
        discover_checkpoints(run_dir, ["step_{step}", "checkpoint-{step}"])


def test_bare_torch_files_are_checkpoints_once_fully_written(tmp_path: Path) -> None:
    """A trainer that saves `step_N.pt` files: each complete one is checkpoint `step_N`, pointing
    at the file; one still being written (no zip end record) waits; other files are ignored."""
    import torch

    run = tmp_path / "run"
    run.mkdir()
    for step in (50, 150):
        torch.save({"model": {"w": torch.zeros(4)}, "step": step}, run / f"step_{step}.pt")
    data = (run / "step_150.pt").read_bytes()
    (run / "step_150.pt").write_bytes(data[: len(data) // 2])  # mid-write
    (run / "step_200.log").write_text("not a checkpoint")
    _ckpt(run, "step_100")
    found = discover_checkpoints(run, ["step_{step}"])
    assert [(c.name, c.step, c.path.name) for c in found] == [
        ("step_50", 50, "step_50.pt"),
        ("step_100", 100, "step_100"),
    ]
    torch.save({"w": torch.zeros(4)}, run / "step_100.pth")
    with pytest.raises(UserError, match="step_100 and step_100.pth are both step 100"):
        discover_checkpoints(run, ["step_{step}"])


def test_checkpoint_lookup_and_cells_are_computed_once_yet_answer_like_a_scan(
    tmp_path: Path,
) -> None:
    """The plan indexes its checkpoints and cells once (input functions ask per job): every
    lookup, a deleted checkpoint's included, answers what a scan of the runs would, an unknown
    name is one line, and the cells (with their steps) are read-only, shared by every caller."""
    import dataclasses

    for step in (10, 20, 30):
        (tmp_path / "run" / f"step_{step}").mkdir(parents=True)
        (tmp_path / "run" / f"step_{step}" / "DONE").touch()
    cfg = {
        "runs": {"a": {"path": str(tmp_path / "run"), "complete_marker": "DONE"}},
        "tasks": {"arith": {}, "pyfunc": {}},
        "sampling": {"greedy": {"temperature": 0.0}},
    }
    validate_config(cfg)
    plan = build_plan(cfg, base_dir=tmp_path)
    gone = dataclasses.replace(plan.runs["a"].checkpoints[0], name="step_5", step=5, deleted=True)
    plan = dataclasses.replace(plan, deleted={"a": (gone,)})
    scan = [*plan.runs["a"].checkpoints, gone]
    for ckpt in scan:
        assert plan.checkpoint("a", ckpt.name) is ckpt
    for run, name in (("a", "step_40"), ("b", "step_10")):
        with pytest.raises(UserError) as error:
            plan.checkpoint(run, name)
        assert "\n" not in str(error.value) and name in str(error.value)
    assert [(c.ckpt, c.task) for c in plan.cell_keys] == [
        (c.name, t) for c in plan.runs["a"].checkpoints for t in ("arith", "pyfunc")
    ]
    assert list(plan.cell_steps.values()) == [c.step for c in scan[:3] for _ in range(2)]
    with pytest.raises(TypeError):  # shared by every caller: read-only
        plan.cell_steps[plan.cell_keys[0]] = 0  # type: ignore[index]
    assert plan.score_files()[0].endswith("/a/step_10/arith/greedy-s42.json")


@pytest.mark.parametrize(
    ("where", "key"),
    [
        ({"tasks": {"val": {"data": {"val_files": "val.parquet"}}}}, "tasks.val.data.val_files"),
        ({"tasks": {"val": {"data.val_files": ["a.parquet"]}}}, "tasks.val.data.val_files"),
        ({"tasks": {"val": {"val_files": "val.parquet"}}}, "tasks.val.val_files"),
        ({"data": {"val_files": "val.parquet"}}, "data.val_files"),
    ],
)
def test_verls_val_files_points_at_problems(run_dir: Path, where: dict[str, Any], key: str) -> None:
    """A verl user pastes `data.val_files` from the trainer's config: one line naming the key
    ckpteval reads the same files from, instead of "not a known key"."""
    config = {**_config(run_dir), **where}
    with pytest.raises(UserError) as err:
        validate_config(config)
    message = str(err.value)
    task = "tasks.val." if key.startswith("tasks.") else "tasks.<name>."
    assert message.startswith(f"config: {key}: verl's key; ")
    assert f"{task}problems: one file" in message
    assert "\n" not in message


@pytest.mark.needs("rustc", "g++")  # and plans them where they are installed
def test_an_optional_task_is_left_out_in_one_line_where_its_checkers_program_is_missing(
    run_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The demo's Rust task on a machine without rustc (a user who cannot install it): marked
    optional, it leaves the plan with one line; asked for plainly, it stays (its evaluate job
    fails naming rustc), so a task a user asked for never silently gives nothing."""
    tasks = {
        "arith": {},
        "rustfunc": {"optional": True},
        "stdio_demo": {"language": "cpp", "optional": True},
    }
    config = _config(run_dir, tasks=copy.deepcopy(tasks))
    validate_config(config)
    here = build_plan(config)  # this machine has rustc and g++: everything runs
    assert list(here.tasks) == ["arith", "rustfunc", "stdio_demo"] and here.left_out == ()

    monkeypatch.setenv("PATH", path_without(tmp_path / "bin", "rustc", "g++"))
    plan = build_plan(config)
    assert list(plan.tasks) == list(plan.task_variants) == ["arith"]
    assert {c.task for c in plan.cell_keys} == {"arith"}
    assert plan.left_out == (
        "task rustfunc left out: it is optional and its checker runs rustc, not found on PATH; "
        "install rustc (Debian: sudo apt-get install rustc) to run it",
        "task stdio_demo left out: it is optional and its checker runs g++, not found on PATH; "
        "install g++ (Debian: sudo apt-get install g++) to run it",
    )
    # `ckpteval check` and `status` read the same plan, and say the same line.
    path = tmp_path / "config.yaml"
    outdir = str(tmp_path / "results")
    path.write_text(yaml.safe_dump(_config(run_dir, tasks=copy.deepcopy(tasks), outdir=outdir)))
    for verb in ("check", "status"):
        main([verb, "--configfile", str(path)])
        said = capsys.readouterr().out.splitlines()
        assert [f"warning: {line}" for line in plan.left_out] == [
            line for line in said if "left out" in line
        ], said
    # A Piston server compiles C++ itself; a Rust task not marked optional stays.
    config = _config(
        run_dir,
        tasks={**copy.deepcopy(tasks), "rustfunc": {}},
        evaluate={"piston_url": "http://127.0.0.1:9/"},
    )
    validate_config(config)
    plan = build_plan(config)
    assert list(plan.tasks) == ["arith", "rustfunc", "stdio_demo"] and plan.left_out == ()
    # Whether a task is optional is no part of what it asks: its identity is the same.
    assert plan.tasks["rustfunc"].config_hash() == here.tasks["rustfunc"].config_hash()
    only = _config(run_dir, tasks={"rustfunc": {"optional": True}})
    validate_config(only)
    with pytest.raises(UserError, match=r"^config: tasks: every task is left out \(task rustfunc"):
        build_plan(only)


def test_a_rust_task_asked_for_without_rustc_fails_naming_it(tmp_path: Path) -> None:
    """What the evaluate job of a Rust task not marked optional says on a machine without
    rustc (in a process of its own: the toolchain's path is cached per process)."""
    done = subprocess.run(
        [sys.executable, "-c", "from ckpteval.checkers import get_checker; get_checker('rust')"],
        env={**os.environ, "PATH": path_without(tmp_path / "bin", "rustc")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "rust checker: rustc not usable" in done.stderr.splitlines()[-1]


def test_an_unreadable_config_is_one_line_naming_where(tmp_path: Path) -> None:
    """A directory, bytes that are not UTF-8, and a YAML error, which names the line and column
    where the parser gave up (before: a traceback, or "while parsing a flow mapping" alone)."""
    from ckpteval.config import load_config

    (tmp_path / "latin1.yaml").write_bytes(b"runs: {r: {path: caf\xe9}}\n")
    (tmp_path / "bad.yaml").write_text("runs:\n  r: {path: run\ntasks: {arith: {}}\n")
    for name, expected in [
        (".", "a directory; give the config's YAML file"),
        ("latin1.yaml", "unreadable ('utf-8' codec can't decode"),
        ("bad.yaml", "not valid YAML at line 3, column 6: expected ',' or '}'"),
    ]:
        with pytest.raises(UserError) as caught:
            load_config(tmp_path / name)
        assert expected in str(caught.value) and "\n" not in str(caught.value)
    assert "(while parsing a flow mapping from line 2)" in str(caught.value)
