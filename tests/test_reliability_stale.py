"""Weights overwritten in place (same path, new content): the manifest hash changes, everything
downstream of that checkpoint reruns, and nothing else does.

A run of two real demo checkpoints (copies, so they can be rewritten) is swept once. Then the
second checkpoint's weight file is overwritten in place with the first one's weights, the way a
trainer re-saving a step would. Using the first checkpoint's weights is deliberate: the expected
result of every rerun job is then known exactly (the first checkpoint's generations and verdicts),
and the generation cache, keyed by the new weights hash, proves the new weights are the ones used
(no engine is even loaded). The other checkpoint's files and the cache must not be touched.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_snakemake, small_config, write_config

pytestmark = pytest.mark.slow

TASKS = {"arith": {"limit": 8}, "pyfunc": {"limit": 3}}


def _files(root: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def _of(files: dict[Path, int], results: Path, ckpt: str) -> dict[Path, int]:
    """The files of one checkpoint: its model, manifest, generations, scores (not its engine
    job's bookkeeping under staging/: done, request and claim files)."""
    return {
        p: t
        for p, t in files.items()
        if (ckpt in p.relative_to(results).parts or p.name == f"{ckpt}.json")
        and p.relative_to(results).parts[0] != "staging"
    }


@pytest.fixture(scope="module")
def sweep(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("stale")
    steps = sorted((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    for ckpt in steps[:2]:
        shutil.copytree(ckpt, work / "run" / ckpt.name)
    write_config(work, small_config(work / "run", tasks=TASKS))
    proc = run_snakemake(work)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return work


def test_overwritten_weights_rerun_that_checkpoint_and_nothing_else(sweep: Path) -> None:
    results = sweep / "results"
    first, second = sorted(
        (p.name for p in (sweep / "run").iterdir()), key=lambda name: int(name.split("_")[1])
    )
    manifest = results / "models" / "demo" / f"{second}.json"
    old_hash = json.loads(manifest.read_text())["weights_sha256"]
    new_hash = json.loads((results / "models" / "demo" / f"{first}.json").read_text())[
        "weights_sha256"
    ]
    assert old_hash != new_hash
    before = _files(results)

    weights = sorted((sweep / "run" / second).glob("*.safetensors"))
    assert weights
    time.sleep(0.01)  # a new mtime even on a coarse clock
    for path in weights:
        data = (sweep / "run" / first / path.name).read_bytes()
        with open(path, "r+b") as handle:  # same path, same inode: rewritten, not replaced
            handle.write(data)
            handle.truncate()

    dry = run_snakemake(sweep, "-n")
    assert dry.returncode == 0, dry.stderr[-3000:]
    counts = dict(
        re.findall(
            r"^(consolidate|infer|evaluate|aggregate)\s+(\d+)", dry.stdout + dry.stderr, re.M
        )
    )
    assert counts == {
        "consolidate": "1",
        "infer": "1",
        "evaluate": str(len(TASKS)),
        "aggregate": "1",
    }

    proc = run_snakemake(sweep)
    assert proc.returncode == 0, proc.stderr[-4000:]
    after = _files(results)

    # The manifest follows the bytes on disk.
    assert json.loads(manifest.read_text())["weights_sha256"] == new_hash
    # Nothing of the other checkpoint, and no cache file, was rewritten.
    untouched = {
        **_of(before, results, first),
        **{p: t for p, t in before.items() if "cache" in p.relative_to(results).parts},
    }
    assert {p: after.get(p) for p in untouched} == untouched
    # Every file of the rewritten checkpoint was written again.
    for path, mtime in _of(before, results, second).items():
        if path.exists():
            assert after[path] != mtime, f"{path} was not rerun"
    # ... from the new weights: their generations and verdicts are the first checkpoint's.
    for kind in ("generations", "scores"):
        for path in (results / kind / "demo" / first).rglob("*.jsonl"):
            twin = (
                results / kind / "demo" / second / path.relative_to(results / kind / "demo" / first)
            )
            strip = ("duration_s", "prompt_tokens") if kind == "scores" else ()
            assert _lines(twin, strip) == _lines(path, strip), twin
    for meta in (results / "generations" / "demo" / second).rglob("*.meta.json"):
        data = json.loads(meta.read_text())
        assert data["model_hash"] == new_hash
        assert data["engine_loads"] == 0 and data["n_generated_prompts"] == 0, data
    for cell in (results / "scores" / "demo" / second).rglob("*.json"):
        assert json.loads(cell.read_text())["model_hash"] == new_hash
    table = pd.read_parquet(results / "summary" / "metrics.parquet")
    assert set(table[table.ckpt == second]["model_hash"]) == {new_hash}

    proc = run_snakemake(sweep, "-n")
    assert "Nothing to be done" in proc.stdout + proc.stderr


def _lines(path: Path, strip: tuple[str, ...]) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if k not in strip}
        for line in path.read_text().splitlines()
    ]
