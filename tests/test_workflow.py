"""The whole workflow, for real: Snakemake -> consolidate -> vLLM on CPU -> sandboxed scoring ->
aggregate, on the tiny demo model. One module-scoped sweep is shared by the tests below: it runs
with one checkpoint, then a second checkpoint is added and the sweep runs again (so the sweep that
the tests read is also the one that proves a new checkpoint runs only its own jobs, without a
third checkpoint's engine); each later test changes something and reruns."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from conftest import dry_snakemake, run_snakemake, small_config, write_config

#: The sweep scores a Rust task (TASKS) and its tests read its cells.
pytestmark = [pytest.mark.slow, pytest.mark.needs("rustc")]

TASKS = ["arith", "arith_harness", "pyfunc", "rustfunc"]


@dataclass(frozen=True)
class Grown:
    """The module's sweep, and what its second run did when a checkpoint was added to it."""

    work: Path
    new: str  # the checkpoint added to the finished one-checkpoint sweep
    planned: dict[str, str]  # jobs per rule in the dry run right after it was added
    before: dict[Path, int]  # score files' mtimes before the second run
    after: dict[Path, int]  # and after it


@pytest.fixture(scope="module")
def grown(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Grown:
    """A run with the first demo checkpoint swept end to end, then the second one added and the
    sweep run again."""
    work = tmp_path_factory.mktemp("sweep")
    run = work / "run"
    run.mkdir()
    steps = sorted((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    first, new = steps[:2]
    (run / first.name).symlink_to(first)
    write_config(work, small_config(run))
    proc = run_snakemake(work)
    assert proc.returncode == 0, proc.stderr[-4000:]
    before = {p: p.stat().st_mtime_ns for p in _cells(work)}
    (run / new.name).symlink_to(new)
    dry = dry_snakemake(work, "-n")
    assert dry.returncode == 0, dry.stderr[-3000:]
    proc = run_snakemake(work)
    assert proc.returncode == 0, proc.stderr[-4000:]
    after = {p: p.stat().st_mtime_ns for p in _cells(work)}
    return Grown(work, new.name, _job_counts(dry.stdout + dry.stderr), before, after)


@pytest.fixture(scope="module")
def sweep(grown: Grown) -> Path:
    """The module's sweep: two checkpoints, every task, scored and summarised."""
    return grown.work


def _job_counts(output: str) -> dict[str, str]:
    """Jobs per rule from a dry run's "Job stats" table (the target rule `all` left out)."""
    return dict(re.findall(r"^(consolidate|infer|evaluate|aggregate)\s+(\d+)$", output, re.M))


def _cells(work: Path) -> list[Path]:
    return sorted((work / "results" / "scores").rglob("*.json"))


def test_sweep_produces_table_with_a_row_per_checkpoint_task_metric(sweep: Path) -> None:
    ckpts = sorted(p.name for p in (sweep / "run").iterdir())
    table = pd.read_parquet(sweep / "results" / "summary" / "metrics.parquet")
    assert set(table["ckpt"]) == set(ckpts)
    assert set(table["task"]) == set(TASKS)
    assert not table.duplicated(["run", "ckpt", "task", "variant", "metric"]).any()
    arith = table[(table.task == "arith") & (table.metric == "pass@1")]
    assert len(arith) == len(ckpts) and arith["n"].eq(20).all()
    harness = table[(table.task == "arith_harness") & (table.metric == "exact_match,strict-match")]
    assert len(harness) == len(ckpts) and harness["n"].eq(10).all()
    # Real vLLM generation: the model learned the `#### N` format and gets some answers right.
    gens = [
        json.loads(line)
        for line in (
            sweep / "results/generations/demo" / ckpts[-1] / "arith/greedy-s42.jsonl"
        ).open()
    ]
    assert len(gens) == 20 and sum("####" in g["completion"] for g in gens) >= 10
    # Scoring is real: the harness task's strict-match equals our own recount from the samples.
    scores = [
        json.loads(line)
        for line in (
            sweep / "results/scores/demo" / ckpts[-1] / "arith_harness/greedy-s42.jsonl"
        ).open()
    ]
    value = harness[harness.ckpt == ckpts[-1]]["value"].item()
    assert value == pytest.approx(
        sum(s["metrics"]["exact_match,strict-match"] for s in scores) / 10
    )


def test_length_metrics_equal_the_generation_files_and_flags_follow_them(sweep: Path) -> None:
    """Every cell's length metrics are those of its real vLLM generation lines (max_new_tokens
    48: the code tasks run into the budget), and truncation.csv flags exactly the cells above
    the default 0.05."""
    table = pd.read_parquet(sweep / "results" / "summary" / "metrics.parquet")
    cells = table.set_index(["ckpt", "task", "metric"])["value"]
    for gen in (sweep / "results" / "generations" / "demo").rglob("greedy-s42.jsonl"):
        ckpt, task = gen.parent.parent.name, gen.parent.name
        lines = [json.loads(line) for line in gen.open()]
        tokens = [g["completion_tokens"] for g in lines]
        assert cells[(ckpt, task, "completion_tokens_mean")] == pytest.approx(
            sum(tokens) / len(tokens)
        )
        reasons = [g.get("finish_reason") for g in lines]
        if any(r is not None for r in reasons):
            known = [r for r in reasons if r is not None]
            share = known.count("length") / len(known)
            assert cells[(ckpt, task, "truncation_rate")] == pytest.approx(share), (ckpt, task)
        else:  # lm-eval lines without finish_reason: no truncation rate, never a fake 0
            assert (ckpt, task, "truncation_rate") not in cells.index
    rates = table[table.metric == "truncation_rate"]
    assert set(rates["task"]) >= {"arith", "pyfunc", "rustfunc"}
    assert rates["value"].max() > 0.05, "the 48-token budget cuts some code completions"
    flags = pd.read_csv(sweep / "results" / "summary" / "truncation.csv")
    assert len(flags) == len(rates)
    assert (flags["flagged"] == (flags["truncation_rate"] > 0.05)).all()
    assert "score is a lower bound" in (sweep / "results/summary/metrics.md").read_text()
    assert (sweep / "results/summary/plots/truncation-pyfunc.png").exists()


def test_one_engine_load_per_checkpoint_and_traceable_numbers(sweep: Path) -> None:
    for ckpt_dir in (sweep / "results" / "generations" / "demo").iterdir():
        metas = [json.loads(p.read_text()) for p in ckpt_dir.rglob("*.meta.json")]
        assert len(metas) == len(TASKS)
        assert {m["engine_loads"] for m in metas} == {1}
        manifest = json.loads((sweep / "results/models/demo" / f"{ckpt_dir.name}.json").read_text())
        assert {m["model_hash"] for m in metas} == {manifest["weights_sha256"]}
    for cell_path in _cells(sweep):
        cell = json.loads(cell_path.read_text())
        assert cell["scorer_version"] and cell["model_hash"] and cell["generation_sha256"]
        assert Path(cell["generation_file"]).name == cell_path.name.replace(".json", ".jsonl")
    log = sweep / "logs" / "infer" / "demo"
    assert all(p.stat().st_size > 0 for p in log.glob("*.log"))


def test_rerun_of_one_target_file_touches_nothing_else(sweep: Path) -> None:
    ckpt = sorted(p.name for p in (sweep / "run").iterdir())[0]
    target = sweep / "results/scores/demo" / ckpt / "pyfunc/greedy-s42.json"
    before = {p: p.stat().st_mtime_ns for p in _cells(sweep)}
    content = target.read_bytes()
    proc = run_snakemake(sweep, "-f", str(target.relative_to(sweep)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = {p: p.stat().st_mtime_ns for p in _cells(sweep)}
    assert [p for p in before if after[p] != before[p]] == [target]
    # Only the summary is now older than one of its inputs, unless the rerun wrote the same
    # bytes (its duration_s is rounded to ms): Snakemake then finds the checksum it recorded for
    # the summary's input and, rightly, plans nothing.
    expected = {} if target.read_bytes() == content else {"aggregate": "1"}
    proc = dry_snakemake(sweep, "-n")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and _job_counts(out) == expected, out[-3000:]
    assert expected or "Nothing to be done" in out, out[-3000:]


def test_a_new_checkpoint_is_picked_up_and_only_its_jobs_run(grown: Grown) -> None:
    """The fixture's second run: the checkpoint added to a finished sweep plans its own jobs
    and the summary only, and running them leaves every other score file untouched."""
    assert grown.planned == {
        "consolidate": "1",
        "infer": "1",
        "evaluate": str(len(TASKS)),
        "aggregate": "1",
    }
    assert grown.before and all(grown.after[p] == t for p, t in grown.before.items())
    new_cells = [p for p in grown.after if p not in grown.before]
    assert {p.parent.parent.name for p in new_cells} == {grown.new}
    assert len(new_cells) == len(TASKS)
    table = pd.read_parquet(grown.work / "results" / "summary" / "metrics.parquet")
    assert grown.new in set(table["ckpt"])


def test_user_mistakes_stop_before_any_job_with_one_line(sweep: Path, tmp_path: Path) -> None:
    write_config(tmp_path, small_config(tmp_path / "missing-run"))
    proc = dry_snakemake(tmp_path, "-n")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "ckpteval: error: config: runs.demo.path:" in out and "Traceback" not in out
    write_config(tmp_path, small_config(sweep / "run", tasks={"nosuchtask": {}}))
    proc = dry_snakemake(tmp_path, "-n")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "tasks.nosuchtask: unknown task" in out
    assert "Traceback" not in out
    write_config(tmp_path, {**small_config(sweep / "run"), "seeds": "42"})
    proc = dry_snakemake(tmp_path, "-n")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "config: seeds: '42' is not of type 'array'" in out
    assert "Traceback" not in out
    assert not (tmp_path / "results").exists()


def test_a_bare_torch_file_is_discovered_and_consolidated(
    sweep: Path, demo_dir: Path, tmp_path: Path
) -> None:
    """A trainer that writes `step_N.pt` state dicts: the file is checkpoint `step_N`, consolidated
    with the run's base_model for config and tokenizer, into the same weights as the HF save."""
    import torch
    from safetensors.torch import load_file

    run = tmp_path / "run"
    run.mkdir()
    first = min((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1])).name
    state = load_file(demo_dir / "run" / first / "model.safetensors")
    torch.save({"model": state, "step": 7}, run / "step_7.pt")
    config = small_config(run)
    config["runs"]["demo"]["base_model"] = str(demo_dir / "base")
    config["consolidate"] = {"smoke": "none"}  # the weights are the claim, not a generation
    write_config(tmp_path, config)
    proc = run_snakemake(tmp_path, "results/models/demo/step_7.json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((tmp_path / "results/models/demo/step_7.json").read_text())
    reference = json.loads((sweep / f"results/models/demo/{first}.json").read_text())
    assert manifest["format"] == "torch"
    assert manifest["weights_sha256"] == reference["weights_sha256"]
