"""The rerun contract (ckpteval.contract) on a finished sweep (tests/contract_sweep.py): a moved
project plans nothing, and the file events that follow (touch, copy, delete, new bytes, a broken
file) change the sweep's files and run last. Every Snakemake verb run for real is
tests/test_contract_verbs.py, and the walk of every config key under `snakemake -n` is
tests/test_contract_walk.py, each on a copy of its own of the one sweep a pytest run builds (so
the three long modules run on the workers side by side).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from conftest import REPO, dry_snakemake, run_snakemake
from contract_sweep import (
    CELLS,
    SUMMARY_JOBS,
    TASKS,
    Sweep,
    chain,
    dry_run,
    planned,
    results_state,
    shared_sweep,
)

from ckpteval.config import validate_config
from ckpteval.contract import (
    CONTRACT,
    GENERATIONS,
    MODEL,
    ROWS,
    SCORES,
    Identity,
    concrete_keys,
)
from ckpteval.plan.layout import CellKey

SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())


def test_every_schema_key_has_exactly_one_contract_row() -> None:
    keys = set(concrete_keys(SCHEMA))
    assert sorted(keys - set(ROWS)) == [], "schema keys without a rerun-contract row"
    assert sorted(set(ROWS) - keys) == [], "contract rows for keys the schema does not have"
    assert len(ROWS) == len(CONTRACT)


def test_an_identity_is_the_same_for_reordered_settings_and_names_what_changed() -> None:
    a = Identity({"evaluate.timeout": 10, "evaluate.ks": [1, 5], "checker": "python"})
    b = Identity({"checker": "python", "evaluate.ks": [1, 5], "evaluate.timeout": 10})
    assert a.text == b.text and a.digest == b.digest
    assert Identity.from_text(a.text) == a
    c = Identity({**a.settings, "evaluate.timeout": 5})
    assert c.digest != a.digest
    assert c.changes(a.settings) == ["evaluate.timeout: 10 -> 5"]


# ---------------------------------------------------------------------------- the finished sweep


@pytest.fixture(scope="module")
def sweep(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sweep]:
    with shared_sweep(demo_dir, tmp_path_factory, "contract") as finished:
        yield finished


@pytest.mark.slow
def test_the_finished_sweep_plans_nothing_and_its_defaults_written_out_neither(
    sweep: Sweep,
) -> None:
    assert planned(sweep, sweep.config, "same") == Counter()
    assert planned(sweep, sweep.full, "full") == Counter()
    reordered = {key: sweep.full[key] for key in reversed(list(sweep.full))}
    reordered["engine"] = dict(reversed(list(sweep.full["engine"].items())))
    assert planned(sweep, reordered, "reordered") == Counter()


def said(proc: subprocess.CompletedProcess[str]) -> tuple[int, list[str]]:
    """A dry run's exit status, job table and ckpteval's own lines (what the tests read)."""
    out = proc.stdout + proc.stderr
    table = out.split("Job stats:", 1)[1].split("total", 1)[0] if "Job stats:" in out else ""
    lines = [ln for ln in out.splitlines() if ln.startswith("ckpteval:")]
    return proc.returncode, [*table.split(), *lines]


@pytest.mark.slow
def test_a_forked_dry_run_plans_and_says_what_a_fresh_snakemake_does(sweep: Sweep) -> None:
    """The contract tests' dry runs are forked from pytest (conftest.dry_snakemake, to skip the
    imports): checked here against `python -m snakemake -n` on the same configs, one that plans
    a chain and one with a user's mistake."""
    changed = copy.deepcopy(sweep.full)
    changed["tasks"]["pyfunc"]["limit"] = 1
    mistake = {**sweep.config, "runs": {"demo": {"path": str(sweep.work / "no-such-run")}}}
    seen = {}
    for name, config in (("changed", changed), ("mistake", mistake)):
        path = sweep.work / f"forked-{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        fresh = run_snakemake(sweep.work, "-n", "--configfile", str(path))
        forked = dry_snakemake(sweep.work, "-n", "--configfile", str(path))
        seen[name] = said(forked)
        assert seen[name] == said(fresh), (forked.stderr[-2000:], fresh.stderr[-2000:])
    status, words = seen["changed"]
    assert status == 0 and "generation" in words and "evaluate" in words, words
    assert any("tasks.pyfunc.limit" in w for w in words), "the reason, in ckpteval's words"
    status, words = seen["mistake"]
    assert status != 0 and any("no-such-run" in w for w in words), words


