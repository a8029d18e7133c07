"""verl runs: `global_step_N/actor/` rank shards, written by a real FSDP2 step, become the model.

The shards are made as verl makes them (tests/helpers_fsdp.py `verl`: processes over gloo, a device
mesh named `fsdp`, `torch.save(model.state_dict())` per rank), once per module. The consolidated
weights must equal, bit for bit, both the in-memory model after the step and the merge of verl's
own rule (`verl/model_merger/fsdp_model_merger.py`: every rank's DTensor piece cast to bfloat16,
concatenated along its `Shard` dim in rank order), run by verl itself when the verl environment
(`.venv-verl`, scripts/setup-env.sh part `verl`) is there, and otherwise by an independent copy of
that rule below. A LoRA actor (`verl-lora`: peft-wrapped before sharding, as verl's FSDP engine
does) has its own module run; its fold must equal peft's merge of the in-memory model and of
verl's merger output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import run_snakemake
from test_consolidate import (
    HERE,
    TIED,
    Tiny,
    assert_same_model,
    consolidate,
    copy_tokenizer,
    load_weights,
)
from test_consolidate import tiny as tiny  # noqa: F401 - the module's shared model fixture

from ckpteval.errors import UserError
from ckpteval.formats import detect_format, is_complete

#: verl's own environment (scripts/setup-env.sh part `verl`, which VERL_VENV also moves).
VERL_PYTHON = Path(os.environ.get("VERL_VENV") or HERE.parent / ".venv-verl") / "bin/python"


def _write_verl_run(
    tiny: Tiny, run: Path, world: int, layout: str = "verl"
) -> dict[str, torch.Tensor]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(HERE / "helpers_fsdp.py"), str(tiny.hf_dir), str(run)]
    subprocess.run([*command, layout, str(world)], check=True, env=env, timeout=600)
    return torch.load(run / "reference.pt")


@pytest.fixture(scope="module")
def verl_run(tiny: Tiny, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A verl experiment directory after one FSDP2 step on 2 ranks, and the full state dict."""
    run = tmp_path_factory.mktemp("verl") / "experiment"
    return run, _write_verl_run(tiny, run, 2)


@pytest.fixture(scope="module")
def verl_lora_run(tiny: Tiny, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A verl experiment directory after one FSDP2 step of a peft LoRA actor on 2 ranks, and
    the full (peft-named) state dict. Its own run: the LoRA layout is what is tested."""
    run = tmp_path_factory.mktemp("verl_lora") / "experiment"
    return run, _write_verl_run(tiny, run, 2, "verl-lora")


def _peft_merged(tiny: Tiny, reference: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The LoRA actor as it was in memory after the step, merged by peft (float32)."""
    from helpers_fsdp import LORA
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny.hf_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(**LORA))
    model.load_state_dict(reference)
    return model.merge_and_unload().eval()


def _trained(tiny: Tiny, reference: dict[str, torch.Tensor]) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny.hf_dir, dtype=torch.float32).eval()
    model.load_state_dict(reference)
    assert not torch.equal(model.model.norm.weight, tiny.model.model.norm.weight), "no step taken"
    return model


def verl_rule_merge(actor: Path) -> dict[str, torch.Tensor]:
    """verl's FSDP merge rule, rewritten here from fsdp_model_merger.py (not ckpteval's code):
    load every rank (weights_only=False, as verl does), `_local_tensor.bfloat16()`, drop the
    replicated `ddp` mesh dim, `torch.cat` along the Shard dim (dim 0 for plain tensors)."""
    from torch.distributed.tensor import DTensor

    world = json.loads((actor / "fsdp_config.json").read_text())["world_size"]
    states = [
        torch.load(actor / f"model_world_size_{world}_rank_{r}.pt", weights_only=False)
        for r in range(world)
    ]
    merged = {}
    for key in states[0]:
        first = states[0][key]
        if isinstance(first, DTensor):
            (placement,) = first.placements
            pieces = [s[key]._local_tensor.bfloat16() for s in states]
            merged[key] = (
                pieces[0] if placement.is_replicate() else torch.cat(pieces, dim=placement.dim)
            )
        else:
            merged[key] = torch.cat([s[key].bfloat16() for s in states], dim=0)
    return merged


