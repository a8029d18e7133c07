"""One engine serves a chain of checkpoints: load another checkpoint's weights in place, proven.

Starting a vLLM engine costs 18 s for the demo's tiny model on CPU and 30-60 s on a GPU (model
load, CUDA graphs, compilation); loading a checkpoint's weights into a running engine costs a
fraction of that (0.04 s for the demo's model). An engine job that has finished its own
checkpoint therefore goes on to the next ones of its run whose engine jobs have work in this
invocation (ckpteval.engine.chain), and swaps weights instead of starting an engine.

A swap is trusted only after it is checked: a fixed sample of the engine's parameters is read
back from the worker (`collective_rpc`) and compared with the checkpoint's own tensors, which
catches a reload that left the old weights in place (vLLM issue 32718, stale cached weights) or
reallocated instead of copying in place. Only checkpoints whose model config and tokenizer files
are those the engine was started with are swapped; anything else gets an engine of its own.

What a reload must rebuild. vLLM derives kernel state from the weights after loading them
(`process_weights_after_loading`). On a GPU its layerwise reload reruns that step per layer. On a
CPU, each linear layer (and the tied output head) gets a `cpu_linear` closure chosen by
`dispatch_cpu_unquantized_gemm`: a oneDNN handle holding a packed copy of the weight (x86 with
oneDNN support: bf16 on AVX-512, fp32 on AVX2 and up), sgl-kernel packs (AMX), zentorch prepacks
(Zen with zentorch), or `torch.nn.functional.linear` on the weight itself (the fallback). The
packed paths also drop the layer's own weight. A plain in-place reload then computes with a mix of
old packed copies and new weights. `reload_in_place` therefore keeps every dispatched layer's
weight during the reload and dispatches each layer again afterwards, from the weight it now holds;
the check after the swap reads each checked layer's weights back through its kernel as well as
from its parameter.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("ckpteval.engine.swap")

#: Values compared per parameter, and config keys that may differ between checkpoints of one
#: run without changing the engine (provenance written by the trainer or by ckpteval).
SAMPLE_VALUES = 64
VOLATILE_CONFIG_KEYS = ("_name_or_path", "transformers_version", "ckpteval")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)


class SwapError(RuntimeError):
    """The engine does not hold the checkpoint it was asked to load."""


def engine_signature(model_dir: Path) -> str:
    """What must be equal for two checkpoints to share an engine: the model config (architecture,
    shapes, context length) and the tokenizer's files."""
    digest = hashlib.sha256()
    config = json.loads((model_dir / "config.json").read_text())
    for key in VOLATILE_CONFIG_KEYS:
        config.pop(key, None)
    digest.update(json.dumps(config, sort_keys=True).encode())
    for name in TOKENIZER_FILES:
        path = model_dir / name
        digest.update(name.encode() + (path.read_bytes() if path.exists() else b"-"))
    return digest.hexdigest()[:16]


def swap_blocker(model_dir: Path) -> str | None:
    """Why an engine started on `model_dir` must not take other checkpoints' weights in place,
    or None. Quantized checkpoints repack or rescale their weights after loading (FP8, Marlin,
    GPTQ/AWQ kernels); vLLM's layerwise reload is meant to redo that, but no such swap has ever
    run under ckpteval's check, so each such checkpoint gets an engine of its own."""
    config = json.loads((model_dir / "config.json").read_text())
    quantization = config.get("quantization_config")
    if quantization:
        method = quantization.get("quant_method", "?") if isinstance(quantization, dict) else "?"
        return (
            f"quantized checkpoint ({method}): its kernels repack weights after loading, "
            "and swapping them in place has never been tested"
        )
    return None


def checkpoint_sample(model_dir: Path, n: int = SAMPLE_VALUES) -> dict[str, dict[str, list[float]]]:
    """Per tensor of the checkpoint's safetensors files: its first `n` values (`row`: of its first
    row for a matrix) and, for a matrix, the first `n` values of its first column (`col`), which
    is what a linear layer's kernel returns for the first unit vector."""
    from safetensors import safe_open

    sample: dict[str, dict[str, list[float]]] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            for name in handle.keys():
                values = handle.get_slice(name)
                matrix = len(values.get_shape()) == 2
                row = values[:1] if matrix else values[:n]
                sample[name] = {"row": [float(v) for v in row.flatten()[:n]]}
                if matrix:
                    sample[name]["col"] = [float(v) for v in values[:n, 0:1].flatten()]
    return sample


def _kernel_column(layer: Any, n: int) -> Any:
    """The first `n` values of the first column of the weight `layer` computes with, read through
    the layer's own kernel (its quant method's `apply`, what its forward pass calls) on the first
    unit vector: exact on any kernel, since every product but one is by zero and that one is by
    one. None for a layer without such a kernel."""
    import torch

    method = getattr(layer, "quant_method", None)
    weight = getattr(layer, "weight", None)
    if method is None or not hasattr(method, "apply") or weight is None:
        return None
    width = getattr(layer, "input_size_per_partition", None) or getattr(layer, "embedding_dim", 0)
    if not width and weight.dim() == 2:
        width = weight.shape[1]
    if not width:
        return None
    probe = torch.zeros(1, width, dtype=weight.dtype, device=weight.device)
    probe[0, 0] = 1
    with torch.inference_mode():
        return method.apply(layer, probe).flatten()[:n]


def _same(held: Any, values: list[float], dtype: Any) -> bool:
    import torch

    want = torch.tensor(values, dtype=torch.float32).to(dtype).to(held.device)
    return held.shape == want.shape and torch.equal(held.to(dtype), want)