@pytest.mark.slow
def test_configfile_replaces_the_demo_config_instead_of_merging_into_it(sweep: Sweep) -> None:
    """A checkout whose demo was never built: its config/config.yaml names runs that do not
    exist. With --configfile, Snakemake and `ckpteval check` see the user's file alone."""
    demo = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    (sweep.work / "config").mkdir()
    (sweep.work / "config" / "config.yaml").write_text(yaml.safe_dump(demo))
    try:
        assert planned(sweep, sweep.config, "mine") == Counter()
        proc = dry_snakemake(
            sweep.work, "-n", "--configfile", str(sweep.work / "mine.yaml"), "--quiet", "rules"
        )
        assert "resources/demo" not in proc.stdout + proc.stderr
        check = subprocess.run(
            [sys.executable, "-m", "ckpteval.cli", "check", "--configfile", "mine.yaml"],
            cwd=sweep.work,
            capture_output=True,
            text=True,
        )
        assert check.returncode == 0, check.stderr
        assert f"{len(CELLS)} cells" in check.stdout and "humaneval" not in check.stdout
    finally:
        shutil.rmtree(sweep.work / "config")


# ----------------------------------------------- a moved project (before any test changes the sweep)


def relocated(config: dict[str, Any], old: Path, new: Path) -> dict[str, Any]:
    """`config` with every path under `old` moved under `new` (what a user edits after a move)."""
    return yaml.safe_load(yaml.safe_dump(config).replace(str(old), str(new)))


