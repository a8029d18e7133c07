"""The rerun contract (ckpteval.contract) on a finished sweep (tests/contract_sweep.py): a moved
project plans nothing, every Snakemake verb run for real redoes exactly the promised files, and
the file events that follow (touch, copy, delete, new bytes, a broken file) change the sweep's
files and run last. The walk of every config key under `snakemake -n` is
tests/test_contract_walk.py, on a sweep of its own (so the two long modules run on two workers).
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
from conftest import REPO, run_snakemake
from contract_sweep import (
    CELLS,
    TASKS,
    VLLM_CKPTS,
    Sweep,
    chain,
    dry_run,
    finished_sweep,
    planned,
)

from ckpteval.backends import cache_namespace
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
    with finished_sweep(demo_dir, tmp_path_factory.mktemp("contract")) as finished:
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


@pytest.mark.slow
def test_configfile_replaces_the_demo_config_instead_of_merging_into_it(sweep: Sweep) -> None:
    """A checkout whose demo was never built: its config/config.yaml names runs that do not
    exist. With --configfile, Snakemake and `ckpteval check` see the user's file alone."""
    demo = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    (sweep.work / "config").mkdir()
    (sweep.work / "config" / "config.yaml").write_text(yaml.safe_dump(demo))
    try:
        assert planned(sweep, sweep.config, "mine") == Counter()
        proc = run_snakemake(
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
    again = run_snakemake(sweep.work, "publish", "-n", "--configfile", str(path))
    assert "Nothing to be done" in again.stdout + again.stderr
    config["publish"]["tensorboard"]["logdir"] = str(sweep.work / "tb2")
    path.write_text(yaml.safe_dump(config))
    moved = run_snakemake(sweep.work, "publish", "-n", "--configfile", str(path))
    assert re.search(r"^publish\s+1\s*$", moved.stdout, re.M), moved.stdout[-2000:]
    del config["publish"]
    path.write_text(yaml.safe_dump(config))
    none = run_snakemake(sweep.work, "publish", "--configfile", str(path))
    assert none.returncode != 0
    assert "ckpteval: error: config: publish: no tracker configured" in none.stderr


# ------------------------------------------------------- every Snakemake verb, run for real
#
# Each verb runs for real on the finished sweep. Every result file's bytes and modification time
# are compared before and after: exactly the promised files change, every other one stays as it
# was, and a dry run afterwards plans nothing (the sweep is finished again).


def cell_files(step: str, cells: list[tuple[str, ...]]) -> set[str]:
    """Paths under results/ of the `step` ("generations" or "scores") files of `cells`."""
    return {
        f"{step}/{run}/{ckpt}/{task}/{sampling}-s42.{ext}"
        for run, ckpt, task, sampling, _ in cells
        for ext in (("jsonl", "meta.json") if step == "generations" else ("jsonl", "json"))
    }


def results_state(work: Path) -> dict[str, tuple[bytes, int]]:
    """(bytes, mtime) of every generation, score and model-card file under results/."""
    root = work / "results"
    paths = [
        *(root / "generations").rglob("*.json*"),
        *(root / "scores").rglob("*.json*"),
        *(root / "models").glob("*/*.json"),
    ]
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in paths}


def run_verb(sweep: Sweep, *args: str, expect_ok: bool = True) -> set[str]:
    """Run Snakemake with `args` (targets first) on the sweep's config, then plain `snakemake`
    (a forced target is made alone; what depends on it follows in the next run); the result
    files the two rewrote or removed. The sweep must be finished again afterwards."""
    before = results_state(sweep.work)
    configfile = ("--configfile", str(sweep.work / "sweep.yaml"))
    proc = run_snakemake(sweep.work, *args, *configfile)
    out = proc.stdout + proc.stderr
    assert (proc.returncode == 0) == expect_ok, out[-4000:]
    if expect_ok:
        assert "Traceback" not in proc.stderr, out[-4000:]
        rest = run_snakemake(sweep.work, *configfile)
        assert rest.returncode == 0, (rest.stdout + rest.stderr)[-4000:]
        assert planned(sweep, sweep.config, "after-verb") == Counter()
    after = results_state(sweep.work)
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def model_cards(*ckpts: tuple[str, str]) -> set[str]:
    return {f"models/{run}/{ckpt}.json" for run, ckpt in ckpts}


