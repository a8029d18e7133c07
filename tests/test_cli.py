"""The `ckpteval` command: subcommands are wired, user mistakes are one line with exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file


def _ckpteval(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckpteval.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_lists_checkpoints_and_cells(tmp_path: Path) -> None:
    for step in (5, 10):
        d = tmp_path / "run" / f"step_{step}"
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
        save_file({"w": np.zeros(2, dtype=np.float32)}, str(d / "model.safetensors"))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "runs: {r: {path: run}}\ntasks: {arith: {}, pyfunc: {}}\nseeds: [1, 2]\n"
        "sampling: {greedy: {}, hot: {temperature: 0.7}}\n"
    )
    proc = _ckpteval("check", "--configfile", str(cfg), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "run r: 2 checkpoint(s): step_5, step_10" in proc.stdout
    # Greedy decoding runs once (labelled with engine.seed), sampled configs once per seed.
    assert (
        "task pyfunc: generate, checker python, variants greedy-s42, hot-s1, hot-s2" in proc.stdout
    )
    assert "12 cells" in proc.stdout


def test_mistakes_are_one_line_with_status_2(tmp_path: Path) -> None:
    proc = _ckpteval("check", "--configfile", "nope.yaml", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "ckpteval: error: nope.yaml: config file not found"
    proc = _ckpteval("status", "--configfile", "nope.yaml", cwd=tmp_path)  # given: no hint
    assert proc.stderr.strip() == "ckpteval: error: nope.yaml: config file not found"
    proc = _ckpteval("status", cwd=tmp_path)  # the default, missing: say how to name another
    assert proc.stderr.strip().endswith(
        "config/config.yaml: config file not found; pass --configfile"
    )
    (tmp_path / "bad.yaml").write_text("runs: [1, 2\n")
    proc = _ckpteval("check", "--configfile", "bad.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "bad.yaml: not valid YAML" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = _ckpteval("--help", cwd=tmp_path)
    assert all(
        cmd in proc.stdout for cmd in ("check", "score", "status", "watch", "publish", "compare")
    )


def test_a_wrong_train_logs_path_is_one_line_at_check(tmp_path: Path) -> None:
    """`runs.<run>.train_logs.path` is checked with the rest of the config (not first by the
    aggregate job): a path that does not exist, then one that holds no log file."""
    (tmp_path / "run" / "step_5").mkdir(parents=True)
    save_file({"w": np.zeros(2, dtype=np.float32)}, str(tmp_path / "run/step_5/model.safetensors"))
    (tmp_path / "run" / "step_5" / "config.json").write_text("{}")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("runs: {r: {path: run, train_logs: {path: logs/exq}}}\ntasks: {arith: {}}\n")
    proc = _ckpteval("check", "--configfile", str(cfg), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"ckpteval: error: config: runs.r.train_logs.path: {tmp_path}/logs/exq does not exist; "
        "point it at the trainer's log directory (TensorBoard event files or verl's file-logger "
        "JSONL)"
    )
    (tmp_path / "logs" / "exq").mkdir(parents=True)
    proc = _ckpteval("check", "--configfile", str(cfg), cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "config: runs.r.train_logs.path: no TensorBoard event file" in proc.stderr
    (tmp_path / "logs" / "exq" / "val.jsonl").write_text('{"step": 5, "acc": 0.5}\n')
    proc = _ckpteval("check", "--configfile", str(cfg), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_each_subcommand_parses_with_only_its_own_module_imported() -> None:
    """`ckpteval status` (scripts call it in a loop) imports status's module, not compare's or
    the scorers'; every subcommand's name is the one its module registers, and the top-level
    help still lists them all."""
    code = (
        "import sys\n"
        "from ckpteval.cli import _PLUGGED, build_parser\n"
        "build_parser('status').parse_args(['status'])\n"
        "print(sorted(m for m in ('ckpteval.compare', 'ckpteval.cli_score', 'ckpteval.gate') "
        "if m in sys.modules))\n"
        "for name in _PLUGGED:\n"
        "    sub = build_parser(name)._subparsers._group_actions[0]\n"
        "    assert name in sub.choices, name\n"
        "print(sorted(build_parser()._subparsers._group_actions[0].choices))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0] == "[]"
    assert out[1] == str(
        sorted(
            ["aggregate", "best", "check", "compare", "gate", "publish", "score", "status", "watch"]
        )
    )