def outputs(work: Path) -> dict[str, bytes]:
    """Every result file (models, generations, scores, summary) by relative path: its bytes."""
    return {
        str(p.relative_to(work)): p.read_bytes()
        for part in ("models", "generations", "scores", "summary")
        for p in sorted((work / "results" / part).rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def moved(sweep: Sweep, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The finished sweep (checkpoints, base model, results, .snakemake) copied with `cp -a`,
    then the copy moved: its first location is gone."""
    first = tmp_path_factory.mktemp("copy") / "project"
    subprocess.run(["cp", "-a", str(sweep.work), str(first)], check=True)
    return first


@pytest.mark.slow
def test_a_copied_then_moved_project_plans_nothing_and_runs_nothing(
    sweep: Sweep, moved: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    before = outputs(sweep.work)
    copy_sweep = Sweep(moved, sweep.config, sweep.full, sweep.endpoint)
    assert planned(copy_sweep, relocated(sweep.config, sweep.work, moved), "copied") == Counter()
    elsewhere = tmp_path_factory.mktemp("disk2") / "project"
    moved.rename(elsewhere)
    try:
        here = Sweep(elsewhere, sweep.config, sweep.full, sweep.endpoint)
        config = relocated(sweep.config, sweep.work, elsewhere)
        assert planned(here, config, "moved") == Counter()
        relative = relocated(sweep.config, sweep.work, Path("."))  # ./run, ./base
        assert relative["runs"]["demo"]["path"] == "./run"
        assert planned(here, relative, "relative") == Counter()
        proc = run_snakemake(elsewhere, "--configfile", str(elsewhere / "moved.yaml"))
        assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr
        assert outputs(elsewhere) == before
    finally:
        elsewhere.rename(moved)


@pytest.mark.slow
def test_checkpoints_or_base_model_mounted_elsewhere_plan_nothing(
    sweep: Sweep, moved: Path
) -> None:
    """Only `runs.*.path` (or `base_model`) changes: the same bytes at another path."""
    here = Sweep(moved, sweep.config, sweep.full, sweep.endpoint)
    config = relocated(sweep.config, sweep.work, moved)
    (moved / "mnt").mkdir()
    (moved / "run").rename(moved / "mnt" / "ckpts")
    try:
        config["runs"]["demo"]["path"] = str(moved / "mnt" / "ckpts")
        assert planned(here, config, "mounted") == Counter()
        (moved / "base").rename(moved / "mnt" / "base")
        config["runs"]["demo"]["base_model"] = str(moved / "mnt" / "base")
        assert planned(here, config, "base-mounted") == Counter()
    finally:
        (moved / "mnt" / "ckpts").rename(moved / "run")
        if (moved / "mnt" / "base").exists():
            (moved / "mnt" / "base").rename(moved / "base")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tokenizer_config.json", "config.json"])
def test_one_byte_of_the_base_model_replans_its_runs_consolidations(
    sweep: Sweep, moved: Path, name: str
) -> None:
    """The adversary's case: one more byte in the base model's tokenizer or config file (its
    modification time put back) is another model; putting the bytes back plans nothing again."""
    here = Sweep(moved, sweep.config, sweep.full, sweep.endpoint)
    config = relocated(sweep.config, sweep.work, moved)
    path = moved / "base" / name
    original, st = path.read_bytes(), path.stat()
    path.write_bytes(original + b" ")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    try:
        jobs, out = dry_run(here, config, "base-byte")
        assert jobs == chain([c for c in CELLS if c[0] == "demo"], model=True)
        assert (
            "ckpteval: rerun: model of demo (2 checkpoints): runs.demo.base_model: sha256:" in out
        )
    finally:
        path.write_bytes(original)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert planned(here, config, "base-restored") == Counter()


@pytest.mark.slow
def test_publish_runs_only_as_its_own_target_and_again_only_for_its_settings(sweep: Sweep) -> None:
    config = copy.deepcopy(sweep.full)
    config["publish"] = {"tensorboard": {"logdir": str(sweep.work / "tb")}}
    assert planned(sweep, config, "publish") == Counter(), "`all` never publishes"
    path = sweep.work / "publish.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = run_snakemake(sweep.work, "publish", "--configfile", str(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = sweep.work / "results" / "summary" / "published" / "tensorboard.json"
    assert json.loads(record.read_text())["new"] > 0
    assert list((sweep.work / "tb").glob("*/*.ckpteval")), "event files written"
    again = dry_snakemake(sweep.work, "publish", "-n", "--configfile", str(path))
    assert "Nothing to be done" in again.stdout + again.stderr
    config["publish"]["tensorboard"]["logdir"] = str(sweep.work / "tb2")
    path.write_text(yaml.safe_dump(config))
    moved = dry_snakemake(sweep.work, "publish", "-n", "--configfile", str(path))
    assert re.search(r"^publish\s+1\s*$", moved.stdout, re.M), moved.stdout[-2000:]
    del config["publish"]
    path.write_text(yaml.safe_dump(config))
    none = run_snakemake(sweep.work, "publish", "--configfile", str(path))
    assert none.returncode != 0
    assert "ckpteval: error: config: publish: no tracker configured" in none.stderr


def _files(ckpt: Path) -> list[Path]:
    return sorted(p for p in ckpt.rglob("*") if p.is_file())


@pytest.mark.slow
def test_touching_or_copying_a_checkpoint_reruns_nothing(sweep: Sweep) -> None:
    for path in _files(sweep.work / "run" / "step_100"):
        os.utime(path)  # `touch`
    assert planned(sweep, sweep.config, "touched") == Counter()
    copy_dir = sweep.work / "run" / "step_400.copy"
    shutil.copytree(sweep.work / "run" / "step_400", copy_dir, copy_function=shutil.copyfile)
    shutil.rmtree(sweep.work / "run" / "step_400")
    copy_dir.rename(sweep.work / "run" / "step_400")  # `cp` without -p: new inodes and times
    assert planned(sweep, sweep.config, "copied") == Counter()


@pytest.mark.slow
def test_new_bytes_rerun_exactly_that_checkpoints_chain_and_the_old_bytes_nothing(
    sweep: Sweep,
) -> None:
    weights = sweep.work / "run" / "step_100" / "model.safetensors"
    original = weights.read_bytes()
    other = (sweep.work / "run" / "step_400" / "model.safetensors").read_bytes()
    assert other != original
    weights.write_bytes(other)
    cells = [c for c in CELLS if c[:2] == ("demo", "step_100")]
    try:
        assert planned(sweep, sweep.config, "new-bytes") == chain(cells, model=True)
    finally:
        weights.write_bytes(original)
    assert planned(sweep, sweep.config, "old-bytes") == Counter()


@pytest.mark.slow
@pytest.mark.parametrize(
    "output", ["deltas.csv", "flips.csv", "truncation.csv", "summary.json", "plots", "report.html"]
)
def test_a_deleted_summary_output_rebuilds_the_summary(sweep: Sweep, output: str) -> None:
    """Snakemake reruns a job for a missing output only if that output is requested: every
    output of rule summary must be a target of `all`, or a deleted one stays missing. It is
    published again from the aggregate job's build, which stays as it is."""
    path = sweep.work / "results" / "summary" / output
    aside = path.with_name(output + ".aside")
    shutil.move(path, aside)
    try:
        assert planned(sweep, sweep.config, f"no-{output}") == Counter({"summary": 1})
    finally:
        shutil.move(aside, path)
    assert planned(sweep, sweep.config, f"back-{output}") == Counter()


@pytest.mark.slow
def test_a_deleted_checkpoint_stays_in_the_summary_marked(sweep: Sweep) -> None:
    """A trainer's save_total_limit removes an old checkpoint: only the summary is rebuilt (to
    mark it); its scores stay in the table and the report, marked as deleted."""
    gone = sweep.work / "run-deleted" / "step_100"
    shutil.move(sweep.work / "run" / "step_100", gone)
    try:
        assert planned(sweep, sweep.config, "deleted") == SUMMARY_JOBS
        retitled = {**copy.deepcopy(sweep.config), "aggregate": {"title": "after a deletion"}}
        assert planned(sweep, retitled, "retitled") == SUMMARY_JOBS
        proc = run_snakemake(sweep.work, "--configfile", str(sweep.work / "retitled.yaml"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        table = pd.read_parquet(sweep.work / "results" / "summary" / "metrics.parquet")
        kept = table[table.ckpt == "step_100"]
        assert len(kept) > 0 and set(kept["task"]) == set(TASKS)
        assert (
            kept["source_deleted"].all()
            and not table[table.ckpt != "step_100"]["source_deleted"].any()
        )
        report = (sweep.work / "results" / "summary" / "report.html").read_text()
        assert "step_100" in report and "deleted" in report
    finally:
        shutil.move(gone, sweep.work / "run" / "step_100")
    assert planned(sweep, retitled, "restored") == SUMMARY_JOBS


@pytest.mark.slow
def test_a_broken_checkpoint_is_reported_in_one_line_and_no_match_is_an_error(
    sweep: Sweep, tmp_path: Path
) -> None:
    broken = sweep.work / "run" / "step_500"
    shutil.copytree(sweep.work / "run" / "step_400", broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])  # truncated tensor data
    old = time.time() - 3600
    for path in [broken, *_files(broken)]:
        os.utime(path, (old, old))
    try:
        path = sweep.work / "broken.yaml"
        path.write_text(yaml.safe_dump(sweep.config))
        proc = dry_snakemake(sweep.work, "-n", "--configfile", str(path))
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        line = next(ln for ln in out.splitlines() if "step_500" in ln and "broken" in ln)
        assert "model.safetensors" in line and "Traceback" not in out
        check = subprocess.run(
            [sys.executable, "-m", "ckpteval.cli", "check", "--configfile", str(path)],
            cwd=sweep.work,
            capture_output=True,
            text=True,
        )
        assert check.returncode == 0 and "step_500" in check.stdout, check.stderr
        status = subprocess.run(
            [sys.executable, "-m", "ckpteval.cli", "status", "--configfile", str(path)],
            cwd=sweep.work,
            capture_output=True,
            text=True,
        )
        assert "step_500" in status.stdout and "broken" in status.stdout, status.stderr
        # Still being written (changed a moment ago): not broken, shown as waiting.
        os.utime(weights)
        proc = dry_snakemake(sweep.work, "-n", "--configfile", str(path))
        mentions = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "step_500" in ln]
        assert not any("model.safetensors" in ln for ln in mentions), mentions
        assert any("step_500 waiting: being written" in ln for ln in mentions), mentions
    finally:
        shutil.rmtree(broken)
    empty = tmp_path / "empty-run"
    (empty / "notes").mkdir(parents=True)
    nothing = {
        **sweep.config,
        "outdir": str(tmp_path / "out"),
        "runs": {"demo": {"path": str(empty)}},
    }
    path = sweep.work / "nothing.yaml"
    path.write_text(yaml.safe_dump(nothing))
    proc = dry_snakemake(sweep.work, "-n", "--configfile", str(path))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out
    assert "runs.demo.patterns: nothing in" in out and "step_{step}" in out and "notes" in out


# -------------------------------------------------------------- a key of replay runs, on its own


@pytest.mark.slow
def test_replay_solutions_rerun_that_runs_cells_only(tmp_path: Path) -> None:
    def solutions(directory: Path, answer: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        rows = [{"task_id": f"arith/{i}", "completion": f" #### {answer}"} for i in range(20)]
        (directory / "arith.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    solutions(tmp_path / "a", 1)
    solutions(tmp_path / "b", 2)
    config = {
        "runs": {
            "one": {"backend": "replay", "solutions": str(tmp_path / "a")},
            "two": {"backend": "replay", "solutions": str(tmp_path / "a")},
        },
        "tasks": {"arith": {}},
    }
    (tmp_path / "replay.yaml").write_text(yaml.safe_dump(config))
    proc = run_snakemake(tmp_path, "--configfile", str(tmp_path / "replay.yaml"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = Sweep(tmp_path, config, config, None)  # type: ignore[arg-type]
    jobs, out = dry_run(sweep, config, "same")
    assert jobs == Counter()
    # Nor is a replayed cell said to be from another model (its meta names the model card).
    assert "rerun:" not in out, out[-3000:]
    _replay_verbs(sweep)
    config["runs"]["two"]["solutions"] = str(tmp_path / "b")  # run two's cell, nothing of one
    # (its redo input: replayed whatever Snakemake's metadata in .snakemake/ holds)
    changed = Counter({"redo": 1, "replay": 1, "evaluate": 1}) + SUMMARY_JOBS
    assert planned(sweep, config, "changed") == changed
    # A task added replays and scores its own cells alone (before, the model card held every
    # task's files: each run's model card and every cell of the step were redone).
    for run in ("a", "b"):
        rows = [{"task_id": "math_qwen/0", "completion": "\\boxed{1}"}]
        (tmp_path / run / "math_qwen.jsonl").write_text(json.dumps(rows[0]) + "\n")
    config["tasks"]["math_qwen"] = {}
    config["runs"]["two"]["solutions"] = str(tmp_path / "a")  # as the sweep ran
    assert planned(sweep, config, "task") == Counter({"replay": 2, "evaluate": 2}) + SUMMARY_JOBS
    _lost_metadata(sweep, config)


def _lost_metadata(sweep: Sweep, config: dict[str, Any]) -> None:
    """Snakemake's records are where ckpteval.verbs.snakemake_has_record looks (one per output
    of a job that ran); with .snakemake/ removed, a changed scoring setting is redone all the
    same (each cell through a redo input: before, nothing was planned, and `status` and the
    rerun line said the cells would be rescored, run after run), and so is a new title."""
    from ckpteval.plan.layout import Layout
    from ckpteval.verbs import snakemake_has_record

    del config["tasks"]["math_qwen"]
    layout, work = Layout("results"), str(sweep.work)
    outputs = [layout.manifest(r, "step_0") for r in ("one", "two")]
    outputs += [layout.score(CellKey(r, "step_0", "arith", "greedy-s42")) for r in ("one", "two")]
    outputs.append(layout.summary_staging())
    assert all(snakemake_has_record(o, work) for o in outputs), outputs
    shutil.rmtree(sweep.work / ".snakemake")
    assert not any(snakemake_has_record(o, work) for o in outputs)
    assert planned(sweep, config, "no-records") == Counter()  # nothing changed: nothing redone
    config["evaluate"] = {"ks": [1, 2]}
    config["aggregate"] = {"title": "Another"}
    expected = Counter({"redo": 3, "evaluate": 2}) + SUMMARY_JOBS  # two cells, the summary
    assert planned(sweep, config, "ks") == expected


def _replay_verbs(sweep: Sweep) -> None:
    """`-R replay` and `-f` on one replay file run for real and bring the same generation bytes
    back; a replay job killed while its rule is forced takes only its own files with it. After
    each verb, plain `snakemake` runs for real when a dry run plans something for it (as
    test_contract_verbs.run_verb does: one that plans nothing would only parse, which the dry
    run does too)."""
    from ckpteval.steps import FAILPOINT_ENV

    configfile = ("--configfile", str(sweep.work / "replay.yaml"))
    before = results_state(sweep.work)
    one = next(p for p in before if p.startswith("generations/one/") and p.endswith(".jsonl"))
    for args in (("-R", "replay"), ("-f", f"results/{one}")):
        proc = run_snakemake(sweep.work, *args, *configfile)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        if planned(sweep, sweep.config, "after-verb"):
            assert run_snakemake(sweep.work, *configfile).returncode == 0
            assert planned(sweep, sweep.config, "after-verb") == Counter()
        after = results_state(sweep.work)
        assert set(after) == set(before)
        for path in (p for p in before if p.startswith("generations/") and p.endswith(".jsonl")):
            assert after[path][0] == before[path][0], path  # scores hold timings: files only
    env = {**os.environ, FAILPOINT_ENV: "replay@two:kill"}
    proc = run_snakemake(sweep.work, "-R", "replay", *configfile, env=env)
    assert proc.returncode != 0 and "Error in rule replay" in proc.stderr
    lost = set(before) - set(results_state(sweep.work))
    assert lost and all(p.startswith("generations/two/") for p in lost), lost
    assert run_snakemake(sweep.work, *configfile).returncode == 0
    assert set(results_state(sweep.work)) == set(before)


def test_the_docs_table_is_the_code_table() -> None:
    """In a fresh interpreter: the table follows the registered checkers, and other tests of
    this process register test doubles."""
    doc = (REPO / "docs" / "reruns.md").read_text()
    table = doc.split("-->\n", 1)[1].split("\n<!-- /contract-table", 1)[0]
    env = {k: v for k, v in os.environ.items() if k != "CKPTEVAL_CHECKERS"}
    code = "from ckpteval.contract import table_markdown; print(table_markdown(), end='')"
    fresh = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert table == fresh.stdout


def test_a_new_optional_key_leaves_every_existing_identity_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upgrading ckpteval to a version with one more (unset) setting must not rerun a sweep."""
    import ckpteval.contract as contract
    from ckpteval.config import build_plan

    (tmp_path / "run" / "step_1").mkdir(parents=True)
    import numpy as np
    from safetensors.numpy import save_file

    (tmp_path / "run" / "step_1" / "config.json").write_text("{}")
    save_file(
        {"w": np.zeros(2, dtype=np.float32)}, str(tmp_path / "run" / "step_1" / "model.safetensors")
    )
    config = {
        "runs": {"r": {"path": str(tmp_path / "run")}},
        "tasks": {"arith": {}, "pyfunc": {}},
        "outdir": str(tmp_path / "out"),
    }
    validate_config(config)
    plan = build_plan(config)
    before = [
        contract.generation_identity(plan, "r", t, "greedy-s42").digest for t in ("arith", "pyfunc")
    ]
    models = contract.model_identity(plan, "r", "step_1").digest
    scores = contract.scoring_identity(plan, "r", "pyfunc", "greedy-s42").digest
    more = (
        *contract.CONTRACT,
        contract.Row("tasks.*.new_option", GENERATIONS, "a future key"),
        contract.Row("runs.*.new_option", MODEL, "a future key"),
        contract.Row("evaluate.new_option", SCORES, "a future key"),
    )
    monkeypatch.setattr(contract, "CONTRACT", more)
    after = [
        contract.generation_identity(plan, "r", t, "greedy-s42").digest for t in ("arith", "pyfunc")
    ]
    assert after == before
    assert contract.model_identity(plan, "r", "step_1").digest == models
    assert contract.scoring_identity(plan, "r", "pyfunc", "greedy-s42").digest == scores
    config["tasks"]["pyfunc"]["new_option"] = 3  # once set, it is part of that task's identity
    assert contract.generation_identity(plan, "r", "pyfunc", "greedy-s42").digest != before[1]
    assert contract.generation_identity(plan, "r", "arith", "greedy-s42").digest == before[0]


def test_a_cell_written_by_an_older_scorer_is_rescored(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cell format is part of every cell's scoring identity: cells from before a metric was
    added (length and truncation: format 2) are rescored instead of silently lacking it."""
    from ckpteval import evaluate
    from ckpteval.config import build_plan, validate_config
    from ckpteval.contract import scoring_identity

    endpoint = {"base_url": "http://127.0.0.1:9/v1", "model": "tiny"}
    config: dict[str, Any] = {"runs": {"ep": {"backend": "openai", "endpoint": endpoint}}}
    config["tasks"] = {"arith": {}}
    validate_config(config)
    plan = build_plan(config)
    variant = next(iter(plan.task_variants["arith"]))
    now = scoring_identity(plan, "ep", "arith", variant)
    assert now.settings["cell.format"] == evaluate.CELL_FORMAT >= 2
    monkeypatch.setattr(evaluate, "CELL_FORMAT", evaluate.CELL_FORMAT + 1)
    later = scoring_identity(plan, "ep", "arith", variant)
    assert later.changes(now.settings) == [
        f"cell.format: {evaluate.CELL_FORMAT - 1} -> {evaluate.CELL_FORMAT}"
    ]
