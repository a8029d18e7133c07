"""consolidate: every checkpoint format becomes a verified HF directory with the original's weights.

The core assertion for each format: the consolidated weights equal the in-memory model's (cast to
the output dtype), and the smoke generation recorded in the manifest is that model's greedy
continuation: every smoke token is the in-memory model's argmax, up to a measured rounding
tolerance (tests/numeric.py: engines and CPUs break near-ties differently, so token ids are not
compared for equality). One test uses vLLM (the engine the infer step uses); the others use the
transformers smoke engine to keep CI time down.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from numeric import assert_greedy_under, other_machine_env
from safetensors.torch import load_file, save_file

from ckpteval.consolidate import (
    SMOKE_PROMPT,
    SMOKE_TOKENS,
    choose_prefix,
    consolidate_checkpoint,
    strip_wrappers,
)
from ckpteval.errors import UserError
from ckpteval.formats.safetensors_io import summarize_weights, weight_files

HERE = Path(__file__).resolve().parent
TIED = "lm_head.weight"


@dataclass
class Tiny:
    """A random 2-layer Llama (fp32, tied embeddings) saved as an HF dir, and its tokenizer."""

    model: Any
    tokenizer: Any
    hf_dir: Path
    tokenizer_dir: Path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from ckpteval.demo import EOS, build_tokenizer

    root = tmp_path_factory.mktemp("tiny")
    tokenizer_dir = build_tokenizer(root / "tokenizer")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        initializer_range=0.5,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    hf_dir = root / "hf"
    model.save_pretrained(hf_dir)
    copy_tokenizer(tokenizer_dir, hf_dir)
    return Tiny(model, tokenizer, hf_dir, tokenizer_dir)


def copy_tokenizer(tokenizer_dir: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for item in tokenizer_dir.iterdir():
        shutil.copy(item, target / item.name)


def greedy_ids(model: Any, tokenizer: Any) -> list[int]:
    """What the smoke check generates, computed on an in-memory model."""
    inputs = tokenizer(SMOKE_PROMPT, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=SMOKE_TOKENS,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def assert_smoke_of(
    manifest: dict[str, Any], model: Any, tokenizer: Any, dtype: torch.dtype
) -> None:
    """The manifest's smoke tokens are `model`'s greedy continuation of the smoke prompt."""
    prompt_ids = tokenizer(SMOKE_PROMPT)["input_ids"]
    assert len(manifest["smoke"]["token_ids"]) == SMOKE_TOKENS
    assert_greedy_under(model, prompt_ids, manifest["smoke"]["token_ids"], dtype)


def load_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in weight_files(model_dir):
        tensors.update(load_file(path))
    return tensors


def assert_same_model(
    out_dir: Path, manifest: dict[str, Any], model: Any, tokenizer: Any, dtype: torch.dtype
) -> None:
    """Weights equal the model's cast to `dtype`; the smoke tokens are its greedy tokens."""
    reference = {k: v for k, v in model.state_dict().items() if k != TIED}
    loaded = load_weights(out_dir)
    assert sorted(loaded) == sorted(reference)
    for name, tensor in reference.items():
        assert loaded[name].dtype == dtype, name
        assert torch.equal(loaded[name], tensor.to(dtype)), name
    assert manifest["param_count"] == sum(t.numel() for t in reference.values())
    counts = manifest["tensors"]
    assert (counts["n"], counts["missing"], counts["unexpected"]) == (len(reference), [], [])
    assert_smoke_of(manifest, copy.deepcopy(model).to(dtype), tokenizer, dtype)
    assert manifest["smoke"]["text"]


def consolidate(
    source: Path, tmp_path: Path, name: str = "out", **kwargs: Any
) -> tuple[Path, dict[str, Any]]:
    out_dir, manifest_path = tmp_path / "models" / name, tmp_path / "models" / f"{name}.json"
    kwargs.setdefault("smoke", "transformers")
    manifest = consolidate_checkpoint(source, out_dir, manifest_path, **kwargs)
    assert json.loads(manifest_path.read_text()) == manifest
    assert not list(out_dir.parent.glob(f".{name}.*")), "staging dirs left behind"
    return out_dir, manifest


