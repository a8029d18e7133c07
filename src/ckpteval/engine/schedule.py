"""Which infer job a sweep starts first: the one expected to take longest.

A sweep's GPU phase ends with its last wave of infer jobs. Started in an arbitrary order (by
default Snakemake starts equal-priority jobs in DAG order), a long job can land in that last wave
and keep one GPU busy while the others idle; starting the longest jobs first (LPT, "longest
processing time") leaves the short ones to fill the gaps at the end. Snakemake starts ready jobs
in order of their `priority`, so each infer job's priority is its expected GPU seconds.

The estimate of a job (one run, checkpoint and engine group) is a sum over the (task, variant)
pairs it generates, each priced by the best evidence at hand:

1. measured: `generation_seconds` from a `.meta.json` of the same run, task and variant, at this
   checkpoint if one exists (a rerun after an overwrite or an engine change), else at the
   checkpoint nearest in step (checkpoints close in training write answers of similar length);
2. static: requests x max new tokens x the checkpoint's weight bytes. That is proportional to
   decoding work on a memory-bound GPU, which is what separates a 7B run from a 1.7B one and a
   pass@10 variant from a greedy one. Static units become seconds at the median rate of every
   pair that has both a measurement and a static figure; without any measurement, all pairs
   stay in static units, which orders them just as well.

Pure functions take plain numbers; `InferCosts` gathers them from a Plan and the results tree,
once per (run, task, variant), so the Snakefile pays for a directory listing, not one per job.
"""

from __future__ import annotations

import bisect
import glob
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.plan.layout import CellKey, Layout

#: Requests assumed for an lm-eval task without `limit` until one of its generations is measured
#: (its documents are not counted at parse time: that would load every dataset).
HARNESS_REQUESTS = 1000

#: Files whose bytes count as a checkpoint's weights for the static estimate.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".distcp")

Key = tuple[str, str]  # (task, variant)


@dataclass(frozen=True)
class Measurement:
    """Seconds one (task, variant) generation took at a checkpoint of the same run."""

    step: int
    seconds: float


def nearest(measurements: Sequence[Measurement], step: int) -> Measurement | None:
    """The measurement at `step`, else at the nearest step (ties: the earlier step), from
    measurements sorted by step."""
    if not measurements:
        return None
    i = bisect.bisect_left(measurements, step, key=lambda m: m.step)
    candidates = measurements[max(0, i - 1) : i + 1]
    return min(candidates, key=lambda m: (abs(m.step - step), m.step))


def learnt_rate(
    static: Mapping[Key, float], measured: Mapping[Key, Sequence[Measurement]]
) -> float | None:
    """Seconds per static unit: the median over every measurement of a pair with a static figure;
    None without any."""
    rates = [
        m.seconds / static[key]
        for key, ms in measured.items()
        if static.get(key, 0) > 0
        for m in ms
    ]
    return statistics.median(rates) if rates else None


def expected_seconds(
    static: Mapping[Key, float],
    measured: Mapping[Key, Sequence[Measurement]],
    step: int,
    rate: float | None = None,
) -> float:
    """Expected cost of one infer job at `step`: the sum over its pairs (`static` keys) of the
    nearest measurement (lists sorted by step), else the static figure at `rate` (by default the
    rate `learnt_rate` finds in these figures; without measurements, 1: static figures still order
    jobs)."""
    if rate is None:
        rate = learnt_rate(static, measured) or 1.0
    total = 0.0
    for key, units in static.items():
        found = nearest(measured.get(key, ()), step)
        total += found.seconds if found is not None else units * rate
    return total


def weight_bytes(path: Path) -> int:
    """Bytes of the weight files under a checkpoint directory (or of the file itself)."""
    if path.is_file():
        return path.stat().st_size
    if not path.is_dir():
        return 0
    return sum(
        p.stat().st_size for p in path.rglob("*") if p.suffix in WEIGHT_SUFFIXES and p.is_file()
    )


