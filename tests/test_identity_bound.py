"""Each job is bound to its identity (issue 22, item 4).

A step reads every setting that changes its output from its identity param (ckpteval.jobs) and
the config only for runtime knobs (ckpteval.knobs.runtime, which refuses any other key). The AST
gate below proves the first half for every line of the step code; the knob tests the second;
the evaluate tests show what it buys: a key outside the job's identity cannot change its output,
and a job builds its own task only.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import REPO

from ckpteval.config import build_plan, validate_config
from ckpteval.contract import scoring_identity
from ckpteval.errors import UserError
from ckpteval.io import iter_jsonl, write_json, write_jsonl
from ckpteval.jobs import ModelJob, PublishJob, ScoringJob, SummaryJob
from ckpteval.knobs import NotAKnob, check_knob, runtime

#: The step code: every module a Snakemake job runs its settings through.
STEP_FILES = [
    REPO / "src" / "ckpteval" / "steps.py",
    REPO / "src" / "ckpteval" / "engine" / "job.py",
    REPO / "src" / "ckpteval" / "jobs.py",
    *sorted((REPO / "workflow" / "scripts").glob("*.py")),
]
ACCESSOR = "runtime"

#: Functions allowed to read the config directly: none (every step decodes its record).
EXEMPT: frozenset[str] = frozenset()


class _Gate(ast.NodeVisitor):
    """Collects every read of a job's config outside the accessor, and the accessor's keys."""

    def __init__(self, where: str, exempt: frozenset[str]) -> None:
        self.where, self.exempt = where, exempt
        self.functions: list[str] = []
        self.allowed: set[int] = set()
        self.bad: list[str] = []
        self.keys: list[str] = []

    def _flag(self, node: ast.AST, what: str) -> None:
        if not self.exempt.intersection(self.functions):
            self.bad.append(f"{self.where}:{getattr(node, 'lineno', 0)}: {what}")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Call(self, node: ast.Call) -> None:
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if name == ACCESSOR and node.args and isinstance(node.args[0], ast.Attribute):
            self.allowed.add(id(node.args[0]))
            key = _key_pattern(node.args[1] if len(node.args) > 1 else None)
            if key is not None:
                self.keys.append(key)
            else:
                self._flag(node, "a runtime knob read with a key that is not a literal string")
        if name == "getattr" and any(
            isinstance(a, ast.Constant) and a.value == "config" for a in node.args[1:2]
        ):
            self._flag(node, "getattr(..., 'config')")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "config" and id(node) not in self.allowed:
            self._flag(node, f"{ast.unparse(node)} read outside {ACCESSOR}()")
        if node.attr == "rule":
            self._flag(node, f"{ast.unparse(node)}: a step dispatching on the rule name")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in ("config", "snakemake_config") and isinstance(node.ctx, ast.Load):
            self._flag(node, f"the name {node.id}")


def _key_pattern(node: ast.AST | None) -> str | None:
    """A knob key as written: a literal, or an f-string whose fields stand for a map's entry
    (`f"runs.{run}.endpoint.timeout"` is `runs.*.endpoint.timeout`); None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.Constant) else "*" for v in node.values]
        key = "".join(map(str, parts))
        if all(part == "*" or "*" not in part for part in key.split(".")):
            return key
    return None


def gate(source: str, where: str, exempt: frozenset[str] = EXEMPT) -> tuple[list[str], list[str]]:
    """(config reads that bypass the accessor, knob keys read through it) in `source`."""
    visitor = _Gate(where, exempt)
    visitor.visit(ast.parse(source))
    return visitor.bad, visitor.keys


def test_steps_read_the_config_only_through_the_knob_accessor() -> None:
    bad: list[str] = []
    keys: list[str] = []
    for path in STEP_FILES:
        found, read = gate(path.read_text(), str(path.relative_to(REPO)))
        bad += found
        keys += read
    assert bad == [], "steps must take settings from their identity (ckpteval.jobs)"
    assert keys, "the gate saw no knob read at all: is it looking at the right code?"
    for key in keys:
        check_knob(key)  # every key a step reads is a `none` key of the contract


