"""The CPU kernels an engine may use (ckpteval.engine.cpu_kernels): the decision for every CPU kind
vLLM's CPU backend distinguishes, and that vLLM's own dispatch reads it.

The decision is pure (the CPU's flags, the environment's caps, the forced path), so every kind is
tested here on any CPU, an AMX Xeon included. That vLLM's choices follow it is tested against
vLLM's own dispatch functions with AMX claimed, and end to end by test_consolidate's vLLM smoke on
a "smaller machine" that claims an AMX Xeon's flags and caps oneDNN at AVX2 (tests/amx_claim).
"""

from __future__ import annotations

import pytest

from ckpteval.engine.cpu_kernels import (
    CPU_LINEAR_CHOICES,
    CpuFlags,
    CpuKernels,
    allowed_by_caps,
    describe,
    onednn_allows_amx,
    plan_cpu_kernels,
)
from ckpteval.errors import UserError

#: The CPU kinds vLLM 0.32's CPU backend tells apart (library, linear and attention dispatch).
CPUS = {
    "avx2": CpuFlags(avx512=False, avx512_bf16=False, amx=False),  # Zen 2/3, Haswell-Skylake
    "avx512": CpuFlags(avx512=True, avx512_bf16=False, amx=False),  # Skylake-X, Ice Lake
    "avx512-bf16": CpuFlags(avx512=True, avx512_bf16=True, amx=False),  # Zen 4/5, Cooper Lake
    "amx": CpuFlags(avx512=True, avx512_bf16=True, amx=True),  # Sapphire Rapids and later
}
#: Caps as users and tests set them: (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY).
CAPS = {
    "none": (None, None),
    "smaller-machine": ("AVX2", "avx2"),  # tests/numeric.py's other_machine_env on AVX-512
    "avx512-core": ("AVX512_CORE", None),
    "bf16-no-amx": ("AVX512_CORE_BF16", None),
    "amx-level": ("AVX512_CORE_AMX", "avx512"),
}


@pytest.mark.parametrize(
    ("cap", "allows"),
    [
        (None, True),
        ("", True),
        ("ALL", True),
        ("default", True),
        ("AVX512_CORE_AMX", True),
        ("avx10_1_512_amx_fp16", True),
        ("AVX2", False),
        ("avx512_core_bf16", False),
        ("AVX512_CORE_VNNI", False),
        ("SSE41", False),
    ],
)
def test_which_onednn_caps_leave_amx(cap: str | None, allows: bool) -> None:
    assert onednn_allows_amx(cap) is allows


@pytest.mark.parametrize(
    ("caps", "left"),
    [
        ("none", (True, True, True)),
        ("smaller-machine", (False, False, False)),
        ("avx512-core", (True, False, False)),
        ("bf16-no-amx", (True, True, False)),
        ("amx-level", (True, True, True)),
    ],
)
def test_what_each_cap_leaves(caps: str, left: tuple[bool, bool, bool]) -> None:
    assert allowed_by_caps(*CAPS[caps]) == CpuFlags(*left)
    # ATen at AVX2 alone drops AVX-512 and what needs it, whatever oneDNN allows.
    assert allowed_by_caps(None, "avx2") == CpuFlags(False, False, False)


