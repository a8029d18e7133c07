"""The rerun contract (ckpteval.contract), key by key: on a finished sweep (tests/contract_sweep.py),
every key of the config schema is changed in turn and the jobs `snakemake -n` plans must be
exactly what the contract table promises for that key: the affected cells' jobs, or nothing.
Every variant is given with `--configfile` and written out with all its defaults filled in, so
each dry run also checks that `--configfile` replaces the demo config and that writing out
defaults (a reformatted config) reruns nothing. A module of its own, apart from
tests/test_contract.py, so that the long modules run on two pytest-xdist workers (each on its own
copy of the sweep).
"""

from __future__ import annotations

import copy
import shutil
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from contract_sweep import (
    CELLS,
    KINDS,
    SUMMARY_JOBS,
    TASKS,
    Sweep,
    chain,
    dry_run,
    shared_sweep,
)

from ckpteval.config import build_plan, validate_config
from ckpteval.contract import (
    CONTRACT,
    GENERATIONS,
    MODEL,
    NONE,
    PLAN,
    PUBLISH,
    SCORES,
    SUMMARY,
    CellScope,
    lookup,
)
from ckpteval.selftest import plan_verdicts


@pytest.fixture(scope="module")
def sweep(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sweep]:
    with shared_sweep(demo_dir, tmp_path_factory, "contract-walk") as finished:
        yield finished


#: Which entry a `*` of a key stands for in the walk.
STAR = {"runs": "demo", "tasks": "pyfunc", "sampling": "greedy"}
STAR_FOR = {
    "runs.*.endpoint": "ep",
    "runs.*.step": "ep",
    "tasks.*.harness": "pyfunc",
    "tasks.*.num_fewshot": "arith_harness",
    "tasks.*.checker": "arith_harness",
    "tasks.*.answer_last_line": "arith",
}


def star_name(key: str) -> str | None:
    head = key.split(".", 1)[0]
    if head not in STAR or "*" not in key:
        return None
    return next((v for k, v in STAR_FOR.items() if key.startswith(k)), STAR[head])


def concrete(key: str) -> str:
    name = star_name(key)
    return key.replace("*", name, 1) if name else key


def promise(row: Any) -> Counter[str]:
    """The jobs the contract table promises for a change of `row.key` in the walk."""
    if row.effect in (NONE, PUBLISH):  # publish: a target of its own, never part of `all`
        return Counter()
    if row.effect == SUMMARY:
        return SUMMARY_JOBS
    name = star_name(row.key)
    head = row.key.split(".", 1)[0]

    def selected(c: tuple[str, ...]) -> bool:
        cell = CellScope(c[0], c[2], c[3], c[4], *KINDS[c[2]])
        picked = name is None or {"runs": c[0], "tasks": c[2], "sampling": c[3]}[head] == name
        return picked and cell.matches(row)

    if row.effect == MODEL:
        runs = {name} if name else {"demo"}
        return chain([c for c in CELLS if c[0] in runs], model=True)
    cells = [c for c in CELLS if selected(c)]
    if row.effect == SCORES:
        return Counter({"evaluate": len(cells)}) + SUMMARY_JOBS if cells else Counter()
    assert row.effect == GENERATIONS
    return chain(cells)


def changed_value(key: str, value: Any, sweep: Sweep) -> Any:
    """A valid value other than `value` for `key`."""
    special: dict[str, Any] = {
        "runs.demo.format": "hf",
        "runs.demo.base_model": str(sweep.work / "base-copy"),
        "runs.demo.backend": "openai",
        "runs.ep.endpoint.base_url": sweep.endpoint.base_url.replace("/v1", "/v2"),
        "runs.ep.endpoint.model": "tiny-2",
        "runs.ep.endpoint.api_key_env": "CKPTEVAL_TEST_KEY",
        "tasks.pyfunc.harness": "ckpteval_arith",
        "tasks.pyfunc.system_prompt": "Be brief.",
        "tasks.arith_harness.checker": "python",
        "tasks.pyfunc.engine_group": "other",
        "tasks.pyfunc.main_metric": "hack_rate",  # the summary reads it: aggregate only
        "runs.demo.chat_template": "chatml",  # no task of the sweep asks for chat: nothing reruns
        # pyfunc from its own file as a user's problem file: a task of its own (no token cap)
        "tasks.pyfunc.problems": str(REPO / "src" / "ckpteval" / "data" / "tasks" / "pyfunc.jsonl"),
        "tasks.pyfunc.language": "python",
        "tasks.pyfunc.prompt": "# Complete the function.\n{prompt}",
        "tasks.pyfunc.max_generated_tests": 1,  # a stdio-only setting: pyfunc's scores stay
        "tasks.arith.answer_last_line": False,
        "engine.dtype": "float32",
        "consolidate.dtype": "float32",
        "consolidate.smoke": "transformers",
        "evaluate.sandbox": "none",
        "evaluate.python_env": sys.prefix,  # the environment this test runs in
        "evaluate.piston_url": "http://127.0.0.1:9/",
        "aggregate.title": "another title",
        "aggregate.truncation_threshold": 0.5,
        "lm_eval.include_paths": [str(sweep.work)],
        "evaluate.ks": [1, 2],
        "reasoning": {"end": "</think>"},
        "tasks.pyfunc.reasoning": {"end": "</think>", "budget": 8},
        "gpus": [],
        "publish.prefix": "eval",
        "publish.trainer_names": True,
        "publish.wandb": {"project": "p", "mode": "offline"},
        "publish.wandb.project": "p",
        "publish.wandb.entity": "team",
        "publish.wandb.run_ids": {"demo": "abc123"},
        "publish.wandb.mode": "offline",
        "publish.tensorboard": {"logdir": "tb"},
        "publish.tensorboard.logdir": "tb",
        "publish.mlflow": {"tracking_uri": "file:mlruns"},
        "publish.mlflow.tracking_uri": "file:mlruns",
        "publish.mlflow.experiment": "e",
    }
    if key in special:
        return special[key]
    if isinstance(value, bool) or value is None and key.endswith(("chat_template",)):
        return not value
    if isinstance(value, int) and not isinstance(value, bool):
        return value + 1
    if isinstance(value, float):
        return round(value / 2, 4) if value else 0.5
    if value is None and key.endswith(("limit", "num_fewshot", "max_new_tokens")):
        return 3
    if value is None and key.startswith("evaluate.piston_limits."):
        return 2000
    raise AssertionError(f"no changed value for {key} = {value!r}: add one to the test")


