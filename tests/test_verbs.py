"""ckpteval.verbs without Snakemake: what a verb forces, the round an engine job gets, and how a
damaged result is found without being touched. The verbs themselves, run for real on a finished
sweep, are in tests/test_contract_verbs.py; that planning writes nothing, in
tests/test_plan_readonly.py."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from types import SimpleNamespace

from ckpteval.contract import Identity
from ckpteval.freshness import StaleCell
from ckpteval.plan.layout import CellKey, done_path, request_path, staging_of
from ckpteval.verbs import (
    Verbs,
    damaged_json,
    next_round,
    read_request,
    redo_path,
    request_body,
    write_done,
    write_request,
)

RULES = ["infer", "generation", "evaluate", "consolidate"]


def settings(**kw: object) -> SimpleNamespace:
    base = {"forcerun": (), "targets": (), "forcetargets": False, "forceall": False}
    return SimpleNamespace(**{**base, **kw})


def test_rules_and_files_are_told_apart_and_targets_count_only_when_forced(
    tmp_path: Path, monkeypatch: object
) -> None:
    os.chdir(tmp_path)
    verbs = Verbs.from_settings(settings(forcerun=("infer", "results/x.jsonl")), RULES)
    assert verbs.forces_rule("infer") and not verbs.forces_rule("generation")
    assert verbs.forces_file(tmp_path / "results" / "x.jsonl")
    assert verbs.forces_file("./results/../results/x.jsonl")
    plain = Verbs.from_settings(settings(targets=("results/y.jsonl",)), RULES)
    assert not plain.forces_file("results/y.jsonl"), "a target alone forces nothing"
    forced = Verbs.from_settings(settings(targets=("results/y.jsonl",), forcetargets=True), RULES)
    assert forced.forces_file("results/y.jsonl")
    assert Verbs.from_settings(settings(forceall=True), RULES).forces_rule("anything")
    assert Verbs.from_settings(None, RULES) == Verbs()


def _cell(task: str, variant: str = "greedy-s42") -> StaleCell:
    return StaleCell(CellKey("r", "step_1", task, variant), Identity({"task": task}), "missing")


def test_a_round_is_one_more_than_any_round_of_its_group_so_its_done_file_is_new(
    tmp_path: Path,
) -> None:
    staging = tmp_path / "step_1" / "main"
    staging.mkdir(parents=True)
    assert next_round(os.listdir(tmp_path / "step_1"), "main") == "r1"
    write_request(request_path(staging, "r1"), request_body([_cell("arith")], "inv"))
    # A run started (its request is there) but its engine job never finished: a new round.
    assert next_round(os.listdir(tmp_path / "step_1"), "main") == "r2"
    write_done(done_path(staging, "r7"), [("arith", "greedy-s42")])
    names = [*os.listdir(tmp_path / "step_1"), "code.r30.done", "main.r9.claim", "main.rx.done"]
    token = next_round(names, "main")
    assert token == "r8", "other groups, claims and foreign names do not count"
    assert not done_path(staging, token).exists()
    assert staging_of(done_path(staging, token)) == staging
    assert staging_of(request_path(staging / "x.y", "r3")) == staging / "x.y"
    assert [(c["task"], c["variant"]) for c in read_request(request_path(staging, "r1"))] == [
        ("arith", "greedy-s42")
    ]


def test_a_request_file_that_does_not_parse_reads_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    for text in ("{not json", "[1, 2]", '{"cells": 3}'):
        path.write_text(text)
        assert read_request(path) == []


def test_a_damaged_json_result_is_found_and_left_in_place(tmp_path: Path) -> None:
    metrics, samples = tmp_path / "c.json", tmp_path / "c.jsonl"
    assert not damaged_json(metrics, samples), "nothing there: missing, not damaged"
    metrics.write_text(json.dumps({"n": 3}))
    samples.write_text("{}\n")
    assert not damaged_json(metrics, samples)
    for text in ('{"n": ', "[1]", ""):  # truncated, not a mapping, empty
        metrics.write_text(text)
        before = (metrics.read_bytes(), metrics.stat().st_mtime_ns)
        assert damaged_json(metrics, samples)
        assert (metrics.read_bytes(), metrics.stat().st_mtime_ns) == before and samples.exists()
    metrics.write_text(json.dumps({"n": 3}))
    samples.unlink()
    assert damaged_json(metrics, samples), "its samples file is gone"


def test_a_redo_input_names_the_damage_and_never_exists_when_planned(tmp_path: Path) -> None:
    damaged, root = tmp_path / "c.json", tmp_path / "redo"
    damaged.write_text('{"n": ')
    first = redo_path(root, damaged)
    assert not first.exists() and redo_path(root, damaged) == first, "the same damage, one name"
    root.mkdir()
    first.touch()  # made by an earlier run for a damage of the same name
    second = redo_path(root, damaged)
    assert second != first and not second.exists()
    assert redo_path(root, damaged, fresh=False) == first, "a cluster job finds the planned one"
    second.touch()
    assert redo_path(root, damaged, fresh=False) == second
    os.utime(damaged, ns=(1, 1))
    assert redo_path(root, damaged).parent == root and redo_path(root, damaged) != first


def test_the_plans_shared_read_of_a_score_cell_finds_the_same_damage(tmp_path: Path) -> None:
    """Freshness.score_damaged (the redo input's check, sharing the rerun explanation's read of
    the cell) says what damaged_json says of the same files, in every state, and touches none;
    and more: JSON that is no score cell of this path (`{"n": 3}`) is damaged too."""
    from ckpteval.freshness import Freshness

    metrics = tmp_path / "scores" / "r" / "step_1" / "arith" / "t0.7-s1.json"
    samples = metrics.with_suffix(".jsonl")
    metrics.parent.mkdir(parents=True)
    cell = CellKey("r", "step_1", "arith", "t0.7-s1")
    whole = {**dataclasses.asdict(cell), "scoring": {}, "metrics": {"acc": 1.0}}
    states = [
        lambda: None,  # nothing there
        lambda: (metrics.write_text(json.dumps(whole)), samples.write_text("{}\n")),
        lambda: metrics.write_text('{"n": '),
        lambda: metrics.write_text("[1]"),
        lambda: metrics.write_text(""),
        lambda: (metrics.write_text(json.dumps(whole)), samples.unlink()),
        lambda: (metrics.write_text(json.dumps({"n": 3})), samples.write_text("{}\n")),
    ]
    seen = []
    for state in states:
        state()
        before = {p: p.read_bytes() for p in (metrics, samples) if p.exists()}
        fresh = Freshness(SimpleNamespace(outdir=str(tmp_path)))  # one per parse
        assert Path(fresh.layout.score(cell)) == metrics
        found = fresh.score_damaged(cell)
        generic = damaged_json(metrics, samples)
        assert found == generic or (found and json.loads(metrics.read_text()) != whole)
        assert {p: p.read_bytes() for p in (metrics, samples) if p.exists()} == before
        seen.append(found)
    assert seen == [False, False, True, True, True, True, True]
