"""Names trainers use: `{run_name}_step{N}`, and a final checkpoint saved without a step
(`{run_name}_final`, `final`, `last`), evaluated after the last numbered one and labelled final."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from test_aggregate import write_cell

from ckpteval.checkpoints import discover_checkpoints, unfinished_checkpoints
from ckpteval.config import load_config, validate_config
from ckpteval.errors import UserError
from ckpteval.report import _steps_figure
from ckpteval.report.plots import _finals
from ckpteval.summary import build_summary


def _defaults(tmp_path: Path) -> dict:
    cfg = tmp_path / "defaults.yaml"
    cfg.write_text("runs: {r: {path: run}}\ntasks: {arith: {}}\n")
    config = load_config(cfg)
    validate_config(config)
    return config["runs"]["r"]


def _hf(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    save_file({"w": np.zeros(2, dtype=np.float32)}, str(path / "model.safetensors"))
    return path


def test_run_name_steps_and_a_final_checkpoint_come_in_order(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for name in ("sagemaker-7_step100", "sagemaker-7_step20", "sagemaker-7_final", "notes"):
        _hf(run / name)
    r = _defaults(tmp_path)
    found = discover_checkpoints(run, r["patterns"], final_names=r["final_names"])
    assert [(c.name, c.step, c.final) for c in found] == [
        ("sagemaker-7_step20", 20, False),
        ("sagemaker-7_step100", 100, False),
        ("sagemaker-7_final", 101, True),
    ]
    # Without a numbered checkpoint the final one is step 1; `last` and `final` count too.
    for name in ("final", "last"):
        alone = tmp_path / name / "run"
        _hf(alone / name)
        (ckpt,) = discover_checkpoints(alone, r["patterns"], final_names=r["final_names"])
        assert (ckpt.name, ckpt.step, ckpt.final) == (name, 1, True)


def test_two_final_checkpoints_are_refused_in_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for name in ("step_5", "final", "last"):
        _hf(run / name)
    r = _defaults(tmp_path)
    with pytest.raises(UserError) as err:
        discover_checkpoints(run, r["patterns"], final_names=r["final_names"])
    assert "\n" not in str(err.value)
    assert "final and last are both a final checkpoint" in str(err.value)


def test_a_final_checkpoint_being_written_waits(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _hf(run / "step_5")
    (run / "myrun_final").mkdir()
    (run / "myrun_final" / "model.safetensors.tmp").write_bytes(b"x")
    r = _defaults(tmp_path)
    found = discover_checkpoints(run, r["patterns"], final_names=r["final_names"])
    assert [c.name for c in found] == ["step_5"]
    (u,) = unfinished_checkpoints(run, r["patterns"], final_names=r["final_names"])
    assert u.name == "myrun_final"
    assert u.waiting_line(age=False) == "waiting: being written (model.safetensors.tmp as .tmp)"


def test_check_labels_the_final_checkpoint(tmp_path: Path) -> None:
    for name in ("myrun_step10", "myrun_step5", "myrun_final"):
        _hf(tmp_path / "run" / name)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("runs: {r: {path: run}}\ntasks: {arith: {}}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ckpteval.cli", "check", "--configfile", str(cfg)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "run r: 3 checkpoint(s): myrun_step5, myrun_step10, myrun_final (final, after step 10)"
        in proc.stdout
    )


def test_tables_and_plots_label_the_final_checkpoint(tmp_path: Path) -> None:
    cells = [
        write_cell(tmp_path, "r", name, step, "t", "greedy-s42", metrics={"acc": step / 20})
        for name, step in (("step_5", 5), ("step_10", 10), ("final", 11))
    ]
    summary = build_summary(cells, tmp_path / "summary", finals=["r/final"])
    import pandas as pd

    table = pd.read_parquet(tmp_path / "summary" / "metrics.parquet")
    assert set(table[table["final"]]["ckpt"]) == {"final"}
    assert _finals(summary) == {("r", "final")}
    steps = summary.seeds[summary.seeds["metric"] == "acc"]
    ax = _steps_figure("t", "acc", steps, summary.deltas, set(), _finals(summary)).axes[0]
    labels = [(t.get_text(), t.xy) for t in ax.texts]
    assert len(labels) == 1 and labels[0][0] == "final"
    assert labels[0][1][0] == 11.0  # on the final checkpoint's point, after step 10


def test_a_checkpoint_deleted_in_a_copied_project_is_marked_though_the_original_remains(
    tmp_path: Path,
) -> None:
    """A manifest records its checkpoint's absolute source path; in a copy of the project that
    path is the original's, which still exists. Deleting the checkpoint in the copy must mark it
    deleted there (its scores kept, marked), and the original still has none deleted."""
    from ckpteval.config import build_plan

    original = tmp_path / "original"
    for name in ("step_5", "step_10"):
        _hf(original / "run" / name)
    (original / "c.yaml").write_text("runs: {r: {path: run}}\ntasks: {arith: {}}\n")
    models = original / "results" / "models" / "r"
    models.mkdir(parents=True)
    for name in ("step_5", "step_10"):
        source = str(original / "run" / name)
        (models / f"{name}.json").write_text(f'{{"source": "{source}"}}')
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    shutil.rmtree(copy / "run" / "step_5")

    def deleted(project: Path) -> list[str]:
        config = load_config(project / "c.yaml")
        config["outdir"] = str(project / "results")
        validate_config(config)
        plan = build_plan(config, project)
        return [c.name for c in plan.deleted.get("r", ())]

    assert deleted(copy) == ["step_5"]
    assert deleted(original) == []
