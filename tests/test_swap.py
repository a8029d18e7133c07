"""Swapping a checkpoint's weights into a running vLLM engine (ckpteval.engine.swap), for real on CPU,
on each kernel path vLLM's CPU backend takes, forced whatever this machine would choose.

vLLM's CPU backend computes a linear layer either with `torch.nn.functional.linear` on the layer's
weight or with a kernel of its own that keeps a packed copy of it (oneDNN on x86, sgl-kernel's
AMX packing on AMX CPUs; zentorch on Zen is not here). Which one depends on the CPU and the dtype:
bf16 takes oneDNN only with AVX-512, fp32 takes it from AVX2 on. So each path is forced
(`CKPTEVAL_CPU_LINEAR`, ckpteval.engine.cpu_kernels): `torch` in bf16 (the production dtype),
`onednn` in fp32 (the dtype in which every x86-64 machine these tests run on builds oneDNN
kernels), `amx` in bf16 where the CPU has AMX (skipped elsewhere, saying so), and the engine
reports the kernels it built, so a path that silently fell back fails the test.

Per path, one child process starts an engine on the demo's first checkpoint, swaps the last
checkpoint in, generates, and then checks what the verification is there to catch; a second
child starts a fresh engine on the last checkpoint and generates the same prompts. The two must
agree (equal, or a near-tie under the reference model: tests/numeric.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from drivers import run_driver
from numeric import assert_same_or_near_tie

from ckpteval.engine.swap import engine_signature

pytestmark = [pytest.mark.slow, pytest.mark.numeric]

PROMPTS = ["Q: What is 3 + 4?\nA:", "Q: What is 12 - 5?\nA:", "def add(a, b):\n", "The capital of"]
#: Kernel path -> the dtype in which every x86-64 machine of ours takes it (`amx`: those with AMX).
PATHS = {"torch": "bfloat16", "onednn": "float32", "amx": "bfloat16"}
#: The label ckpteval.engine.cpu_kernels.cpu_linear_kinds gives each path's layers.
KERNEL = {"torch": "torch", "onednn": "onednn", "amx": "sgl"}
HAS_AMX = bool(torch.cpu._is_amx_tile_supported())
#: The paths this CPU can take, each a test parameter; `amx` is skipped, saying why, elsewhere.
RUNNABLE = [p for p in PATHS if p != "amx" or HAS_AMX]
ALL_PATHS = [
    pytest.param(
        p,
        marks=pytest.mark.skipif(
            p not in RUNNABLE, reason="this CPU has no AMX tiles: the amx path runs on AMX CPUs"
        ),
    )
    for p in PATHS
]

DRIVER = r"""
import json, os, sys
from pathlib import Path

if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    os.environ["CKPTEVAL_CPU_LINEAR"] = spec["path"]
    from ckpteval.backends.vllm import VllmBackend
    from ckpteval.backends import SamplingSpec
    from ckpteval.engine.swap import SwapError, verify_weights

    engine = {"dtype": spec["dtype"], "max_model_len": 512, "seed": 42, "tensor_parallel_size": 1,
              "gpu_memory_utilization": 0.15, "enforce_eager": True}
    backend = VllmBackend(Path(spec["start"]), engine)
    greedy = [SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_tokens=24, seed=42)] * len(spec["prompts"])
    before = [g.outputs[0].text for g in backend.generate(spec["prompts"], greedy)]
    result = {"before": before, "kernels": backend.cpu_kernels}
    if spec.get("swap_to"):
        # A swap through vLLM's own reload alone, without ckpteval's rebuild of the CPU
        # kernels: what the check inside every swap must refuse wherever a kernel keeps a
        # packed copy (a swap that skipped its check would pass here).
        import ckpteval.engine.swap as swap

        rebuild = swap.reload_in_place
        swap.reload_in_place = lambda worker, path: worker.reload_weights(weights_path=path)
        try:
            backend.swap(Path(spec["swap_to"]))
            result["plain_reload"] = "passed"
        except SwapError as exc:
            result["plain_reload"] = str(exc)
        finally:
            swap.reload_in_place = rebuild
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
    found: dict[str, Any] = {"first": steps[0], "last": steps[-1]}
    for path in RUNNABLE:
        dtype = PATHS[path]
        common = {"path": path, "dtype": dtype}
        found[path] = {
            "swapped": _run(
                work,
                f"swapped-{path}",
                start=str(steps[0]),
                swap_to=str(steps[-1]),
                broken=str(broken),
                **common,
            ),
            "fresh": _run(work, f"fresh-{path}", start=str(steps[-1]), **common),
        }
    return found