def verl_merger_output(actor: Path, target: Path) -> dict[str, torch.Tensor] | None:
    """What `python -m verl.model_merger merge --backend fsdp` writes, or None without verl."""
    if not VERL_PYTHON.exists():
        return None
    subprocess.run(
        [VERL_PYTHON, "-m", "verl.model_merger", "merge", "--backend", "fsdp"]
        + ["--local_dir", str(actor), "--target_dir", str(target)],
        check=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": "", "CUDA_VISIBLE_DEVICES": ""},
    )
    return load_weights(target)


def assert_bit_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    want = {k: v for k, v in want.items() if k != TIED}
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype, name
        assert got[name].shape == tensor.shape, name
        assert torch.equal(got[name].view(torch.int16), tensor.view(torch.int16)), name


@pytest.mark.numeric
@pytest.mark.slow
def test_verl_run_is_found_merged_and_equals_the_trained_model(
    tiny: Tiny, verl_run: tuple[Path, dict], tmp_path: Path
) -> None:
    from ckpteval.checkpoints import discover_checkpoints

    run, reference = verl_run
    patterns = ["step_{step}", "checkpoint-{step}", "global_step{step}", "global_step_{step}"]
    (found,) = discover_checkpoints(run, patterns)
    assert (found.name, found.step, detect_format(found.path)) == ("global_step_1", 1, "verl")

    trained = _trained(tiny, reference)
    for dtype in (torch.float32, torch.bfloat16):
        out_dir, manifest = consolidate(found.path, tmp_path, str(dtype), dtype=str(dtype)[6:])
        assert manifest["format"] == "verl"
        assert manifest["tensors"]["tied_dropped"] == [TIED]
        assert_same_model(out_dir, manifest, trained, tiny.tokenizer, dtype)
        for name in ("tokenizer.json", "tokenizer_config.json"):  # from actor/huggingface/
            assert (out_dir / name).read_bytes() == (tiny.hf_dir / name).read_bytes()
    # The same checkpoint, pointed at by its actor/ directory, is the same model.
    _, by_actor = consolidate(found.path / "actor", tmp_path, "actor", dtype="bfloat16")
    assert by_actor["weights_sha256"] == manifest["weights_sha256"]


@pytest.mark.numeric
@pytest.mark.slow
def test_verl_merge_is_bit_equal_to_verls_model_merger(
    verl_run: tuple[Path, dict], tmp_path: Path
) -> None:
    run, _ = verl_run
    actor = run / "global_step_1" / "actor"
    out_dir, _ = consolidate(actor.parent, tmp_path, "ours", dtype="bfloat16", smoke="none")
    ours = load_weights(out_dir)
    assert_bit_equal(ours, verl_rule_merge(actor))
    by_verl = verl_merger_output(actor, tmp_path / "verl_merged")
    if by_verl is None:
        pytest.skip(f"verl's own model_merger not installed ({VERL_PYTHON} missing)")
    assert_bit_equal(ours, by_verl)


def plain_run(weights: dict[str, torch.Tensor], like: Path, root: Path) -> Path:
    """A run directory whose one checkpoint `step_1` holds `weights` as a plain HF save, with
    `like`'s config.json and tokenizer: the reference a trainer's checkpoint is compared with."""
    from safetensors.torch import save_file

    checkpoint = root / "step_1"
    copy_tokenizer(like, checkpoint)
    (checkpoint / "model.safetensors").unlink(missing_ok=True)
    tensors = {k: v.contiguous() for k, v in weights.items() if k != TIED}
    save_file(tensors, checkpoint / "model.safetensors", metadata={"format": "pt"})
    return root


def _generation_metas(results: Path) -> list[Path]:
    return sorted((results / "generations").rglob("*.meta.json"))