@pytest.mark.numeric
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_smoke_comparison_passes_the_model_and_fails_a_wrong_tensor(
    tiny: Tiny, dtype: torch.dtype
) -> None:
    """The margin the smoke assertions allow (tests/numeric.py) still catches a wrong tensor: the
    greedy tokens of copies with one tensor replaced or reordered are refused, the model's own
    (computed in either dtype: its near-ties may break either way) are accepted."""
    weights = copy.deepcopy(tiny.model).to(dtype)
    prompt_ids = tiny.tokenizer(SMOKE_PROMPT)["input_ids"]
    for engine_dtype in (torch.float32, dtype):
        own = greedy_ids(copy.deepcopy(weights).to(engine_dtype), tiny.tokenizer)
        assert_greedy_under(weights, prompt_ids, own, dtype)
    corruptions = {
        "down_proj of layer 1 loaded into layer 0": lambda m: m.model.layers[
            0
        ].mlp.down_proj.weight.copy_(m.model.layers[1].mlp.down_proj.weight),
        "gate_proj loaded from up_proj": lambda m: m.model.layers[0].mlp.gate_proj.weight.copy_(
            m.model.layers[0].mlp.up_proj.weight
        ),
        "k_proj rows reversed": lambda m: m.model.layers[0].self_attn.k_proj.weight.copy_(
            m.model.layers[0].self_attn.k_proj.weight.flip(0)
        ),
    }
    for name, corrupt in corruptions.items():
        wrong = copy.deepcopy(weights)
        with torch.no_grad():
            corrupt(wrong)
        with pytest.raises(AssertionError, match="not this model's greedy tokens"):
            assert_greedy_under(weights, prompt_ids, greedy_ids(wrong, tiny.tokenizer), dtype)
            pytest.fail(f"{name}: accepted")


# ---- the formats ------------------------------------------------------------------------------


@pytest.mark.numeric
def test_hf_dir_in_the_output_dtype_is_hard_linked_not_copied(tiny: Tiny, tmp_path: Path) -> None:
    out_dir, manifest = consolidate(tiny.hf_dir, tmp_path, dtype="float32")

    assert (
        os.stat(out_dir / "model.safetensors").st_ino
        == os.stat(tiny.hf_dir / "model.safetensors").st_ino
    )
    weights = [f for f in manifest["files"] if f["name"] == "model.safetensors"]
    assert weights[0]["how"] == "hardlink"
    assert manifest["format"] == "hf" and manifest["dtype"] == "float32"
    assert manifest["architecture"] == "LlamaForCausalLM"
    assert json.loads((out_dir / "config.json").read_text())["dtype"] == "float32"
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
    ):
        assert (out_dir / name).is_file(), name
    assert manifest["source"] == str(tiny.hf_dir)
    assert manifest["consolidate_version"] and manifest["ckpteval_version"]
    assert manifest["smoke"]["engine"] == "transformers"
    assert manifest["smoke"]["prompt"] == SMOKE_PROMPT
    assert_same_model(out_dir, manifest, tiny.model, tiny.tokenizer, torch.float32)


@pytest.mark.numeric
def test_sharded_fp32_becomes_bf16_and_the_hash_ignores_sharding(
    tiny: Tiny, tmp_path: Path
) -> None:
    sharded = tmp_path / "sharded32"
    tiny.model.save_pretrained(sharded, max_shard_size="300KB")
    copy_tokenizer(tiny.tokenizer_dir, sharded)
    assert len(list(sharded.glob("model-*.safetensors"))) > 2

    out_dir, manifest = consolidate(sharded, tmp_path, "from32")
    assert manifest["dtype"] == "bfloat16"
    assert all(f["how"] != "hardlink" for f in manifest["files"])
    assert_same_model(out_dir, manifest, tiny.model, tiny.tokenizer, torch.bfloat16)

    # The same model saved in bf16 with other shard sizes: linked as is, same weights hash.
    sharded16 = tmp_path / "sharded16"
    copy.deepcopy(tiny.model).to(torch.bfloat16).save_pretrained(sharded16, max_shard_size="200KB")
    copy_tokenizer(tiny.tokenizer_dir, sharded16)
    linked_dir, linked = consolidate(sharded16, tmp_path, "from16")
    assert {f["how"] for f in linked["files"] if f["name"].endswith(".safetensors")} == {"hardlink"}
    assert (linked_dir / "model.safetensors.index.json").is_file()
    assert linked["weights_sha256"] == manifest["weights_sha256"]


