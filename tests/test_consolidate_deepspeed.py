"""DeepSpeed ZeRO runs (OpenRLHF's `ckpt_path/_actor/global_stepN/`) become the model.

The checkpoints are real: DeepSpeed 0.19.8 in its own environment (`.venv-deepspeed`,
scripts/setup-env.sh part `deepspeed`; those tests skip without it) trains the module's tiny
Llama one bf16 step on 2 ranks over gloo and saves it with `engine.save_checkpoint`, at ZeRO
stage 2 (tied embeddings: a shared parameter) and stage 3 (untied, odd sizes so every rank's
piece is padded, a frozen parameter), in one run for the module (tests/helpers_deepspeed.py).
DeepSpeed's own `zero_to_fp32` merges both; ckpteval's consolidation must equal it bit for bit
(fp32: the same copies of the same master weights, no arithmetic), and vLLM must generate from
the consolidated checkpoint what it generates from those weights saved as a plain HF directory.

The completeness and refusal rules are checked on small ZeRO-shaped files written here (plain
dicts, no DeepSpeed needed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from test_consolidate import HERE, TIED, Tiny, consolidate, copy_tokenizer, load_weights
from test_consolidate import tiny as tiny  # noqa: F401 - the module's shared model fixture
from test_consolidate_verl import assert_same_generations, plain_run

from ckpteval.checkpoints import discover_checkpoints, unfinished_checkpoints
from ckpteval.errors import UserError
from ckpteval.formats import detect_format, is_complete

#: DeepSpeed's environment (scripts/setup-env.sh part `deepspeed`; DEEPSPEED_VENV moves it).
DEEPSPEED_PYTHON = (
    Path(os.environ.get("DEEPSPEED_VENV") or HERE.parent / ".venv-deepspeed") / "bin/python"
)
DEFAULT_PATTERNS = ["step_{step}", "checkpoint-{step}", "global_step{step}", "global_step_{step}"]
FROZEN = "model.layers.0.input_layernorm.weight"


@pytest.fixture(scope="module")
def zero_runs(tiny: Tiny, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`zero2/`, `zero3/` (each `global_step1/` + `latest`), their `*-zero_to_fp32/` merges by
    DeepSpeed, and `untied/` (zero3's config.json plus the tokenizer)."""
    if not DEEPSPEED_PYTHON.exists():
        pytest.skip(f"DeepSpeed's environment missing ({DEEPSPEED_PYTHON}): setup-env.sh deepspeed")
    out = tmp_path_factory.mktemp("deepspeed")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": "", "CUDA_VISIBLE_DEVICES": ""}
    command = [DEEPSPEED_PYTHON, HERE / "helpers_deepspeed.py", tiny.hf_dir, out]
    proc = subprocess.run(command, env=env, timeout=600, capture_output=True, text=True)
    if proc.returncode:
        pytest.fail(f"helpers_deepspeed.py failed:\n{proc.stderr[-3000:]}")
    copy_tokenizer(tiny.tokenizer_dir, out / "untied")
    return out


def zero_to_fp32(run: Path) -> dict[str, torch.Tensor]:
    """What DeepSpeed's zero_to_fp32 wrote for `run` (fp32; shared tensors under both names)."""
    return torch.load(run.parent / f"{run.name}-zero_to_fp32" / "pytorch_model.bin")


def assert_bit_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert (got[name].dtype, got[name].shape) == (tensor.dtype, tensor.shape), name
        bits = torch.int32 if tensor.dtype == torch.float32 else torch.int16
        assert torch.equal(got[name].view(bits), tensor.view(bits)), name


@pytest.mark.numeric
@pytest.mark.slow
@pytest.mark.parametrize("layout", ["zero2", "zero3"])
def test_zero_run_is_found_and_merges_bit_equal_to_deepspeeds_zero_to_fp32(
    tiny: Tiny, zero_runs: Path, tmp_path: Path, layout: str
) -> None:
    run = zero_runs / layout
    assert (run / "latest").read_text() == "global_step1"
    (found,) = discover_checkpoints(run, DEFAULT_PATTERNS)
    assert (found.name, found.step, detect_format(found.path)) == ("global_step1", 1, "deepspeed")
    base = tiny.hf_dir if layout == "zero2" else zero_runs / "untied"
    want = zero_to_fp32(run)
    if layout == "zero2":
        assert want[TIED].data_ptr() == want["model.embed_tokens.weight"].data_ptr()
        want.pop(TIED)  # tied: written once, as every consolidated model
        before = tiny.model.state_dict()["model.norm.weight"]
        assert not torch.equal(want["model.norm.weight"], before), "no step taken"
    else:
        assert TIED in want and FROZEN in want and want[FROZEN].numel() % 2 == 1
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype)[6:]
        out_dir, manifest = consolidate(
            found.path, tmp_path, name, dtype=name, base_model=base, smoke="none"
        )
        assert manifest["format"] == "deepspeed"
        assert manifest["tensors"]["tied_dropped"] == ([TIED] if layout == "zero2" else [])
        assert_bit_equal(load_weights(out_dir), {k: v.to(dtype) for k, v in want.items()})
    for file in ("tokenizer.json", "config.json"):
        assert (out_dir / file).exists(), file


