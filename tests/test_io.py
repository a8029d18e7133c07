"""ckpteval.io.atomic_open: a write removes its own file's temp files left by a killed writer and
no other file's, and a write that is not durable (no fsync) writes the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpteval.io import atomic_open, write_json


@pytest.mark.parametrize("durable", [True, False])
def test_a_write_removes_only_its_own_files_debris(tmp_path: Path, durable: bool) -> None:
    out = tmp_path / "a.json"
    debris = tmp_path / ".a.json.k2j3x_9a.tmp"  # mkstemp's 8 characters: a killed writer's
    kept = [
        tmp_path / ".a.json.short.tmp",  # not mkstemp's name
        tmp_path / ".a.jsonl.k2j3x_9a.tmp",  # another output's
        tmp_path / ".b.a.json.k2j3x_9a.tmp",
        tmp_path / "a.json.k2j3x_9a.tmp",
    ]
    for path in [debris, *kept]:
        path.write_text("x")
    write_json(out, {"n": 1}, durable=durable)
    assert json.loads(out.read_text()) == {"n": 1}
    assert not debris.exists()
    assert all(path.exists() for path in kept)
    leftovers = sorted(p.name for p in tmp_path.iterdir())
    assert leftovers == sorted(["a.json", *(p.name for p in kept)])


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    write_json(out, {"n": 1})
    with pytest.raises(RuntimeError), atomic_open(out, durable=False) as handle:
        handle.write("{half")
        raise RuntimeError("killed")
    assert json.loads(out.read_text()) == {"n": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
