"""One engine serves a chain of checkpoints: load another checkpoint's weights in place, proven.

Starting a vLLM engine costs 18 s for the demo's tiny model on CPU and 30-60 s on a GPU (model
load, CUDA graphs, compilation); loading a checkpoint's weights into a running engine costs a
fraction of that (0.04 s for the demo's model). An engine job that has finished its own
checkpoint therefore goes on to the next ones of its run whose engine jobs have work in this
invocation (ckpteval.chain), and swaps weights instead of starting an engine.

A swap is trusted only after it is checked: a fixed sample of the engine's parameters is read
back from the worker (`collective_rpc`) and compared with the checkpoint's own tensors, which
catches a reload that left the old weights in place (vLLM issue 32718, stale cached weights) or
reallocated instead of copying in place. Only checkpoints whose model config and tokenizer files
are those the engine was started with are swapped; anything else gets an engine of its own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("ckpteval.swap")

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


def checkpoint_sample(model_dir: Path, n: int = SAMPLE_VALUES) -> dict[str, list[float]]:
    """The first `n` values of every tensor in the checkpoint's safetensors files."""
    from safetensors import safe_open

    sample: dict[str, list[float]] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            for name in handle.keys():
                values = handle.get_slice(name)
                flat = values[:1] if len(values.get_shape()) > 1 else values[:n]
                sample[name] = [float(v) for v in flat.flatten()[:n]]
    return sample


def _engine_check(worker: Any, expected: dict[str, list[float]]) -> tuple[int, list[str]]:
    """Runs inside each vLLM worker (collective_rpc): how many of the named parameters the
    engine holds, and which of them differ from `expected` once it is cast to the parameter's
    own dtype (the conversion the engine made when it loaded them)."""
    import torch

    params = dict(worker.model_runner.model.named_parameters())
    compared, differ = 0, []
    for name, values in expected.items():
        param = params.get(name)
        if param is None:
            continue
        held = (param.data[:1] if param.dim() > 1 else param.data).flatten()[: len(values)]
        want = torch.tensor(values, dtype=torch.float32).to(param.dtype).to(held.device)
        compared += 1
        if held.shape != want.shape or not torch.equal(held, want):
            differ.append(name)
    return compared, differ


def verify_weights(llm: Any, model_dir: Path) -> int:
    """Compare the engine's parameters with the checkpoint's; raise SwapError on any difference.
    Returns how many parameters were compared (those the engine keeps under the checkpoint's
    names: fused projections are left out)."""
    compared, differ = llm.collective_rpc(_engine_check, args=(checkpoint_sample(model_dir),))[0]
    if not compared:
        raise SwapError(f"{model_dir}: no parameter of the checkpoint found in the engine")
    if differ:
        raise SwapError(
            f"{model_dir}: after the swap the engine holds other values for {len(differ)} of "
            f"{compared} sampled parameters (e.g. {differ[0]})"
        )
    return compared


def swap_weights(llm: Any, model_dir: Path) -> float:
    """Load `model_dir`'s weights into the running engine in place, drop every cached prefix,
    and check the result (verify_weights). Returns the seconds it took."""
    started = time.monotonic()
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(model_dir)})
    llm.reset_prefix_cache()
    compared = verify_weights(llm, model_dir)
    seconds = time.monotonic() - started
    log.info("swapped to %s in %.2f s (%d parameters checked)", model_dir, seconds, compared)
    return seconds
