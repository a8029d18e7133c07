"""The chain's order of work (ckpteval.engine.job._chain, ckpteval.engine.chain.scan) with a stand-in engine:
which checkpoints an engine job serves after its own, which it leaves to their own jobs and why,
and how long it waits for a consolidation. The swaps and generations themselves run for real in
tests/test_swap.py and tests/test_swap_workflow.py; here the engine only records what it is asked.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import ckpteval.engine.job as steps
from ckpteval.contract import Identity
from ckpteval.freshness import StaleCell
from ckpteval.plan.layout import CellKey, request_path
from ckpteval.verbs import request_body, write_request

RUN, INVOCATION = "r", "inv-1"


class StandIn:
    """An engine that records swaps; a swap to a checkpoint named in `broken` fails."""

    def __init__(self, model_dir: Path, load_seconds: float, broken: set[str]) -> None:
        self.model_dir, self.load_seconds, self.broken = model_dir, load_seconds, broken
        self.swapped: list[str] = []

    def swap(self, model_dir: Path) -> None:
        if model_dir.name in self.broken:
            raise RuntimeError(f"{model_dir}/model.safetensors: incomplete file\nmore detail")
        self.swapped.append(model_dir.name)
        self.model_dir = model_dir


def _request(out: Path, ckpt: str) -> Path:
    """The request file a run writes when it starts for `ckpt`'s engine job (round r1)."""
    request = request_path(out / "staging" / RUN / ckpt / "main", "r1")
    key = CellKey(RUN, ckpt, "arith", "greedy-s42")
    cell = StaleCell(key, Identity({"task.definition": ckpt}), "missing")
    write_request(request, request_body([cell], INVOCATION, {}))
    return request


def _consolidate(out: Path, ckpt: str, layers: int = 4) -> None:
    model = out / "models" / RUN / ckpt
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": layers}))
    (model.parent / f"{ckpt}.json").write_text(json.dumps({"weights_sha256": ckpt}))


def _chain(out: Path, engine: StandIn, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Run the chain of step_1's engine job; the checkpoints it generated for, in order."""
    generated: list[str] = []
    monkeypatch.setattr(
        steps,
        "_generate",
        lambda smk, eng, job, staging, *a, **k: generated.append(staging.parent.name),
    )
    monkeypatch.setattr(steps, "CHAIN_POLL_SECONDS", 0.1)
    smk = SimpleNamespace(
        wildcards=SimpleNamespace(run=RUN, ckpt="step_1"),
        params=SimpleNamespace(
            request=str(out / "staging" / RUN / "step_1" / "main.r1.request.json")
        ),
    )
    steps._chain(smk, steps.EngineSession(engine), out / "staging" / RUN / "step_1" / "main")
    return generated


@pytest.fixture
def out(tmp_path: Path) -> Path:
    out = tmp_path / "results"
    for ckpt in ("step_1", "step_2", "step_3", "step_4", "step_5"):
        _request(out, ckpt)
    for ckpt in ("step_1", "step_2", "step_5"):
        _consolidate(out, ckpt)
    _consolidate(out, "step_4", layers=2)  # another architecture
    return out


def test_the_chain_skips_what_it_cannot_serve_and_waits_for_a_consolidation(
    out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """step_2's swap fails (skipped, the chain goes on), step_3 is consolidated while the chain
    works (waited for), step_4 has another architecture (left to its own job)."""
    later = threading.Timer(1.0, _consolidate, (out, "step_3"))
    later.start()
    engine = StandIn(out / "models" / RUN / "step_1", load_seconds=30.0, broken={"step_2"})
    started = time.monotonic()
    try:
        generated = _chain(out, engine, monkeypatch)
    finally:
        later.cancel()
    said = capsys.readouterr().out
    assert generated == engine.swapped == ["step_5", "step_3"]
    assert "chain: cannot serve r/step_2: " in said and "incomplete file" in said
    assert "more detail" not in said, "one line per skipped checkpoint"
    assert "chain: r/step_4 has another model config or tokenizer" in said
    assert time.monotonic() - started < 30, "it stops waiting once nothing is pending"


def test_the_chain_waits_no_longer_than_its_engine_took_to_start(
    out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = StandIn(out / "models" / RUN / "step_1", load_seconds=0.5, broken=set())
    started = time.monotonic()
    generated = _chain(out, engine, monkeypatch)
    assert generated == ["step_2", "step_5"]
    assert 0.5 <= time.monotonic() - started < 10
    assert (
        "chain: step_3 not consolidated in time; their jobs serve them" in capsys.readouterr().out
    )


def test_a_failed_generation_stops_the_chain(
    out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = StandIn(out / "models" / RUN / "step_1", load_seconds=0.0, broken=set())

    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("engine died")

    monkeypatch.setattr(steps, "_generate", fail)
    smk = SimpleNamespace(
        wildcards=SimpleNamespace(run=RUN, ckpt="step_1"),
        params=SimpleNamespace(
            request=str(out / "staging" / RUN / "step_1" / "main.r1.request.json")
        ),
    )
    steps._chain(smk, steps.EngineSession(engine), out / "staging" / RUN / "step_1" / "main")
    assert engine.swapped == ["step_2"]
    assert "chain: stopped at r/step_2: engine died" in capsys.readouterr().out