def test_each_script_hands_its_job_to_the_one_step_function_named_after_it() -> None:
    """One script and one step function per rule kind: `workflow/scripts/<kind>.py` is
    `run_step(<kind>, snakemake)`, and the step does not dispatch on the rule name (the gate)."""
    import ckpteval.steps as steps

    for path in sorted((REPO / "workflow" / "scripts").glob("*.py")):
        calls = [
            node
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "run_step"
        ]
        assert len(calls) == 1, path
        step = calls[0].args[0]
        assert isinstance(step, ast.Name) and step.id == path.stem, path
        assert callable(getattr(steps, path.stem))


def test_the_exemption_list_names_only_functions_that_exist() -> None:
    tree = ast.parse((REPO / "src" / "ckpteval" / "steps.py").read_text())
    names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert names >= EXEMPT


@pytest.mark.parametrize(
    "snippet",
    [
        'def evaluate(smk):\n    return smk.config["evaluate"]["timeout"]\n',
        'def evaluate(smk):\n    cfg = smk.config\n    return runtime(cfg, "evaluate.workers")\n',
        'def aggregate(smk):\n    return snakemake.config.get("aggregate")\n',
        'def publish(smk):\n    return getattr(smk, "config")["publish"]\n',
        'def evaluate(smk):\n    key = "evaluate.workers"\n    return runtime(smk.config, key)\n',
        'print(config["evaluate"])\n',
        'def evaluate(smk):\n    if smk.rule == "evaluate_harness":\n        return 1\n',
    ],
    ids=["subscript", "alias", "script-global", "getattr", "computed-key", "bare-name", "rule"],
)
def test_the_gate_bites(snippet: str) -> None:
    bad, _ = gate(snippet, "snippet.py")
    assert len(bad) == 1 and bad[0].startswith("snippet.py:"), bad


def test_the_gate_lets_knobs_and_exempt_functions_through_and_checks_the_keys() -> None:
    ok = 'def evaluate(smk):\n    return runtime(smk.config, "evaluate.workers")\n'
    assert gate(ok, "x.py") == ([], ["evaluate.workers"])
    exempt = 'def _generate(smk):\n    return smk.config["engine"]\n'
    assert gate(exempt, "x.py", exempt=frozenset({"_generate"})) == ([], [])
    assert gate(exempt, "x.py")[0] != []
    # A key with a run's name in it reads as the contract row it falls under.
    per_run = 'def f(smk):\n    return runtime(smk.config, f"runs.{smk.run}.endpoint.timeout")\n'
    assert gate(per_run, "x.py") == ([], ["runs.*.endpoint.timeout"])
    check_knob("runs.*.endpoint.timeout")
    _, keys = gate('def f(smk):\n    return runtime(smk.config, f"runs.{smk.run}.path")\n', "x")
    with pytest.raises(NotAKnob, match="runs"):
        check_knob(keys[0])
    # A literal key that changes results is caught by the key check the gate test runs.
    _, keys = gate('def f(smk):\n    return runtime(smk.config, "evaluate.timeout")\n', "x.py")
    with pytest.raises(NotAKnob, match="evaluate.timeout"):
        check_knob(keys[0])


# ------------------------------------------------------------------------------- the knob accessor


def _config() -> dict[str, Any]:
    endpoint = {"base_url": "http://127.0.0.1:9/v1", "model": "tiny", "concurrency": 3}
    config: dict[str, Any] = {
        "runs": {"ep": {"backend": "openai", "endpoint": endpoint}},
        "tasks": {"arith": {"limit": 4}},
        "evaluate": {"workers": 3, "timeout": 7},
    }
    validate_config(config)
    return config


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("evaluate.workers", 3),
        ("engine.gpu_memory_utilization", 0.8),
        ("engine.chunk_size", 256),
        ("gpus", None),
        ("consolidate.smoke", "vllm"),
        ("runs.ep.endpoint.concurrency", 3),
        ("runs.ep.settle_seconds", 300),  # a schema default
    ],
)
def test_runtime_serves_knobs(key: str, value: Any) -> None:
    assert runtime(_config(), key) == value


