"""A real FSDP2 training step on CPU: two processes over gloo write DCP checkpoints, for tests.

`python tests/helpers_fsdp.py MODEL_DIR OUT_DIR` loads the HF model in MODEL_DIR in float32,
shards every decoder layer and the root with `fully_shard`, takes one AdamW step on a fixed batch,
and writes, the way FSDP2 trainers do:

- `OUT_DIR/with_optim/`: `dcp.save({"model": ..., "optim": ...})` from `get_state_dict`;
- `OUT_DIR/model_only/`: `dcp.save(model_state_dict)`;
- `OUT_DIR/reference.pt`: the full (unsharded) model state dict after the step, from rank 0 —
  the in-memory model the consolidated checkpoints must reproduce.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

WORLD_SIZE = 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, model_dir: str, out_dir: str, port: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
    )
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        generator = torch.Generator().manual_seed(rank)
        batch = torch.randint(0, model.config.vocab_size, (2, 16), generator=generator)
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()

        out = Path(out_dir)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=out / "with_optim")
        dcp.save(model_sd, checkpoint_id=out / "model_only")
        full = get_model_state_dict(
            model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if rank == 0:
            torch.save(full, out / "reference.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(model_dir: str, out_dir: str) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(model_dir, out_dir, _free_port()), nprocs=WORLD_SIZE, join=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
