"""A checkpoint being written is shown as waiting, with how far its writer got, never skipped
without a word: in `ckpteval check`, `ckpteval status` and the report."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from test_aggregate import write_cell

from ckpteval.checkpoints import unfinished_checkpoints, writing_progress
from ckpteval.status import add_status_parser
from ckpteval.summary import build_summary

WEIGHTS = {"w": np.zeros(4, dtype=np.float32)}
PATTERNS = ["step_{step}", "global_step_{step}"]


def _hf(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    save_file(WEIGHTS, str(path / "model.safetensors"))
    return path


def _sharded_being_written(path: Path) -> Path:
    """Shard 1 of 2 written, shard 2 still under its temporary name, no index yet."""
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    save_file(WEIGHTS, str(path / "model-00001-of-00002.safetensors"))
    save_file(WEIGHTS, str(path / "model-00002-of-00002.safetensors.tmp"))
    return path


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    for item in [path, *path.rglob("*")]:
        os.utime(item, (then, then))


def test_progress_names_the_first_unfinished_shard_and_how(tmp_path: Path) -> None:
    step = _sharded_being_written(tmp_path / "step_2")
    assert writing_progress(step) == "shard 2 of 2 as .tmp"
    (step / "model-00002-of-00002.safetensors.tmp").unlink()
    assert writing_progress(step) == "shard 2 of 2 not there yet"
    save_file(WEIGHTS, str(step / "model-00002-of-00002.safetensors"))
    data = (step / "model-00002-of-00002.safetensors").read_bytes()
    (step / "model-00002-of-00002.safetensors").write_bytes(data[:-4])
    assert writing_progress(step) == "shard 2 of 2 partly written"

    verl = tmp_path / "global_step_3" / "actor"
    verl.mkdir(parents=True)
    (verl / "fsdp_config.json").write_text('{"FSDP_version": 2, "world_size": 2}')
    import torch

    torch.save({"w": torch.zeros(2)}, verl / "model_world_size_2_rank_0.pt")
    assert writing_progress(verl.parent) == "shard 2 of 2 not there yet"
    torch.save({"w": torch.zeros(2)}, verl / "model_world_size_2_rank_1.pt")
    (verl / "fsdp_config.json").unlink()  # rank 0 writes it after its shard
    assert writing_progress(verl.parent) == "fsdp_config.json not there yet"
    (verl / "fsdp_config.json").write_text('{"FSDP_version": 2, "world_size": 2}')
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    progress = "latest_checkpointed_iteration.txt still says step 2"
    assert writing_progress(verl.parent) == progress  # the trainer has not recorded step 3

    lone = tmp_path / "step_4"
    lone.mkdir()
    (lone / "model.safetensors.tmp").write_bytes(b"x")
    assert writing_progress(lone) == "model.safetensors.tmp as .tmp"


def test_unfinished_line_says_waiting_with_progress_and_age(tmp_path: Path) -> None:
    _sharded_being_written(tmp_path / "step_2")
    _age(tmp_path / "step_2", 3)
    (u,) = unfinished_checkpoints(tmp_path, PATTERNS)
    line = u.waiting_line()
    assert line.startswith("waiting: being written (shard 2 of 2 as .tmp, last change ")
    assert line.endswith(" s ago)") and 2 <= float(line.split("last change ")[1].split()[0]) <= 60
    assert u.waiting_line(age=False) == "waiting: being written (shard 2 of 2 as .tmp)"


def _config(tmp_path: Path) -> Path:
    _hf(tmp_path / "run" / "step_1")
    _sharded_being_written(tmp_path / "run" / "step_2")
    broken = _sharded_being_written(tmp_path / "run" / "step_3")
    _age(broken, 3600)  # unchanged for an hour: broken, not waiting
    cfg = tmp_path / "c.yaml"
    cfg.write_text("outdir: results\nruns: {r: {path: run}}\ntasks: {arith: {}}\n")
    return cfg


def test_check_and_status_show_a_checkpoint_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "ckpteval.cli", "check", "--configfile", str(cfg)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "run r: 1 checkpoint(s): step_1" in proc.stdout
    waiting = [ln for ln in proc.stdout.splitlines() if "step_2" in ln]
    assert len(waiting) == 1, proc.stdout
    assert waiting[0].startswith(
        "run r: checkpoint step_2 waiting: being written (shard 2 of 2 as .tmp, last change "
    )
    assert any("step_3 looks broken" in ln for ln in proc.stdout.splitlines())

    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    add_status_parser(parser.add_subparsers())
    args = parser.parse_args(["status", "--configfile", str(cfg)])
    args.func(args)
    out = capsys.readouterr().out
    assert "run r: checkpoint step_2 waiting: being written (shard 2 of 2 as .tmp" in out
    assert "step_3 looks broken" in out


def test_the_report_lists_checkpoints_being_written(tmp_path: Path) -> None:
    cells = [write_cell(tmp_path, "r", "step_1", 1, "t", "greedy-s42", metrics={"acc": 0.5})]
    line = "run r: checkpoint step_2 waiting: being written (shard 2 of 2 as .tmp)"
    build_summary(cells, tmp_path / "summary", waiting=[line])
    report = (tmp_path / "summary" / "report.html").read_text()
    assert "Checkpoints being written" in report and "shard 2 of 2 as .tmp" in report
