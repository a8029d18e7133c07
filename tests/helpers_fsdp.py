"""A real FSDP2 training step on CPU: processes over gloo write sharded checkpoints, for tests.

`python tests/helpers_fsdp.py MODEL_DIR OUT_DIR [verl [WORLD_SIZE]]` loads the HF model in
MODEL_DIR in float32, shards every decoder layer and the root with `fully_shard` over a device
mesh named `("fsdp",)` (as verl builds it), takes one AdamW step on a fixed batch, and writes the
way FSDP2 trainers do. By default (2 ranks), torch.distributed.checkpoint directories:

- `OUT_DIR/with_optim/`: `dcp.save({"model": ..., "optim": ...})` from `get_state_dict`;
- `OUT_DIR/model_only/`: `dcp.save(model_state_dict)`;

with `verl` (`verl-fsdp1`: the model wrapped in FSDP1's `FullyShardedDataParallel` with the
mesh, as verl's FSDP1 workers do; `verl-lora`: the model wrapped with peft LoRA first, as verl's
FSDP engine does for `lora_rank > 0`, only the adapter trained), a verl run directory as verl's `FSDPCheckpointManager.save_checkpoint` writes it, step
1: `OUT_DIR/global_step_1/actor/` with `torch.save(model.state_dict())` per rank as
`model_world_size_{W}_rank_{R}.pt` (DTensors), `optim_world_size_*`, `extra_state_world_size_*`,
`fsdp_config.json`, `lora_train_meta.json` with LoRA (`r`, `lora_alpha`, `task_type`, as verl
writes it), `huggingface/` (config, generation config, tokenizer files copied from
MODEL_DIR, never weights), and `OUT_DIR/latest_checkpointed_iteration.txt` written last, as verl's trainer does.

Both also write `OUT_DIR/reference.pt`: the full (unsharded) model state dict after the step,
from rank 0 — the in-memory model the consolidated checkpoints must reproduce.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

WORLD_SIZE = 2
#: The LoRA verl's FSDP engine builds (`task_type`, `r`, `lora_alpha`, `target_modules`, no bias);
#: dropout 0 so that the step is the same on every run.
LORA = {
    "task_type": "CAUSAL_LM",
    "r": 4,
    "lora_alpha": 16,
    "lora_dropout": 0.0,
    "target_modules": ["q_proj", "v_proj", "down_proj"],
    "bias": "none",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, model_dir: str, out_dir: str, port: int, layout: str, world: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if layout == "verl-lora":  # verl's FSDP engine: get_peft_model before sharding
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(**LORA))
        if layout == "verl-fsdp1":  # verl's FSDP1 workers: the wrapper, given the device mesh
            from torch.distributed.fsdp import FullyShardedDataParallel

            cpu = torch.device("cpu")
            model = FullyShardedDataParallel(
                model, device_mesh=mesh, use_orig_params=True, device_id=cpu
            )
        else:
            for layer in model.get_decoder().layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=1e-2)
        generator = torch.Generator().manual_seed(rank)
        batch = torch.randint(0, model.config.vocab_size, (2, 16), generator=generator)
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()

        out = Path(out_dir)
        if layout.startswith("verl"):
            _save_verl(model, optimizer, rank, world, Path(model_dir), out)
        else:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=out / "with_optim")
            dcp.save(model_sd, checkpoint_id=out / "model_only")
        if layout == "verl-fsdp1":  # (get_model_state_dict's CPU offload crashes FSDP1 on CPU)
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp import StateDictType

            with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
                full = {k: v.clone() for k, v in model.state_dict().items()}
        else:
            full = get_model_state_dict(
                model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
        if rank == 0:
            torch.save(full, out / "reference.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _save_verl(model, optimizer, rank: int, world: int, model_dir: Path, out: Path) -> None:  # noqa: ANN001
    """What verl's FSDPCheckpointManager.save_checkpoint writes (FSDP2, or FSDP1 under its
    SHARDED_STATE_DICT context), then the tracker file."""
    import contextlib
    import json
    import shutil

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    actor = out / "global_step_1" / "actor"
    actor.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    tag = f"world_size_{world}_rank_{rank}.pt"
    fsdp1 = isinstance(model, FSDP)
    sharded = FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT) if fsdp1 else None
    with sharded or contextlib.nullcontext():
        torch.save(model.state_dict(), actor / f"model_{tag}")
        torch.save(optimizer.state_dict(), actor / f"optim_{tag}")
    torch.save(
        {"lr_scheduler": None, "rng": {"cpu": torch.get_rng_state()}}, actor / f"extra_state_{tag}"
    )
    if rank == 0:
        hf = actor / "huggingface"
        hf.mkdir()
        for file in model_dir.iterdir():  # config, generation config, tokenizer: not weights
            if file.is_file() and "safetensors" not in file.name:
                shutil.copy(file, hf / file.name)
        config = {"FSDP_version": 1 if fsdp1 else 2, "world_size": world}
        (actor / "fsdp_config.json").write_text(json.dumps(config, indent=4))
        if type(model).__name__.endswith("PeftModelForCausalLM"):  # verl's _save_lora_train_meta
            meta = {key: LORA[key] for key in ("r", "lora_alpha", "task_type")}
            (actor / "lora_train_meta.json").write_text(json.dumps(meta, indent=4))
    dist.barrier()
    if rank == 0:
        (out / "latest_checkpointed_iteration.txt").write_text("1")


def main(model_dir: str, out_dir: str, layout: str = "dcp", world: int = WORLD_SIZE) -> None:
    """The ranks are forked from this process after it imported what they use (transformers'
    model classes, peft): one import instead of one per rank (seconds of CPU each). Nothing
    distributed starts before the fork: each rank builds its own process group and model."""
    import torch.multiprocessing as mp
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(model_dir))]  # imports the class
    if layout == "verl-lora":
        import peft  # noqa: F401

    args = (model_dir, out_dir, _free_port(), layout, world)
    mp.start_processes(_worker, args=args, nprocs=world, join=True, start_method="fork")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *sys.argv[3:4], *[int(a) for a in sys.argv[4:5]])