def loads(sweep: Sweep, cells: list[tuple[str, ...]]) -> list[int]:
    return [
        json.loads((sweep.work / "results" / p).read_text()).get("engine_loads", 0)
        for p in cell_files("generations", cells)
        if p.endswith(".meta.json")
    ]


ONE = [c for c in CELLS if c[:3] == ("demo", "step_100", "arith")]
VLLM_CELLS = [c for c in CELLS if c[4] == "vllm"]
EP_CELLS = [c for c in CELLS if c[4] == "openai"]


@pytest.mark.slow
def test_forcing_one_generation_file_regenerates_that_cell_only(sweep: Sweep) -> None:
    """`-f` makes that file alone; the regenerated bytes are the same (from the cache), so
    Snakemake's checksum of the scores' input keeps the scores. `-R FILE` redoes what depends on
    it too."""
    target = "results/" + next(iter(sorted(cell_files("generations", ONE))))
    before = (sweep.work / target).read_bytes()
    assert run_verb(sweep, target, "-f") == cell_files("generations", ONE)
    assert (sweep.work / target).read_bytes() == before, "the same generation, from the cache"
    changed = run_verb(sweep, "-R", target)
    assert changed == cell_files("generations", ONE) | cell_files("scores", ONE)


@pytest.mark.slow
def test_forcing_a_meta_file_or_a_score_file_redoes_that_cell_only(sweep: Sweep) -> None:
    ep_one = [c for c in EP_CELLS if c[2] == "pyfunc"]
    meta = next(p for p in cell_files("generations", ep_one) if p.endswith(".meta.json"))
    assert run_verb(sweep, f"results/{meta}", "-f") == cell_files("generations", ep_one)
    score = next(p for p in cell_files("scores", ONE) if p.endswith(".json"))
    assert run_verb(sweep, f"results/{score}", "-f") == cell_files("scores", ONE)