# --- completeness and refusals, on ZeRO-shaped files written here -----------------------------


def _fake_zero2(step: Path, world: int = 2) -> Path:
    """A stage-2 checkpoint as DeepSpeed lays it out: rank 0's model states (names, shapes,
    `dp_world_size`) and one optimizer file per rank (its fp32 partition of the group)."""
    step.mkdir(parents=True)
    shapes = OrderedDict(w=torch.Size([3, 2]), b=torch.Size([3]))
    model = {
        "module": OrderedDict(w=torch.zeros(3, 2, dtype=torch.bfloat16), b=torch.zeros(3)),
        "buffer_names": [],
        "param_shapes": [shapes],
        "shared_params": {},
        "frozen_param_shapes": None,
        "dp_world_size": world,
        "mp_world_size": 1,
        "ds_version": "0.19.8",
    }
    torch.save(model, step / "mp_rank_00_model_states.pt")
    flat = torch.arange(12, dtype=torch.float32)  # 9 elements, padded to 2 * world
    for rank, part in enumerate(flat.chunk(world)):
        state = {
            "zero_stage": 2,
            "partition_count": [world],
            "single_partition_of_fp32_groups": [part.clone()],
            "param_alignment_paddings": [[0, 0]],
        }
        name = f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        torch.save({"optimizer_state_dict": state}, step / name)
    (step.parent / "latest").write_text(step.name)
    return step