@pytest.mark.parametrize(
    "key",
    [
        "evaluate.timeout",
        "evaluate.ks",
        "engine.dtype",
        "engine.max_model_len",
        "consolidate.dtype",
        "aggregate.title",
        "publish.prefix",
        "runs.ep.endpoint.model",
        "tasks.arith.limit",
        # a section is a knob only if all of it is
        "engine",
        "evaluate",
        "runs.ep.endpoint",
        "evaluate.piston_limits",
        # not a key at all
        "evaluate.nope",
    ],
)
def test_runtime_refuses_every_key_that_changes_results(key: str) -> None:
    with pytest.raises(NotAKnob, match=key.replace(".", r"\.")):
        runtime(_config(), key)


# ---------------------------------------------------------------------------- the typed records


def test_each_record_reads_what_its_step_needs_from_the_identity(tmp_path: Path) -> None:
    from ckpteval.contract import model_identity, publish_identity, summary_identity

    (tmp_path / "run" / "step_1").mkdir(parents=True)
    (tmp_path / "base").mkdir()
    _tiny_safetensors(tmp_path / "run" / "step_1")
    config: dict[str, Any] = {
        "runs": {"r": {"path": str(tmp_path / "run"), "base_model": "base", "format": "hf"}},
        "tasks": {"arith": {}},
        "consolidate": {"dtype": "float16"},
        "aggregate": {"title": "T", "bootstrap": 7, "truncation_threshold": 0.2},
        "publish": {"prefix": "p", "tensorboard": {"logdir": "tb"}},
        "outdir": str(tmp_path / "out"),
    }
    validate_config(config)
    plan = build_plan(config, base_dir=tmp_path)
    model = ModelJob.decode(model_identity(plan, "r", "step_1").text, "r")
    assert (model.fmt, model.dtype) == ("hf", "float16")
    base_id = model.identity.settings["runs.r.base_model"]
    assert base_id.startswith("sha256:"), "the base model counts by content, never by path"
    summary = SummaryJob.decode(summary_identity(config).text)
    assert (summary.title, summary.bootstrap, summary.truncation_threshold) == ("T", 7, 0.2)
    assert PublishJob.decode(publish_identity(config).text).section == {
        "prefix": "p",
        "tensorboard": {"logdir": "tb"},
    }