@pytest.mark.slow
def test_forcing_a_model_redoes_that_checkpoints_chain(sweep: Sweep) -> None:
    ckpt = [c for c in CELLS if c[:2] == ("demo", "step_400")]
    changed = run_verb(sweep, "results/models/demo/step_400", "-f")
    expected = cell_files("generations", ckpt) | cell_files("scores", ckpt)
    assert changed == expected | model_cards(("demo", "step_400"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "rule, cells",
    [
        ("infer", VLLM_CELLS),
        ("endpoint", EP_CELLS),
        ("generation", CELLS),
    ],
)
def test_rerunning_an_infer_side_rule_regenerates_its_cells_without_engine_loads(
    sweep: Sweep, rule: str, cells: list[tuple[str, ...]]
) -> None:
    changed = run_verb(sweep, "-R", rule)
    assert changed == cell_files("generations", cells) | cell_files("scores", cells)
    # Served from the cache: no engine was started (a fresh sweep starts one per checkpoint).
    assert set(loads(sweep, cells)) <= {0}


@pytest.mark.slow
@pytest.mark.parametrize(
    "rule, cells, cards",
    [
        ("consolidate", VLLM_CELLS, model_cards(*[("demo", c) for c in VLLM_CKPTS])),
        ("model_card", EP_CELLS, model_cards(("ep", "step_7"))),
    ],
)
def test_rerunning_a_model_rule_redoes_its_runs_chains(
    sweep: Sweep, rule: str, cells: list[tuple[str, ...]], cards: set[str]
) -> None:
    changed = run_verb(sweep, "-R", rule)
    assert changed == cell_files("generations", cells) | cell_files("scores", cells) | cards


@pytest.mark.slow
def test_rerunning_evaluate_or_aggregate_leaves_every_generation_alone(sweep: Sweep) -> None:
    assert run_verb(sweep, "-R", "evaluate") == cell_files("scores", CELLS)
    summary = sweep.work / "results" / "summary" / "metrics.parquet"
    mtime = summary.stat().st_mtime_ns
    assert run_verb(sweep, "-R", "aggregate") == set()
    assert summary.stat().st_mtime_ns != mtime


@pytest.mark.slow
def test_forceall_and_until_and_omit_from_plan_chains_that_run(sweep: Sweep) -> None:
    everything = cell_files("generations", CELLS) | cell_files("scores", CELLS)
    cards = model_cards(*{(c[0], c[1]) for c in CELLS})
    assert run_verb(sweep, "--forceall") == everything | cards
    configfile = ("--configfile", str(sweep.work / "sweep.yaml"))
    for verb in (("--until", "generation"), ("--omit-from", "evaluate")):
        before = results_state(sweep.work)
        proc = run_snakemake(sweep.work, "-F", *verb, *configfile)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        after = results_state(sweep.work)
        changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        assert changed == cell_files("generations", CELLS) | cards, verb
        # What comes after the generations is left for the next run, which finishes the sweep.
        assert run_verb(sweep) <= cell_files("scores", CELLS)


@pytest.mark.slow
def test_deleted_or_truncated_files_are_redone_and_nothing_else(sweep: Sweep) -> None:
    root = sweep.work / "results"
    gone_gen = [c for c in CELLS if c[:3] == ("demo", "step_100", "pyfunc")]
    gone_meta = [c for c in CELLS if c[:3] == ("ep", "step_7", "arith")]
    cut_gen = [c for c in CELLS if c[:3] == ("demo", "step_400", "arith")]
    cut_score = [c for c in CELLS if c[:3] == ("demo", "step_400", "pyfunc")]
    (root / "generations/demo/step_100/pyfunc/greedy-s42.jsonl").unlink()
    (root / "generations/ep/step_7/arith/greedy-s42.meta.json").unlink()
    cut = root / "generations/demo/step_400/arith/greedy-s42.jsonl"
    cut.write_bytes(cut.read_bytes()[:-40])
    score = root / "scores/demo/step_400/pyfunc/greedy-s42.json"
    score.write_bytes(score.read_bytes()[:20])
    changed = run_verb(sweep)
    redone = gone_gen + gone_meta + cut_gen
    assert changed == (cell_files("generations", redone) | cell_files("scores", redone + cut_score))
    card = root / "models/demo/step_100.json"
    card.write_bytes(card.read_bytes()[:30])
    ckpt = [c for c in CELLS if c[:2] == ("demo", "step_100")]
    changed = run_verb(sweep)
    expected = cell_files("generations", ckpt) | cell_files("scores", ckpt)
    assert changed == expected | model_cards(("demo", "step_100"))


@pytest.mark.slow
def test_a_failed_engine_job_deletes_no_finished_file(sweep: Sweep) -> None:
    """The engine job of one checkpoint fails (its model's config is broken) while every cell is
    forced: the other checkpoint's cells are redone, and no file of the failed one is lost."""
    models = sweep.work / "results" / "models" / "demo"
    config = models / "step_400" / "config.json"
    namespace = cache_namespace(json.loads((models / "step_400.json").read_text()))
    cache = sweep.work / "results" / "cache" / namespace  # so that the engine must start
    good = config.read_bytes()
    before = results_state(sweep.work)
    config.write_text("{not json")
    shutil.move(cache, cache.with_name(cache.name + ".aside"))
    try:
        changed = run_verb(sweep, "-R", "infer", expect_ok=False)
    finally:
        config.write_bytes(good)
        shutil.rmtree(cache, ignore_errors=True)
        shutil.move(cache.with_name(cache.name + ".aside"), cache)
    after = results_state(sweep.work)
    assert set(before) <= set(after), "a failed job cost a finished file"
    redone = [c for c in VLLM_CELLS if c[1] == "step_100"]
    assert changed == cell_files("generations", redone) | cell_files("scores", redone)
    # With the model repaired, the next run finishes what the failure left: step_400's cells
    # (forced, not redone) are current, so only the summary is rebuilt.
    assert planned(sweep, sweep.config, "after-failure") == Counter({"aggregate": 1})
    assert run_verb(sweep) == set()


#: One job of each rule kind fails (a crash with a traceback) or is killed (SIGKILL), while
#: every job of its rule is forced: (rule, failpoint, the result files the failing job may take
#: with it, its own outputs). The engine rule fails for real in the test above.
FAILURES = [
    ("consolidate", "consolidate@demo/step_400:kill", {"models/demo/step_400.json"}),
    ("endpoint", "infer@ep/step_7:kill", set()),
    (
        "generation",
        "generation@demo/step_100/arith",  # in Snakemake's process: a crash, never a kill
        cell_files("generations", [c for c in CELLS if c[:3] == ("demo", "step_100", "arith")]),
    ),
    ("model_card", "model_card@ep/step_7", {"models/ep/step_7.json"}),
    (
        "evaluate",
        "evaluate@demo/step_400/pyfunc:kill",
        cell_files("scores", [c for c in CELLS if c[:3] == ("demo", "step_400", "pyfunc")]),
    ),
    ("aggregate", "aggregate@", set()),
]


@pytest.mark.slow
@pytest.mark.parametrize(("rule", "failpoint", "own"), FAILURES, ids=[f[0] for f in FAILURES])
def test_a_failed_or_killed_job_of_any_rule_costs_no_other_file(
    sweep: Sweep, rule: str, failpoint: str, own: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Snakemake deletes the outputs of a failed job, and only those: no job's failure takes a
    finished file of another job with it, and the next run finishes the sweep."""
    from ckpteval.steps import FAILPOINT_ENV

    configfile = ("--configfile", str(sweep.work / "sweep.yaml"))
    before = results_state(sweep.work)
    monkeypatch.setenv(FAILPOINT_ENV, failpoint)
    proc = run_snakemake(sweep.work, "-R", rule, *configfile)
    monkeypatch.delenv(FAILPOINT_ENV)
    assert proc.returncode != 0, (proc.stdout + proc.stderr)[-3000:]
    assert "Error in rule" in proc.stderr, proc.stderr[-3000:]
    lost = set(before) - set(results_state(sweep.work))
    assert lost <= own, f"a failed {rule} job cost other files: {sorted(lost - own)}"
    rest = run_snakemake(sweep.work, *configfile)
    assert rest.returncode == 0, (rest.stdout + rest.stderr)[-4000:]
    assert set(before) <= set(results_state(sweep.work))
    assert planned(sweep, sweep.config, "after-failure") == Counter()


# ------------------------------------------------------------------- file events, on the same sweep


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
    output of rule aggregate must be a target of `all`, or a deleted one stays missing."""
    path = sweep.work / "results" / "summary" / output
    aside = path.with_name(output + ".aside")
    shutil.move(path, aside)
    try:
        assert planned(sweep, sweep.config, f"no-{output}") == Counter({"aggregate": 1})
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
        assert planned(sweep, sweep.config, "deleted") == Counter({"aggregate": 1})
        retitled = {**copy.deepcopy(sweep.config), "aggregate": {"title": "after a deletion"}}
        assert planned(sweep, retitled, "retitled") == Counter({"aggregate": 1})
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
    assert planned(sweep, retitled, "restored") == Counter({"aggregate": 1})


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
        proc = run_snakemake(sweep.work, "-n", "--configfile", str(path))
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
        # Still being written (changed a moment ago): not broken, not reported.
        os.utime(weights)
        proc = run_snakemake(sweep.work, "-n", "--configfile", str(path))
        assert "step_500" not in proc.stdout + proc.stderr
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
    proc = run_snakemake(sweep.work, "-n", "--configfile", str(path))
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
    assert planned(sweep, config, "same") == Counter()
    _replay_verbs(sweep)
    config["runs"]["two"]["solutions"] = str(tmp_path / "b")  # run two's chain, nothing of one
    assert planned(sweep, config, "changed") == Counter(
        {"model_card": 1, "replay": 1, "evaluate": 1, "aggregate": 1}
    )


def _replay_verbs(sweep: Sweep) -> None:
    """`-R replay` and `-f` on one replay file run for real and bring the same generation bytes
    back; a replay job killed while its rule is forced takes only its own files with it."""
    from ckpteval.steps import FAILPOINT_ENV

    configfile = ("--configfile", str(sweep.work / "replay.yaml"))
    before = results_state(sweep.work)
    one = next(p for p in before if p.startswith("generations/one/") and p.endswith(".jsonl"))
    for args in (("-R", "replay"), ("-f", f"results/{one}")):
        proc = run_snakemake(sweep.work, *args, *configfile)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
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