@pytest.mark.numeric
@pytest.mark.slow
@pytest.mark.parametrize("machine", ["this-machine", "one-thread-smaller-isa"])
def test_single_file_beside_an_index_of_missing_shards_loads_in_vllm(
    tiny: Tiny,
    tmp_path: Path,
    machine: str,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """vLLM refuses this layout ("Weight files referenced in index but missing"); the output loads.

    The one vLLM smoke check of the suite; engine arguments include ckpteval's own `chunk_size`,
    which must be left out of `vllm.LLM(...)`. Run twice: as this machine computes, and with one
    thread and a smaller instruction set (the vLLM child process inherits the environment), so a
    comparison that holds on one CPU only fails here, not on someone else's machine. The smaller
    machine also claims AVX-512, its BF16 and AMX (tests/amx_claim), as an Intel Xeon with AMX
    does: there vLLM used to pack for AMX under oneDNN's AVX2 cap and abort in C++; ckpteval now
    tells vLLM what the caps leave (one log line), so it loads its AVX2 library and builds no AMX
    kernel, on every CPU this runs on.
    """
    if machine != "this-machine":
        for name, value in other_machine_env().items():
            monkeypatch.setenv(name, value)
        claim = str(HERE / "amx_claim")
        monkeypatch.setenv(
            "PYTHONPATH", os.pathsep.join(filter(None, [claim, os.environ.get("PYTHONPATH")]))
        )
    broken = tmp_path / "broken"
    shutil.copytree(tiny.hf_dir, broken)
    keys = list(load_file(broken / "model.safetensors"))
    index = {
        "metadata": {"total_size": 0},
        "weight_map": {k: "model-00001-of-00001.safetensors" for k in keys},
    }
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    before = {p.name: p.read_bytes() for p in broken.iterdir()}

    engine = {
        "gpu_memory_utilization": 0.1,
        "enforce_eager": True,
        "max_model_len": 256,
        "chunk_size": 64,
    }
    out_dir, manifest = consolidate(broken, tmp_path, smoke="vllm", engine_args=engine)

    assert {p.name: p.read_bytes() for p in broken.iterdir()} == before, "source was modified"
    assert not (out_dir / "model.safetensors.index.json").exists()
    assert any("missing shard" in note for note in manifest["notes"])
    assert manifest["smoke"]["engine"] == "vllm"
    kernels, library = (manifest["smoke"]["cpu_kernels"][k] for k in ("linear", "library"))
    assert kernels and sum(kernels.values()) >= 2, kernels
    if machine != "this-machine":
        assert "sgl" not in kernels, f"an AMX kernel was built under a cap at AVX2: {kernels}"
        assert library == "_C_AVX2", f"vLLM loaded {library} under a cap at AVX2"
        assert "cap this CPU below its AVX-512, AVX-512 BF16, AMX" in capfd.readouterr().err
    else:
        assert library in {"_C", "_C_AVX512", "_C_AVX2"}, library
        if not torch.cpu._is_amx_tile_supported():
            assert "sgl" not in kernels, kernels
    assert_same_model(out_dir, manifest, tiny.model, tiny.tokenizer, torch.bfloat16)


@pytest.mark.numeric
@pytest.mark.slow
def test_dcp_written_by_a_two_process_fsdp2_run(tiny: Tiny, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    run = tmp_path / "fsdp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, str(HERE / "helpers_fsdp.py"), str(tiny.hf_dir), str(run)],
        check=True,
        env=env,
        timeout=600,
    )
    reference = torch.load(run / "reference.pt")
    trained = AutoModelForCausalLM.from_pretrained(tiny.hf_dir, dtype=torch.float32).eval()
    trained.load_state_dict(reference)
    assert not torch.equal(trained.model.norm.weight, tiny.model.model.norm.weight), "no step taken"

    hashes = []
    for name in ("with_optim", "model_only"):
        out_dir, manifest = consolidate(
            run / name, tmp_path, name, dtype="float32", base_model=tiny.hf_dir
        )
        assert manifest["format"] == "dcp"
        assert manifest["tensors"]["tied_dropped"] == [TIED]
        assert_same_model(out_dir, manifest, trained, tiny.tokenizer, torch.float32)
        hashes.append(manifest["weights_sha256"])
        if name == "with_optim":
            assert manifest["tensors"]["ignored"] > 0
            assert any("prefix 'model.'" in note for note in manifest["notes"])
    assert hashes[0] == hashes[1]


@pytest.mark.numeric
def test_torch_save_state_dicts_bin_and_nested_pt(tiny: Tiny, tmp_path: Path) -> None:
    linked_hash = consolidate(tiny.hf_dir, tmp_path, "reference", dtype="float32", smoke="none")[1][
        "weights_sha256"
    ]

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    torch.save(tiny.model.state_dict(), bin_dir / "pytorch_model.bin")
    shutil.copy(tiny.hf_dir / "config.json", bin_dir)
    copy_tokenizer(tiny.tokenizer_dir, bin_dir)
    out_dir, manifest = consolidate(bin_dir, tmp_path, "bin", dtype="float32")
    assert manifest["format"] == "torch"
    assert_same_model(out_dir, manifest, tiny.model, tiny.tokenizer, torch.float32)
    assert manifest["weights_sha256"] == linked_hash

    # A trainer's own file: torch.compile'd module names, optimizer state, a step counter.
    state = {f"_orig_mod.{k}": v for k, v in tiny.model.state_dict().items()}
    optim = {"state": {0: {"exp_avg": torch.zeros(3)}}, "param_groups": [{"lr": 0.1}]}
    pt_file = tmp_path / "step_7.pt"
    torch.save({"model": state, "optimizer": optim, "step": 7}, pt_file)
    out_dir, manifest = consolidate(
        pt_file, tmp_path, "pt", dtype="float32", base_model=tiny.hf_dir
    )
    assert manifest["format"] == "torch"
    assert manifest["weights_sha256"] == linked_hash
    assert manifest["tensors"]["ignored"] == 3
    assert_same_model(out_dir, manifest, tiny.model, tiny.tokenizer, torch.float32)


@pytest.mark.numeric
def test_moe_state_dict_in_transformers_memory_layout_is_converted(
    tiny: Tiny, tmp_path: Path
) -> None:
    """transformers 5 fuses MoE experts in memory but saves them per expert: a trainer's raw state
    dict has the fused names, which are converted to the on-disk names vLLM loads."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "qwen3_moe",
        vocab_size=len(tiny.tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        initializer_range=0.5,
        tie_word_embeddings=False,
        eos_token_id=tiny.tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    hf_dir = tmp_path / "moe_hf"
    model.save_pretrained(hf_dir)
    copy_tokenizer(tiny.tokenizer_dir, hf_dir)
    _, saved = consolidate(hf_dir, tmp_path, "moe_hf", dtype="float32", smoke="none")

    fused = [k for k in model.state_dict() if k.endswith("experts.gate_up_proj")]
    assert fused, "this transformers no longer fuses experts in memory"
    pt_file = tmp_path / "moe.pt"
    torch.save({"model": model.state_dict()}, pt_file)
    _, manifest = consolidate(pt_file, tmp_path, "moe_pt", dtype="float32", base_model=hf_dir)
    assert manifest["weights_sha256"] == saved["weights_sha256"]
    assert any("in-memory layout" in note for note in manifest["notes"])
    assert_smoke_of(manifest, model, tiny.tokenizer, torch.float32)


def _train_lora(tiny: Tiny) -> Any:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    peft_model = get_peft_model(
        copy.deepcopy(tiny.model),
        LoraConfig(
            r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"]
        ),
    )
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=0.05)
    batch = torch.randint(0, tiny.model.config.vocab_size, (2, 12))
    peft_model.train()
    peft_model(input_ids=batch, labels=batch).loss.backward()
    optimizer.step()
    return peft_model.eval()


@pytest.mark.numeric
def test_lora_adapter_is_merged_into_its_base_model(tiny: Tiny, tmp_path: Path) -> None:
    peft_model = _train_lora(tiny)
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "some-org/some-hub-model"
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    merged = copy.deepcopy(peft_model).merge_and_unload()

    with pytest.raises(
        UserError,
        match=r"adapter_config.json: LoRA adapter without a base model: set "
        r"base_model .*some-org/some-hub-model",
    ):
        consolidate(adapter, tmp_path, "no_base")
    assert not (tmp_path / "models" / "no_base").exists()

    out_dir, manifest = consolidate(
        adapter, tmp_path, "lora", dtype="float32", base_model=tiny.hf_dir
    )
    assert manifest["format"] == "lora"
    assert_smoke_of(manifest, peft_model, tiny.tokenizer, torch.float32)
    assert_same_model(out_dir, manifest, merged, tiny.tokenizer, torch.float32)
    base_q = tiny.model.model.layers[0].self_attn.q_proj.weight
    assert not torch.equal(load_weights(out_dir)["model.layers.0.self_attn.q_proj.weight"], base_q)

    # Without base_model, an absolute local base_model_name_or_path is used.
    config["base_model_name_or_path"] = str(tiny.hf_dir)
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    _, fallback = consolidate(adapter, tmp_path, "lora2", dtype="float32")
    assert fallback["weights_sha256"] == manifest["weights_sha256"]

    # An adapter file lacking tensors its config targets: peft only warns and leaves the layer
    # un-adapted; here it is an error.
    weights = load_file(adapter / "adapter_model.safetensors")
    dropped = next(k for k in weights if "lora_B" in k)
    del weights[dropped]
    save_file(weights, adapter / "adapter_model.safetensors", metadata={"format": "pt"})
    _fails(
        adapter,
        tmp_path,
        r"adapter_model.safetensors: does not fit base model .*missing "
        r"adapter keys",
    )


# ---- bad input --------------------------------------------------------------------------------


def _hf_copy(tiny: Tiny, target: Path) -> Path:
    shutil.copytree(tiny.hf_dir, target)
    return target


def _rewrite_weights(path: Path, edit: Any) -> None:
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def _fails(source: Path, tmp_path: Path, pattern: str, **kwargs: Any) -> str:
    with pytest.raises(UserError, match=pattern) as caught:
        consolidate(source, tmp_path, "bad", **kwargs)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(source))
    assert not (tmp_path / "models" / "bad").exists()
    assert not (tmp_path / "models" / "bad.json").exists()
    assert not list((tmp_path / "models").glob(".bad.*")), "staging dir left behind"
    return message


def _truncate_weights(source: Path) -> None:
    weights = source / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 1000)


def _widen_mlp_in_config(source: Path) -> None:
    config = json.loads((source / "config.json").read_text())
    config["intermediate_size"] = 512
    (source / "config.json").write_text(json.dumps(config))


def _edit_weights(edit: Callable[[dict[str, torch.Tensor]], Any]) -> Callable[[Path], None]:
    return lambda source: _rewrite_weights(source, edit)


@pytest.mark.parametrize(
    ("name", "corrupt", "pattern", "kwargs"),
    [
        pytest.param(
            "truncated",
            _truncate_weights,
            r"truncated: .*model.safetensors: truncated shard: tensor data ends at "
            r"byte \d+, file has \d+ bytes",
            {"fmt": "hf"},
            id="truncated-shard",
        ),
        pytest.param(
            "missing",
            _edit_weights(lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
            r"model.safetensors: 1 tensor\(s\) missing that LlamaForCausalLM "
            r"expects: model.layers.1.mlp.up_proj.weight",
            {},
            id="missing-tensor",
        ),
        pytest.param(
            "unexpected",
            _edit_weights(
                lambda t: t.update({"model.layers.2.mlp.up_proj.weight": torch.zeros(2)})
            ),
            r"1 unexpected tensor\(s\) LlamaForCausalLM has no place for: "
            r"model.layers.2.mlp.up_proj.weight",
            {},
            id="unexpected-tensor",
        ),
        pytest.param(
            "shape",
            _widen_mlp_in_config,
            r"model.safetensors: shape mismatch: tensor model.layers.0.mlp.\w+_proj."
            r"weight is \[\d+, \d+\], config.json's LlamaForCausalLM expects",
            {},
            id="shape-mismatch-with-config",
        ),
        pytest.param(
            "nan",
            _edit_weights(lambda t: t["model.norm.weight"].fill_(float("nan"))),
            r"smoke generation \(transformers\) produced NaN/inf logits",
            {},
            id="nan-weights-fail-the-smoke-check",
        ),
    ],
)
def test_broken_hf_checkpoint_is_named(
    tiny: Tiny,
    tmp_path: Path,
    name: str,
    corrupt: Callable[[Path], None],
    pattern: str,
    kwargs: dict[str, Any],
) -> None:
    source = _hf_copy(tiny, tmp_path / name)
    corrupt(source)
    _fails(source, tmp_path, pattern, **kwargs)


def test_unknown_format_and_incomplete_checkpoint(tiny: Tiny, tmp_path: Path) -> None:
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "weights.npz").write_bytes(b"\0" * 64)
    _fails(unknown, tmp_path, r"unknown checkpoint format .*set the run's format")

    writing = tmp_path / "writing"
    writing.mkdir()
    (writing / "__0_0.distcp").write_bytes(b"\0" * 64)
    _fails(writing, tmp_path, r"writing: .metadata: missing: the checkpoint is incomplete")

    with pytest.raises(UserError, match="unknown checkpoint format 'gguf'"):
        consolidate(tiny.hf_dir, tmp_path, fmt="gguf")


def test_untied_lm_head_under_a_tied_config_is_refused(tiny: Tiny, tmp_path: Path) -> None:
    source = tmp_path / "untied"
    source.mkdir()
    state = dict(tiny.model.state_dict())
    state[TIED] = state[TIED].clone() + 1
    torch.save(state, source / "pytorch_model.bin")
    _fails(
        source,
        tmp_path,
        r"tensor lm_head.weight differs from model.embed_tokens.weight, but "
        r"config.json ties them",
        base_model=tiny.hf_dir,
    )


# ---- atomicity, hashing, name mapping ---------------------------------------------------------


def test_output_is_replaced_whole_and_kept_on_failure(tiny: Tiny, tmp_path: Path) -> None:
    out_dir, first = consolidate(tiny.hf_dir, tmp_path, "model", smoke="none")
    (out_dir / "stale.txt").write_text("from an older run")
    out_dir, second = consolidate(tiny.hf_dir, tmp_path, "model", smoke="none")
    assert not (out_dir / "stale.txt").exists()
    assert second["weights_sha256"] == first["weights_sha256"]

    missing = _hf_copy(tiny, tmp_path / "missing")
    _rewrite_weights(missing, lambda t: t.pop("model.norm.weight"))
    with pytest.raises(UserError):
        consolidate_checkpoint(missing, out_dir, tmp_path / "models" / "model.json", smoke="none")
    assert summarize_weights(out_dir).sha256 == second["weights_sha256"]
    assert not list(out_dir.parent.glob(".model.*"))


#: Consolidates argv[1] into argv[2] without a smoke test; prints whether transformers' model
#: classes were imported (they are not when the tensor list comes from the cache).
CONSOLIDATE_AND_SAY = """
import json, sys
from pathlib import Path
from types import SimpleNamespace
from ckpteval.consolidate import consolidate_checkpoint
out = Path(sys.argv[2])
manifest = consolidate_checkpoint(Path(sys.argv[1]), out / "m", out / "m.json", smoke="none")
print(json.dumps([manifest["weights_sha256"], "transformers.models.auto.modeling_auto" in sys.modules]))
"""


def test_the_tensor_list_is_kept_per_config_and_a_kept_one_refuses_what_a_built_one_does(
    tiny: Tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The expected tensors of a config are built by transformers once and read back from the
    cache after that: in a fresh process no model class is imported, the result is the same, a
    missing tensor is still refused; another config (one number changed) or another
    transformers version is another entry; a damaged entry is built again."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    kept = cache / "ckpteval" / "architectures"
    _, first = consolidate(tiny.hf_dir, tmp_path, "first", smoke="none")
    (entry,) = kept.iterdir()

    def fresh_process(out: str) -> list[Any]:
        proc = subprocess.run(
            [sys.executable, "-c", CONSOLIDATE_AND_SAY, str(tiny.hf_dir), str(tmp_path / out)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.splitlines()[-1])

    assert fresh_process("second") == [first["weights_sha256"], False]

    missing = _hf_copy(tiny, tmp_path / "missing")
    _rewrite_weights(missing, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    _fails(missing, tmp_path, r"1 tensor\(s\) missing that LlamaForCausalLM expects")
    widened = _hf_copy(tiny, tmp_path / "widened")
    _widen_mlp_in_config(widened)
    _fails(widened, tmp_path, r"shape mismatch: tensor model.layers.0.mlp.\w+_proj.weight")
    assert len(list(kept.iterdir())) == 2

    for i, damage in enumerate(("{", json.dumps({"name": 1, "shapes": [["x", ["y"]]]}))):
        entry.write_text(damage)
        _, again = consolidate(tiny.hf_dir, tmp_path, f"again-{i}", smoke="none")
        assert again["weights_sha256"] == first["weights_sha256"]
        assert json.loads(entry.read_text())["name"] == "LlamaForCausalLM"

    import importlib.metadata as md

    real = md.version
    monkeypatch.setattr(md, "version", lambda name: "0.0" if name == "transformers" else real(name))
    consolidate(tiny.hf_dir, tmp_path, "other-version", smoke="none")
    assert len(list(kept.iterdir())) == 3


def test_weights_hash_follows_content_not_mtime(tiny: Tiny, tmp_path: Path) -> None:
    source = _hf_copy(tiny, tmp_path / "hashed")
    before = summarize_weights(source)
    os.utime(source / "model.safetensors", (1, 1))
    assert summarize_weights(source) == before
    _rewrite_weights(source, lambda t: t["model.norm.weight"].mul_(2))
    after = summarize_weights(source)
    assert after.sha256 != before.sha256
    assert (after.tensors, after.params) == (before.tensors, before.params)


def test_name_mapping() -> None:
    expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    assert strip_wrappers("_orig_mod.model._fsdp_wrapped_module.norm.weight") == "model.norm.weight"
    dcp_names = [
        "model.model.embed_tokens.weight",
        "model.model.norm.weight",
        "model.lm_head.weight",
        "optim.state.model.norm.weight.exp_avg",
        "optim.state.lm_head.weight.exp_avg",
    ]
    assert choose_prefix(dcp_names, expected) == "model."
    assert choose_prefix(sorted(expected), expected) == ""
    assert (
        choose_prefix(["module.model.norm.weight", "module.lm_head.weight"], expected) == "module."
    )
    assert choose_prefix(["encoder.layer.0.weight"], expected) is None


class _Named(dict):
    """Snakemake's named file lists as a job script sees them (`.name`, `keys()`, `get`)."""

    __getattr__ = dict.__getitem__


def test_the_manifest_of_a_checkpoint_on_s3_names_its_url_and_keeps_the_copy_apart(
    tiny: Tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consolidate job on an S3 checkpoint (ckpteval.steps.consolidate) as Snakemake runs
    it: the objects downloaded under `.snakemake/storage/s3/`, the listing identity the parse
    wrote. The manifest's `source` is the `s3://` URL, not the temporary copy (issue 47)."""
    from ckpteval.contract import Identity
    from ckpteval.steps import consolidate as consolidate_job

    monkeypatch.chdir(tmp_path)
    url = "s3://bkt/jobs/run/step_1"
    copy = Path(".snakemake/storage/s3/bkt/jobs/run/step_1")
    shutil.copytree(tiny.hf_dir, copy)
    files = {p.name: {"size": p.stat().st_size, "etag": f"etag-{p.name}"} for p in copy.iterdir()}
    source_id = tmp_path / "step_1.source.json"
    source_id.write_text(json.dumps({"source": url, "s3": True, "content": "c", "files": files}))
    settings = {"runs.s3run.format": "auto", "consolidate.dtype": "float32"}
    smk = SimpleNamespace(
        params=SimpleNamespace(identity=Identity(settings).text),
        wildcards=SimpleNamespace(run="s3run"),
        input=_Named(source=[str(copy / name) for name in files], source_id=str(source_id)),
        output=SimpleNamespace(model=str(tmp_path / "m"), manifest=str(tmp_path / "m.json")),
        config={"consolidate": {"smoke": "none"}},
    )
    consolidate_job(smk)
    manifest = json.loads((tmp_path / "m.json").read_text())
    assert manifest["source"] == url
    assert manifest["local_copy"] == str(copy.absolute())
    assert manifest["source_files"]["model.safetensors"]["etag"] == "etag-model.safetensors"
    assert "local_copy" not in consolidate(tiny.hf_dir, tmp_path, smoke="none")[1]