def _tiny_safetensors(directory: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    (directory / "config.json").write_text("{}")
    save_file({"w": np.zeros(2, dtype=np.float32)}, str(directory / "model.safetensors"))


# ------------------------------------------------------------------------- the evaluate step


class _NoConfig:
    """A job config that fails on any read: the evaluate step must not need one."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the evaluate step read the config ({name})")

    def __getitem__(self, key: str) -> Any:
        raise AssertionError(f"the evaluate step read the config ({key})")


def _plan(tasks: dict[str, Any], evaluate: dict[str, Any]) -> Any:
    endpoint = {"base_url": "http://127.0.0.1:9/v1", "model": "tiny"}
    config: dict[str, Any] = {
        "runs": {"ep": {"backend": "openai", "endpoint": endpoint}},
        "tasks": tasks,
        "evaluate": evaluate,
    }
    validate_config(config)
    return build_plan(config)


def _arith_generations(path: Path, problems: dict[str, dict[str, Any]]) -> None:
    """One right and one wrong answer per problem."""
    rows = []
    for task_id, problem in problems.items():
        gold = problem["answer"].split("####")[-1].strip()
        rows.append({"task_id": task_id, "sample_idx": 0, "completion": f"#### {gold}"})
        rows.append({"task_id": task_id, "sample_idx": 1, "completion": "#### -1"})
    write_jsonl(path, rows)
    write_json(path.with_suffix(".meta.json"), {})


def _evaluate(tmp: Path, identity: str, task: str, config: Any, **inputs: str) -> dict[str, Any]:
    """Run the evaluate step on the cell `ep/step_7/<task>/greedy-s42`; return its metrics."""
    from ckpteval.steps import evaluate

    out = tmp / "scores"
    evaluate(
        SimpleNamespace(
            config=config,
            threads=1,
            params=SimpleNamespace(
                cell={
                    "run": "ep",
                    "ckpt": "step_7",
                    "step": 7,
                    "task": task,
                    "variant": "greedy-s42",
                    "is_baseline": False,
                },
                identity=identity,
            ),
            input=SimpleNamespace(
                generations=str(tmp / "gen" / f"{task}.jsonl"),
                manifest=str(tmp / "manifest.json"),
                **inputs,
            ),
            output=SimpleNamespace(samples=str(out / "s.jsonl"), metrics=str(out / "s.json")),
        )
    )
    return json.loads((out / "s.json").read_text())


def test_a_key_outside_the_identity_cannot_change_the_evaluate_output(tmp_path: Path) -> None:
    """The same identity param with configs whose evaluate.timeout differ (7 and 0.001, which
    would time every sample out if it were read): both cells score with the identity's 7."""
    plan = _plan({"arith": {"limit": 3}}, {"timeout": 7})
    identity = scoring_identity(plan, "ep", "arith", "greedy-s42")
    assert identity.settings["evaluate.timeout"] == 7
    _arith_generations(tmp_path / "gen" / "arith.jsonl", plan.tasks["arith"].problems())
    write_json(tmp_path / "manifest.json", {"weights_sha256": "abc"})
    cells = []
    for timeout in (7, 0.001):
        config = {"evaluate": {"timeout": timeout, "workers": 1}}  # never read
        cells.append(_evaluate(tmp_path, identity.text, "arith", config))
    for cell in cells:
        assert cell["timeouts"]["configured"] == 7.0
        assert cell["metrics"]["pass@1"]["value"] == 0.5
        assert cell["scoring"] == identity.settings
        assert (cell["sampling"], cell["seed"], cell["model_hash"]) == ("greedy", 42, "abc")
    # And the identity's own value is what counts: another identity, another timeout.
    other = scoring_identity(
        _plan({"arith": {"limit": 3}}, {"timeout": 3}), "ep", "arith", "greedy-s42"
    )
    assert _evaluate(tmp_path, other.text, "arith", _NoConfig())["timeouts"]["configured"] == 3.0


def test_an_evaluate_job_builds_its_own_task_only(tmp_path: Path) -> None:
    """Another task's problem file is gone by the time the job runs, and the job gets no config
    at all: it builds its own task from its identity and its problem file input."""
    mine, theirs = tmp_path / "mine.jsonl", tmp_path / "theirs.jsonl"
    source = REPO / "src" / "ckpteval" / "data" / "tasks" / "arith.jsonl"
    shutil.copyfile(source, mine)
    shutil.copyfile(source, theirs)
    tasks = {
        "mine": {"problems": str(mine), "checker": "math", "limit": 2},
        "theirs": {"problems": str(theirs), "checker": "math"},
    }
    plan = _plan(tasks, {"timeout": 5})
    identity = scoring_identity(plan, "ep", "mine", "greedy-s42")
    _arith_generations(tmp_path / "gen" / "mine.jsonl", plan.tasks["mine"].problems())
    write_json(tmp_path / "manifest.json", {"weights_sha256": "abc"})
    theirs.unlink()
    moved = tmp_path / "elsewhere" / "mine.jsonl"  # a moved problem file: same content
    moved.parent.mkdir()
    shutil.move(mine, moved)
    cell = _evaluate(tmp_path, identity.text, "mine", _NoConfig(), problems=str(moved))
    assert cell["n_problems"] == 2 and cell["metrics"]["pass@1"]["value"] == 0.5
    lines = list(iter_jsonl(tmp_path / "scores" / "s.jsonl"))
    assert {line["task_id"] for line in lines} == {"arith/0", "arith/1"}


def test_an_evaluate_job_refuses_a_problem_file_changed_since_the_plan(tmp_path: Path) -> None:
    mine = tmp_path / "mine.jsonl"
    shutil.copyfile(REPO / "src" / "ckpteval" / "data" / "tasks" / "arith.jsonl", mine)
    plan = _plan({"mine": {"problems": str(mine), "checker": "math", "limit": 2}}, {})
    identity = scoring_identity(plan, "ep", "mine", "greedy-s42")
    _arith_generations(tmp_path / "gen" / "mine.jsonl", plan.tasks["mine"].problems())
    write_json(tmp_path / "manifest.json", {"weights_sha256": "abc"})
    rows = list(iter_jsonl(mine))
    write_jsonl(mine, rows[1:])  # the file the job reads is not the one planned
    with pytest.raises(UserError, match="problems changed after the workflow planned"):
        _evaluate(tmp_path, identity.text, "mine", _NoConfig(), problems=str(mine))


def test_a_checker_reads_only_the_evaluate_settings_in_its_identity() -> None:
    """A harness (lm-eval metrics) cell's identity holds no timeout, sandbox or piston setting:
    its record has none, whatever the config says; a stdio cell's has all it reads."""
    plan = _plan(
        {"arith_harness": {"limit": 2}, "stdio_demo": {"max_generated_tests": 2}},
        {
            "timeout": 9,
            "sandbox": "none",
            "piston_url": "http://127.0.0.1:9/",
            "piston_limits": {"run_timeout": 3000},
        },
    )
    harness = ScoringJob.decode(
        scoring_identity(plan, "ep", "arith_harness", "greedy-s42").text, "arith_harness"
    )
    assert (harness.timeout, harness.timeout_factor, harness.checker_options) == (None, None, {})
    stdio = ScoringJob.decode(
        scoring_identity(plan, "ep", "stdio_demo", "greedy-s42").text, "stdio_demo"
    )
    assert stdio.timeout == 9 and stdio.max_generated_tests == 2
    assert stdio.checker_options == {
        "sandbox": "none",
        "endpoint": "http://127.0.0.1:9/",
        "piston_limits": {"run_timeout": 3000},
    }


def test_a_python_env_is_in_python_cells_by_its_packages(tmp_path: Path) -> None:
    """`evaluate.python_env` reaches python cells only, as its path and a hash of what it holds:
    a package installed there after the plan is refused by the job (a stale number otherwise); a
    directory that is no environment is one line when the config is planned."""
    import sys

    site = tmp_path / "env" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    (site / "site-packages").mkdir(parents=True)
    env = str(tmp_path / "env")
    plan = _plan({"pyfunc": {"limit": 2}, "arith_harness": {"limit": 2}}, {"python_env": env})
    held = scoring_identity(plan, "ep", "pyfunc", "greedy-s42").settings["evaluate.python_env"]
    assert held["path"] == env and held["packages"].startswith("sha256:")
    harness = scoring_identity(plan, "ep", "arith_harness", "greedy-s42")
    assert "evaluate.python_env" not in harness.settings
    job = ScoringJob.decode(scoring_identity(plan, "ep", "pyfunc", "greedy-s42").text, "pyfunc")
    assert job.checker_options["python_env"] == env
    assert job.scoring_kwargs()["checker_options"]["python_env"] == env
    info = site / "site-packages" / "netlib-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: netlib\nVersion: 1.0\n")
    with pytest.raises(UserError, match="packages of .* changed after the workflow planned"):
        job.scoring_kwargs()
    with pytest.raises(UserError, match="is not a python3"):
        _plan({"pyfunc": {"limit": 2}}, {"python_env": str(tmp_path)})


