"""A moved or copied project keeps every identity; a changed byte of what a setting names does not.

Every setting that names files (`runs.*.base_model`, `runs.*.chat_template`, `runs.*.solutions`,
`tasks.*.problems`, `lm_eval.include_paths`) counts in identities by content (ckpteval.content).
Here a small project is built on disk, its identities taken, then it is copied (`cp -a`) and
moved, with the config's absolute paths updated: every identity of every job is the same. One
changed byte of each named file changes the identities the contract says it should. The same on
a real finished sweep with `snakemake -n`: tests/test_contract.py, "a moved project".
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REPO
from safetensors.numpy import save_file

import ckpteval.content as content
from ckpteval.config import build_plan, validate_config
from ckpteval.contract import generation_identity, model_identity, scoring_identity
from ckpteval.plan.layout import CellKey

PYFUNC = REPO / "src" / "ckpteval" / "data" / "tasks" / "pyfunc.jsonl"
TASKS = ("arith", "mine", "arith_harness")


def make_project(root: Path) -> None:
    """A vllm run with a base model (a weights file above the always-hashed size), a chat
    template file, a problem file, an lm-eval include path, and a replay run's solutions."""
    ckpt = root / "run" / "step_1"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    save_file({"w": np.zeros(2, dtype=np.float32)}, str(ckpt / "model.safetensors"))
    base = root / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (base / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512}))
    weights = np.arange(2 * content.ALWAYS_HASH_BYTES // 4, dtype=np.float32)
    save_file({"w": weights}, str(base / "model.safetensors"))
    (root / "template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    shutil.copy(PYFUNC, root / "problems.jsonl")
    (root / "lmeval").mkdir()
    (root / "lmeval" / "mine.yaml").write_text("task: mine_harness\n")
    (root / "sols").mkdir()
    for task in TASKS:
        (root / "sols" / f"{task}.jsonl").write_text(json.dumps({"task_id": "x"}) + "\n")
    (root / "results").mkdir()


def project_config(root: Path) -> dict[str, Any]:
    config = {
        "outdir": str(root / "results"),
        "runs": {
            "demo": {
                "path": str(root / "run"),
                "base_model": str(root / "base"),
                "chat_template": str(root / "template.jinja"),
            },
            "rep": {"backend": "replay", "solutions": str(root / "sols")},
        },
        "tasks": {
            "arith": {"chat_template": True},
            "mine": {"problems": str(root / "problems.jsonl"), "checker": "python"},
            "arith_harness": {"limit": 2},
        },
        "lm_eval": {"include_paths": [str(root / "lmeval")]},
    }
    validate_config(config)
    return config


def identities(root: Path) -> dict[str, str]:
    """Every job identity of the project at `root` (a fresh parse), by job."""
    plan = build_plan(project_config(root), base_dir=root)
    out = {}
    for run in plan.runs.values():
        for ckpt in run.checkpoints:
            out[f"model {run.name}/{ckpt.name}"] = model_identity(plan, run.name, ckpt.name).text
            for task, variants in plan.task_variants.items():
                for variant in variants:
                    cell = f"{run.name}/{ckpt.name}/{task}/{variant}"
                    out[f"generation {cell}"] = generation_identity(
                        plan, run.name, task, variant
                    ).text
                    out[f"scoring {cell}"] = scoring_identity(plan, run.name, task, variant).text
                    if run.solutions is not None:  # a replay cell's files (its job's param)
                        key = CellKey(run.name, ckpt.name, task, variant)
                        out[f"solutions {cell}"] = str(plan.solutions_id(key))
    return out


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "first"
    make_project(root)
    return root


def test_no_identity_holds_a_path(project: Path) -> None:
    ids = identities(project)
    assert len(ids) == 2 + 2 * 2 * len(TASKS) + len(TASKS)
    assert not [job for job, text in ids.items() if str(project) in text]


def test_a_copied_and_then_moved_project_keeps_every_identity(
    project: Path, tmp_path: Path
) -> None:
    before = identities(project)
    copied = tmp_path / "copied"
    shutil.copytree(project, copied, symlinks=True)  # `cp -a`: times kept, new inodes
    assert identities(copied) == before
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    copied.rename(moved)
    assert identities(moved) == before
    shutil.rmtree(project)  # the first location gone: still the same jobs
    assert identities(moved) == before


def _append_byte(path: Path) -> None:
    """One more byte (a space: JSON and YAML stay valid), with the file's times restored."""
    st = path.stat()
    path.write_bytes(path.read_bytes() + b" ")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _new_weights(path: Path) -> None:
    """Other weights of the same size, written as a trainer would (a new mtime)."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _first_problem_only(path: Path) -> None:
    path.write_text(path.read_text().splitlines()[0] + "\n")


def _cells(task: str, runs: tuple[str, ...] = ("demo", "rep")) -> set[str]:
    ckpts = {"demo": "demo/step_1", "rep": "rep/step_0"}
    return {f"generation {ckpts[run]}/{task}/greedy-s42" for run in runs}


# (file, how it changes, the jobs whose identity changes)
CHANGES: list[tuple[str, Callable[[Path], None], set[str]]] = [
    ("base/tokenizer_config.json", _append_byte, {"model demo/step_1"}),
    ("base/config.json", _append_byte, {"model demo/step_1"}),
    ("base/model.safetensors", _new_weights, {"model demo/step_1"}),
    ("template.jinja", _append_byte, _cells("arith", ("demo",))),
    # The problems are what a cell is scored against too: its scoring identity holds the
    # task's content (ckpteval.jobs builds the task from it), so its evaluate job reruns as well.
    (
        "problems.jsonl",
        _first_problem_only,
        _cells("mine") | {c.replace("generation", "scoring") for c in _cells("mine")},
    ),
    # a replay cell's own files: that cell alone (before, the run's model card, so every cell)
    ("sols/arith.jsonl", _append_byte, {"solutions rep/step_0/arith/greedy-s42"}),
    ("lmeval/mine.yaml", _append_byte, _cells("arith_harness")),
]


@pytest.mark.parametrize(("name", "change", "jobs"), CHANGES, ids=[c[0] for c in CHANGES])
def test_a_changed_byte_of_a_named_file_changes_exactly_its_jobs_identities(
    project: Path, name: str, change: Callable[[Path], None], jobs: set[str]
) -> None:
    before = identities(project)
    change(project / name)
    after = identities(project)
    assert {job for job in before if before[job] != after[job]} == jobs


def test_a_large_file_is_hashed_once_and_not_again_after_a_copy(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed: list[str] = []
    real = content.sha256_file

    def counting(path: Any, *args: Any) -> str:
        hashed.append(Path(path).name)
        return real(path, *args)

    monkeypatch.setattr(content, "sha256_file", counting)
    identities(project)
    assert hashed.count("model.safetensors") == 1
    memo = json.loads((project / "results" / "sources" / "content.json").read_text())
    assert list(memo["runs.demo.base_model"]) == ["model.safetensors"]
    hashed.clear()
    identities(project)  # a second parse: the small files only
    assert "model.safetensors" not in hashed and "tokenizer_config.json" in hashed
    copied = tmp_path / "copied"
    shutil.copytree(project, copied)
    hashed.clear()
    identities(copied)
    assert "model.safetensors" not in hashed
    _new_weights(copied / "base" / "model.safetensors")
    hashed.clear()
    identities(copied)
    assert hashed.count("model.safetensors") == 1


def test_a_new_project_has_no_memo_written(tmp_path: Path) -> None:
    """`ckpteval check` before the first run must not create the outdir."""
    root = tmp_path / "p"
    make_project(root)
    shutil.rmtree(root / "results")
    identities(root)
    assert not (root / "results").exists()
