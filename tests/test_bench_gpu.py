"""bench/gpu.py, the GPU runbook, runs on CPU with its tiny shape (what CI can run): the real
workflow with swapping on and off, a bare engine, and every figure the runbook promises printed
and sane (present, positive, consistent with each other; not particular values, which depend on
the machine and its load). One task (`arith`) instead of the tiny default's two: the figures are the
same lines whatever the tasks, and lm-eval's task through a swapped engine is
tests/test_swap_workflow.py's (there the generations are also compared with a fresh engine's)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def _number(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    assert found, f"missing {pattern!r} in:\n{text}"
    return float(found.group(1))


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-gpu")


@pytest.fixture(scope="module")
def printed(bench_out: Path) -> str:
    out = bench_out
    cmd = [sys.executable, str(REPO / "bench" / "gpu.py"), "--tiny", "--checkpoints", "2"]
    cmd += ["--tasks", "arith", "--max-new-tokens", "16", "--out", str(out)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3000)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout


def test_the_runbook_prints_every_figure_on_cpu(printed: str) -> None:
    assert re.search(r"^device: cpu \(tiny Qwen3 shape, random weights\)$", printed, re.M)
    assert "swap on: 2 checkpoints, 2 generation files, engine loads 1, swaps 1," in printed
    assert "swap off: 2 checkpoints, 2 generation files, engine loads 2, swaps 0," in printed
    start = _number(r"engine start seconds: ([\d.]+) \(bare LLM: [\d.]+\)", printed)
    swap = _number(r"swap seconds: ([\d.]+) per swap \(1 swaps\)", printed)
    assert 0 < swap < start, "a swap costs a fraction of an engine start"
    ours = _number(r"generated tokens per second: ckpteval ([\d.]+)", printed)
    bare = _number(r"bare LLM.generate ([\d.]+) \(\d+ tokens in", printed)
    assert ours > 0 and bare > 0
    assert printed.count("GPU busy share during the infer step") == 2
    assert "(swap on): n/a" in printed, "no GPU here: NVML's share is n/a"
    assert _number(r"GPU-seconds per checkpoint x task \(swap on\): ([\d.]+)", printed) > 0
    assert _number(r"GPU-seconds per checkpoint x task \(swap off\): ([\d.]+)", printed) > 0
    off = _number(r"swap off: C x \(o \+ S \+ T x g\) / 3600 = ([\d.]+) GPU-hours", printed)
    on = _number(r"E=16 = ([\d.]+) GPU-hours", printed)
    assert 0 < on < off, "with 16 engines for 30 checkpoints, 14 starts become swaps"


def test_the_runbooks_checkpoints_are_qwen3_with_a_padded_tokenizer(
    printed: str, bench_out: Path
) -> None:
    """The shipped config is Qwen3-1.7B's; the tiny shape keeps its architecture, and the local
    tokenizer is padded to the config's vocabulary, every id of which decodes."""
    from transformers import AutoTokenizer

    shipped = json.loads((REPO / "bench" / "data" / "qwen3-1.7b" / "config.json").read_text())
    assert shipped["architectures"] == ["Qwen3ForCausalLM"]
    assert (shipped["hidden_size"], shipped["num_hidden_layers"], shipped["vocab_size"]) == (
        2048,
        28,
        151936,
    )
    checkpoint = bench_out / "run" / "step_200"
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["vocab_size"] == 1024
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert len(tokenizer) == config["vocab_size"]
    assert tokenizer.decode([1023]) == "<fill1023>"
    assert tokenizer.decode(tokenizer("Question: 3 + 4?")["input_ids"]) == "Question: 3 + 4?"