def set_key(config: dict[str, Any], key: str, value: Any) -> None:
    node = config
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


# Plan keys: a change adds, drops or renames cells; what it plans is spelled out per key.
def plan_case(key: str, sweep: Sweep) -> tuple[dict[str, Any], Counter[str]]:
    config = copy.deepcopy(sweep.full)
    if key == "outdir":
        config["outdir"] = "results-elsewhere"
        return config, chain(CELLS, model=True)
    if key == "shard":
        config["shard"] = "1/2"  # a shard scores its checkpoints (all done), no summary
        return config, Counter()
    if key == "runs":
        config["runs"]["ep2"] = copy.deepcopy(config["runs"]["ep"])
        return config, chain([("ep2", "step_7", t, "greedy", "openai") for t in TASKS], model=True)
    if key == "runs.*.path":
        moved = sweep.work / "run-moved"
        if not moved.exists():  # the same bytes elsewhere, copied without their times
            shutil.copytree(sweep.work / "run", moved, copy_function=shutil.copyfile)
        config["runs"]["demo"]["path"] = str(moved)
        return config, Counter()
    if key in ("runs.*.patterns", "runs.*.final_names"):  # the same checkpoints: nothing runs
        other = {"patterns": ["step_{step}", "ckpt-{step}"], "final_names": ["done", "*_end"]}
        name = key.rsplit(".", 1)[1]
        config["runs"]["demo"][name] = other[name]
        return config, Counter()
    if key == "runs.*.evaluate_base":
        config["runs"]["demo"]["evaluate_base"] = True
        return config, chain([("demo", "base", t, "greedy", "vllm") for t in TASKS], model=True)
    if key == "runs.*.complete_marker":  # no checkpoint has it: demo's cells leave the summary
        config["runs"]["demo"]["complete_marker"] = "DONE"
        return config, SUMMARY_JOBS
    if key == "runs.*.step":
        config["runs"]["ep"]["step"] = 8
        return config, chain([("ep", "step_8", t, "greedy", "openai") for t in TASKS], model=True)
    if key == "tasks":
        config["tasks"]["humaneval"] = {"limit": 1}
        return config, chain([c[:2] + ("humaneval",) + c[3:] for c in CELLS if c[2] == "arith"])
    if key in ("tasks.*.sampling", "tasks.*.optional"):
        # pyfunc keeps its one sampling config; its checker runs no program this machine
        # lacks (Checker.programs), so optional leaves it in: nothing runs
        name = key.rsplit(".", 1)[1]
        config["tasks"]["pyfunc"][name] = {"sampling": ["greedy"], "optional": True}[name]
        return config, Counter()
    if key == "sampling":  # the list form names configs from their values: every cell renamed
        config["sampling"] = [{"temperature": 0.0, "max_new_tokens": 32}]
        return config, chain([c[:3] + ("t0p1n1m32",) + c[4:] for c in CELLS])
    if key == "seeds":  # greedy configs run once, whatever the seeds
        config["seeds"] = [1, 2]
        return config, Counter()
    if key == "engine.seed":  # renames the greedy variants of every cell
        config["engine"]["seed"] = 7
        return config, chain(CELLS)
    raise AssertionError(f"no plan case for {key}: add one to the test")