def test_zero_completeness_follows_every_rank_file_and_latest(tmp_path: Path) -> None:
    step = _fake_zero2(tmp_path / "_actor" / "global_step3")
    assert (detect_format(step), is_complete(step)) == ("deepspeed", True)
    (step.parent / "latest").write_text("global_step2")
    assert not is_complete(step), "rank 0 writes latest once it has saved"
    (waiting,) = unfinished_checkpoints(step.parent, DEFAULT_PATTERNS)
    assert waiting.progress == "latest still says global_step2"
    (step.parent / "latest").write_text("global_step3")
    optim = step / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    data = optim.read_bytes()
    optim.write_bytes(data[: len(data) // 2])
    assert not is_complete(step)
    (waiting,) = unfinished_checkpoints(step.parent, DEFAULT_PATTERNS)
    assert waiting.progress == "shard 3 of 3 partly written"
    with pytest.raises(UserError, match=r"rank_1_mp_rank_00_optim_states.pt: truncated"):
        consolidate(step, tmp_path, smoke="none")
    optim.unlink()
    assert not is_complete(step), "dp_world_size says 2 ranks"
    with pytest.raises(UserError, match=r"optim_states.pt: missing \(world size 2\): copy every"):
        consolidate(step, tmp_path, smoke="none")


def test_zero_merge_of_written_partitions_and_the_missing_config(tmp_path: Path) -> None:
    """Group partitions concatenated in rank order and cut into parameters (the padding after
    them dropped); without config.json or base_model, one line saying which to set."""
    from ckpteval.formats import deepspeed

    step = _fake_zero2(tmp_path / "global_step3")
    source = deepspeed.open_checkpoint(step, tmp_path, "float32")
    assert torch.equal(source.tensors["w"].read(), torch.arange(6.0).view(3, 2))
    assert torch.equal(source.tensors["b"].read(), torch.arange(6.0, 9.0))
    with pytest.raises(UserError) as err:
        deepspeed.open_checkpoint(step, None, "float32")
    assert "\n" not in str(err.value)
    assert "holds no config.json or tokenizer: set base_model for this run" in str(err.value)


def test_model_parallel_and_optimizerless_saves_are_refused_in_one_line(tmp_path: Path) -> None:
    step = _fake_zero2(tmp_path / "global_step3")
    shutil.copy(step / "mp_rank_00_model_states.pt", step / "mp_rank_01_model_states.pt")
    with pytest.raises(UserError, match=r"model-parallel DeepSpeed checkpoint \(mp_rank_01"):
        consolidate(step, tmp_path, smoke="none")
    (step / "mp_rank_01_model_states.pt").unlink()
    for optim in step.glob("*_optim_states.pt"):
        optim.unlink()
    assert detect_format(step) == "deepspeed" and not is_complete(step)
    with pytest.raises(UserError, match=r"without \*_optim_states.pt \(ZeRO stage 0"):
        consolidate(step, tmp_path, smoke="none")


def test_on_s3_a_zero_checkpoint_waits_for_its_ranks_and_downloads_its_optimizer_states() -> None:
    """The optimizer states hold the fp32 master weights: unlike other trainers' optimizer
    files they are the model, so they are in the identity and downloaded."""
    from ckpteval.s3 import S3Entry, S3Object, waiting_for

    def entry(*names: str) -> S3Entry:
        objects = tuple(S3Object(name, 10, f"etag-{name}", 0.0) for name in names)
        return S3Entry("global_step3", "s3://bucket/_actor/global_step3", objects)

    model, optim = "mp_rank_00_model_states.pt", "bf16_zero_pp_rank_{}_mp_rank_00_optim_states.pt"
    assert waiting_for(entry(model), None) == "no *_optim_states.pt yet"
    assert waiting_for(entry(model, optim.format(1)), None) == "shard 1 of 2 not there yet"
    complete = entry(model, optim.format(0), optim.format(1))
    assert waiting_for(complete, None) is None
    assert sorted(complete.identity()) == sorted([model, optim.format(0), optim.format(1)])
    stage3 = entry("zero_pp_rank_0_mp_rank_00_model_states.pt", optim.format(0), optim.format(1))
    assert waiting_for(stage3, None) == "1 of 2 zero_pp_rank_*_model_states.pt there yet"


def test_hf_trainers_deepspeed_checkpoint_stays_an_hf_checkpoint(tmp_path: Path) -> None:
    """HF Trainer under DeepSpeed writes `checkpoint-N/` with the model saved as HF and its
    ZeRO state in `checkpoint-N/global_stepN/`: the HF weights are the checkpoint."""
    from safetensors.torch import save_file

    checkpoint = tmp_path / "checkpoint-3"
    _fake_zero2(checkpoint / "global_step3")
    save_file({"w": torch.zeros(2)}, checkpoint / "model.safetensors")
    (checkpoint / "config.json").write_text("{}")
    assert detect_format(checkpoint) == "hf"
    assert detect_format(checkpoint / "global_step3") == "deepspeed"


@pytest.mark.numeric
@pytest.mark.slow
def test_a_zero_run_is_found_consolidated_and_evaluated_through_the_workflow(
    tiny: Tiny, zero_runs: Path, tmp_path: Path
) -> None:
    """The run directory as OpenRLHF leaves it, pointed at with its base model only: the
    workflow finds `global_step1` by default, consolidates it into the weights DeepSpeed's
    zero_to_fp32 gives, generates from it and scores it into the summary. Reuses the module's
    DeepSpeed run (the expensive part). In the same sweep, a second run holds zero_to_fp32's
    weights saved as a plain HF directory (config and tokenizer of the base): vLLM generates
    from it, line for line, what it generates from the ZeRO checkpoint (one sweep, one engine
    each: the infer step's own engine is the one compared)."""
    import pandas as pd
    import yaml
    from conftest import run_snakemake

    want = {k: v for k, v in zero_to_fp32(zero_runs / "zero2").items() if k != TIED}
    cfg = tmp_path / "zero.yaml"
    config = {
        "runs": {
            "zero": {"path": str(zero_runs / "zero2"), "base_model": str(tiny.hf_dir)},
            "plain": {"path": str(plain_run(want, tiny.hf_dir, tmp_path / "plain"))},
        },
        "tasks": {"arith": {}},
        "consolidate": {"smoke": "none", "dtype": "float32"},
        # The tiny model's positions; no swapping: each checkpoint is loaded by an engine of its
        # own, from its own directory.
        "engine": {"max_model_len": 256, "swap": False},
        "outdir": str(tmp_path / "results"),
    }
    cfg.write_text(yaml.safe_dump(config))
    proc = run_snakemake(tmp_path, "--configfile", str(cfg), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tidy = pd.read_parquet(tmp_path / "results" / "summary" / "metrics.parquet")
    assert set(zip(tidy["run"], tidy["ckpt"], tidy["task"])) == {
        ("zero", "global_step1", "arith"),
        ("plain", "step_1", "arith"),
    }
    assert (tidy["n"] > 0).all()
    model = tmp_path / "results" / "models" / "zero" / "global_step1"
    merged = load_weights(model)
    assert sorted(merged) == sorted(want)
    assert all(torch.equal(merged[k], want[k]) for k in want)
    assert_same_generations(tmp_path / "results", "zero/global_step1", "plain/step_1")