def assert_same_generations(results: Path, ours: str, plain: str) -> None:
    """The trainer's checkpoint `ours` ("run/ckpt") and the same weights saved as a plain HF
    directory `plain`, each consolidated and generated from by the workflow's infer step in one
    sweep: the same weights hash and the same greedy completions, line for line (same weights,
    same engine and settings: equal, not just close)."""
    manifests = [json.loads((results / "models" / f"{c}.json").read_text()) for c in (ours, plain)]
    assert manifests[0]["weights_sha256"] == manifests[1]["weights_sha256"]
    metas = [
        [json.loads(m.read_text()) for m in (results / "generations" / c).rglob("*.meta.json")]
        for c in (ours, plain)
    ]
    # `served_by` names the engine job (its own run/ckpt): a swapped-in checkpoint has its
    # chain's, so distinct sets mean each directory was loaded by an engine of its own.
    served = [{m["served_by"] for m in side} for side in metas]
    assert all(served) and not served[0] & served[1], served
    files = [sorted((results / "generations" / c).rglob("*.jsonl")) for c in (ours, plain)]
    assert files[0] and [f.relative_to(results / "generations" / ours) for f in files[0]] == [
        f.relative_to(results / "generations" / plain) for f in files[1]
    ]
    for a, b in zip(*files):
        lines = [[json.loads(x) for x in f.read_text().splitlines()] for f in (a, b)]
        assert len(lines[0]) == len(lines[1]) > 0, a
        for x, y in zip(*lines):
            assert (x["prompt"], x["completion"]) == (y["prompt"], y["completion"]), a
            assert x["completion_tokens"] == y["completion_tokens"] > 0, a


@pytest.mark.numeric
@pytest.mark.slow
def test_fsdp1_shards_over_three_ranks_merge_as_verls_merger_merges_them(
    tiny: Tiny, tmp_path: Path
) -> None:
    """verl's FSDP1 workers: FullyShardedDataParallel given the device mesh, saved under
    SHARDED_STATE_DICT (DTensors again), over 3 ranks: 128-wide rows are 43 + 43 + 42, so any
    world size and uneven pieces are checked on the same run. Cannot reuse the module's 2-rank
    FSDP2 run: FSDP1 and the world size are what is tested. One run covers both, since ckpteval
    merges every DTensor by its placement whatever FSDP version wrote it (formats/verl.py reads
    `FSDP_version` nowhere); the module's run is the FSDP2 case."""
    run = tmp_path / "experiment"
    reference = _write_verl_run(tiny, run, 3, "verl-fsdp1")
    actor = run / "global_step_1" / "actor"
    assert json.loads((actor / "fsdp_config.json").read_text())["FSDP_version"] == 1
    ranks = sorted(p.name for p in actor.glob("model_*"))
    assert ranks == [f"model_world_size_3_rank_{r}.pt" for r in range(3)]
    first = torch.load(actor / ranks[0], weights_only=False)
    last = torch.load(actor / ranks[2], weights_only=False)
    uneven = [k for k in first if first[k]._local_tensor.shape != last[k]._local_tensor.shape]
    assert uneven, "no tensor split unevenly over 3 ranks"
    out_dir, _ = consolidate(actor.parent, tmp_path, "fp32", dtype="float32", smoke="none")
    loaded = load_weights(out_dir)
    assert sorted(loaded) == sorted(k for k in reference if k != TIED)
    for name, tensor in loaded.items():
        assert torch.equal(tensor, reference[name]), name
    ours = load_weights(consolidate(actor.parent, tmp_path, "bf16", smoke="none")[0])
    assert_bit_equal(ours, verl_rule_merge(actor))
    by_verl = verl_merger_output(actor, tmp_path / "verl_merged")
    if by_verl is None:
        pytest.skip(f"verl's own model_merger not installed ({VERL_PYTHON} missing)")
    assert_bit_equal(ours, by_verl)


