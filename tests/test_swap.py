"""Swapping a checkpoint's weights into a running vLLM engine (ckpteval.swap), for real on CPU.

One child process starts an engine on the demo's first checkpoint, swaps the last checkpoint in,
generates, and then checks what the verification is there to catch; a second child starts a fresh
engine on the last checkpoint and generates the same prompts. The two must agree (equal, or a
near-tie under the reference model: tests/numeric.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from drivers import run_driver
from numeric import assert_same_or_near_tie

from ckpteval.swap import engine_signature

pytestmark = [pytest.mark.slow, pytest.mark.numeric]

PROMPTS = ["Q: What is 3 + 4?\nA:", "Q: What is 12 - 5?\nA:", "def add(a, b):\n", "The capital of"]

DRIVER = r"""
import json, sys
from pathlib import Path
from ckpteval.backends.vllm import VllmBackend
from ckpteval.backends import SamplingSpec
from ckpteval.swap import SwapError, verify_weights

if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    engine = {"dtype": "bfloat16", "max_model_len": 512, "seed": 42, "tensor_parallel_size": 1,
              "gpu_memory_utilization": 0.15, "enforce_eager": True}
    backend = VllmBackend(Path(spec["start"]), engine)
    greedy = [SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_tokens=24, seed=42)] * len(spec["prompts"])
    before = [g.outputs[0].text for g in backend.generate(spec["prompts"], greedy)]
    result = {"before": before}
    if spec.get("swap_to"):
        backend.swap(Path(spec["swap_to"]))
        try:
            verify_weights(backend.lm.model, Path(spec["start"]))
            result["stale_check"] = "passed"
        except SwapError as exc:
            result["stale_check"] = str(exc)
        try:
            backend.swap(Path(spec["broken"]))
            result["broken"] = "loaded"
        except Exception as exc:
            result["broken"] = type(exc).__name__
        backend.swap(Path(spec["swap_to"]))
    result["after"] = [g.outputs[0].text for g in backend.generate(spec["prompts"], greedy)]
    result["loads"], result["swaps"] = backend.loads, backend.swaps
    print("RESULT " + json.dumps(result), flush=True)
"""


def _run(work: Path, name: str, **spec: Any) -> dict[str, Any]:
    return run_driver(work, DRIVER, name, {"prompts": PROMPTS, **spec}, timeout=1200)


@pytest.fixture(scope="module")
def runs(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("swap")
    steps = sorted((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    broken = work / "broken"
    shutil.copytree(steps[-1], broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    swapped = _run(work, "swapped", start=str(steps[0]), swap_to=str(steps[-1]), broken=str(broken))
    fresh = _run(work, "fresh", start=str(steps[-1]))
    return {"swapped": swapped, "fresh": fresh, "first": steps[0], "last": steps[-1]}


def test_a_swapped_engine_generates_what_a_fresh_engine_does(runs: dict[str, Any]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    swapped, fresh = runs["swapped"], runs["fresh"]
    assert swapped["loads"] == 1 and swapped["swaps"] >= 2, "one engine, weights swapped in place"
    assert swapped["before"] != fresh["after"], "the two checkpoints must answer differently"
    model = AutoModelForCausalLM.from_pretrained(runs["last"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(runs["last"])
    for prompt, ours, theirs in zip(PROMPTS, swapped["after"], fresh["after"], strict=True):
        assert_same_or_near_tie(model, tokenizer, prompt, ours, theirs)


def test_the_check_after_a_swap_catches_weights_that_are_not_the_checkpoints(
    runs: dict[str, Any],
) -> None:
    """What vLLM issue 32718 looks like from outside: the engine holds other weights than the
    checkpoint asked for. The engine holds the last checkpoint; checked against the first, the
    verification must fail."""
    assert "sampled parameters" in runs["swapped"]["stale_check"]


def test_a_checkpoint_that_cannot_load_fails_the_swap_and_a_good_one_loads_after(
    runs: dict[str, Any],
) -> None:
    assert runs["swapped"]["broken"] != "loaded"
    assert runs["swapped"]["after"], "the engine still served the good checkpoint afterwards"


def test_only_checkpoints_with_the_same_config_and_tokenizer_share_an_engine(
    demo_dir: Path, tmp_path: Path
) -> None:
    steps = sorted((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    assert engine_signature(steps[0]) == engine_signature(steps[-1])
    other = tmp_path / "other"
    shutil.copytree(steps[-1], other)
    config = json.loads((other / "config.json").read_text())
    config["_name_or_path"] = "/elsewhere"  # provenance only: still the same engine
    (other / "config.json").write_text(json.dumps(config))
    assert engine_signature(other) == engine_signature(steps[-1])
    config["max_position_embeddings"] = 2 * config.get("max_position_embeddings", 512)
    (other / "config.json").write_text(json.dumps(config))
    assert engine_signature(other) != engine_signature(steps[-1])
    (other / "config.json").write_text((steps[-1] / "config.json").read_text())
    (other / "tokenizer.json").write_text((other / "tokenizer.json").read_text() + " ")
    assert engine_signature(other) != engine_signature(steps[-1])
