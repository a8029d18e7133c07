"""The vLLM backend on CPU with the tiny demo model: one engine for every task of a checkpoint,
resume after SIGKILL, no engine when everything is cached, and lm-eval parity.

Engines run in subprocesses (their memory goes back when they exit). The module shares one
killed run, one resumed run and one `lm_eval --model vllm` run: three engine starts in all.

Two engines that batch the same greedy requests differently (lm-eval's CLI, an assist job) may
break a near-tie differently: their completions must be equal or first differ at a token the
reference model calls a near-tie (tests/numeric.py), never elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from numeric import assert_same_or_near_tie
from test_tasks_harness import local_code_tasks

from ckpteval.backends import cache_namespace
from ckpteval.harness import score_harness_file
from ckpteval.io import read_json
from ckpteval.tasks import HARNESS_TASK_DIR

pytestmark = pytest.mark.slow

ENGINE = {"gpu_memory_utilization": 0.15, "enforce_eager": True}

DRIVER = """
import json, logging, sys
from pathlib import Path
from ckpteval.config import build_tasks, validate_config
from ckpteval.engine.generate import Job, run_infer

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    spec = json.loads(Path(sys.argv[1]).read_text())
    config = spec["config"]
    validate_config(config)
    tasks, variants, task_variants = build_tasks(config)
    out = Path(spec["out"])
    jobs = [Job(tasks[t], variants[v], out / t / f"{v}.jsonl")
            for t, vs in task_variants.items() for v in vs]
    summary = run_infer(jobs, manifest_path=Path(spec["manifest"]), model_dir=Path(spec["model"]),
                        run_cfg={"backend": "vllm"}, engine_cfg=config["engine"],
                        cache_dir=Path(spec["cache"]), include_paths=config["lm_eval"]["include_paths"],
                        gpus=spec.get("gpus"))
    print("SUMMARY " + json.dumps(summary), flush=True)
