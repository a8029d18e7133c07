"""Competitive programming inside the workflow, end to end with real Snakemake: solution files
that already exist, a directory per checkpoint, judged on stdin/stdout in the local sandbox and
through Piston (tests/piston_standin.py on loopback) with the same verdicts; and the demo model
generating for the bundled stdio task on vLLM."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import run_snakemake, small_config, write_config
from piston_standin import PistonStandin

RIGHT = {
    "stdio_demo/0": "a, b = map(int, input().split())\nprint(a + b)\n",
    "stdio_demo/1": "input()\nprint(max(map(int, input().split())))\n",
    "stdio_demo/2": "n = int(input())\nprint(n, 0)\n",  # another right answer: the checker program
    "stdio_demo/3": "input()\nxs = list(map(int, input().split()))\nprint(sum(xs) / len(xs))\n",
    "stdio_demo/4": "n = int(input())\na, b = 0, 1\nfor _ in range(n):\n"
    "    a, b = b, (a + b) % 1000000007\nprint(a)\n",
}
#: Kept where a verdict is compared between the two judges (timings and stderr differ).
VERDICT_FIELDS = (
    "task_id",
    "sample_idx",
    "source_file",
    "passed",
    "error_type",
    "compile_ok",
    "first_failed_test",
    "first_failed_set",
    "official_passed",
    "generated_passed",
)


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _solutions(root: Path) -> None:
    """model_solution_r/checkpoint_<step>/ as users' scripts leave them: several files per
    checkpoint, in subdirectories too, fenced or bare code."""
    ckpt = root / "checkpoint_100"
    _write(
        ckpt / "part1.jsonl",
        [
            {"task_id": "stdio_demo/0", "completion": f"```python\n{RIGHT['stdio_demo/0']}```"},
            {"task_id": "stdio_demo/1", "completion": "input()\nprint(7)\n"},  # passes test 0 only
            {"task_id": "stdio_demo/2", "completion": RIGHT["stdio_demo/2"]},
        ],
    )
    _write(
        ckpt / "more" / "part2.jsonl",
        [
            {"task_id": "stdio_demo/3", "completion": "print(1 +)\n"},  # does not compile
            {
                "task_id": "stdio_demo/4",  # right on the official tests, wrong on the last generated
                "completion": "n = int(input())\nprint(0 if n == 0 else 55 if n == 10 else 1)\n",
            },
            {"task_id": "stdio_demo/0", "completion": "raise SystemExit(3)\n"},
        ],
    )
    _write(
        root / "checkpoint_200" / "all.jsonl",
        [{"task_id": tid, "completion": code} for tid, code in RIGHT.items()],
    )


def _sweep(work: Path, solutions: Path, **evaluate: Any) -> subprocess.CompletedProcess[str]:
    write_config(
        work,
        {
            "runs": {"r": {"backend": "replay", "solutions": str(solutions)}},
            "tasks": {"stdio_demo": {}},
            "sampling": {"greedy": {"temperature": 0.0}},
            "evaluate": {"workers": 2, "timeout": 10, **evaluate},
        },
    )
    return run_snakemake(work)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_per_checkpoint_solution_files_judged_locally_and_by_piston_alike(tmp_path: Path) -> None:
    solutions = tmp_path / "model_solution_r"
    _solutions(solutions)
    local, remote = tmp_path / "local", tmp_path / "piston"
    proc = _sweep(local, solutions)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with PistonStandin() as piston:
        proc = _sweep(remote, solutions, piston_url=piston.url)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert len(piston.requests) >= 10  # the solutions really ran there

    verdicts = {}
    for work in (local, remote):
        verdicts[work.name] = {
            ckpt: [
                {k: line.get(k) for k in VERDICT_FIELDS}
                for line in _lines(work / "results/scores/r" / ckpt / "stdio_demo/greedy-s42.jsonl")
            ]
            for ckpt in ("step_100", "step_200")
        }
    assert verdicts["local"] == verdicts["piston"]
    first = {(v["task_id"], v["sample_idx"]): v for v in verdicts["local"]["step_100"]}
    # files in path order, samples numbered on across them
    assert first["stdio_demo/0", 0]["error_type"] == "runtime_error"
    assert first["stdio_demo/0", 0]["source_file"] == "more/part2.jsonl"
    assert (
        first["stdio_demo/0", 1]["passed"]
        and first["stdio_demo/0", 1]["source_file"] == "part1.jsonl"
    )
    assert (
        first["stdio_demo/1", 0]["first_failed_set"],
        first["stdio_demo/1", 0]["first_failed_test"],
    ) == ("official", 1)
    assert first["stdio_demo/2", 0]["passed"]  # accepted by the problem's checker program
    assert first["stdio_demo/3", 0]["error_type"] == "compile_error"
    assert (
        first["stdio_demo/4", 0]["first_failed_set"],
        first["stdio_demo/4", 0]["first_failed_test"],
        first["stdio_demo/4", 0]["official_passed"],
    ) == ("generated", 2, True)
    assert all(v["passed"] for v in verdicts["local"]["step_200"])

    cell = json.loads((local / "results/scores/r/step_100/stdio_demo/greedy-s42.json").read_text())
    assert cell["per_file"] == {
        "more/part2.jsonl": {"n_samples": 3, "n_passed": 0, "n_problems": 3, "pass_rate": 0.0},
        "part1.jsonl": {"n_samples": 3, "n_passed": 2, "n_problems": 3, "pass_rate": 2 / 3},
    }
    metrics = cell["metrics"]
    assert metrics["official_tests_pass_rate"]["value"] == pytest.approx(3 / 6)
    assert metrics["generated_tests_pass_rate"]["value"] == pytest.approx(2 / 3)

    summary = json.loads((local / "results/summary/summary.json").read_text())
    run = summary["runs"]["r"]
    assert list(run) == ["step_100", "step_200"] and run["step_200"]["step"] == 200
    entry = run["step_100"]["tasks"]["stdio_demo"]["greedy-s42"]
    assert entry["n_problems"] == 5 and entry["n_samples"] == 6 and entry["n_passed"] == 2
    assert entry["problems"]["stdio_demo/1"] == {
        "samples": 1,
        "passed": 0,
        "verdict": "wrong_answer",
        "first_failed_test": 1,
        "first_failed_set": "official",
    }
    assert run["step_200"]["tasks"]["stdio_demo"]["greedy-s42"]["pass_rate"] == 1.0
    table = pd.read_parquet(local / "results/summary/metrics.parquet")
    rates = table[table.metric == "official_tests_pass_rate"].sort_values("step")
    assert list(rates["value"]) == pytest.approx([0.5, 1.0])  # a curve over checkpoints
    again = run_snakemake(local, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr


def test_replay_refuses_task_ids_the_task_does_not_have(tmp_path: Path) -> None:
    solutions = tmp_path / "sol"
    _write(
        solutions / "checkpoint_5" / "a.jsonl",
        [
            {"task_id": "stdio_demo/0", "completion": "print(1)"},
            {"task_id": "cf/1", "completion": "print(1)"},
        ],
    )
    proc = _sweep(tmp_path / "w", solutions)
    assert proc.returncode != 0
    assert (
        "a.jsonl: 1 line(s) name task_ids that task stdio_demo does not have (first: "
        "'cf/1' (line 2))" in proc.stderr
    )
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_the_demo_model_generates_for_the_bundled_stdio_task(
    demo_dir: Path, tmp_path: Path
) -> None:
    """vLLM on CPU, one checkpoint, two problems: the prompt ends in an open code block, the
    completion is judged (the tiny model solves nothing; the self-test proves the judge)."""
    run = tmp_path / "run"
    run.mkdir()
    last = max((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    (run / "step_400").symlink_to(last)  # named step_400 below, whatever the demo saved
    write_config(
        tmp_path,
        small_config(
            run,
            tasks={"stdio_demo": {"limit": 2}},
            sampling={"greedy": {"temperature": 0.0, "max_new_tokens": 32}},
        ),
    )
    proc = run_snakemake(tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    gens = _lines(tmp_path / "results/generations/demo/step_400/stdio_demo/greedy-s42.jsonl")
    assert [g["task_id"] for g in gens] == ["stdio_demo/0", "stdio_demo/1"]
    assert all(g["prompt"].endswith("```python\n") and "```" not in g["completion"] for g in gens)
    cell = json.loads(
        (tmp_path / "results/scores/demo/step_400/stdio_demo/greedy-s42.json").read_text()
    )
    assert cell["checker"] == "stdio" and cell["n_samples"] == 2
    assert cell["self_test"]["references_passed"] == 2
    assert "official_tests_pass_rate" in cell["metrics"]
    scored = _lines(tmp_path / "results/scores/demo/step_400/stdio_demo/greedy-s42.jsonl")
    assert all("first_failed_test" in line for line in scored)
