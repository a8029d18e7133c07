"""One engine per GPU slot through the real workflow (`engine.swap`, ckpteval.engine.chain): a run of four
checkpoints, three of one architecture and one of another, on every kind of task (ckpteval's own,
lm-eval's through its vLLM wrapper, a reasoning task, a chat-template task).

The sweep runs with swapping on, from an empty cache; then, in its own outdir with swapping off,
the checkpoints that were swapped in run again, each on a fresh engine of its own: the reference
(the checkpoint each engine started on was loaded fresh already, its generations are their own
reference, so a second fresh load of it would prove nothing and cost an engine). Both run on vLLM's oneDNN kernels, forced
(`CKPTEVAL_CPU_LINEAR=onednn`, in fp32, the dtype in which every x86-64 machine of ours builds
them): the path whose packed weight copies a reload must rebuild, whatever this machine would take
by itself (tests/test_swap.py forces each path on a bare engine). Every generation of the swapped
sweep equals a fresh engine's, by tests/numeric.py's rules; the three checkpoints of one architecture share one
engine load, and the fourth starts its own, saying why. Then a chain whose middle checkpoint is
corrupt: that checkpoint fails alone, and the rest are served and equal to the reference.

Every sweep here stops at the generations (`--until generation`): what is tested is what the
engines generate, and scoring those files (an evaluate job per cell, each a new interpreter, and
the summary) would check nothing more about swapping; tests/test_workflow.py scores every task
kind end to end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import dry_snakemake, run_snakemake
from numeric import assert_same_or_near_tie

pytestmark = [pytest.mark.slow, pytest.mark.numeric]

SAME = ("step_1", "step_2", "step_3")  # the demo's last three checkpoints, renamed
OTHER = "step_4"  # two layers instead of four: another engine
TASKS = {
    "arith": {"limit": 4, "chat_template": True},  # ckpteval's own task, through a chat template
    "arith_harness": {"limit": 3},  # lm-eval's generate_until through its VLLM wrapper
    "pyfunc": {"limit": 2, "reasoning": {"start": "def", "end": "\n\n", "budget": 24}},
}


def _other_architecture(source: Path, target: Path) -> None:
    """A checkpoint of the same tokenizer with half the layers (random weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    shutil.copytree(source, target)
    for weights in target.glob("*.safetensors"):
        weights.unlink()
    config = AutoConfig.from_pretrained(source)
    config.num_hidden_layers = 2
    torch.manual_seed(7)
    AutoModelForCausalLM.from_config(config).save_pretrained(target, safe_serialization=True)


def _config(work: Path, outdir: str, swap: bool) -> Path:
    config = {
        "outdir": outdir,
        "runs": {"demo": {"path": str(work / "run")}},
        "tasks": TASKS,
        "sampling": {"greedy": {"temperature": 0.0, "max_new_tokens": 24}},
        "engine": {
            "gpu_memory_utilization": 0.15,
            "enforce_eager": True,
            "swap": swap,
            "dtype": "float32",
        },
        "consolidate": {"smoke": "none"},
        "evaluate": {"workers": 2, "timeout": 10},
    }
    path = work / f"{outdir}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


#: vLLM's oneDNN kernels for every linear layer (ckpteval.engine.swap.force_cpu_linear).
ONEDNN = {**os.environ, "CKPTEVAL_CPU_LINEAR": "onednn"}


#: Where every sweep of this module stops: the generation files, never scored (module docstring).
UNTIL = ("--until", "generation")


def _sweep(work: Path, config: Path, *args: str, ok: bool = True) -> str:
    """Snakemake with `args` (targets, verbs) before the configfile, which takes several."""
    proc = run_snakemake(work, *args, "--configfile", str(config), env=ONEDNN)
    out = proc.stdout + proc.stderr
    assert (proc.returncode == 0) == ok, out[-4000:]
    return out


@pytest.fixture(scope="module")
def sweeps(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("swapflow")
    steps = sorted((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    for name, source in zip(SAME, steps[-len(SAME) :]):
        shutil.copytree(source, work / "run" / name)
    _other_architecture(steps[-1], work / "run" / OTHER)
    swapped = _config(work, "swapped", swap=True)
    # Consolidated first, so that the chain finds every checkpoint ready (how long it waits for
    # a consolidation, and what it then does: tests/test_chain.py).
    _sweep(work, swapped, "--until", "consolidate")
    _sweep(work, swapped, *UNTIL)
    # The checkpoints an engine started on: their files, kept aside (a later test regenerates
    # the sweep's own) as their reference. Every other one runs again on a fresh engine.
    metas = _metas(work, "swapped")
    loaded = sorted({p.split("/")[0] for p, m in metas.items() if m["swaps"] == 0})
    for ckpt in loaded:
        for part in ("generations", "models"):
            shutil.copytree(
                work / "swapped" / part / "demo" / ckpt,
                work / "loaded" / part / "demo" / ckpt,
                # Weights hard-linked (read only; the test that cuts them replaces the file).
                copy_function=os.link if part == "models" else shutil.copy2,
            )
    swapped_in = sorted({p.split("/")[0] for p in metas} - set(loaded))
    # Their consolidated models, hard-linked into the fresh outdir with their source records:
    # the same bytes the swapped engine swapped in, and nothing for Snakemake to consolidate
    # again (what is compared is the engines, not two consolidations of one checkpoint).
    for ckpt in swapped_in:
        for part in (
            f"models/demo/{ckpt}",
            f"models/demo/{ckpt}.json",
            f"sources/demo/{ckpt}.json",
        ):
            _link(work / "swapped" / part, work / "fresh" / part)
    targets = [
        f"fresh/generations/demo/{ckpt}/{task}/greedy-s42.jsonl"
        for ckpt in swapped_in
        for task in TASKS
    ]
    out = _sweep(work, _config(work, "fresh", swap=False), *targets)
    assert "rule consolidate" not in out, "the fresh outdir's models are the swapped sweep's"
    return {"work": work, "loaded": loaded, "swapped_in": swapped_in}


def _link(source: Path, target: Path) -> None:
    """`source` (a file, or a directory's files) hard-linked at `target` (read only here)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target, copy_function=os.link)
    else:
        os.link(source, target)


def _reference(work: Path, ckpt: str) -> Path:
    """The outdir of `ckpt`'s reference: the fresh sweep's, or the swapped sweep's own files
    (kept aside) when the engine started on it."""
    fresh = work / "fresh" / "generations" / "demo" / ckpt
    return work / ("fresh" if fresh.exists() else "loaded")


def _metas(work: Path, outdir: str) -> dict[str, dict[str, Any]]:
    root = work / outdir / "generations" / "demo"
    return {str(p.relative_to(root)): json.loads(p.read_text()) for p in root.rglob("*.meta.json")}


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _assert_equal_generations(work: Path, ckpts: tuple[str, ...], outdir: str) -> int:
    """Every generation file of `ckpts` in `outdir` equals its fresh engine's (`_reference`; a
    near-tie under the checkpoint's own reference model aside); returns how many completions
    were compared."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    compared = 0
    for ckpt in ckpts:
        reference_dir = _reference(work, ckpt)
        model_dir = reference_dir / "models" / "demo" / ckpt
        reference = (
            AutoModelForCausalLM.from_pretrained(model_dir),
            AutoTokenizer.from_pretrained(model_dir),
        )
        for task in TASKS:
            name = f"generations/demo/{ckpt}/{task}/greedy-s42.jsonl"
            ours, theirs = _lines(work / outdir / name), _lines(reference_dir / name)
            assert [r["task_id"] for r in ours] == [r["task_id"] for r in theirs], name
            for a, b in zip(ours, theirs):
                assert a["prompt"] == b["prompt"], name
                assert_same_or_near_tie(*reference, a["prompt"], a["completion"], b["completion"])
                compared += 1
    return compared


def test_the_fresh_sweep_starts_one_engine_per_checkpoint(sweeps: dict[str, Any]) -> None:
    """With swapping off, two checkpoints of one architecture (the two swapped in with it on)
    each start an engine of their own."""
    metas = _metas(sweeps["work"], "fresh")
    assert sweeps["swapped_in"] and set(sweeps["swapped_in"]) <= set(SAME)
    assert len(metas) == len(TASKS) * len(sweeps["swapped_in"])
    assert {m["swaps"] for m in metas.values()} == {0}
    assert {m["engine_loads"] for m in metas.values()} == {1}


def test_one_engine_serves_each_architecture_and_the_generations_are_a_fresh_engines(
    sweeps: dict[str, Any],
) -> None:
    work = sweeps["work"]
    metas = _metas(work, "swapped")
    assert len(metas) == len(TASKS) * (len(SAME) + 1)
    same = [m for path, m in metas.items() if path.split("/")[0] in SAME]
    other = [m for path, m in metas.items() if path.startswith(OTHER)]
    # One engine load for the three checkpoints of one architecture: the two after the first
    # came in by swapping, and the checkpoint that started it says so.
    servers = {m["served_by"] for m in same}
    assert len(servers) == 1, servers
    assert {m["engine_loads"] for m in same} == {1}
    assert {m["swaps"] for m in same} == set(range(len(SAME)))  # 0 for the first, then 1, 2
    assert len(sweeps["loaded"]) == 2 and OTHER in sweeps["loaded"], "one load per architecture"
    assert all(m["swap_seconds"] > 0 for m in same if m["swaps"])
    assert {m["served_by"] for m in other} != servers, "another architecture, another engine"
    log = "\n".join(p.read_text() for p in (work / "logs" / "infer").rglob("*.log"))
    assert "has another model config or tokenizer" in log
    kernels = re.findall(r"CPU linear kernels: (.*) \(forced", log)
    assert kernels and all(re.fullmatch(r"onednn x \d+", k) for k in kernels), kernels
    # Generations differ between checkpoints (so equality below is not vacuous) ...
    name = "generations/demo/{}/arith/greedy-s42.jsonl"
    first = _lines(_reference(work, "step_1") / name.format("step_1"))
    last = _lines(_reference(work, "step_3") / name.format("step_3"))
    assert [r["completion"] for r in first] != [r["completion"] for r in last]
    # ... and every task kind's generations equal a fresh engine's on that checkpoint, lm-eval's
    # included: its VLLM wrapper answered with the swapped-in weights.
    assert _assert_equal_generations(work, tuple(sweeps["swapped_in"]), "swapped") > 0


def test_a_corrupt_checkpoint_in_the_middle_of_a_chain_fails_alone(sweeps: dict[str, Any]) -> None:
    """The middle checkpoint's consolidated weights are cut short after its consolidation (what
    a disk error would leave): its swap fails, the chain goes on to the next checkpoint, its own
    job fails to load it, and every other cell is regenerated as the fresh engine made it
    (`-R infer` on the generation files of one architecture's checkpoints, with the cache moved
    aside so that the engines really generate)."""
    work = sweeps["work"]
    config = _config(work, "swapped", swap=True)
    weights = work / "swapped" / "models" / "demo" / "step_2" / "model.safetensors"
    # The consolidated file is a hard link of the checkpoint's: set it aside (the checkpoint
    # keeps its bytes) and put a file cut short in its place.
    aside = weights.with_name("model.safetensors.aside")
    os.replace(weights, aside)
    weights.write_bytes(aside.read_bytes()[: aside.stat().st_size // 2])
    cache = work / "swapped" / "cache"
    shutil.move(cache, work / "cache.aside")  # so that every engine really generates
    targets = [
        f"swapped/generations/demo/{ckpt}/{task}/greedy-s42.jsonl"
        for ckpt in SAME
        for task in TASKS
    ]
    try:  # the chain of one architecture only: the other needs no engine load here (the
        # targets go before `-R`, whose list would take them and leave the default target)
        out = _sweep(work, config, *targets, "-R", "infer", ok=False)
    finally:
        os.replace(aside, weights)
    assert "Error in rule infer" in out and "step_2" in out
    assert "ckpt=step_4" not in out and "rule evaluate" not in out, "one chain's jobs, no more"
    metas = _metas(work, "swapped")
    served = {p: m for p, m in metas.items() if p.split("/")[0] in ("step_1", "step_3")}
    assert len(served) == 2 * len(TASKS)
    assert len({m["served_by"] for m in served.values()}) == 1, "step_2 skipped, chain went on"
    assert 1 in {m["swaps"] for m in served.values()}
    log = "\n".join(p.read_text() for p in (work / "logs" / "infer").rglob("*.log"))
    assert "chain: cannot serve demo/step_2" in log
    _assert_equal_generations(work, ("step_1", "step_3"), "swapped")
    # Repaired, the next run finishes: step_2's files were never touched by the failure (they
    # are current, so nothing is generated again), and nothing is left to do.
    _sweep(work, config, *UNTIL)
    _assert_equal_generations(work, ("step_2",), "swapped")
    every = [
        f"swapped/generations/demo/{ckpt}/{task}/greedy-s42.jsonl"
        for ckpt in (*SAME, OTHER)
        for task in TASKS
    ]  # (a dry run `--until generation` of the default target says nothing of the kind)
    dry = dry_snakemake(work, *every, "--configfile", str(config))
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stderr