"""


def _config(tasks: dict[str, Any], include: Path, **engine: Any) -> dict[str, Any]:
    return {
        "runs": {"r": {"path": "."}},
        "tasks": tasks,
        "sampling": {
            "greedy": {"max_new_tokens": 48},
            "hot": {"temperature": 0.8, "top_p": 0.95, "n": 2, "max_new_tokens": 32},
        },
        "engine": {**ENGINE, **engine},
        "lm_eval": {"include_paths": [str(include)]},
    }


TASKS = {
    "arith": {"sampling": ["greedy"]},
    "arith_harness": {"limit": 10, "sampling": ["greedy"]},
    "math_qwen": {"limit": 2, "sampling": ["greedy"]},
    "pyfunc": {"limit": 3},  # greedy and hot: two variants on the same engine
    "he": {"harness": "he_local", "checker": "python", "limit": 3, "sampling": ["greedy"]},
}


def _spawn(
    work: Path,
    name: str,
    config: dict[str, Any],
    model: dict[str, Path],
    gpus: list[str] | None = None,
) -> subprocess.Popen:
    """Run the infer step in a child process (the engine's memory goes back when it exits)."""
    spec = work / f"{name}.json"
    spec.write_text(
        json.dumps(
            {
                "config": config,
                "out": str(work / "gen"),
                "gpus": gpus,
                "cache": str(work / "cache"),
                **{k: str(v) for k, v in model.items()},
            }
        )
    )
    driver = work / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONUNBUFFERED": "1"}
    with open(work / f"{name}.log", "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, str(driver), str(spec)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=work,
        )


def _rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by SIGKILL
    return rows


@pytest.fixture(scope="module")
def model(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from ckpteval.consolidate import consolidate_checkpoint

    out = tmp_path_factory.mktemp("model")
    ckpt = max((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    consolidate_checkpoint(ckpt, out / "m", out / "m.json", smoke="none")
    return {"model": out / "m", "manifest": out / "m.json"}


@pytest.fixture(scope="module")
def resumed(model: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Kill a job with SIGKILL after its first chunk reached the cache, then rerun every task."""
    work = tmp_path_factory.mktemp("infer")
    include = local_code_tasks(work / "tasks")
    cache = work / "cache" / cache_namespace(read_json(model["manifest"])) / "arith.jsonl"
    killed = _spawn(work, "killed", _config({"arith": {}}, include, chunk_size=1), model)
    deadline = time.monotonic() + 600
    while not (cache.exists() and _rows(cache)):
        assert killed.poll() is None, (work / "killed.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no chunk reached the cache in 600 s"
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    at_kill = len({r["key"] for r in _rows(cache)})
    proc = _spawn(work, "resumed", _config(TASKS, include, chunk_size=4), model)
    assert proc.wait(timeout=900) == 0, (work / "resumed.log").read_text()[-4000:]
    return {"work": work, "at_kill": at_kill, "cache": cache, "include": include}


@pytest.fixture(scope="module")
def reference(model: dict[str, Path]) -> tuple[Any, Any]:
    """The consolidated model in transformers, and its tokenizer: the judge of near-ties."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (
        AutoModelForCausalLM.from_pretrained(model["model"]).eval(),
        AutoTokenizer.from_pretrained(model["model"]),
    )


def _meta(work: Path, task: str, variant: str = "greedy-s42") -> dict[str, Any]:
    return json.loads((work / "gen" / task / f"{variant}.meta.json").read_text())


def test_killed_job_resumes_and_generates_only_missing_requests(resumed: dict[str, Any]) -> None:
    work, at_kill = resumed["work"], resumed["at_kill"]
    assert 1 <= at_kill < 20, "the kill must land mid-task"
    meta = _meta(work, "arith")
    assert (meta["n_cached_prompts"], meta["n_generated_prompts"]) == (at_kill, 20 - at_kill)
    keys = [r["key"] for r in _rows(resumed["cache"])]
    assert len(keys) == len(set(keys)) == 20  # no request was generated twice
    lines = [json.loads(x) for x in (work / "gen" / "arith" / "greedy-s42.jsonl").open()]
    assert [x["task_id"] for x in lines] == [f"arith/{i}" for i in range(20)]


def test_one_engine_load_serves_every_task_and_variant(resumed: dict[str, Any]) -> None:
    work = resumed["work"]
    metas = [json.loads(p.read_text()) for p in (work / "gen").rglob("*.meta.json")]
    assert sorted((m["task"], m["variant"]) for m in metas) == sorted(
        [
            ("arith", "greedy-s42"),
            ("arith_harness", "greedy-s42"),
            ("math_qwen", "greedy-s42"),
            ("pyfunc", "greedy-s42"),
            ("pyfunc", "hot-s42"),
            ("he", "greedy-s42"),
        ]
    )
    assert {m["engine_loads"] for m in metas} == {1}
    assert all(m["load_seconds"] > 0 and m["backend"] == "vllm" for m in metas)
    log = (work / "resumed.log").read_text()
    assert (
        log.count("loading vLLM engine") == 1
        and "done: 6 generation files, 1 engine load(s)" in log
    )
    hot = [json.loads(x) for x in (work / "gen" / "pyfunc" / "hot-s42.jsonl").open()]
    assert len(hot) == 3 * 2 and _meta(work, "pyfunc", "hot-s42")["sampling"]["n"] == 2
    assert _meta(work, "arith")["tokens_per_s"] > 0


def test_rerun_after_deleting_outputs_loads_no_engine(resumed: dict[str, Any]) -> None:
    from ckpteval.config import build_tasks, validate_config
    from ckpteval.engine.generate import Job, run_infer

    work = resumed["work"]
    model = json.loads((work / "resumed.json").read_text())
    targets = [
        work / "gen" / "arith" / "greedy-s42.jsonl",
        work / "gen" / "arith_harness" / "greedy-s42.jsonl",
        work / "gen" / "pyfunc" / "hot-s42.jsonl",
    ]
    before = {p: p.read_bytes() for p in targets}
    for p in targets:
        p.unlink()
    config = _config(TASKS, resumed["include"])
    validate_config(config)
    tasks, variants, task_variants = build_tasks(config)
    jobs = [
        Job(tasks[t], variants[v], work / "gen" / t / f"{v}.jsonl")
        for t, vs in task_variants.items()
        for v in vs
    ]
    summary = run_infer(
        jobs,
        manifest_path=Path(model["manifest"]),
        model_dir=Path(model["model"]),
        run_cfg={"backend": "vllm"},
        engine_cfg=config["engine"],
        cache_dir=work / "cache",
        include_paths=[str(resumed["include"])],
    )
    assert summary["engine_loads"] == 0
    assert all(p.read_bytes() == data for p, data in before.items())
    assert _meta(work, "arith_harness")["n_generated_prompts"] == 0


def test_code_harness_task_is_generated_on_the_engine_and_scored_in_the_sandbox(
    resumed: dict[str, Any], tmp_path: Path
) -> None:
    gen = resumed["work"] / "gen" / "he" / "greedy-s42.jsonl"
    lines = [json.loads(x) for x in gen.open()]
    assert [x["task_id"] for x in lines] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert all(x["prompt"] == x["problem"]["prompt"] and x["problem"]["test"] for x in lines)
    cell = score_harness_file(
        gen,
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        provenance={"task": "he"},
        checker_options={"sandbox": "bwrap"},
    )
    assert cell["checker"] == "python" and cell["n_samples"] == 3
    assert cell["self_test"]["references_passed"] == 3


@pytest.mark.numeric
def test_harness_path_equals_lm_eval_cli(
    resumed: dict[str, Any], model: dict[str, Path], reference: tuple[Any, Any], tmp_path: Path
) -> None:
    """`lm_eval --model vllm` on the same model and task gives the same samples and metrics
    (a sample whose completion differs at a near-tie is compared on nothing else)."""
    args = ",".join(
        [
            "pretrained=" + str(model["model"]),
            "dtype=bfloat16",
            "max_model_len=4096",
            "gpu_memory_utilization=0.15",
            "enforce_eager=True",
            "seed=42",
        ]
    )
    # lm-eval's wrapper passes no KV-cache size: on CPU vLLM would write 15% of the machine's
    # memory before the first token. 1 GiB, as ckpteval's own engines ask for at least
    # (ckpteval.engine.kvcache); the size changes no generation.
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lm_eval",
            "--model",
            "vllm",
            "--model_args",
            args,
            "--tasks",
            "ckpteval_arith",
            "--include_path",
            str(HARNESS_TASK_DIR),
            "--limit",
            "10",
            "--batch_size",
            "auto",
            "--seed",
            "42",
            "--log_samples",
            "--output_path",
            str(tmp_path),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    samples_file = next(tmp_path.rglob("samples_ckpteval_arith_*.jsonl"))
    theirs = {}
    for line in samples_file.open():
        s = json.loads(line)
        entry = theirs.setdefault(
            s["doc_id"], {"completion": s["resps"][0][0], "metrics": {}, "filtered": {}}
        )
        entry["filtered"][s["filter"]] = s["filtered_resps"][0]
        entry["metrics"].update({f"{m},{s['filter']}": float(s[m]) for m in s["metrics"]})
    ours = [
        json.loads(x)
        for x in (resumed["work"] / "gen" / "arith_harness" / "greedy-s42.jsonl").open()
    ]
    assert len(ours) == len(theirs) == 10
    equal = 0
    for line in ours:
        doc = theirs[int(line["task_id"].rsplit("/", 1)[1])]
        if assert_same_or_near_tie(
            *reference, line["prompt"], line["completion"], doc["completion"]
        ):
            equal += 1
            assert line["filtered"] == doc["filtered"] and line["metrics"] == doc["metrics"]
    results = json.loads(next(tmp_path.rglob("results_*.json")).read_text())["results"][
        "ckpteval_arith"
    ]
    ref = _meta(resumed["work"], "arith_harness")["lm_eval_results"]
    if equal == len(ours):
        for key in ("exact_match,strict-match", "exact_match,flexible-extract"):
            assert ref[key] == results[key]
    assert equal >= len(ours) // 2, "most completions must match exactly: near-ties are rare"
    assert sum(line["completion"] != "" for line in ours) >= 5  # real generations, not blanks


@pytest.mark.numeric
def test_an_assist_job_generates_a_published_chunk_as_the_job_would(
    resumed: dict[str, Any], model: dict[str, Path], reference: tuple[Any, Any], tmp_path: Path
) -> None:
    """A board published here (the job) from the fixture's requests; `run_assist` in a child
    process loads its own vLLM engine, takes every chunk and writes the same completions."""
    from ckpteval.backends import SamplingSpec
    from ckpteval.backends.vllm import VllmBackend
    from ckpteval.config import validate_config
    from ckpteval.engine.assist import Board, boards_root
    from ckpteval.engine.cache import cache_key, read_cache

    work = resumed["work"]
    config = _config(TASKS, resumed["include"], chunk_size=4)
    validate_config(config)
    identity = VllmBackend(model["model"], config["engine"]).identity
    namespace = cache_namespace(read_json(model["manifest"]))
    items = []
    for task, variant in (("arith", "greedy-s42"), ("pyfunc", "greedy-s42")):
        sampling = _meta(work, task, variant)["sampling"]
        spec = SamplingSpec(**{**sampling, "stop": tuple(sampling["stop"])})
        for line in (work / "gen" / task / f"{variant}.jsonl").open():
            row = json.loads(line)
            items.append(
                {
                    "cache_file": str(tmp_path / "cache" / namespace / f"{task}.jsonl"),
                    "key": cache_key(row["prompt"], spec, identity),
                    "task_id": row["task_id"],
                    "prompt": row["prompt"],
                    "spec": spec.as_dict(),
                    "completion": row["completion"],
                }
            )
    fixture_cache = {
        key: row
        for task in ("arith", "pyfunc")
        for key, row in read_cache(work / "cache" / namespace / f"{task}.jsonl").items()
    }
    assert all(item["key"] in fixture_cache for item in items)  # the job's very keys
    chunks = [items[i : i + 5] for i in range(0, len(items), 5)]
    board = Board.publish(
        boards_root(tmp_path / "cache"),
        "r/step_1",
        {
            "run_cfg": {"backend": "vllm"},
            "model_dir": str(model["model"]),
            "engine_cfg": config["engine"],
            "identity": identity,
            "chunk_cost": [1] * len(chunks),
        },
        chunks,
    )
    try:
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                "import json, logging, sys; from pathlib import Path; "
                "from ckpteval.engine.generate import run_assist; logging.basicConfig(level=logging.INFO); "
                "print('SUMMARY', json.dumps(run_assist(Path(sys.argv[1]), 'a1', grace_seconds=3)))",
                str(tmp_path / "cache"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        summary = json.loads(proc.stdout.split("SUMMARY", 1)[1])
        assert summary["chunks"] == len(chunks) and summary["requests"] == len(items) == 23
        assert all(board.done(i)["by"] == "a1" for i in range(len(chunks)))
    finally:
        board.leave()
    helped = {
        key: row
        for task in ("arith", "pyfunc")
        for key, row in read_cache(tmp_path / "cache" / namespace / f"{task}.jsonl").items()
    }
    assert set(helped) == {item["key"] for item in items}
    # Greedy on the same model and engine settings: the same completion, up to a near-tie broken
    # the other way in a differently composed batch.
    equal = sum(
        assert_same_or_near_tie(
            *reference,
            item["prompt"],
            helped[item["key"]]["outputs"][0]["text"],
            item["completion"],
        )
        for item in items
    )
    assert equal >= len(items) // 2, "most completions must match exactly: near-ties are rare"
