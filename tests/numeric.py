"""Comparing what two inference engines generated, without asking for float bit-equality.

Greedy decoding is an argmax over logits. Two engines (vLLM and transformers), two dtypes, two
thread counts or two CPUs (AVX2 vs AVX-512 kernels) compute those logits with different rounding,
so where the model's top two logits are nearly tied they may pick different tokens, and from there
on their continuations differ. A test that compares token ids for equality then fails on some
machines and not on others (seen: vLLM vs transformers in bf16, token 7 of 8: 148 vs 403 on a
2-core EPYC without AVX-512, where the fp32 top-2 gap is 0.08 between logits around 15).

What such a test means to prove is that the engine ran *this* model. `assert_greedy_under` checks
that with a margin: the reference (transformers on the weights under test) reads the engine's own
tokens (teacher forcing, so the check goes on past a near-tie), and every token the engine picked
must be within a tolerance of the reference's best logit at its position. The tolerance of a
position is measured, not guessed: the reference computes the logits twice, in float32 and in the
engine's dtype, and the spread between the two on that position's leading candidates is how far
rounding alone moves them; another engine's kernels may move them as far again, so the tolerance is
`NOISE_FACTOR` times that spread plus `FLOOR` of the logit scale. A wrong tensor, tokenizer or
model picks tokens far from the reference's argmax at most positions and fails (tests/numeric.py's
own test in test_consolidate.py proves it on corrupted copies of the model); a near-tie broken the
other way passes.

`assert_same_or_near_tie` compares two engines' completions the same way: equal, or equal up to a
first differing token that is a near-tie under the reference.

Tests relying on this are marked `numeric`; `make test-threads` reruns them with another torch
thread count and another CPU kernel set (AVX2 instead of AVX-512).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

#: How many times the measured fp32-vs-dtype spread a position's tolerance allows.
NOISE_FACTOR = 3.0
#: Tolerance added on every position, as a fraction of the position's largest |logit|.
FLOOR = 0.005
#: Candidates whose spread is measured: the reference's leading logits at a position.
CANDIDATES = 8


def reference_logits(
    model: Any, prompt_ids: Sequence[int], token_ids: Sequence[int], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 logits for each position of `token_ids` after `prompt_ids`, and a tolerance.

    Row i is the distribution `token_ids[i]` was chosen from. `model` is left unchanged.
    """
    ids = torch.tensor([list(prompt_ids) + list(token_ids)])
    start, stop = len(prompt_ids) - 1, len(prompt_ids) - 1 + len(token_ids)

    def logits(precision: torch.dtype) -> torch.Tensor:
        reference = copy.deepcopy(model).to(precision).eval()
        with torch.no_grad():
            return reference(input_ids=ids).logits[0, start:stop].float()

    exact = logits(torch.float32)
    rounded = logits(dtype) if dtype != torch.float32 else exact
    top = exact.topk(min(CANDIDATES, exact.shape[1]), dim=1).indices
    shift = (rounded - exact).gather(1, top)
    spread = shift.max(dim=1).values - shift.min(dim=1).values
    tolerance = NOISE_FACTOR * spread + FLOOR * exact.abs().max(dim=1).values
    return exact, tolerance


def off_greedy(
    logits: torch.Tensor, tolerance: torch.Tensor, token_ids: Sequence[int]
) -> list[str]:
    """Positions where the chosen token is not within tolerance of that row's best logit."""
    problems = []
    for position, (row, tol, token) in enumerate(zip(logits, tolerance, token_ids, strict=True)):
        best = row.max().item()
        if row[token].item() < best - tol.item():
            problems.append(
                f"token {position}: {token} has logit {row[token].item():.3f}, the reference's "
                f"best is {int(row.argmax())} at {best:.3f} (tolerance {tol.item():.3f})"
            )
    return problems


def assert_greedy_under(
    model: Any,
    prompt_ids: Sequence[int],
    token_ids: Sequence[int],
    dtype: torch.dtype = torch.bfloat16,
) -> None:
    """`token_ids` are a greedy continuation of `prompt_ids` by `model`, up to rounding.

    `model` holds the weights under test (e.g. the in-memory model cast to the output dtype);
    `dtype` is the precision the engine computed in.
    """
    assert token_ids, "no tokens to check"
    logits, tolerance = reference_logits(model, prompt_ids, token_ids, dtype)
    problems = off_greedy(logits, tolerance, token_ids)
    assert not problems, "not this model's greedy tokens: " + "; ".join(problems)


def assert_same_or_near_tie(
    model: Any,
    tokenizer: Any,
    prompt: str,
    ours: str,
    theirs: str,
    dtype: torch.dtype = torch.bfloat16,
) -> bool:
    """Two greedy completions of `prompt` are equal, or first differ at a near-tie.

    Returns True when they are equal. Completions are re-tokenized: the demo tokenizer splits
    words and digits before merging, so a completion's text maps back to the tokens generated.
    """
    if ours == theirs:
        return True
    a = tokenizer(ours, add_special_tokens=False)["input_ids"]
    b = tokenizer(theirs, add_special_tokens=False)["input_ids"]
    common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert common < min(len(a), len(b)), (
        f"one completion is a prefix of the other, not a near-tie: {ours!r} vs {theirs!r}"
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    logits, tolerance = reference_logits(model, prompt_ids, a[: common + 1], dtype)
    for token in (a[common], b[common]):
        problems = off_greedy(logits[common:], tolerance[common:], [token])
        assert not problems, (
            f"completions differ at token {common} ({a[common]} vs {b[common]}) and it is not a "
            f"near-tie: {problems[0]}: {ours!r} vs {theirs!r}"
        )
    return False


def other_machine_env(cpuinfo: str | None = None) -> dict[str, str]:
    """Environment that makes this machine compute like a smaller one: one thread, and CPU kernels
    one instruction-set level down (AVX2 on an AVX-512 CPU, baseline on an AVX2 one).

    Float results depend on both (reduction order, vector width). `make test-threads` runs the
    `numeric` tests under it; the vLLM smoke test runs under it too (a child process inherits it).
    ATen's capability is only ever lowered: forcing a level the CPU lacks would crash.
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as handle:
                cpuinfo = handle.read()
        except OSError:
            cpuinfo = ""
    flags = set(cpuinfo.split())
    aten = "avx2" if "avx512f" in flags else "default"
    return {
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "ATEN_CPU_CAPABILITY": aten,
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
    }
