"""Stable-hash sharding of checkpoints for the scheduler-free two-node fallback."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, write_config
from hypothesis import given
from hypothesis import strategies as st

from ckpteval.errors import UserError
from ckpteval.shard import Shard, parse_shard, select, shard_index

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_.-", min_size=1, max_size=20)


@dataclass(frozen=True)
class Ckpt:
    name: str


def test_parse_shard_accepts_i_of_n_and_treats_empty_as_unsharded() -> None:
    assert parse_shard("0/2") == Shard(0, 2)
    assert parse_shard(" 3 / 4 ") == Shard(3, 4)
    assert parse_shard(None) is None
    assert parse_shard("") is None
    assert str(Shard(1, 2)) == "1/2"


@pytest.mark.parametrize("bad", ["2/2", "1/0", "-1/2", "half", "0/2/4", "1", 0.5])
def test_parse_shard_rejects_malformed_values_with_one_line(bad: object) -> None:
    with pytest.raises(UserError) as info:
        parse_shard(bad)
    assert "config: shard:" in str(info.value) and "\n" not in str(info.value)


@given(run=names, ckpts=st.lists(names, unique=True, max_size=40), count=st.integers(1, 6))
def test_shards_partition_the_checkpoints(run: str, ckpts: list[str], count: int) -> None:
    """Every checkpoint is in exactly one shard, and each shard keeps the input order."""
    items = [Ckpt(c) for c in ckpts]
    parts = [select(items, run, Shard(i, count)) for i in range(count)]
    assert sorted(c.name for part in parts for c in part) == sorted(ckpts)
    for part in parts:
        assert part == [c for c in items if c in part]


@given(run=names, ckpts=st.lists(names, unique=True, min_size=1, max_size=30), extra=names)
def test_a_new_checkpoint_does_not_move_existing_ones(
    run: str, ckpts: list[str], extra: str
) -> None:
    """A checkpoint written later (listed anywhere) leaves every other one on its node."""
    before = [Ckpt(c) for c in ckpts]
    after = [Ckpt(extra), *before]
    for index in range(2):
        kept_before = set(select(before, run, Shard(index, 2)))
        kept_after = set(select(after, run, Shard(index, 2)))
        assert kept_before - {Ckpt(extra)} == kept_after - {Ckpt(extra)}


def test_no_shard_keeps_everything() -> None:
    items = [Ckpt("step_1"), Ckpt("step_2")]
    assert select(items, "run", None) == items


def test_assignment_is_stable_across_processes() -> None:
    """Two nodes must agree: the value cannot depend on Python's per-process hash salt."""
    code = "from ckpteval.shard import shard_index; print(shard_index('demo', 'step_300', 7))"
    seen = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed},
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2", "3")
    }
    assert seen == {str(shard_index("demo", "step_300", 7))}
    # Pinned: a change to the hash would silently re-split sweeps that are half done.
    assert [shard_index("demo", f"step_{s}", 2) for s in (100, 200, 300, 400, 500, 600)] == [
        1,
        1,
        0,
        1,
        1,
        1,
    ]
    assert shard_index("demo", "step_300", 7) == 5


def test_a_sweep_splits_roughly_evenly() -> None:
    """30 checkpoints x 2 shards: a hash is binomial, but not lopsided for realistic names."""
    counts = [
        len(select([Ckpt(f"step_{100 * s}") for s in range(1, 31)], "run", Shard(i, 2)))
        for i in range(2)
    ]
    assert sum(counts) == 30 and min(counts) >= 10


# --- the workflow side: `--config shard=i/n` on two "nodes" at once, then an unsharded aggregate --

ARITH = [
    json.loads(line)
    for line in (REPO / "src" / "ckpteval" / "data" / "tasks" / "arith.jsonl")
    .read_text()
    .splitlines()
]


@pytest.mark.slow
def test_two_shards_then_an_unsharded_aggregate(tmp_path: Path) -> None:
    """Two Snakemakes in one directory split 8 checkpoints by hash; the third run only aggregates."""
    steps = range(1, 9)
    for step in steps:
        answers = tmp_path / "solutions" / f"step_{step}" / "arith.jsonl"
        answers.parent.mkdir(parents=True)
        answers.write_text(
            "".join(
                json.dumps({"task_id": p["task_id"], "completion": p["answer"]}) + "\n"
                for p in ARITH[:step]
            )
        )
    write_config(
        tmp_path,
        {
            "runs": {
                "sols": {
                    "backend": "replay",
                    "solutions": str(tmp_path / "solutions/step_{step}/{task}.jsonl"),
                }
            },
            "tasks": {"arith": {}},
            "evaluate": {"workers": 1, "timeout": 10},
        },
    )

    shards = [_snakemake(tmp_path, "--config", f"shard={i}/2") for i in range(2)]
    for proc in shards:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    scores = tmp_path / "results" / "scores" / "sols"
    done = {p.name for p in scores.iterdir()} if scores.exists() else set()
    assert done == {f"step_{s}" for s in steps}
    assert not (tmp_path / "results" / "summary").exists(), "a shard must not aggregate"

    before = {p: p.stat().st_mtime_ns for p in scores.rglob("*.json")}
    final = _snakemake(tmp_path)
    out, err = final.communicate(timeout=600)
    assert final.returncode == 0, err[-3000:]
    assert {p: p.stat().st_mtime_ns for p in scores.rglob("*.json")} == before
    assert (tmp_path / "results" / "summary" / "metrics.parquet").exists()


def _snakemake(workdir: Path, *args: str) -> subprocess.Popen[str]:
    """The repository's workflow in `workdir` with profiles/local, started in the background."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(workdir),
            "--profile",
            str(REPO / "profiles" / "local"),
            *args,
        ],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
