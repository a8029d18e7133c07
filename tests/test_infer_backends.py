"""The backends that need no engine: `replay` (existing solutions) and `openai` (an endpoint),
the latter against a small OpenAI-compatible server on 127.0.0.1 started by the test."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run_snakemake, write_config
from fakes import JsonHandler, LoopbackServer, down_url

from ckpteval.backends import model_card
from ckpteval.backends.replay import replay_solutions
from ckpteval.config import build_plan, build_tasks, validate_config
from ckpteval.engine.generate import Job, run_infer
from ckpteval.errors import UserError
from ckpteval.io import write_json
from ckpteval.tasks import resolve_task

# ------------------------------------------------------------------------------- fake endpoint


class FakeEndpoint(LoopbackServer):
    """Answers /v1/completions and /v1/chat/completions deterministically; can fail on purpose."""

    def __init__(self) -> None:
        super().__init__(_Handler)
        self.bodies: list[dict[str, Any]] = []
        self.unavailable = 0  # answer this many requests with 503 first
        self.reject_marker: str | None = None  # 400 for prompts containing it

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


def completion_for(prompt: str, seed: int, index: int) -> str:
    """The fake model: a stable answer per (prompt, seed, sample index)."""
    return f" #### {(len(prompt) + 7 * seed + index) % 50}"


class _Handler(JsonHandler):
    server: FakeEndpoint

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.read_json()
        with self.server.lock:
            self.server.bodies.append(body)
            if self.server.unavailable > 0:
                self.server.unavailable -= 1
                return self.send_json(503, {"error": {"message": "warming up"}})
        chat = self.path.endswith("/chat/completions")
        prompts = (
            [body["messages"][-1]["content"]]
            if chat
            else body["prompt"]
            if isinstance(body["prompt"], list)
            else [body["prompt"]]
        )
        if self.server.reject_marker and any(self.server.reject_marker in p for p in prompts):
            return self.send_json(400, {"error": {"message": "prompt is too long for this model"}})
        n = int(body.get("n", 1))
        choices = []
        for p_idx, prompt in enumerate(prompts):
            for i in range(n):
                text = completion_for(prompt, int(body.get("seed") or 0), i)
                choice = {"index": p_idx * n + i, "finish_reason": "stop", "logprobs": None}
                choice.update(
                    {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
                )
                choices.append(choice)
        self.send_json(
            200,
            {
                "id": "x",
                "object": "text_completion",
                "model": body["model"],
                "choices": choices,
                "usage": {
                    "prompt_tokens": sum(len(p.split()) for p in prompts),
                    "completion_tokens": 3 * len(choices),
                },
            },
        )


@pytest.fixture
def endpoint() -> Iterator[FakeEndpoint]:
    with FakeEndpoint() as server:
        yield server


def _setup(
    tmp_path: Path,
    run: dict[str, Any],
    tasks: dict[str, Any],
    sampling: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[Job], Path]:
    config = {
        "runs": {"r": run},
        "tasks": tasks,
        "sampling": sampling or {"greedy": {"max_new_tokens": 32}},
        "outdir": str(tmp_path),
    }
    validate_config(config)
    tasks_, variants, task_variants = build_tasks(config)
    jobs = [
        Job(tasks_[t], variants[v], tmp_path / "gen" / t / f"{v}.jsonl")
        for t, vs in task_variants.items()
        for v in vs
    ]
    card = tmp_path / "models" / "r" / "step_0.json"
    settings = run.get("endpoint") or {"step": 0}
    write_json(card, model_card("r", config["runs"]["r"]["backend"], settings))
    return config, jobs, card


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------------------------- openai


def test_openai_backend_generates_retries_and_resumes_from_the_cache(
    endpoint: FakeEndpoint, tmp_path: Path
) -> None:
    run = {
        "backend": "openai",
        "endpoint": {
            "base_url": endpoint.base_url,
            "model": "tiny",
            "concurrency": 3,
            "retries": 3,
        },
    }
    config, jobs, card = _setup(
        tmp_path,
        run,
        {"arith": {"limit": 6}, "pyfunc": {"limit": 2}},
        sampling={"greedy": {"max_new_tokens": 32}, "hot": {"temperature": 0.7, "n": 3}},
    )
    endpoint.unavailable = 2  # the server is still starting: two 503s, then answers
    summary = run_infer(
        jobs,
        manifest_path=card,
        model_dir=None,
        run_cfg=config["runs"]["r"],
        engine_cfg={**config["engine"], "chunk_size": 4},
        cache_dir=tmp_path / "cache",
    )
    assert summary["engine_loads"] == 0
    hot = _lines(tmp_path / "gen" / "arith" / "hot-s42.jsonl")
    assert len(hot) == 6 * 3 and {line["sample_idx"] for line in hot} == {0, 1, 2}
    for line in hot:
        assert line["completion"] == completion_for(line["prompt"], 42, line["sample_idx"])
    sent = [b for b in endpoint.bodies if "prompt" in b]
    assert len(sent) == 2 * (6 + 2) + 2  # one request per prompt and variant, plus the 2 refused
    hot_body = next(b for b in sent if b.get("temperature") == 0.7)
    assert hot_body["n"] == 3 and hot_body["seed"] == 42 and hot_body["model"] == "tiny"
    assert "\n\n" in hot_body["stop"] and hot_body["max_tokens"] == 64  # arith caps at 64
    meta = json.loads((tmp_path / "gen" / "pyfunc" / "greedy-s42.meta.json").read_text())
    assert meta["backend"] == "openai" and meta["n_generated_prompts"] == 2
    assert meta["model_identity"] == json.loads(card.read_text())["identity_sha256"]
    assert set(meta["device"]) >= {"host", "cuda_visible_devices", "slurm_job_id"}
    assert meta["started_at"] <= meta["finished_at"] and meta["completion_tokens"] == 2 * 3

    # Everything is cached now: a rerun sends nothing and writes identical files.
    before = (tmp_path / "gen" / "arith" / "hot-s42.jsonl").read_bytes()
    endpoint.bodies.clear()
    run_infer(
        jobs,
        manifest_path=card,
        model_dir=None,
        run_cfg=config["runs"]["r"],
        engine_cfg=config["engine"],
        cache_dir=tmp_path / "cache",
    )
    assert endpoint.bodies == []
    assert (tmp_path / "gen" / "arith" / "hot-s42.jsonl").read_bytes() == before
    meta = json.loads((tmp_path / "gen" / "arith" / "hot-s42.meta.json").read_text())
    assert (meta["n_cached_prompts"], meta["n_generated_prompts"]) == (6, 0)


def test_openai_chat_template_tasks_use_chat_completions(
    endpoint: FakeEndpoint, tmp_path: Path
) -> None:
    run = {"backend": "openai", "endpoint": {"base_url": endpoint.base_url, "model": "tiny"}}
    config, jobs, card = _setup(
        tmp_path, run, {"arith": {"limit": 2, "chat_template": True, "system_prompt": "Be brief."}}
    )
    run_infer(
        jobs,
        manifest_path=card,
        model_dir=None,
        run_cfg=config["runs"]["r"],
        engine_cfg=config["engine"],
        cache_dir=tmp_path / "cache",
    )
    sent = [body["messages"] for body in endpoint.bodies]
    assert len(sent) == 2 and all(m[0] == {"role": "system", "content": "Be brief."} for m in sent)
    assert all(m[1]["role"] == "user" and m[1]["content"].startswith("Question: ") for m in sent)
    lines = _lines(tmp_path / "gen" / "arith" / "greedy-s42.jsonl")
    assert sorted(map(json.dumps, sent)) == sorted(json.dumps(x["prompt"]) for x in lines)


def test_endpoint_failures_are_one_line_naming_the_url(
    endpoint: FakeEndpoint, tmp_path: Path
) -> None:
    dead = f"{down_url()}/v1"
    run = {"backend": "openai", "endpoint": {"base_url": dead, "model": "tiny", "retries": 1}}
    config, jobs, card = _setup(tmp_path, run, {"arith": {"limit": 1}})
    with pytest.raises(UserError) as err:
        run_infer(
            jobs,
            manifest_path=card,
            model_dir=None,
            run_cfg=config["runs"]["r"],
            engine_cfg=config["engine"],
            cache_dir=tmp_path / "cache",
            where="config: runs.r",
        )
    message = str(err.value)
    assert f"{dead}/completions" in message and "Connection refused" in message
    assert "2 attempt(s)" in message and "runs.r.endpoint.base_url" in message
    assert "\n" not in message

    run["endpoint"]["base_url"] = endpoint.base_url
    config, jobs, card = _setup(tmp_path, run, {"arith": {"limit": 1}})
    endpoint.reject_marker = "Question"
    with pytest.raises(UserError) as err:
        run_infer(
            jobs,
            manifest_path=card,
            model_dir=None,
            run_cfg=config["runs"]["r"],
            engine_cfg=config["engine"],
            cache_dir=tmp_path / "cache",
            where="config: runs.r",
        )
    message = str(err.value)
    assert "rejected a request: HTTP 400 prompt is too long for this model" in message
    assert "\n" not in message and len(endpoint.bodies) == 1  # a 400 is not retried


def test_openai_harness_task_runs_through_lm_eval_local_completions(
    endpoint: FakeEndpoint, tmp_path: Path
) -> None:
    run = {"backend": "openai", "endpoint": {"base_url": endpoint.base_url, "model": "tiny"}}
    config, jobs, card = _setup(tmp_path, run, {"arith_harness": {"limit": 4}})
    run_infer(
        jobs,
        manifest_path=card,
        model_dir=None,
        run_cfg=config["runs"]["r"],
        engine_cfg=config["engine"],
        cache_dir=tmp_path / "cache",
    )
    lines = _lines(tmp_path / "gen" / "arith_harness" / "greedy-s42.jsonl")
    assert len(lines) == 4
    assert {body["seed"] for body in endpoint.bodies} == {42}  # engine.seed, as for vllm runs
    for line in lines:
        assert line["completion"] == completion_for(line["prompt"], 42, 0)
        assert set(line["metrics"]) == {"exact_match,strict-match", "exact_match,flexible-extract"}
    assert len(endpoint.bodies) == 4
    meta = json.loads((tmp_path / "gen" / "arith_harness" / "greedy-s42.meta.json").read_text())
    assert (
        meta["n_generated_prompts"] == 4 and "exact_match,strict-match" in meta["lm_eval_results"]
    )


# ------------------------------------------------------------------------------------- replay


def _write(path: Path, rows: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_replay_validates_and_writes_the_generation_contract(tmp_path: Path) -> None:
    _, jobs, _ = _setup(
        tmp_path, {"backend": "replay", "solutions": str(tmp_path / "sol")}, {"arith": {"limit": 3}}
    )
    task = jobs[0].task
    source = _write(
        tmp_path / "sol" / "arith.jsonl",
        [
            {"task_id": "arith/2", "completion": " #### 48"},
            {"task_id": "arith/0", "completion": " #### 13"},
            {"task_id": "arith/0", "completion": " #### 12"},
            {"task_id": "arith/15", "completion": " #### 1"},  # beyond limit 3: dropped
            "",
            {"task_id": "arith/2", "sample_idx": 5, "completion": "x", "finish_reason": "length"},
        ],
    )
    out = tmp_path / "gen" / "arith" / "greedy-s42.jsonl"
    stats = replay_solutions(source, task, "greedy-s42", out, where="config: runs.r")
    lines = _lines(out)
    assert [(x["task_id"], x["sample_idx"], x["completion"]) for x in lines] == [
        ("arith/0", 0, " #### 13"),
        ("arith/0", 1, " #### 12"),
        ("arith/2", 0, " #### 48"),
        ("arith/2", 5, "x"),
    ]
    assert lines[0]["prompt"].startswith("Question: ") and lines[3]["finish_reason"] == "length"
    assert stats["missing_problems"] == ["arith/1"] and stats["dropped_beyond_limit"] == 1
    meta = json.loads(out.with_suffix(".meta.json").read_text())
    assert meta["engine_loads"] == 0 and meta["solutions_file"] == str(source)
    assert {"host", "cuda_visible_devices", "slurm_job_id"} <= set(meta["device"])


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (
            [{"task_id": "arith/0", "completion": "a"}, {"task_id": "gsm8k/7", "completion": "b"}],
            "1 line(s) name task_ids that task arith does not have (first: 'gsm8k/7' (line 2))",
        ),
        (
            [{"task_id": "arith/0", "completion": 3}],
            "arith.jsonl:1: completion missing or not a string",
        ),
        (["{not json"], "arith.jsonl:1: not valid JSON"),
        (
            [
                {"task_id": "arith/0", "sample_idx": 0, "completion": "a"},
                {"task_id": "arith/0", "sample_idx": 0, "completion": "b"},
            ],
            "arith.jsonl:2: a second sample 0 of task arith/0",
        ),
    ],
)
def test_replay_mistakes_are_one_line(tmp_path: Path, rows: list[Any], expected: str) -> None:
    _, jobs, _ = _setup(
        tmp_path, {"backend": "replay", "solutions": str(tmp_path / "sol")}, {"arith": {}}
    )
    source = _write(tmp_path / "sol" / "arith.jsonl", rows)
    with pytest.raises(UserError) as err:
        replay_solutions(source, jobs[0].task, "greedy-s42", tmp_path / "o.jsonl", where="x")
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "o.jsonl").exists()


def test_sampling_list_is_named_from_its_values() -> None:
    config = {
        "runs": {"r": {"path": "."}},
        "tasks": {"arith": {"sampling": ["t0p1n1m64"]}, "pyfunc": {}},
        "sampling": [{"temperature": 0.6, "top_p": 0.95, "n": 8}, {"max_new_tokens": 64}],
        "seeds": [1, 2],
    }
    validate_config(config)
    _, variants, task_variants = build_tasks(config)
    # The greedy config runs once, labelled with engine.seed; the sampled one once per seed.
    assert task_variants == {
        "arith": ("t0p1n1m64-s42",),
        "pyfunc": ("t0.6p0.95n8-s1", "t0.6p0.95n8-s2", "t0p1n1m64-s42"),
    }
    assert variants["t0.6p0.95n8-s2"].sampling.n == 8 and variants["t0.6p0.95n8-s2"].seed == 2
    config["sampling"].append({"temperature": 0.6, "top_p": 0.95, "n": 8, "max_new_tokens": 512})
    validate_config(config)
    with pytest.raises(UserError, match=r"sampling: two entries are both t0\.6p0\.95n8"):
        build_tasks(config)


def test_weightless_runs_in_the_plan(tmp_path: Path) -> None:
    for step in (10, 20):
        _write(tmp_path / "sol" / f"step_{step}" / "arith-greedy-s42.jsonl", [])
    _write(tmp_path / "sol" / "step_30" / "other.jsonl", [])  # no arith file: not a checkpoint
    config = {
        "runs": {
            "rep": {
                "backend": "replay",
                "solutions": str(tmp_path / "sol/step_{step}/{task}-{variant}.jsonl"),
            },
            "ep": {
                "backend": "openai",
                "step": 7,
                "endpoint": {"base_url": "http://127.0.0.1:1/v1", "model": "m"},
            },
        },
        "tasks": {"arith": {}},
        "seeds": [1],
    }
    validate_config(config)
    plan = build_plan(config)
    assert [(c.name, c.step) for c in plan.runs["rep"].checkpoints] == [
        ("step_10", 10),
        ("step_20", 20),
    ]
    assert [c.name for c in plan.runs["ep"].checkpoints] == ["step_7"]
    assert plan.runs["rep"].solutions_file("arith", "greedy-s42", 20) == (
        tmp_path / "sol" / "step_20" / "arith-greedy-s42.jsonl"
    )
    assert not plan.runs["ep"].has_weights and plan.runs_with_backend("replay") == ["rep"]

    bad = {**config, "seeds": [1, 2], "sampling": {"hot": {"temperature": 0.7}}}
    validate_config(bad)
    with pytest.raises(UserError, match=r"runs\.rep\.solutions: .*"):
        build_plan(
            {
                **bad,
                "runs": {
                    "rep": {
                        **config["runs"]["rep"],
                        "solutions": str(tmp_path / "sol/step_{step}/{task}.jsonl"),
                    }
                },
            }
        )
    for run, expected in [
        ({"backend": "openai"}, r"runs\.x\.endpoint: backend openai needs endpoint"),
        ({"backend": "replay"}, r"runs\.x\.solutions: backend replay needs solutions"),
        (
            {"backend": "replay", "solutions": str(tmp_path / "none/{task}.jsonl")},
            r"runs\.x\.solutions: no file .*none/arith\.jsonl",
        ),
        (
            {"backend": "replay", "solutions": str(tmp_path / "sol/{model}.jsonl")},
            r"must contain \{task\}",
        ),
        ({}, r"runs\.x\.path: required for backend vllm"),
    ]:
        cfg = {"runs": {"x": run}, "tasks": {"arith": {}}}
        validate_config(cfg)
        with pytest.raises(UserError, match=expected):
            build_plan(cfg)


def test_workflow_with_weightless_runs_has_no_consolidate_and_reruns_nothing(
    endpoint: FakeEndpoint, tmp_path: Path
) -> None:
    """A replay run and an openai run through Snakemake: model cards instead of consolidation,
    replay files straight to evaluate, the endpoint job per checkpoint, then a clean `-n`."""
    gold = resolve_task("arith", {}).problems()["arith/1"]["answer"].rsplit("####", 1)[1].strip()
    for step in (5, 10):  # arith/1 right, arith/0 and arith/2 wrong
        _write(
            tmp_path / "sol" / f"step_{step}" / "arith.jsonl",
            [
                {"task_id": f"arith/{i}", "completion": f" #### {gold if i == 1 else 'x'}"}
                for i in range(3)
            ],
        )
    write_config(
        tmp_path,
        {
            "runs": {
                "rep": {
                    "backend": "replay",
                    "solutions": str(tmp_path / "sol/step_{step}/{task}.jsonl"),
                },
                "ep": {
                    "backend": "openai",
                    "step": 3,
                    "endpoint": {"base_url": endpoint.base_url, "model": "tiny"},
                },
            },
            "tasks": {"arith": {"limit": 3}},
            "sampling": {"greedy": {"max_new_tokens": 16}},
            "evaluate": {"workers": 1},
        },
    )
    dry = run_snakemake(tmp_path, "-n")
    assert dry.returncode == 0, dry.stderr[-3000:]
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", dry.stdout, re.M))
    assert counts == {
        "model_card": "3",
        "replay": "2",
        "endpoint": "1",
        "generation": "1",
        "evaluate": "3",
        "aggregate": "1",
        "summary": "1",
        "all": "1",
        "total": "13",
    }
    proc = run_snakemake(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = tmp_path / "results"
    assert not (res / "models" / "rep" / "step_5").exists()
    card = json.loads((res / "models" / "rep" / "step_5.json").read_text())
    assert card["backend"] == "replay" and card["weights_sha256"] is None
    cell = json.loads(
        (res / "scores" / "rep" / "step_10" / "arith" / "greedy-s42.json").read_text()
    )
    assert cell["metrics"]["pass@1"]["value"] == pytest.approx(1 / 3)
    ep = _lines(res / "generations" / "ep" / "step_3" / "arith" / "greedy-s42.jsonl")
    assert [x["completion"] for x in ep] == [completion_for(x["prompt"], 42, 0) for x in ep]
    again = run_snakemake(tmp_path, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr


def test_cache_survives_a_torn_last_line(tmp_path: Path) -> None:
    """A job killed mid-append leaves a torn line: it is skipped, and the next append starts on
    a line of its own."""
    from ckpteval.engine.cache import append_cache, read_cache

    cache = tmp_path / "c.jsonl"
    append_cache(cache, [{"key": "a", "v": 1}])
    with open(cache, "a") as handle:
        handle.write('{"key": "b", "v"')  # SIGKILL here
    append_cache(cache, [{"key": "c", "v": 3}])
    assert {k: r["v"] for k, r in read_cache(cache).items()} == {"a": 1, "c": 3}
    assert set(read_cache(cache, {"c", "zz"})) == {"c"}
