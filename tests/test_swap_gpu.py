"""Swapping weights into a running vLLM engine on a real GPU (skipped without one).

The CPU test (tests/test_swap.py) runs vLLM eagerly; on a GPU the engine captures CUDA graphs at
start (`enforce_eager: false`), and a graph keeps pointing at the parameter storage it was
captured with. A reload that reallocated a parameter instead of copying into it would leave the
graphs decoding with the old weights: the swapped engine would still answer like the first
checkpoint. So here the engine runs with CUDA graphs, starts on the demo's first checkpoint, swaps
the last one in, and must generate what a fresh engine on the last checkpoint generates (equal, or
a near-tie under the reference model: tests/numeric.py), for plain prompts, chat-templated ones,
and through lm-eval's `VLLM` wrapper (whose `.model` must be the swapped engine).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from drivers import run_driver
from numeric import assert_same_or_near_tie

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.numeric]

PROMPTS = [
    "Question: Ana has 3 pens and gets 4 more. How many pens does Ana have?\nAnswer:",
    "Question: Ben has 12 cards and gives away 5. How many cards are left?\nAnswer:",
    "def add(a, b):\n",
    "The capital of",
]
#: CUDA graphs on (the trap a reallocating reload falls into), a GPU's memory share.
GPU_ENGINE = {
    "dtype": "bfloat16",
    "max_model_len": 512,
    "seed": 42,
    "tensor_parallel_size": 1,
    "gpu_memory_utilization": 0.3,
    "enforce_eager": False,
}

DRIVER = r"""
import json, sys
from pathlib import Path
from ckpteval.backends.vllm import VllmBackend
from ckpteval.backends import SamplingSpec
from ckpteval.engine.swap import verify_weights

if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    backend = VllmBackend(Path(spec["start"]), spec["engine"])
    prompts = spec["prompts"] + [backend.render_chat(None, p) for p in spec["prompts"][:2]]
    greedy = [SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_tokens=24, seed=42)] * len(prompts)
    result = {"before": [g.outputs[0].text for g in backend.generate(prompts, greedy)]}
    if spec.get("swap_to"):
        backend.swap(Path(spec["swap_to"]))
    harness = backend.harness_model()
    result["harness_is_engine"] = harness.model is backend.lm.model
    result["checked"] = verify_weights(harness.model, backend.model_dir)
    result["after"] = [g.outputs[0].text for g in backend.generate(prompts, greedy)]
    from lm_eval.api.instance import Instance
    until = {"until": ["\n\n"], "max_gen_toks": 24, "do_sample": False}
    requests = [
        Instance(request_type="generate_until", doc={}, arguments=(p, until), idx=i)
        for i, p in enumerate(spec["prompts"])
    ]
    result["harness"] = harness.generate_until(requests, disable_tqdm=True)
    result["prompts"] = prompts
    result["loads"], result["swaps"] = backend.loads, backend.swaps
    print("RESULT " + json.dumps(result), flush=True)
"""


def run_gpu_driver(work: Path, name: str, engine: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """Run DRIVER in a child process (its own engine); returns its RESULT."""
    return run_driver(work, DRIVER, name, {"prompts": PROMPTS, "engine": engine, **spec}, 1800)


def swapped_and_fresh(demo_dir: Path, work: Path, engine: dict[str, Any]) -> dict[str, Any]:
    steps = sorted((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    swapped = run_gpu_driver(work, "swapped", engine, start=str(steps[0]), swap_to=str(steps[-1]))
    fresh = run_gpu_driver(work, "fresh", engine, start=str(steps[-1]))
    return {"swapped": swapped, "fresh": fresh, "last": steps[-1]}


def assert_equivalent(runs: dict[str, Any]) -> None:
    """The swapped engine generates what the fresh one does, by tests/numeric.py's rules."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    swapped, fresh = runs["swapped"], runs["fresh"]
    assert swapped["loads"] == 1 and swapped["swaps"] == 1, "one engine, weights swapped in place"
    assert swapped["harness_is_engine"] and swapped["checked"] > 0
    assert swapped["before"] != fresh["after"], "the two checkpoints must answer differently"
    model = AutoModelForCausalLM.from_pretrained(runs["last"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(runs["last"])
    pairs = [
        *zip(swapped["prompts"], swapped["after"], fresh["after"], strict=True),
        *zip(PROMPTS, swapped["harness"], fresh["harness"], strict=True),
    ]
    for prompt, ours, theirs in pairs:
        assert_same_or_near_tie(model, tokenizer, prompt, ours, theirs)


@pytest.fixture(scope="module")
def gpu_runs(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return swapped_and_fresh(demo_dir, tmp_path_factory.mktemp("swap-gpu"), GPU_ENGINE)


def test_a_swapped_engine_with_cuda_graphs_generates_what_a_fresh_engine_does(
    gpu_runs: dict[str, Any],
) -> None:
    assert_equivalent(gpu_runs)
