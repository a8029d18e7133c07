"""Which kernels vLLM's CPU backend computes with, chosen coherently with the environment.

vLLM 0.32's CPU backend picks kernels from what the CPU says it has (torch.cpu's flags, per
process):
- its native library, once, when vLLM is imported: `_C` (AVX-512 with BF16; the only one with
  sgl-kernel's AMX kernels), `_C_AVX512`, or `_C_AVX2`;
- linear layers (`dispatch_cpu_unquantized_gemm`): sgl-kernel's VNNI-packed `weight_packed_linear`
  on AMX (bf16 weights up to 1 MiB whose shape its tiles fit), zentorch on its Zen platform (only
  with zentorch installed), oneDNN's `onednn_mm` where oneDNN builds a kernel (bf16 with AVX-512,
  fp32 from AVX2 on), and `torch.nn.functional.linear` otherwise;
- attention (`_get_attn_isa`): `amx` for bf16 on AMX, else `vec` (or `vec16` by head size).

The environment can cap the instruction set below what the CPU has: `ONEDNN_MAX_CPU_ISA` and
`ATEN_CPU_CAPABILITY` (a smaller machine simulated, or a site's setting). vLLM reads neither: on an
AMX CPU capped at AVX2 it still packs for AMX, and the packed kernel, which needs oneDNN's AMX
micro-kernels, aborts the whole process from C++ ("BFloat16 Brgemm VNNI format is only supported
on X64 when oneDNN ukernel is enabled and amx is supported"). `apply_cpu_kernels` makes them agree
before vLLM is imported: each flag the caps exclude (AVX-512, AVX-512 BF16, AMX) is reported to
vLLM as absent, so it loads the library and takes the paths a CPU without them takes, and the job
log says so in one line.

`CKPTEVAL_CPU_LINEAR` forces the linear path (the tests force each one the CPU has): `auto`
(vLLM's choice, the default), `amx` (sgl-kernel's AMX packing for every layer whose shape it packs;
needs AMX and no cap below it), `onednn` (vLLM still falls back to torch where oneDNN cannot build
a kernel, e.g. bf16 without AVX-512), or `torch`. A choice the machine cannot honour is one line.

The decision (`plan_cpu_kernels`) is a pure function of the CPU's flags, the caps and the choice;
`apply_cpu_kernels` carries it out in the process that builds the engine (on CPU, ckpteval runs
the engine in the job's own process: engine.gpus, consolidate's smoke child).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from ckpteval.errors import UserError

log = logging.getLogger("ckpteval.engine.cpu_kernels")

#: Forces the linear kernel of every engine built in this process (module docstring).
CPU_LINEAR_ENV = "CKPTEVAL_CPU_LINEAR"
CPU_LINEAR_CHOICES = ("auto", "amx", "onednn", "torch")
#: oneDNN's and ATen's own caps on the instruction set they dispatch to (their documented names).
ONEDNN_CAP_ENV = "ONEDNN_MAX_CPU_ISA"
ATEN_CAP_ENV = "ATEN_CPU_CAPABILITY"
#: Values of ONEDNN_MAX_CPU_ISA that leave every ISA the CPU has (oneDNN's names, any case).
_UNCAPPED = {"", "ALL", "DEFAULT"}
#: The torch.cpu flag vLLM reads for each feature (and AMX's fp16 variant, which needs AMX).
_TORCH_FLAGS = {
    "avx512": ("_is_avx512_supported",),
    "avx512_bf16": ("_is_avx512_bf16_supported",),
    "amx": ("_is_amx_tile_supported", "_is_amx_fp16_supported"),
}
_NAMES = {"avx512": "AVX-512", "avx512_bf16": "AVX-512 BF16", "amx": "AMX"}


@dataclass(frozen=True)
class CpuFlags:
    """What vLLM is told the CPU has: the three features it dispatches on besides AVX2."""

    avx512: bool
    avx512_bf16: bool
    amx: bool

    @classmethod
    def of_this_cpu(cls) -> CpuFlags:
        import torch

        return cls(
            bool(torch.cpu._is_avx512_supported()),
            bool(torch.cpu._is_avx512_bf16_supported()),
            bool(torch.cpu._is_amx_tile_supported()),
        )


def onednn_allows_amx(cap: str | None) -> bool:
    """Whether oneDNN capped at `cap` still dispatches to AMX: no cap, `ALL`, or a level whose
    name includes AMX (`AVX512_CORE_AMX`, `AVX10_1_512_AMX_FP16`, ...); every lower level
    (`AVX2`, `AVX512_CORE_BF16`, ...) excludes it."""
    value = (cap or "").strip().upper()
    return value in _UNCAPPED or "AMX" in value


def allowed_by_caps(onednn_cap: str | None, aten_cap: str | None) -> CpuFlags:
    """The features the caps leave (each still needs the CPU to have it). oneDNN's levels name
    what they include: `AVX512_CORE*` and `AVX10*` keep AVX-512, those with `BF16`, `AMX`, `FP16`
    or `AVX10` keep its BF16 too, only `*AMX*` keeps AMX; ATen at `avx2` or `default` drops
    AVX-512 (and so the rest)."""
    onednn = (onednn_cap or "").strip().upper()
    aten = (aten_cap or "").strip().lower()
    uncapped = onednn in _UNCAPPED
    avx512 = aten not in ("avx2", "default") and (
        uncapped or onednn.startswith(("AVX512", "AVX10"))
    )
    bf16 = avx512 and (
        uncapped or any(level in onednn for level in ("BF16", "AMX", "FP16", "AVX10"))
    )
    return CpuFlags(avx512, bf16, bf16 and onednn_allows_amx(onednn_cap))


@dataclass(frozen=True)
class CpuKernels:
    """What an engine built in this process may compute with."""

    #: The linear path asked for (CPU_LINEAR_CHOICES).
    linear: str
    #: What vLLM is told the CPU has (the CPU's own flags less what the caps exclude).
    flags: CpuFlags
    #: One line for the job log when the caps switched something off, else None.
    note: str | None = None

    @property
    def amx(self) -> bool:
        return self.flags.amx


def plan_cpu_kernels(
    choice: str, cpu: CpuFlags, onednn_cap: str | None, aten_cap: str | None = None
) -> CpuKernels:
    """The kernels an engine may use, from the CPU's flags, the caps and the forced linear path.
    Raises UserError (one line) for a choice this machine cannot honour."""
    if choice not in CPU_LINEAR_CHOICES:
        raise UserError(
            f"{CPU_LINEAR_ENV}={choice}: expected one of {', '.join(CPU_LINEAR_CHOICES)}"
        )
    allowed = allowed_by_caps(onednn_cap, aten_cap)
    flags = CpuFlags(
        cpu.avx512 and allowed.avx512,
        cpu.avx512_bf16 and allowed.avx512_bf16,
        cpu.amx and allowed.amx,
    )
    caps = ", ".join(
        f"{name}={value}"
        for name, value in ((ONEDNN_CAP_ENV, onednn_cap), (ATEN_CAP_ENV, aten_cap))
        if value
    )
    if choice == "amx" and not flags.amx:
        why = f"{caps} caps this CPU below AMX" if cpu.amx else "this CPU has no AMX tiles"
        raise UserError(
            f"{CPU_LINEAR_ENV}=amx: {why}, which vLLM's AMX packing needs; use auto, onednn or "
            "torch"
        )
    off = [_NAMES[f] for f in _TORCH_FLAGS if getattr(cpu, f) and not getattr(flags, f)]
    if not off:
        return CpuKernels(choice, flags)
    return CpuKernels(
        choice,
        flags,
        note=(
            f"{caps} cap this CPU below its {', '.join(off)}: vLLM is told the CPU lacks "
            f"{'them' if len(off) > 1 else 'it'} and takes the kernels of a CPU without "
            f"(its {'AVX-512' if flags.avx512 else 'AVX2'} library"
            f"{', no AMX packing' if cpu.amx else ''}), as oneDNN and ATen do"
        ),
    )


def apply_cpu_kernels(choice: str | None = None) -> CpuKernels:
    """Carry out `plan_cpu_kernels` for every engine built in this process from now on: the
    choice from `CPU_LINEAR_ENV` (or `choice`), the caps from the environment. Call it before
    vLLM is imported (its native library is chosen then) and before the engine is built.
    Returns the plan in force."""
    import torch

    plan = plan_cpu_kernels(
        choice or os.environ.get(CPU_LINEAR_ENV) or "auto",
        CpuFlags.of_this_cpu(),
        os.environ.get(ONEDNN_CAP_ENV),
        os.environ.get(ATEN_CAP_ENV),
    )
    if plan.note:
        log.warning("%s", plan.note)
    # vLLM asks torch.cpu at each decision (library, linear dispatch, attention ISA, MoE, MLA),
    # so these are the switches all of them read.
    for feature, names in _TORCH_FLAGS.items():
        if not getattr(plan.flags, feature):
            for name in names:
                setattr(torch.cpu, name, _no)
    if plan.linear == "auto":
        return plan
    import vllm._custom_ops as ops
    import vllm.model_executor.layers.utils as gemm
    from vllm.platforms import current_platform

    current_platform.is_zen_cpu = _no  # zentorch prepacks
    if plan.linear == "amx":
        # sgl-kernel for every layer whose shape it packs, not only those up to 1 MiB.
        gemm._CPU_SGL_GEMM_MAX_WEIGHT_BYTES = float("inf")
        return plan
    gemm.check_cpu_sgl_kernel = lambda n, k, dtype: False  # AMX packs
    if plan.linear == "torch":
        ops._supports_onednn = False
    return plan


def _no() -> bool:
    return False


def cpu_linear_kinds(worker: Any) -> dict[str, int]:
    """Runs inside each vLLM worker (collective_rpc): how many layers compute with each CPU
    kernel (`onednn`, `sgl`, `zentorch`, `torch`); empty off the CPU backend."""
    kinds: dict[str, int] = {}
    for layer in worker.model_runner.model.modules():
        kernel = getattr(layer, "cpu_linear", None)
        if kernel is None:
            continue
        names = getattr(getattr(kernel, "__code__", None), "co_names", ())
        kind = next(
            (
                label
                for label, marker in (
                    ("onednn", "onednn_mm"),
                    ("sgl", "weight_packed_linear_cpu"),
                    ("zentorch", "zentorch_linear_unary"),
                )
                if marker in names
            ),
            "torch",
        )
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def vllm_library() -> str | None:
    """Which of vLLM's native CPU libraries this process loaded (`_C`, `_C_AVX512`, `_C_AVX2`),
    from the process's memory map; None if none is."""
    try:
        with open("/proc/self/maps") as maps:
            mapped = maps.read()
    except OSError:
        return None
    for name in ("_C_AVX2", "_C_AVX512", "_C"):
        if f"/vllm/{name}.abi3.so" in mapped:
            return name
    return None


def describe(kinds: dict[str, int], plan: CpuKernels, library: str | None = None) -> str:
    """`onednn x 18 (vLLM's choice; library _C_AVX2)`: the kernels an engine built and why, for
    its log line."""
    built = ", ".join(f"{k} x {n}" for k, n in sorted(kinds.items())) or "none"
    why = "vLLM's choice" if plan.linear == "auto" else f"forced: {CPU_LINEAR_ENV}={plan.linear}"
    if library:
        why += f"; library {library}"
    if plan.note:
        why += "; capped by the environment"
    return f"{built} ({why})"
