"""Real DeepSpeed ZeRO checkpoints on CPU, as OpenRLHF saves them, and DeepSpeed's own merge.

Run with DeepSpeed's environment (scripts/setup-env.sh part `deepspeed`, `.venv-deepspeed`):
`python tests/helpers_deepspeed.py MODEL_DIR OUT_DIR`. Two processes over gloo
(`DS_ACCELERATOR=cpu`) load the HF model in MODEL_DIR, train it one AdamW step in bf16 under
`deepspeed.initialize` and save it with `engine.save_checkpoint(run, tag="global_step1")`, which
is what OpenRLHF's `strategy.save_ckpt` calls (its `ckpt_path/_actor`), once per layout:

- `OUT_DIR/zero2/`: ZeRO stage 2, the model as given (tied embeddings: a shared parameter);
- `OUT_DIR/zero3/`: ZeRO stage 3, a model of the same config with its embeddings untied and
  `hidden_size` 129 (odd sizes, so each rank's piece is padded), randomly initialised
  (`OUT_DIR/untied/` holds its config.json), layer 0's input norm frozen (a frozen parameter,
  saved partitioned as stage 3 does).

Each holds `global_step1/` and `latest`. Then DeepSpeed's own `zero_to_fp32` merges each into
`OUT_DIR/<layout>-zero_to_fp32/pytorch_model.bin` (fp32), the reference ckpteval must equal.

No DeepSpeed op is compiled: torch's AdamW (`torch_adam`), and the shared-memory all-reduce that
DeepSpeed's CPU backend would build with g++ on first use (minutes) is switched off
(`build_shm_op` returns None: gloo does the collectives, which is all the op speeds up).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

WORLD_SIZE = 2
LAYOUTS = {"zero2": 2, "zero3": 3}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _model(model_dir: str, layout: str, out: Path, rank: int):  # noqa: ANN202
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if layout == "zero2":
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = AutoConfig.from_pretrained(model_dir)
    config.tie_word_embeddings = False
    config.hidden_size, config.num_attention_heads = 129, 3  # odd: every rank's piece padded
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.model.layers[0].input_layernorm.weight.requires_grad_(False)
    if rank == 0:
        config.save_pretrained(out / "untied")
    return model


def _worker(rank: int, model_dir: str, out_dir: str, port: int) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD_SIZE),
        LOCAL_SIZE=str(WORLD_SIZE),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import deepspeed
    import deepspeed.comm.torch
    import torch

    # No g++ build; gloo all the same. (`deepspeed.comm.torch` as an attribute is torch itself.)
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    out = Path(out_dir)
    for layout, stage in LAYOUTS.items():
        torch.manual_seed(0)
        model = _model(model_dir, layout, out, rank)
        config = {
            "train_micro_batch_size_per_gpu": 2,
            "zero_optimization": {"stage": stage},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
            "zero_allow_untested_optimizer": True,
            "bf16": {"enabled": True},
        }
        params = [p for p in model.parameters() if p.requires_grad]
        engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=config)
        ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator())
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
        engine.save_checkpoint(str(out / layout), tag="global_step1")
        engine.destroy()


def main(model_dir: str, out_dir: str) -> None:
    os.environ["DS_ACCELERATOR"] = "cpu"
    import torch.multiprocessing as mp
    from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict

    mp.spawn(_worker, args=(model_dir, out_dir, _free_port()), nprocs=WORLD_SIZE)
    for layout in LAYOUTS:
        convert_zero_checkpoint_to_fp32_state_dict(
            str(Path(out_dir) / layout), str(Path(out_dir) / f"{layout}-zero_to_fp32")
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
