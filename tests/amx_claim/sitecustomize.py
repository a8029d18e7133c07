"""Makes a Python process's torch say the CPU has AVX-512, its BF16 and AMX tiles, as an Intel
Xeon with AMX (Sapphire Rapids and later) does.

Tests put this directory on a child's PYTHONPATH to run what an AMX machine runs on any CPU: vLLM
asks torch.cpu's flags when it loads its native library and at each kernel decision, so from here
on it chooses its AVX-512 library and its AMX kernels (which fault or abort on a CPU without
them). What the test proves is that ckpteval reports these flags as absent where the environment
caps the instruction set below them (ckpteval.engine.cpu_kernels), so vLLM then loads its AVX2
library and builds no AMX kernel.
"""

import torch

for _flag in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_amx_tile_supported"):
    setattr(torch.cpu, _flag, lambda: True)