def verl_merger_folded(actor: Path, target: Path) -> dict[str, torch.Tensor] | None:
    """What a verl user does today with a LoRA actor: verl's `model_merger` (base model +
    `lora_adapter/`, bfloat16), then peft's `PeftModel.from_pretrained(...).merge_and_unload()`
    on them, in bfloat16. None without verl."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    if verl_merger_output(actor, target) is None:
        return None
    assert json.loads((target / "lora_adapter" / "adapter_config.json").read_text())["r"] == 4
    base = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16)
    folded = PeftModel.from_pretrained(base, str(target / "lora_adapter")).merge_and_unload()
    return {k: v.detach() for k, v in folded.state_dict().items()}


@pytest.mark.numeric
@pytest.mark.slow
def test_verl_lora_actor_is_folded_as_peft_folds_it(
    tiny: Tiny, verl_lora_run: tuple[Path, dict], tmp_path: Path
) -> None:
    """A LoRA actor's shards (peft names: base_layer, lora_A, lora_B; lora_train_meta.json)
    become the merged model: in float32 exactly the in-memory peft model after the step merged
    by peft (same op, same dtype, same machine); in bfloat16, bit for bit, verl's own merger
    output with its adapter folded by peft (both cast to bfloat16 first, then peft's merge)."""
    run, reference = verl_lora_run
    step = run / "global_step_1"
    assert detect_format(step) == "verl" and is_complete(step)
    merged = _peft_merged(tiny, reference)
    out_dir, manifest = consolidate(step, tmp_path, "fp32", dtype="float32")
    assert any("folded the LORA adapter (r=4, alpha=16) in" in n for n in manifest["notes"])
    assert manifest["tensors"]["tied_dropped"] == [TIED]
    assert_same_model(out_dir, manifest, merged, tiny.tokenizer, torch.float32)
    ours = load_weights(out_dir)
    want = {k: v for k, v in merged.state_dict().items() if k != TIED}
    assert sorted(ours) == sorted(want)
    for name, tensor in want.items():
        assert torch.equal(ours[name], tensor), name
    # The adapter did something, and only where verl put it.
    base = tiny.model.state_dict()
    changed = sorted(k for k in want if not torch.equal(ours[k], base[k]))
    assert changed == sorted(
        f"model.layers.{i}.{m}.weight"
        for i in range(2)
        for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")
    )

    bf16 = load_weights(consolidate(step, tmp_path, "bf16", dtype="bfloat16", smoke="none")[0])
    by_verl = verl_merger_folded(step / "actor", tmp_path / "verl_merged")
    if by_verl is None:
        pytest.skip(f"verl's own model_merger not installed ({VERL_PYTHON} missing)")
    assert_bit_equal(bf16, by_verl)


def _lora_step_copy(run: Path, root: Path) -> Path:
    step = root / "global_step_1"
    shutil.copytree(
        run / "global_step_1", step, ignore=shutil.ignore_patterns("optim_*", "extra_*")
    )
    return step


@pytest.mark.numeric
@pytest.mark.slow
def test_verl_lora_scale_comes_from_lora_train_meta_or_nothing_is_made(
    tiny: Tiny, verl_lora_run: tuple[Path, dict], tmp_path: Path
) -> None:
    """verl's merger falls back to lora_alpha 0 (an adapter scaled to nothing) when
    lora_train_meta.json is missing or unreadable: here that is one line naming the file. The
    file is part of the checkpoint's identity. Shards saved with save_lora_only (the adapter
    alone) fold onto the run's base_model into the same model."""
    from ckpteval.checkpoints import hash_source, source_files

    run, reference = verl_lora_run
    step = _lora_step_copy(run, tmp_path / "experiment")
    meta = step / "actor" / "lora_train_meta.json"
    assert "actor/lora_train_meta.json" in source_files(step)
    before = hash_source(step)
    good = json.loads(meta.read_text())
    meta.write_text(json.dumps({**good, "lora_alpha": 32}))
    assert hash_source(step) != before

    for content, problem in (
        (None, r"lora_train_meta.json: missing: the rank shards hold a LoRA adapter"),
        ("{not json", r"lora_train_meta.json: unreadable"),
        ({**good, "lora_alpha": 0}, r"lora_train_meta.json: lora_alpha is 0: a positive number"),
        ({"r": 4, "task_type": "CAUSAL_LM"}, r"lora_alpha is None: a positive number"),
        ({**good, "r": 8}, r"lora_train_meta.json: says r=8, but .*lora_A has rank 4"),
        ({**good, "use_rslora": True}, r"has use_rslora, which ckpteval does not fold"),
    ):
        meta.unlink(missing_ok=True)
        if content is not None:
            meta.write_text(content if isinstance(content, str) else json.dumps(content))
        with pytest.raises(UserError, match=problem) as err:
            consolidate(step, tmp_path, "bad", smoke="none")
        assert "\n" not in str(err.value)
    meta.write_text(json.dumps(good))

    # save_lora_only: each rank's shard keeps only the adapter (verl's filter: "lora_" in k).
    for shard in (step / "actor").glob("model_world_size_2_rank_*.pt"):
        state = torch.load(shard, weights_only=False)
        torch.save({k: v for k, v in state.items() if "lora_" in k}, shard)
    with pytest.raises(UserError, match=r"holds the LoRA adapter alone .*set base_model"):
        consolidate(step, tmp_path, "alone", smoke="none")
    out_dir, _ = consolidate(step, tmp_path, "alone", dtype="float32", base_model=tiny.hf_dir)
    ours = load_weights(out_dir)
    for name, tensor in _peft_merged(tiny, reference).state_dict().items():
        if name != TIED:
            assert torch.equal(ours[name], tensor), name


def _plain_verl_step(root: Path, world: int = 2) -> Path:
    """A verl step directory with plain-tensor rank shards (enough for completeness rules)."""
    actor = root / "global_step_1" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    for rank in range(world):
        torch.save({"w": torch.zeros(4)}, actor / f"model_world_size_{world}_rank_{rank}.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world}))
    return actor.parent


def test_verl_completeness_follows_shards_and_the_tracker(tmp_path: Path) -> None:
    step = _plain_verl_step(tmp_path / "experiment")
    tracker = step.parent / "latest_checkpointed_iteration.txt"
    assert (detect_format(step), is_complete(step)) == ("verl", True)  # no tracker: shards decide
    assert (detect_format(step / "actor"), is_complete(step / "actor")) == ("verl", True)
    tracker.write_text("0")
    assert not is_complete(step), "the trainer has not recorded step 1 yet"
    tracker.write_text("1")
    assert is_complete(step)
    (step / "actor" / "fsdp_config.json").unlink()
    assert not is_complete(step), "rank 0 writes fsdp_config.json after its shard"
    (step / "actor" / "fsdp_config.json").write_text('{"FSDP_version": 2, "world_size": 2}')
    shard = step / "actor" / "model_world_size_2_rank_1.pt"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    assert not is_complete(step)
    with pytest.raises(UserError, match=r"model_world_size_2_rank_1.pt: truncated"):
        consolidate(step, tmp_path, smoke="none")
    shard.unlink()
    assert not is_complete(step)
    with pytest.raises(UserError, match=r"model_world_size_2_rank_1.pt: missing \(world size 2\)"):
        consolidate(step, tmp_path, smoke="none")


def test_the_identity_of_a_verl_checkpoint_is_what_consolidation_reads(tmp_path: Path) -> None:
    """Optimizer and extra-state shards (twice the model and more) and a critic are not hashed,
    and rewriting them changes nothing; a model shard, the config or a tokenizer file does."""
    from ckpteval.checkpoints import hash_source, source_files

    step = _plain_verl_step(tmp_path / "experiment")
    actor = step / "actor"
    torch.save({"state": {}}, actor / "optim_world_size_2_rank_0.pt")
    torch.save({"rng": None}, actor / "extra_state_world_size_2_rank_0.pt")
    (step / "critic").mkdir()
    torch.save({"w": torch.ones(3)}, step / "critic" / "model_world_size_2_rank_0.pt")
    (actor / "huggingface" / "tokenizer.json").write_text("{}")
    assert sorted(source_files(step)) == [
        "actor/fsdp_config.json",
        "actor/huggingface/tokenizer.json",
        "actor/model_world_size_2_rank_0.pt",
        "actor/model_world_size_2_rank_1.pt",
    ]
    before = hash_source(step)
    torch.save({"state": {0: torch.ones(2)}}, actor / "optim_world_size_2_rank_0.pt")
    assert hash_source(step) == before
    (actor / "huggingface" / "tokenizer.json").write_text('{"changed": 1}')
    assert hash_source(step) != before


def test_verl_megatron_checkpoint_is_refused_naming_the_merge_command(tmp_path: Path) -> None:
    step = tmp_path / "global_step_5"
    (step / "actor" / "dist_ckpt").mkdir(parents=True)
    (step / "actor" / "dist_ckpt" / ".metadata").write_bytes(b"x")
    (step / "actor" / "huggingface").mkdir()
    assert (detect_format(step), is_complete(step)) == ("verl", True)
    with pytest.raises(UserError) as err:
        consolidate(step, tmp_path, smoke="none")
    message = str(err.value)
    assert "\n" not in message
    assert "verl Megatron checkpoint" in message
    assert f"--backend megatron --local_dir {step / 'actor'}" in message


@pytest.mark.numeric
@pytest.mark.slow
def test_a_verl_run_uploaded_to_s3_is_found_consolidated_and_evaluated_through_the_workflow(
    tiny: Tiny, verl_run: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verl layout end to end from object storage (a real S3 API server on loopback): the
    default patterns find `global_step_1` in the listing, only what consolidation reads is
    downloaded (never the optimizer or extra state), the model is the one a local
    consolidation of the same shards gives, and it is evaluated into the summary. In the same
    sweep, a local run holds the trained model (in memory after the step) saved as a plain HF
    directory: vLLM generates from it, line for line, what it generates from the verl
    checkpoint (one engine each, the infer step's own). Reuses this module's FSDP run: building
    shards is the expensive part, the S3 server starts in a second."""
    import yaml

    s3 = pytest.importorskip("test_s3")
    run, reference = verl_run
    weights = _trained(tiny, reference).state_dict()
    plain = plain_run(weights, tiny.hf_dir, tmp_path / "plain")
    with s3.moto_server() as endpoint:
        s3.set_s3_env(monkeypatch, endpoint)
        s3._bucket(endpoint, "verl")
        s3._upload(endpoint, "verl", "ckpts/proj/exp", run)
        cfg = s3._workflow_config(tmp_path, "s3://verl/ckpts/proj/exp")
        config = yaml.safe_load(cfg.read_text())
        config["runs"]["plain"] = {"path": str(plain)}
        # The tiny model has 256 positions; no swapping: each checkpoint is loaded by an engine
        # of its own, from its own directory (eager and a small memory share, as every engine of
        # the tests: vLLM's compiled CPU graph took 32 s of each start).
        config["engine"] = {
            "max_model_len": 256,
            "swap": False,
            "enforce_eager": True,
            "gpu_memory_utilization": 0.15,
        }
        cfg.write_text(yaml.safe_dump(config))
        target = tmp_path / "results" / "models" / "s3run" / "global_step_1.json"
        proc = run_snakemake(tmp_path, "--configfile", str(cfg), timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        # The same weights make the same request-cache keys: the job that ran second was served
        # from the first's cache without loading its model. With the cache gone, its cell is
        # forced, so that both directories are really loaded and generated from.
        cached = [
            cell
            for cell in _generation_metas(tmp_path / "results")
            if json.loads(cell.read_text())["n_generated_prompts"] == 0
        ]
        assert len(cached) == 1, cached
        shutil.rmtree(tmp_path / "results" / "cache")
        forced = str(cached[0].with_name(cached[0].name.replace(".meta.json", ".jsonl")))
        proc = run_snakemake(tmp_path, "-f", forced, "--configfile", str(cfg), timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
    for cell in _generation_metas(tmp_path / "results"):
        meta = json.loads(cell.read_text())
        assert (meta["engine_loads"], meta["n_generated_prompts"]) == (1, 20), cell
    # Evaluated end to end: the consolidated model generated and was scored, in the summary.
    tidy = pd.read_parquet(tmp_path / "results" / "summary" / "metrics.parquet")
    assert set(zip(tidy["run"], tidy["ckpt"], tidy["task"])) == {
        ("s3run", "global_step_1", "arith"),
        ("plain", "step_1", "arith"),
    }
    assert (tidy["n"] > 0).all()
    manifest = json.loads(target.read_text())
    assert manifest["format"] == "verl"
    assert manifest["source"] == "s3://verl/ckpts/proj/exp/global_step_1"
    read = sorted(manifest["source_files"])
    assert read and all(name.startswith("actor/") for name in read), read
    assert not [n for n in read if "optim" in n or "extra_state" in n], read
    _, local = consolidate(run / "global_step_1", tmp_path, "local", dtype=manifest["dtype"])
    assert manifest["weights_sha256"] == local["weights_sha256"]
    assert_same_generations(tmp_path / "results", "s3run/global_step_1", "plain/step_1")