def test_the_smoke_tests_context_comes_from_the_model_not_the_engine_config(
    tmp_path: Path,
) -> None:
    """`engine.max_model_len` changes generations, not the model: consolidate's smoke test does
    not read it (a knob-only engine config), and asks for a short context the model allows."""
    from ckpteval.consolidate import SMOKE_MAX_MODEL_LEN, smoke_context

    assert smoke_context(tmp_path) == SMOKE_MAX_MODEL_LEN  # no config.json
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    assert smoke_context(tmp_path) == 64
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 32768}))
    assert smoke_context(tmp_path) == SMOKE_MAX_MODEL_LEN


@pytest.mark.slow
def test_a_sweep_scores_a_problem_file_task_and_a_moved_problem_file_reruns_nothing(
    tmp_path: Path,
) -> None:
    """Real Snakemake, a replay run (no engine) of a task from the user's problem file: the
    evaluate job gets that file as its input and builds its task from its identity. Moving the
    file (the config updated) changes no evaluate job's params: its identity holds the problems
    by content. (The generation's identity still holds the path, `tasks.*.problems`: issue 22
    item 3; so the cell is regenerated and, as a consequence, rescored.)"""
    import yaml
    from conftest import run_snakemake, write_config

    problems = tmp_path / "data" / "mine.jsonl"
    problems.parent.mkdir()
    shutil.copyfile(REPO / "src" / "ckpteval" / "data" / "tasks" / "arith.jsonl", problems)
    solutions = tmp_path / "sol" / "checkpoint_100" / "mine.jsonl"
    solutions.parent.mkdir(parents=True)
    right = [{"task_id": f"arith/{i}", "completion": "#### -1"} for i in range(2)]
    write_jsonl(solutions, [{"task_id": "arith/0", "completion": "#### 13"}, *right])
    config: dict[str, Any] = {
        "runs": {
            "r": {
                "backend": "replay",
                "solutions": str(tmp_path / "sol" / "checkpoint_{step}" / "{task}.jsonl"),
            }
        },
        "tasks": {"mine": {"problems": str(problems), "checker": "math", "limit": 2}},
        "sampling": {"greedy": {"temperature": 0.0}},
        "evaluate": {"workers": 1, "timeout": 5},
    }
    write_config(tmp_path, config)
    proc = run_snakemake(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cell = json.loads((tmp_path / "results/scores/r/step_100/mine/greedy-s42.json").read_text())
    assert cell["n_problems"] == 2 and cell["scoring"]["task.options"]["limit"] == 2
    moved = tmp_path / "elsewhere" / "mine.jsonl"
    moved.parent.mkdir()
    shutil.move(problems, moved)
    config["tasks"]["mine"]["problems"] = str(moved)
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    proc = run_snakemake(tmp_path, "-n")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "scores of mine" not in out, out[-3000:]  # ckpteval's own rerun lines
    by_params = [line for line in out.splitlines() if "provenance triggered jobs:" in line]
    assert not any("evaluate" in line for line in by_params), out[-3000:]


# --------------------------------------------------------------------------- the engine step


def _engine_job_files(tmp: Path, plan: Any, run: str) -> SimpleNamespace:
    """What the engine job of `run`'s checkpoint step_7 reads: its model card and the request
    file a run writes when it starts (every cell of the default engine group requested)."""
    from ckpteval.backends import model_card
    from ckpteval.contract import engine_payload, generation_identity, model_identity
    from ckpteval.plan.layout import CellKey, request_path
    from ckpteval.verbs import StaleCell, request_body, write_request

    out = tmp / "results"
    manifest = out / "models" / run / "step_7.json"
    endpoint = plan.config["runs"][run]["endpoint"]
    write_json(
        manifest,
        {**model_card(run, "openai", endpoint), **model_identity(plan, run, "step_7").record()},
    )
    staging = out / "staging" / run / "step_7" / "main"
    request = request_path(staging, "r1")
    pairs = [(t, v) for t, vs in plan.task_variants.items() for v in vs]
    cells = [
        StaleCell(CellKey(run, "step_7", t, v), generation_identity(plan, run, t, v), "new")
        for t, v in pairs
    ]
    payload = engine_payload(plan, run, list(plan.task_variants))
    write_request(request, request_body(cells, "inv-1", payload))
    done = staging.with_name("main.r1.done")
    return SimpleNamespace(
        out=out, manifest=manifest, staging=staging, request=request, done=done, pairs=pairs
    )


def _run_engine_step(tmp: Path, files: SimpleNamespace, run: str, config: dict[str, Any]) -> None:
    from ckpteval.steps import infer

    infer(
        SimpleNamespace(
            config=config,
            wildcards=SimpleNamespace(run=run, ckpt="step_7"),
            input=SimpleNamespace(manifest=str(files.manifest), keys=lambda: ["manifest"]),
            output=SimpleNamespace(done=str(files.done)),
            params=SimpleNamespace(
                staging=str(files.staging),
                request=str(files.request),
                cache_dir=str(files.out / "cache"),
            ),
            log=[str(tmp / "logs" / "infer.log")],
            resources={},
        )
    )


def test_the_engine_step_generates_what_its_request_says_whatever_the_config_says(
    tmp_path: Path,
) -> None:
    """The engine job builds its tasks, variants, engine settings and served model from its
    request file and its model card (ckpteval.jobs.EngineJob); the config serves knobs only.
    Run against a config whose every result-affecting value is changed, it writes exactly what
    it writes against the config the request was planned from."""
    import copy

    from test_infer_backends import FakeEndpoint

    from ckpteval.config import validate_config

    with FakeEndpoint() as endpoint:
        config: dict[str, Any] = {
            "runs": {
                "ep": {
                    "backend": "openai",
                    "step": 7,
                    "endpoint": {"base_url": endpoint.base_url, "model": "tiny"},
                }
            },
            "tasks": {"arith": {"limit": 3}, "arith_harness": {"limit": 2}},
            "sampling": {"greedy": {"temperature": 0.0, "max_new_tokens": 16}},
        }
        validate_config(config)
        plan = build_plan(config, base_dir=tmp_path)
        other = copy.deepcopy(config)
        other["runs"]["ep"]["endpoint"].update(base_url="http://127.0.0.1:9/v1", model="other")
        other["tasks"] = {"arith": {"limit": 1, "system_prompt": "x"}}
        other["sampling"] = {"greedy": {"temperature": 0.7, "max_new_tokens": 3}}
        other["engine"].update(max_model_len=64, seed=7)
        texts = {}
        for name, cfg in (("planned", config), ("changed", other)):
            files = _engine_job_files(tmp_path / name, plan, "ep")
            _run_engine_step(tmp_path / name, files, "ep", cfg)
            texts[name] = {
                f"{t}/{v}": (files.staging / t / f"{v}.jsonl").read_text() for t, v in files.pairs
            }
    assert texts["planned"] == texts["changed"]
    rows = [json.loads(line) for line in texts["planned"]["arith/greedy-s42"].splitlines()]
    assert len(rows) == 3, "the request's task (limit 3) was generated, not the config's"


def test_an_engine_job_whose_task_changed_after_the_parse_stops_with_one_line(
    tmp_path: Path,
) -> None:
    """A request whose task options no longer hash to the definition in its cells' identities
    (edited, or written by another version) is refused before any request is sent."""
    from ckpteval.jobs import EngineJob

    config: dict[str, Any] = {
        "runs": {
            "ep": {
                "backend": "openai",
                "step": 7,
                "endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "tiny"},
            }
        },
        "tasks": {"arith": {"limit": 3}},
    }
    validate_config(config)
    plan = build_plan(config, base_dir=tmp_path)
    files = _engine_job_files(tmp_path, plan, "ep")
    body = json.loads(files.request.read_text())
    manifest = json.loads(files.manifest.read_text())
    job = EngineJob.decode(body, manifest, "ep", "step_7")
    cell = job.cell("arith", "greedy-s42")
    assert cell.build_task().config_hash() == plan.tasks["arith"].config_hash()
    assert cell.build_variant() == plan.variants["greedy-s42"]
    assert job.served == {
        "backend": "openai",
        "endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "tiny"},
    }
    body["tasks"]["arith"]["options"]["limit"] = 4
    with pytest.raises(UserError, match="task arith: its definition changed"):
        EngineJob.decode(body, manifest, "ep", "step_7").cell("arith", "greedy-s42").build_task()
