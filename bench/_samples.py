"""Samples for the checker benchmarks: each problem's reference, mutants of it, and fillers.

Mutants flip one operator or literal of the reference solution, so a realistic share of samples
fails its tests for a reason the checker must find; the last sample of each problem is broken.
"""

from __future__ import annotations

import re


def make_samples(
    problems: list[dict],
    per_problem: int,
    *,
    mutations: list[tuple[str, str]],
    filler: str,
    broken: str,
) -> list[dict]:
    """`per_problem` samples per problem: the reference, mutants, `filler`s, then `broken`
    (`{body}` in it stands for the reference solution)."""
    samples = []
    for p in problems:
        body = p["canonical_solution"]
        variants = [body]
        for pattern, replacement in mutations:
            if len(variants) >= per_problem - 1:
                break
            mutated = re.sub(pattern, replacement, body, count=1)
            if mutated != body and mutated not in variants:
                variants.append(mutated)
        while len(variants) < per_problem - 1:
            variants.append(filler)
        variants.append(broken.replace("{body}", body))
        samples += [{"task_id": p["task_id"], "completion": v} for v in variants[:per_problem]]
    return samples
