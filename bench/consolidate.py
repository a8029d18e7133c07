"""How long consolidation takes and how much memory it needs, on a ~1 GB sharded checkpoint.

Builds a random Llama (~250M parameters) as float32 safetensors shards with an index (~1 GB) in a
temporary directory, then consolidates it in a fresh child process each time and prints wall
seconds and the child's peak RSS (VmHWM), next to its RSS right after importing torch and
transformers' model code (the floor any process that verifies weights against an architecture
pays; transformers' modeling imports pull in scipy, sklearn, pandas and sympy here):

1. float32 shards -> bfloat16: every tensor read, cast and written, streamed chunk by chunk;
2. that bfloat16 output consolidated again: already right, so hard-linked, only hashed.

Verification against config.json runs in both; the smoke generation does not (`--smoke` to add
one; it loads the whole model and so measures the smoke engine, not consolidation).

    python bench/consolidate.py [--workdir DIR] [--smoke none|transformers]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SHARD_BYTES = 256 << 20
MODEL: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 1536,
    "intermediate_size": 4096,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}


def build_checkpoint(target: Path) -> tuple[int, int]:
    """Write the random model as float32 shards of <= SHARD_BYTES plus an index and tokenizer.

    Tensors are generated per shard, so building needs memory for one shard, not the model.
    Returns (parameters, bytes).
    """
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from ckpteval.demo import build_tokenizer

    config = LlamaConfig(**MODEL)
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in LlamaForCausalLM(config).state_dict().items()}
    target.mkdir(parents=True)
    config.save_pretrained(target)
    build_tokenizer(target)
    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = 4 * int(torch.Size(shape).numel())
        if groups[-1] and size + nbytes > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    generator = torch.Generator().manual_seed(0)
    weight_map = {}
    total = 0
    for i, names in enumerate(groups, start=1):
        shard = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        tensors = {n: torch.randn(shapes[n], generator=generator) * 0.02 for n in names}
        save_file(tensors, target / shard, metadata={"format": "pt"})
        total += sum(t.numel() * 4 for t in tensors.values())
        weight_map.update(dict.fromkeys(names, shard))
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    return total // 4, total


CHILD = r"""
import json, sys, time
from pathlib import Path
from typing import Any

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
import torch  # the floor: what any process verifying weights against an architecture imports
from transformers import LlamaForCausalLM
from ckpteval.consolidate import consolidate_checkpoint
after_imports = status("VmRSS")
start = time.monotonic()
manifest = consolidate_checkpoint(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[2] + ".json"),
                                  smoke=sys.argv[3])
print(json.dumps({"seconds": time.monotonic() - start, "peak_rss": status("VmHWM"),
                  "after_imports": after_imports, "files": manifest["files"],
                  "sha256": manifest["weights_sha256"]}))
"""


def run_child(source: Path, out: Path, smoke: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(source), str(out), smoke],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.0f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--smoke", default="none", choices=["none", "transformers"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ckpteval-bench-", dir=args.workdir) as tmp:
        root = Path(tmp)
        started = time.monotonic()
        params, nbytes = build_checkpoint(root / "ckpt32")
        shards = len(list((root / "ckpt32").glob("model-*.safetensors")))
        print(
            f"checkpoint: {params / 1e6:.1f}M parameters, {shards} float32 shards, {mb(nbytes)}, "
            f"built in {time.monotonic() - started:.1f} s"
        )
        print(f"smoke generation: {args.smoke}")
        cases = [
            ("float32 shards -> bfloat16 (streamed cast)", root / "ckpt32", root / "out16"),
            ("bfloat16 dir -> bfloat16 (hard links, hash only)", root / "out16", root / "relinked"),
        ]
        for label, source, out in cases:
            result = run_child(source, out, args.smoke)
            written = sum(f["bytes"] for f in result["files"] if f["how"] == "written")
            linked = sum(f["bytes"] for f in result["files"] if f["how"] in ("hardlink", "symlink"))
            added = result["peak_rss"] - result["after_imports"]
            print(
                f"{label}: {result['seconds']:.1f} s, peak RSS {mb(result['peak_rss'])} "
                f"= {mb(result['after_imports'])} after imports + {mb(added)} consolidating; "
                f"written {mb(written)}, linked {mb(linked)}"
            )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