def case(row: Any, sweep: Sweep) -> tuple[dict[str, Any], Counter[str]]:
    if row.effect == PLAN:
        return plan_case(row.key, sweep)
    config = copy.deepcopy(sweep.full)
    key = concrete(row.key)
    value = lookup(config, key)
    if isinstance(value, dict):  # a whole section or entry: reorder it (a reformatted config)
        set_key(config, key, dict(reversed(list(value.items()))))
        return config, Counter()
    if key == "runs.demo.backend":  # a vllm run turned into an endpoint run is another model
        config["runs"]["demo"] = {
            "backend": "openai",
            "step": 7,
            "endpoint": {"base_url": sweep.endpoint.base_url, "model": "t"},
        }
        return config, chain([("demo", "step_7", t, "greedy", "openai") for t in TASKS], model=True)
    if key == "engine.tensor_parallel_size":  # refused without its safety switch (a none key)
        config["engine"]["allow_tensor_parallel"] = True
    if key.split(".")[-2:-1] == ["reasoning"]:  # a marker or budget needs the section's `end`
        parent, name = key.rsplit(".", 1)
        changed = {"start": "<think>", "end": "</r>", "budget": 64}[name]
        set_key(config, parent, {"end": "</think>", name: changed})
        return config, promise(row)
    if key.startswith("runs.demo.train_logs"):  # a section whose `path` is required
        logs = sweep.work / "trainer-val.jsonl"  # verl's file logger, one validation step
        logs.write_text('{"step": 1, "data": {"val-core/arith/reward/mean@1": 0.5}}\n')
        set_key(config, "runs.demo.train_logs", {"path": str(logs)})
        name = key.removeprefix("runs.demo.train_logs").lstrip(".")
        changed = {
            "val_kwargs": {"n": 2},
            "val_kwargs.n": 2,
            "val_kwargs.temperature": 0.6,
            "val_kwargs.top_p": 0.9,
            "val_kwargs.top_k": 5,
            "val_kwargs.do_sample": True,
            "response_length": 64,
            "metrics": {"pass@1": "val-core/arith/acc/mean@1"},
        }
        if name in changed:
            set_key(config, key, changed[name])
        if row.effect == NONE:  # a section as a whole: the sweep has none to reorder, so it is
            # added with its keys in reverse order and plans what adding its keys plans
            full = {"val_kwargs": {"top_p": 0.9, "n": 2}, "response_length": 64}
            whole = {"path": str(logs), **full} if name == "" else {**full["val_kwargs"]}
            set_key(config, key, dict(reversed(list(whole.items()))))
            return config, SUMMARY_JOBS
        return config, promise(row)
    if key == "runs.demo.base_model" and not (sweep.work / "base-copy").exists():
        # Another base model: a copy would be the same one (identity by content).
        shutil.copytree(sweep.work / "base", sweep.work / "base-copy")
        with open(sweep.work / "base-copy" / "tokenizer_config.json", "a") as handle:
            handle.write("\n")
    set_key(config, key, changed_value(key, value, sweep))
    return config, promise(row)


def self_tests(config: dict[str, Any], sweep: Sweep) -> Counter[str]:
    """The self-test jobs (rule selftest) a changed config plans besides its cells': one per
    code task (pyfunc, or one the change adds) whose self-test has no verdict under `config`:
    a new outdir or task, or a setting its self-test reads (the task's definition, what the
    checker reads of `evaluate`). The finished sweep holds pyfunc's verdict, so any other
    change plans none; the contract table promises the cells."""
    checked = copy.deepcopy(config)
    validate_config(checked)
    plan = build_plan(checked, base_dir=sweep.work)
    verdicts = plan_verdicts(plan)
    missing = sum(not (sweep.work / path).exists() for path in verdicts)  # outdir may be relative
    return Counter({"selftest": missing}) if missing else Counter()


#: Keys of backends the walk's sweep has no run of: tested on a sweep of their own below; and
#: the options of a checker's `checker:` mapping (no task of the sweep has one): the reward
#: function's, on a sweep of their own in tests/test_reward.py.
ELSEWHERE = {
    "runs.*.solutions",
    *(row.key for row in CONTRACT if row.key.startswith("tasks.*.checker.")),
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "row",
    [r for r in CONTRACT if r.key not in ELSEWHERE],
    ids=[r.key for r in CONTRACT if r.key not in ELSEWHERE],
)
def test_changing_a_key_plans_exactly_what_the_contract_promises(sweep: Sweep, row: Any) -> None:
    config, expected = case(row, sweep)
    expected += self_tests(config, sweep)
    jobs, out = dry_run(sweep, config, "walk")
    assert jobs == expected, f"{row.key} ({row.effect}): {row.why}"
    if row.effect in (SCORES, GENERATIONS) and expected:
        # The dry run says in words which setting changed, before Snakemake's own reasons.
        said = [line for line in out.splitlines() if line.startswith("ckpteval: rerun:")]
        assert any(f"{concrete(row.key)}: " in line for line in said), said