@pytest.mark.parametrize("path", ALL_PATHS)
def test_each_kernel_path_is_the_one_forced(runs: dict[str, Any], path: str) -> None:
    """The engine built the forced kernel for every dispatched layer (the demo's 16 linear
    layers and its tied output head), in the swapped and in the fresh engine alike. AMX packs
    only shapes its tiles fit; the others take oneDNN."""
    for name in ("swapped", "fresh"):
        kernels = runs[path][name]["kernels"]
        if path == "amx":
            assert kernels.get("sgl", 0) >= 1 and set(kernels) <= {"sgl", "onednn"}, kernels
        else:
            assert set(kernels) == {KERNEL[path]} and kernels[KERNEL[path]] >= 17, (name, kernels)


@pytest.mark.parametrize("path", ALL_PATHS)
def test_a_swapped_engine_generates_what_a_fresh_engine_does(
    runs: dict[str, Any], path: str
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    swapped, fresh = runs[path]["swapped"], runs[path]["fresh"]
    assert swapped["loads"] == 1 and swapped["swaps"] >= 2, "one engine, weights swapped in place"
    assert swapped["before"] != fresh["after"], "the two checkpoints must answer differently"
    model = AutoModelForCausalLM.from_pretrained(runs["last"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(runs["last"])
    for prompt, ours, theirs in zip(PROMPTS, swapped["after"], fresh["after"], strict=True):
        assert_same_or_near_tie(model, tokenizer, prompt, ours, theirs)


@pytest.mark.parametrize("path", ALL_PATHS)
def test_the_check_after_a_swap_catches_weights_that_are_not_the_checkpoints(
    runs: dict[str, Any], path: str
) -> None:
    """What vLLM issue 32718 looks like from outside: the engine holds other weights than the
    checkpoint asked for. The engine holds the last checkpoint; checked against the first, the
    verification must fail."""
    assert "sampled parameters" in runs[path]["swapped"]["stale_check"]


def test_the_check_reads_the_weights_through_the_kernels(runs: dict[str, Any]) -> None:
    """vLLM's in-place reload alone leaves the oneDNN kernel of the tied output head computing
    with the old checkpoint (the layer's own weight holds the new one). The check inside every
    swap reads each dispatched layer's weights back through its kernel, so a swap made with that
    reload fails; on the plain torch path, where nothing is packed, the same reload is sound."""
    assert "(kernel" in runs["onednn"]["swapped"]["plain_reload"]
    assert runs["torch"]["swapped"]["plain_reload"] == "passed"


@pytest.mark.parametrize("path", ALL_PATHS)
def test_a_checkpoint_that_cannot_load_fails_the_swap_and_a_good_one_loads_after(
    runs: dict[str, Any], path: str
) -> None:
    assert runs[path]["swapped"]["broken"] != "loaded"
    assert runs[path]["swapped"]["after"], "the engine still served the good checkpoint afterwards"


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


def test_a_quantized_checkpoint_is_not_swapped_and_the_reason_is_one_line(
    demo_dir: Path, tmp_path: Path
) -> None:
    from ckpteval.engine.swap import swap_blocker

    steps = sorted((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    assert swap_blocker(steps[-1]) is None
    quantized = tmp_path / "fp8"
    quantized.mkdir()
    config = json.loads((steps[-1] / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    (quantized / "config.json").write_text(json.dumps(config))
    why = swap_blocker(quantized)
    assert why and "fp8" in why and "\n" not in why