@pytest.mark.parametrize("choice", CPU_LINEAR_CHOICES)
@pytest.mark.parametrize("caps", list(CAPS))
@pytest.mark.parametrize("cpu", list(CPUS))
def test_every_cpu_kind_gets_a_coherent_plan_or_one_line(choice: str, caps: str, cpu: str) -> None:
    """vLLM is told a feature only where the CPU has it and no cap excludes it; forcing `amx`
    where it cannot run is one line naming why; a feature switched off says so in one line."""
    flags, (onednn, aten) = CPUS[cpu], CAPS[caps]
    expected = CpuFlags(
        *(
            getattr(flags, f) and getattr(allowed_by_caps(onednn, aten), f)
            for f in ("avx512", "avx512_bf16", "amx")
        )
    )
    if choice == "amx" and not expected.amx:
        with pytest.raises(UserError) as refused:
            plan_cpu_kernels(choice, flags, onednn, aten)
        line = str(refused.value)
        assert "\n" not in line and line.startswith("CKPTEVAL_CPU_LINEAR=amx: ")
        assert ("no AMX tiles" in line) if not flags.amx else (f"{onednn}" in line)
        return
    plan = plan_cpu_kernels(choice, flags, onednn, aten)
    assert plan.linear == choice and plan.flags == expected
    # Never a feature vLLM would use without the CPU having it, nor AMX without BF16 or AVX-512.
    assert not plan.amx or (plan.flags.avx512_bf16 and plan.flags.avx512)
    if expected != flags:
        assert plan.note and "\n" not in plan.note and (onednn or aten) in plan.note
    else:
        assert plan.note is None


def test_the_abort_seen_on_an_amx_xeon_is_now_a_plan_without_amx() -> None:
    """CI on a 2-core Intel Xeon with AMX under the smaller machine's caps: vLLM packed for AMX
    and aborted in C++. The plan now tells vLLM the CPU is an AVX2 one, in one line."""
    plan = plan_cpu_kernels("auto", CPUS["amx"], "AVX2", "avx2")
    assert plan.flags == CPUS["avx2"]
    assert plan.note == (
        "ONEDNN_MAX_CPU_ISA=AVX2, ATEN_CPU_CAPABILITY=avx2 cap this CPU below its AVX-512, "
        "AVX-512 BF16, AMX: vLLM is told the CPU lacks them and takes the kernels of a CPU "
        "without (its AVX2 library, no AMX packing), as oneDNN and ATen do"
    )


def test_an_unknown_choice_is_one_line() -> None:
    with pytest.raises(UserError, match=r"^CKPTEVAL_CPU_LINEAR=avx: expected one of auto, amx"):
        plan_cpu_kernels("avx", CPUS["amx"], None)


def test_the_log_line_says_what_was_built_and_why() -> None:
    capped = plan_cpu_kernels("auto", CPUS["amx"], "AVX2", "avx2")
    assert describe({"onednn": 18, "torch": 1}, capped, "_C_AVX2") == (
        "onednn x 18, torch x 1 (vLLM's choice; library _C_AVX2; capped by the environment)"
    )
    assert describe({"torch": 19}, CpuKernels("torch", CPUS["avx2"])) == (
        "torch x 19 (forced: CKPTEVAL_CPU_LINEAR=torch)"
    )


@pytest.mark.slow
def test_vllms_own_dispatch_follows_the_plan_on_a_capped_amx_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With AMX claimed (as an AMX Xeon reports it), vLLM's linear dispatch packs a small bf16
    weight for AMX and its attention picks the `amx` ISA; once the plan for a cap at AVX2 is
    applied, both take what a CPU without AMX takes. Without a cap, AMX stays on."""
    import torch
    import vllm.model_executor.layers.utils as gemm
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from ckpteval.engine.cpu_kernels import apply_cpu_kernels

    # monkeypatch records the originals, so whatever apply_cpu_kernels sets is undone afterwards.
    for flag in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, flag, lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_amx_fp16_supported", torch.cpu._is_amx_fp16_supported)
    for name in ("CKPTEVAL_CPU_LINEAR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)

    assert apply_cpu_kernels().amx
    assert gemm.check_cpu_sgl_kernel(64, 64, torch.bfloat16)
    assert _get_attn_isa(torch.bfloat16, 32) == "amx"

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not apply_cpu_kernels().amx
    assert not gemm.check_cpu_sgl_kernel(64, 64, torch.bfloat16)
    assert _get_attn_isa(torch.bfloat16, 32) != "amx"
    assert not torch.cpu._is_avx512_supported(), "vLLM would load its AVX-512 library"