class InferCosts:
    """Expected seconds of the workflow's infer jobs, for the infer rules' `priority`."""

    def __init__(self, plan: Any) -> None:
        self.plan = plan
        self._measured: dict[tuple[str, str, str], list[Measurement]] = {}
        self._bytes: dict[tuple[str, str], int] = {}
        self._static: dict[Key, int] = {}
        self._token_rates: dict[tuple[str, tuple[Key, ...]], float | None] = {}
        self._costs: dict[tuple[str, str, tuple[Key, ...]], float] = {}

    def __call__(self, run: str, ckpt: str, pairs: Sequence[Key]) -> float:
        """Expected seconds of the job generating `pairs` at checkpoint `ckpt` of `run` (asked
        twice per job: by its infer rule and, summed over groups, by its consolidate rule)."""
        key = (run, ckpt, tuple(pairs))
        if key not in self._costs:
            size = max(1, self._weight_bytes(run, ckpt))
            static = {(t, v): self._tokens(t, v) * size / 1e9 for t, v in pairs}
            measured = {(t, v): self._measurements(run, t, v) for t, v in pairs}
            # Learnt once per run and pairs, per token: within a run, measured pairs price the
            # others at the same seconds per token whatever the checkpoint's size.
            token_rate = self._token_rate(run, key[2], measured)
            rate = 1.0 if token_rate is None else token_rate * 1e9 / size
            self._costs[key] = expected_seconds(
                static, measured, self.plan.checkpoint(run, ckpt).step, rate
            )
        return self._costs[key]

    def _token_rate(
        self, run: str, pairs: tuple[Key, ...], measured: Mapping[Key, Sequence[Measurement]]
    ) -> float | None:
        if (run, pairs) not in self._token_rates:
            self._token_rates[(run, pairs)] = learnt_rate(
                {k: self._tokens(*k) for k in pairs}, measured
            )
        return self._token_rates[(run, pairs)]

    def _tokens(self, task: str, variant: str) -> int:
        """Requests x max new tokens of a (task, variant): the most it can decode."""
        if (task, variant) not in self._static:
            self._static[(task, variant)] = self._requests(task, variant) * self._max_tokens(
                task, variant
            )
        return self._static[(task, variant)]

    def _requests(self, task: str, variant: str) -> int:
        spec = self.plan.tasks[task]
        n = self.plan.variants[variant].sampling.n
        if spec.kind == "generate":
            return len(spec.problems()) * n
        return int(spec.options.get("limit") or HARNESS_REQUESTS) * n

    def _max_tokens(self, task: str, variant: str) -> int:
        spec = self.plan.tasks[task]
        return int(
            spec.options.get("max_new_tokens")
            or self.plan.variants[variant].sampling.max_new_tokens
        )

    def _weight_bytes(self, run: str, ckpt: str) -> int:
        if (run, ckpt) not in self._bytes:
            r = self.plan.runs[run]
            path = self.plan.checkpoint(run, ckpt).path
            size = weight_bytes(path) if r.has_weights else 0
            if r.has_weights and r.base_model and (path / "adapter_config.json").exists():
                size += weight_bytes(
                    Path(r.base_model)
                )  # a LoRA adapter decodes at its base's cost
            self._bytes[(run, ckpt)] = size
        return self._bytes[(run, ckpt)]

    def _measurements(self, run: str, task: str, variant: str) -> list[Measurement]:
        """Generation seconds recorded by earlier infer jobs of this run, task and variant."""
        key = (run, task, variant)
        if key not in self._measured:
            steps = {c.name: c.step for c in self.plan.runs[run].checkpoints}
            found = []
            layout = Layout(glob.escape(self.plan.outdir))
            metas = layout.generation_meta(CellKey(glob.escape(run), "*", task, variant))
            for meta in map(Path, glob.glob(metas)):
                ckpt = meta.parent.parent.name
                seconds = _generation_seconds(meta)
                if ckpt in steps and seconds is not None:
                    found.append(Measurement(steps[ckpt], seconds))
            self._measured[key] = sorted(found, key=lambda m: m.step)
        return self._measured[key]


def _generation_seconds(meta: Path) -> float | None:
    try:
        value = json.loads(meta.read_text()).get("generation_seconds")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None
