"""ckpteval.verbs without Snakemake: what a verb forces, and the markers that keep an engine job's
rerun from spreading to the cells it did not generate. The verbs themselves, run for real on a
finished sweep, are in tests/test_contract.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

from ckpteval.contract import Identity
from ckpteval.freshness import StaleCell
from ckpteval.verbs import (
    Verbs,
    drop_damaged_json,
    marker_path,
    read_request,
    sync_markers,
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
    return StaleCell(task, variant, Identity({"task": task}), "missing")


def test_a_marker_exists_exactly_for_the_cells_not_requested(tmp_path: Path) -> None:
    staging, request = tmp_path / "main", tmp_path / "main.request.json"
    pairs = [("arith", "greedy-s42"), ("pyfunc", "greedy-s42"), ("pyfunc", "hot-s1")]
    sync_markers(staging, request, pairs, [_cell("pyfunc")])
    present = {p for p in pairs if marker_path(staging, *p).exists()}
    assert present == {("arith", "greedy-s42"), ("pyfunc", "hot-s1")}
    assert [(c["task"], c["variant"]) for c in read_request(request)] == [("pyfunc", "greedy-s42")]
    # The next parse finds nothing to do: every marker is back, the request is empty.
    sync_markers(staging, request, pairs, [])
    assert all(marker_path(staging, *p).exists() for p in pairs)
    assert read_request(request) == []


def test_an_unchanged_request_file_is_not_rewritten(tmp_path: Path) -> None:
    staging, request = tmp_path / "main", tmp_path / "main.request.json"
    sync_markers(staging, request, [("arith", "greedy-s42")], [_cell("arith")])
    os.utime(request, (1, 1))
    sync_markers(staging, request, [("arith", "greedy-s42")], [_cell("arith")])
    assert request.stat().st_mtime == 1


def test_a_request_file_that_does_not_parse_reads_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    for text in ("{not json", "[1, 2]", '{"cells": 3}'):
        path.write_text(text)
        assert read_request(path) == []


def test_a_damaged_json_result_is_removed_with_its_companions(tmp_path: Path) -> None:
    metrics, samples = tmp_path / "c.json", tmp_path / "c.jsonl"
    metrics.write_text(json.dumps({"n": 3}))
    samples.write_text("{}\n")
    assert drop_damaged_json(metrics, samples) == []
    metrics.write_text('{"n": ')  # truncated
    assert drop_damaged_json(metrics, samples) == [metrics, samples]
    assert not metrics.exists() and not samples.exists()
    metrics.write_text(json.dumps({"n": 3}))  # its samples file is gone
    assert drop_damaged_json(metrics, samples) == [metrics, samples]
    assert drop_damaged_json(metrics, samples) == [], "nothing there, nothing to do"
