"""How much memory a vLLM engine on CPU takes for its KV cache.

On a GPU, vLLM sizes the KV cache from `gpu_memory_utilization`. On a CPU, unless told otherwise,
it takes that share of the whole NUMA node's memory and writes all of it before the first token:
measured on a 24 GB machine, 17 GiB for the demo's 4-layer model, and 21 s of the engine's 34 s
start (1 GiB: 0.5 s). Two engines side by side (two jobs, or a job beside a test) each ask for
80% of the machine; the second one fails "Available memory ... is less than requested memory".

An engine job on CPU needs a cache for the sequences it runs at once, not for the node: ckpteval
asks for `SEQUENCES` sequences of `engine.max_model_len` tokens (at least 1 GiB), with four bytes
per value whatever the dtype, and leaves vLLM's own sizing when that is more than half of the
memory available. A user's `VLLM_CPU_KVCACHE_SPACE` (GiB, vLLM's own variable) always wins. The
size changes no generation: the cache holds the same values; a smaller one only lets fewer
sequences run at once, and greedy outputs are compared between engines sized alike.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

GIB = 1 << 30
MIB = 1 << 20

#: Full-length sequences the cache holds at once (vLLM schedules the rest after them).
SEQUENCES = 16


def token_bytes(config: dict) -> int:
    """KV cache bytes per token of a Hugging Face model config, at four bytes a value."""
    text = config.get("text_config") or config
    layers = int(text["num_hidden_layers"])
    heads = int(text.get("num_attention_heads") or 1)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    return 2 * layers * kv_heads * head_dim * 4


def cpu_kv_cache_bytes(model_dir: Path | str, max_model_len: int) -> int | None:
    """The KV cache to ask of an engine on CPU, or None for vLLM's own choice (the user set
    `VLLM_CPU_KVCACHE_SPACE`, the config is not a usual decoder's, or the need is too large)."""
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return None
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
        per_token = token_bytes(config)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None
    need = max(GIB, SEQUENCES * int(max_model_len) * per_token)
    need = -(-need // MIB) * MIB
    available = _available_memory()
    if available is not None and need > available // 2:
        return None
    return need


def cpu_engine_args(model_dir: Path | str, max_model_len: int) -> dict[str, int]:
    """The vLLM engine argument for `cpu_kv_cache_bytes` (`kv_cache_memory_bytes`), or nothing
    where vLLM's own sizing stays: what every engine ckpteval starts on CPU passes."""
    need = cpu_kv_cache_bytes(model_dir, max_model_len)
    return {} if need is None else {"kv_cache_memory_bytes": need}


def _available_memory() -> int | None:
    try:
        import psutil
    except ImportError:  # pragma: no cover - vLLM depends on psutil
        return None
    return int(psutil.virtual_memory().available)