def _engine_check(
    worker: Any, expected: dict[str, dict[str, list[float]]]
) -> tuple[int, list[str]]:
    """Runs inside each vLLM worker (collective_rpc): how many of the named parameters the
    engine holds, and which of them differ from `expected` once it is cast to the parameter's
    own dtype (the conversion the engine made when it loaded them): in the parameter itself,
    or as the layer's kernel computes with it (`name (kernel)`). A kernel that keeps a packed
    copy may have dropped the parameter's values; its kernel is then what is checked. Every
    other CPU-dispatched layer's kernel is checked against the weight it keeps (`name (kernel
    vs weight)`), which covers the fused projections the checkpoint has no name for."""
    model = worker.model_runner.model
    params = dict(model.named_parameters())
    compared, differ, checked = 0, [], set()
    for name, want in expected.items():
        param = params.get(name)
        if param is None:
            continue
        compared += 1
        if param.numel():
            held = (param.data[:1] if param.dim() > 1 else param.data).flatten()
            if not _same(held[: len(want["row"])], want["row"], param.dtype):
                differ.append(name)
        layer = model.get_submodule(name.rpartition(".")[0]) if "col" in want else None
        column = _kernel_column(layer, len(want["col"])) if layer is not None else None
        if column is not None:
            checked.add(id(layer))
            if not _same(column, want["col"], param.dtype):
                differ.append(f"{name} (kernel)")
        elif not param.numel():
            differ.append(f"{name} (no values and no kernel to read)")
    for module_name, layer in model.named_modules():
        weight = getattr(layer, "weight", None)
        if id(layer) in checked or not hasattr(layer, "cpu_linear") or weight is None:
            continue
        if weight.dim() == 2 and weight.numel():
            column = _kernel_column(layer, SAMPLE_VALUES)
            if column is not None and not _same(
                column, weight[: len(column), 0].tolist(), weight.dtype
            ):
                differ.append(f"{module_name} (kernel vs weight)")
    return compared, differ


def verify_weights(llm: Any, model_dir: Path) -> int:
    """Compare the engine's parameters, and the kernels that compute with them, with the
    checkpoint's; raise SwapError on any difference. Returns how many parameters were compared
    (those the engine keeps under the checkpoint's names: fused projections are checked against
    their own weights only)."""
    compared, differ = llm.collective_rpc(_engine_check, args=(checkpoint_sample(model_dir),))[0]
    if not compared:
        raise SwapError(f"{model_dir}: no parameter of the checkpoint found in the engine")
    if differ:
        raise SwapError(
            f"{model_dir}: after the swap the engine holds other values than the checkpoint "
            f"in {len(differ)} place(s) of {compared} sampled parameters and their kernels "
            f"(e.g. {differ[0]})"
        )
    return compared


def _dispatched_layers(model: Any) -> list[Any]:
    """The layers vLLM's CPU backend gave a kernel of its own (`cpu_linear`), but those it
    deliberately leaves on the plain torch kernel."""
    return [
        m
        for m in model.modules()
        if hasattr(m, "cpu_linear") and not getattr(m, "_cpu_skip_gemm_dispatch", False)
    ]


def _restore_full_weight(layer: Any) -> bool:
    """Give a layer whose packed kernel dropped its weight a full-size weight again (shape, dtype
    and loader as vLLM recorded them before the first load), so that a reload has somewhere to
    put the new values. True if it had to."""
    import torch
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info
    from vllm.model_executor.model_loader.reload.meta import materialize_meta_tensor

    weight = getattr(layer, "weight", None)
    meta = get_layerwise_info(layer).restore_metadata[0].get("weight")
    if weight is None or meta is None or weight.numel() == meta.numel():
        return False
    with torch.device(weight.device):
        full = materialize_meta_tensor(meta)
    del layer.weight
    layer.register_parameter("weight", full)
    return True


def reload_in_place(worker: Any, weights_path: str) -> int:
    """Runs inside each vLLM worker (collective_rpc): load `weights_path` into the engine in
    place, and rebuild what the CPU backend derived from the old weights (module docstring).
    Dispatched layers keep their weights from then on (their packed copies are rebuilt from
    them at every swap), which costs one more copy of the linear weights in memory. Returns how
    many layers were dispatched again (0 off the CPU backend: vLLM's own reload reruns each
    layer's post-load processing)."""
    model = worker.model_runner.model
    dispatched = _dispatched_layers(model)
    if not dispatched:
        worker.reload_weights(weights_path=weights_path)
        return 0
    import vllm.model_executor.layers.utils as gemm

    for layer in dispatched:
        _restore_full_weight(layer)
    dispatch = gemm.dispatch_cpu_unquantized_gemm

    def keep_weight(layer: Any, remove_weight: bool) -> None:
        dispatch(layer, remove_weight=False)

    gemm.dispatch_cpu_unquantized_gemm = keep_weight
    try:
        worker.reload_weights(weights_path=weights_path)
    finally:
        gemm.dispatch_cpu_unquantized_gemm = dispatch
    for layer in dispatched:
        if layer.weight.dim() == 2:
            dispatch(layer, remove_weight=False)
    return len(dispatched)


def swap_weights(llm: Any, model_dir: Path) -> float:
    """Load `model_dir`'s weights into the running engine in place (reload_in_place), drop every
    cached prefix, and check the result (verify_weights). Returns the seconds it took."""
    started = time.monotonic()
    llm.collective_rpc(reload_in_place, args=(str(model_dir),))
    llm.reset_prefix_cache()
    compared = verify_weights(llm, model_dir)
    seconds = time.monotonic() - started
    log.info("swapped to %s in %.2f s (%d parameters checked)", model_dir, seconds, compared)
    return seconds
