"""The KV cache an engine on CPU asks for: what its sequences need, not the machine's memory."""

from __future__ import annotations

import json

import pytest

from ckpteval.engine import kvcache

LLAMA = {
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 256,
}


def write_config(tmp_path, config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_bytes_per_token_follow_the_configs_grouped_heads_and_head_dim():
    assert kvcache.token_bytes(LLAMA) == 2 * 4 * 2 * 64 * 4
    assert kvcache.token_bytes({**LLAMA, "head_dim": 128}) == 2 * 4 * 2 * 128 * 4
    no_gqa = {k: v for k, v in LLAMA.items() if k != "num_key_value_heads"}
    assert kvcache.token_bytes(no_gqa) == 2 * 4 * 4 * 64 * 4
    assert kvcache.token_bytes({"text_config": LLAMA}) == kvcache.token_bytes(LLAMA)


def test_a_tiny_model_gets_the_floor_and_a_large_context_gets_its_sequences(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setattr(kvcache, "_available_memory", lambda: 64 * kvcache.GIB)
    model = write_config(tmp_path, LLAMA)
    assert kvcache.cpu_kv_cache_bytes(model, 4096) == kvcache.GIB
    assert kvcache.cpu_engine_args(model, 4096) == {"kv_cache_memory_bytes": kvcache.GIB}
    wide = write_config(tmp_path, {**LLAMA, "num_hidden_layers": 32, "num_key_value_heads": 8})
    need = (
        kvcache.SEQUENCES
        * 8192
        * kvcache.token_bytes(json.loads((wide / "config.json").read_text()))
    )
    got = kvcache.cpu_kv_cache_bytes(wide, 8192)
    assert got >= need and got % kvcache.MIB == 0 and got - need < kvcache.MIB


@pytest.mark.parametrize(
    "case", ["user variable", "need over half the memory", "no config", "odd config"]
)
def test_vllms_own_sizing_is_left_alone_where_ckpteval_cannot_do_better(
    tmp_path, monkeypatch, case
):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setattr(kvcache, "_available_memory", lambda: 64 * kvcache.GIB)
    model = write_config(tmp_path, LLAMA)
    if case == "user variable":
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    elif case == "need over half the memory":
        monkeypatch.setattr(kvcache, "_available_memory", lambda: kvcache.GIB)
    elif case == "no config":
        (model / "config.json").unlink()
    else:
        write_config(tmp_path, {"architectures": ["Mamba"]})
    assert kvcache.cpu_kv_cache_bytes(model, 4096) is None
    assert kvcache.cpu_engine_args(model, 4096) == {}  # no engine argument: vLLM's own sizing
