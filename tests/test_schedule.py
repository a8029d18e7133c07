"""Infer jobs start longest-expected first: the estimate, and the order Snakemake really uses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from conftest import run_snakemake, write_config
from safetensors.numpy import save_file

from ckpteval.config import build_plan, validate_config
from ckpteval.engine.schedule import (
    InferCosts,
    Measurement,
    expected_seconds,
    nearest,
    weight_bytes,
)


def _ckpt(run: Path, name: str, floats: int) -> None:
    d = run / name
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    save_file({"w": np.zeros(floats, dtype=np.float32)}, str(d / "model.safetensors"))


def _meta(out: Path, run: str, ckpt: str, task: str, variant: str, seconds: float) -> None:
    path = out / "generations" / run / ckpt / task / f"{variant}.meta.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"generation_seconds": seconds}))


def test_nearest_prefers_the_same_step_then_the_closest_then_the_earlier() -> None:
    ms = [Measurement(100, 1.0), Measurement(300, 3.0), Measurement(500, 5.0)]
    assert nearest(ms, 300).seconds == 3.0
    assert nearest(ms, 350).seconds == 3.0
    assert nearest(ms, 400).seconds == 3.0  # a tie goes to the earlier step
    assert nearest(ms, 10_000).seconds == 5.0
    assert nearest([], 100) is None


def test_expected_seconds_prices_unmeasured_pairs_at_the_learnt_rate() -> None:
    static = {("a", "g"): 10.0, ("b", "g"): 40.0}
    # Nothing measured: static units, which still order jobs correctly.
    assert expected_seconds(static, {}, 100) == 50.0
    # `a` measured at 20 s for 10 units: 2 s per unit, so `b` is expected to take 80 s.
    measured = {("a", "g"): [Measurement(100, 20.0)]}
    assert expected_seconds(static, measured, 200) == 20.0 + 80.0


def test_weight_bytes_counts_weight_files_only(tmp_path: Path) -> None:
    _ckpt(tmp_path, "c", 1000)
    (tmp_path / "c" / "tokenizer.json").write_text("x" * 10_000)
    assert weight_bytes(tmp_path / "c") == (tmp_path / "c" / "model.safetensors").stat().st_size
    assert weight_bytes(tmp_path / "missing") == 0


def _plan(tmp_path: Path, out: Path):
    for name, floats in (("step_100", 1000), ("step_200", 1000)):
        _ckpt(tmp_path / "small", name, floats)
    _ckpt(tmp_path / "big", "step_100", 4000)
    config = {
        "runs": {
            "small": {"path": str(tmp_path / "small")},
            "big": {"path": str(tmp_path / "big")},
        },
        "tasks": {"arith": {"limit": 10}, "pyfunc": {"limit": 5}},
        "sampling": {"greedy": {"temperature": 0.0, "max_new_tokens": 64}},
        "outdir": str(out),
    }
    validate_config(config)
    return build_plan(config)


def test_a_bigger_model_is_expected_to_take_longer_and_measurements_override(
    tmp_path: Path,
) -> None:
    out = tmp_path / "results"
    plan = _plan(tmp_path, out)
    pairs = [("arith", "greedy-s42"), ("pyfunc", "greedy-s42")]
    costs = InferCosts(plan)
    small, big = costs("small", "step_100", pairs), costs("big", "step_100", pairs)
    assert big > 3.5 * small  # 4x the weight bytes (less the safetensors header)

    # An earlier sweep measured arith of `small` at step_100: step_200 is priced from its nearest
    # step, and pyfunc (unmeasured) at the rate that measurement implies.
    _meta(out, "small", "step_100", "arith", "greedy-s42", 30.0)
    costs = InferCosts(plan)
    arith_units = 10 * 64 * weight_bytes(tmp_path / "small" / "step_100") / 1e9
    pyfunc_units = 5 * 64 * weight_bytes(tmp_path / "small" / "step_200") / 1e9
    expected = 30.0 + pyfunc_units * (30.0 / arith_units)
    assert abs(costs("small", "step_200", pairs) - expected) < 1e-9


def test_snakemake_gives_each_infer_job_its_expected_seconds_as_priority(tmp_path: Path) -> None:
    """A dry run of the real workflow: the longest expected infer job has the highest priority."""
    workdir = tmp_path / "work"
    plan = _plan(tmp_path, workdir / "results")
    config = {k: plan.config[k] for k in ("runs", "tasks", "sampling")}
    write_config(workdir, config)
    result = run_snakemake(workdir, "-n", "--cores", "1", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout + result.stderr
    priority: dict[str, dict[tuple[str, str], float]] = {"infer": {}, "consolidate": {}}
    for block in text.split("\n\n"):
        rule = re.search(r"rule (infer|consolidate):", block)
        if rule:
            run, ckpt = re.search(r"wildcards: run=(\w+), ckpt=(\w+)", block).groups()
            priority[rule.group(1)][(run, ckpt)] = float(
                re.search(r"priority: (\S+)", block).group(1)
            )
    assert set(priority["infer"]) == {
        ("small", "step_100"),
        ("small", "step_200"),
        ("big", "step_100"),
    }
    assert max(priority["infer"], key=priority["infer"].__getitem__) == ("big", "step_100")
    # One engine group: a checkpoint's consolidation carries its infer job's priority.
    assert priority["consolidate"] == priority["infer"]
