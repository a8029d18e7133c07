"""Chat templates chosen per run (`runs.<name>.chat_template`, ckpteval.chat_templates): parse-time
resolution and warnings, prompts rendered through the real demo tokenizer, identities by content,
the template recorded in generation metas and score cells of a real sweep, plans after moving or
editing a template file, and deltas flagged when they pair different templates."""

from __future__ import annotations

import copy
import html
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from conftest import run_snakemake
from contract_sweep import dry_run
from test_aggregate import verdicts, write_cell

from ckpteval.aggregate.deltas import TEMPLATE_NOTE
from ckpteval.backends.vllm import VllmBackend
from ckpteval.chat_templates import (
    BUILTIN_DIR,
    NO_TEMPLATE,
    ChatTemplate,
    builtin_names,
    missing_template_lines,
    resolve,
    template_use,
    text_sha256,
)
from ckpteval.config import build_plan, build_tasks, validate_config
from ckpteval.contract import generation_identity
from ckpteval.engine.generate import Job, render_prompts
from ckpteval.errors import UserError
from ckpteval.summary import build_summary, summarize

#: A template of our own: visibly not the demo's ChatML.
QA_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
ENGINE = {"dtype": "float32", "max_model_len": 512, "seed": 42, "tensor_parallel_size": 1}


def bare_copy(ckpt: Path, dest: Path) -> Path:
    """A copy of a demo checkpoint without any chat template (a base or RL-zero checkpoint)."""
    shutil.copytree(ckpt, dest)
    (dest / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((dest / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    return dest


@pytest.fixture(scope="module")
def ckpts(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two run directories of one checkpoint each: `chat/step_150` (the demo's, with its ChatML
    template) and `bare/step_150` (the same without a template)."""
    work = tmp_path_factory.mktemp("ckpts")
    first = min((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    shutil.copytree(first, work / "chat" / first.name)
    bare_copy(first, work / "bare" / first.name)
    return {"chat": work / "chat" / first.name, "bare": work / "bare" / first.name}


def plan_for(tmp_path: Path, runs: dict[str, Any], chat: bool = True) -> Any:
    config = {
        "runs": runs,
        "tasks": {"arith": {"chat_template": chat, "limit": 3}, "pyfunc": {"limit": 1}},
        "outdir": str(tmp_path / "results"),
    }
    validate_config(config)
    return build_plan(config, base_dir=tmp_path)


# ---------------------------------------------------------------------------- parse time


def test_known_names_are_shipped_and_valid(tmp_path: Path) -> None:
    assert {"chatml", "qwen3"} <= set(builtin_names())
    for name in builtin_names():
        choice = resolve(name, key="k", base_dir=tmp_path)
        assert choice.source == f"builtin:{name}"
        assert choice.sha256 == text_sha256((BUILTIN_DIR / f"{name}.jinja").read_text())


def test_auto_none_path_and_name_resolve_and_bad_values_are_one_line(tmp_path: Path) -> None:
    key = "config: runs.r.chat_template"
    assert resolve(None, key=key, base_dir=tmp_path) == ChatTemplate("auto")
    assert resolve("none", key=key, base_dir=tmp_path).identity == "none"
    assert resolve("auto", key=key, base_dir=tmp_path).identity is None
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "qa.jinja").write_text(QA_TEMPLATE)
    chosen = resolve("t/qa.jinja", key=key, base_dir=tmp_path)
    assert chosen.source == f"file:{tmp_path / 't' / 'qa.jinja'}"
    assert chosen.identity == f"sha256:{text_sha256(QA_TEMPLATE)[:16]}"
    for value, says in (
        ("vicuna", "'vicuna' is neither a known template (chatml, "),
        ("t/missing.jinja", f"no template file {tmp_path / 't' / 'missing.jinja'}"),
    ):
        with pytest.raises(UserError) as err:
            resolve(value, key=key, base_dir=tmp_path)
        assert str(err.value).startswith(f"{key}: {says}") and "\n" not in str(err.value)
    (tmp_path / "t" / "broken.jinja").write_text("{% for m in messages %}")
    with pytest.raises(UserError, match=r"is not valid Jinja \(line 1"):
        resolve("t/broken.jinja", key=key, base_dir=tmp_path)
    with pytest.raises(UserError, match="applies to vllm runs only"):
        resolve("chatml", key=key, base_dir=tmp_path, backend="openai")


def test_config_errors_name_the_key(tmp_path: Path, ckpts: dict[str, Path]) -> None:
    with pytest.raises(UserError, match=r"^config: runs\.r\.chat_template: 'nope' is neither"):
        plan_for(tmp_path, {"r": {"path": str(ckpts["chat"].parent), "chat_template": "nope"}})
    with pytest.raises(UserError, match=r"^config: runs\.r\.chat_template: no template file "):
        plan_for(tmp_path, {"r": {"path": str(ckpts["chat"].parent), "chat_template": "x.jinja"}})


def test_auto_warns_once_per_run_lacking_a_template_and_only_when_a_task_asks(
    tmp_path: Path, ckpts: dict[str, Path]
) -> None:
    runs = {
        "chat": {"path": str(ckpts["chat"].parent)},
        "bare": {"path": str(ckpts["bare"].parent)},
    }
    assert missing_template_lines(plan_for(tmp_path, runs)) == [
        f"run bare: checkpoint(s) {ckpts['bare'].name} have no chat template but task(s) arith ask for one: "
        "their prompts are plain (recorded as such); set runs.bare.chat_template to a .jinja "
        f"file or a known template ({', '.join(builtin_names())}), or to none"
    ]
    assert missing_template_lines(plan_for(tmp_path, runs, chat=False)) == []
    for value in ("none", "chatml"):
        runs["bare"]["chat_template"] = value
        assert missing_template_lines(plan_for(tmp_path, runs)) == []


def test_ckpteval_check_prints_the_warning(tmp_path: Path, ckpts: dict[str, Path]) -> None:
    config = {
        "runs": {"bare": {"path": str(ckpts["bare"].parent)}},
        "tasks": {"arith": {"chat_template": True}},
        "outdir": str(tmp_path / "results"),
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [sys.executable, "-m", "ckpteval.cli", "check", "--configfile", str(tmp_path / "c.yaml")],
        capture_output=True,
        text=True,
        check=True,
    )
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert f"run bare: checkpoint(s) {ckpts['bare'].name} have no chat" in warnings[0]


def verl_step(run_dir: Path, step: int, template: bool) -> Path:
    """A verl `global_step_N/` laid out as verl's checkpoint manager writes it (rank shards of
    plain tensors: enough to be found complete), whose config and tokenizer, with or without a
    chat template, are in `actor/huggingface/`, not beside the shards."""
    import torch

    actor = run_dir / f"global_step_{step}" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    for rank in range(2):
        torch.save({"w": torch.zeros(2)}, actor / f"model_world_size_2_rank_{rank}.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 2}))
    (actor / "huggingface" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    tokenizer = {"tokenizer_class": "Qwen2Tokenizer"}
    if template:
        tokenizer["chat_template"] = QA_TEMPLATE
    (actor / "huggingface" / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return actor.parent


def test_a_verl_checkpoints_template_is_read_in_actor_huggingface_as_consolidation_copies_it(
    tmp_path: Path,
) -> None:
    """Issue 47: a verl run whose generations said `chat_template source: checkpoint` was
    warned about as having none (the parse looked for tokenizer files in `global_step_N/`)."""
    from ckpteval.consolidate import copy_side_files, has_chat_template
    from ckpteval.formats import get_format

    steps = [verl_step(tmp_path / "grpo", step, template=True) for step in (100, 200)]
    verl_step(tmp_path / "zero", 100, template=False)
    runs = {"grpo": {"path": str(tmp_path / "grpo")}, "zero": {"path": str(tmp_path / "zero")}}
    plan = plan_for(tmp_path, runs)
    assert [c.name for c in plan.runs["grpo"].checkpoints] == ["global_step_100", "global_step_200"]
    (line,) = missing_template_lines(plan)
    assert line.startswith("run zero: checkpoint(s) global_step_100 have no chat template")
    # What the parse read is what consolidation copies, for the format named or detected.
    staging = tmp_path / "staging"
    staging.mkdir()
    ckpt = get_format("verl").open(steps[0], None, "float32")
    copy_side_files(ckpt, None, staging, "float32")
    assert has_chat_template(staging)
    runs["grpo"]["format"] = "verl"
    assert missing_template_lines(plan_for(tmp_path, runs)) == [line]


def test_identity_counts_a_template_by_content_and_only_for_chat_tasks(
    tmp_path: Path, ckpts: dict[str, Path]
) -> None:
    path = str(ckpts["chat"].parent)
    auto = plan_for(tmp_path, {"r": {"path": path, "chat_template": "auto"}})
    unset = plan_for(tmp_path, {"r": {"path": path}})
    (tmp_path / "a.jinja").write_text(QA_TEMPLATE)
    (tmp_path / "moved").mkdir()
    (tmp_path / "moved" / "b.jinja").write_text(QA_TEMPLATE)
    here = plan_for(tmp_path, {"r": {"path": path, "chat_template": "a.jinja"}})
    moved = plan_for(tmp_path, {"r": {"path": path, "chat_template": "moved/b.jinja"}})
    (tmp_path / "a.jinja").write_text(QA_TEMPLATE + " ")
    edited = plan_for(tmp_path, {"r": {"path": path, "chat_template": "a.jinja"}})

    def digest(plan: Any, task: str) -> str:
        return generation_identity(plan, "r", task, "greedy-s42").digest

    assert "runs.r.chat_template" not in generation_identity(auto, "r", "arith", "greedy-s42").text
    assert digest(auto, "arith") == digest(unset, "arith")
    assert digest(here, "arith") == digest(moved, "arith") != digest(auto, "arith")
    assert digest(edited, "arith") != digest(here, "arith")
    assert digest(here, "pyfunc") == digest(edited, "pyfunc") == digest(auto, "pyfunc")


# ---------------------------------------------------------------------------- rendering


def job(chat: bool = True, system: str | None = None) -> Job:
    config = {
        "runs": {"r": {"path": "."}},
        "tasks": {"arith": {"chat_template": chat, "limit": 2, "system_prompt": system}},
    }
    validate_config(config)
    tasks, variants, _ = build_tasks(config)
    return Job(tasks["arith"], variants["greedy-s42"], Path("unused.jsonl"))


def prompts(ckpt: Path, choice: ChatTemplate, task: Job) -> tuple[dict[str, Any], dict[str, Any]]:
    backend = VllmBackend(ckpt, ENGINE)
    use = template_use(choice, bool(task.task.options.get("chat_template")), backend)
    rendered = render_prompts(
        backend, Job(task.task, task.variant, task.out, chat=use), _problems()
    )
    return rendered, use.record


def _problems() -> dict[str, dict[str, Any]]:
    return job().task.problems()


def test_prompts_through_the_real_tokenizer(tmp_path: Path, ckpts: dict[str, Path]) -> None:
    chat = job()
    plain = {tid: chat.task.render(p) for tid, p in _problems().items()}
    own = (ckpts["chat"] / "chat_template.jinja").read_text()
    auto, record = prompts(ckpts["chat"], ChatTemplate("auto"), chat)
    assert record == {"source": "checkpoint", "sha256": text_sha256(own)}
    assert all(p.startswith("<|im_start|>user\n") and p != plain[t] for t, p in auto.items())
    # The shipped chatml renders exactly what the demo's own ChatML template renders.
    chatml, record = prompts(ckpts["chat"], resolve("chatml", key="k", base_dir=tmp_path), chat)
    assert chatml == auto and record["source"] == "builtin:chatml"
    (tmp_path / "qa.jinja").write_text(QA_TEMPLATE)
    qa, record = prompts(ckpts["chat"], resolve("qa.jinja", key="k", base_dir=tmp_path), chat)
    assert qa == {t: f"USER: {p}\nASSISTANT:" for t, p in plain.items()}
    assert record == {"source": f"file:{tmp_path / 'qa.jinja'}", "sha256": text_sha256(QA_TEMPLATE)}
    # A file template renders the same on a checkpoint without a template of its own.
    assert prompts(ckpts["bare"], resolve("qa.jinja", key="k", base_dir=tmp_path), chat)[0] == qa
    # none, a task that does not ask, and auto on a checkpoint without a template: plain.
    none, record = prompts(ckpts["chat"], ChatTemplate("none"), chat)
    assert none == plain and record == {"source": "none", "sha256": None}
    assert (
        prompts(ckpts["chat"], resolve("qa.jinja", key="k", base_dir=tmp_path), job(False))[0]
        == plain
    )
    bare, record = prompts(ckpts["bare"], ChatTemplate("auto"), chat)
    assert bare == plain and record == {"source": NO_TEMPLATE, "sha256": None}


def test_qwen3_template_opens_an_assistant_turn_and_can_close_thinking(
    ckpts: dict[str, Path], tmp_path: Path
) -> None:
    tokenizer = VllmBackend(ckpts["chat"], ENGINE).tokenizer
    text = resolve("qwen3", key="k", base_dir=tmp_path).text
    history = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\nhm\n</think>\n\nA1"},
        {"role": "user", "content": "Q2"},
    ]
    common = (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n"
        "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    render = tokenizer.apply_chat_template
    assert render(history, tokenize=False, add_generation_prompt=True, chat_template=text) == common
    assert (
        render(
            history,
            tokenize=False,
            add_generation_prompt=True,
            chat_template=text,
            enable_thinking=False,
        )
        == common + "<think>\n\n</think>\n\n"
    )


def test_an_endpoint_run_records_its_servers_template_or_sends_plain_prompts(
    tmp_path: Path,
) -> None:
    from test_infer_backends import FakeEndpoint, _setup

    from ckpteval.engine.generate import run_infer

    with FakeEndpoint() as endpoint:
        for value, record, chat in (
            ("auto", {"source": "endpoint", "sha256": None}, True),
            ("none", {"source": "none", "sha256": None}, False),
        ):
            run = {
                "backend": "openai",
                "endpoint": {"base_url": endpoint.base_url, "model": "tiny"},
                "chat_template": value,
            }
            out = tmp_path / value
            config, jobs, card = _setup(out, run, {"arith": {"limit": 2, "chat_template": True}})
            endpoint.bodies.clear()
            run_infer(
                jobs,
                manifest_path=card,
                model_dir=None,
                run_cfg=config["runs"]["r"],
                engine_cfg=config["engine"],
                cache_dir=out / "cache",
            )
            assert _read(out / "gen" / "arith" / "greedy-s42.meta.json")["chat_template"] == record
            assert all(("messages" in body) == chat for body in endpoint.bodies)
            assert len(endpoint.bodies) == 2


# ---------------------------------------------------------------------------- a real sweep


@dataclass
class Sweep:
    work: Path
    config: dict[str, Any]
    ckpt: str


@pytest.fixture(scope="module")
def sweep(ckpts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Run `chat` (auto: the checkpoint's ChatML) and run `tpl` (the checkpoint without a
    template, through a template file), each with a ckpteval task and an lm-eval task asking
    for chat formatting, run once through the whole workflow."""
    work = tmp_path_factory.mktemp("sweep")
    (work / "templates").mkdir()
    (work / "templates" / "qa.jinja").write_text(QA_TEMPLATE)
    config = {
        "runs": {
            "chat": {"path": str(ckpts["chat"].parent)},
            "tpl": {"path": str(ckpts["bare"].parent), "chat_template": "templates/qa.jinja"},
        },
        "tasks": {
            "arith": {"chat_template": True, "limit": 3},
            "arith_harness": {"chat_template": True, "limit": 2},
        },
        "sampling": {"greedy": {"temperature": 0.0, "max_new_tokens": 16}},
        "engine": {"gpu_memory_utilization": 0.15, "enforce_eager": True, "max_model_len": 512},
        "consolidate": {"smoke": "none"},
        "evaluate": {"workers": 1, "timeout": 10},
    }
    (work / "sweep.yaml").write_text(yaml.safe_dump(config))
    proc = run_snakemake(work, "--configfile", str(work / "sweep.yaml"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return Sweep(work, config, ckpts["chat"].name)


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


@pytest.mark.slow
def test_metas_and_score_cells_record_the_template_used(
    sweep: Sweep, ckpts: dict[str, Path]
) -> None:
    own = text_sha256((ckpts["chat"] / "chat_template.jinja").read_text())
    expected = {
        "chat": {"source": "checkpoint", "sha256": own},
        "tpl": {
            "source": f"file:{(sweep.work / 'templates' / 'qa.jinja').resolve()}",
            "sha256": text_sha256(QA_TEMPLATE),
        },
    }
    out = sweep.work / "results"
    for run, record in expected.items():
        for task in ("arith", "arith_harness"):
            cell = f"{run}/{sweep.ckpt}/{task}/greedy-s42"
            assert _read(out / "generations" / f"{cell}.meta.json")["chat_template"] == record
            assert _read(out / "scores" / f"{cell}.json")["chat_template"] == record
            first = json.loads((out / "generations" / f"{cell}.jsonl").read_text().splitlines()[0])
            opening = "<|im_start|>user\n" if run == "chat" else "USER: "
            assert first["prompt"].startswith(opening), first["prompt"]


def _plan(sweep: Sweep, config: dict[str, Any], name: str) -> tuple[Counter[str], str]:
    return dry_run(sweep, config, name)  # type: ignore[arg-type] - it reads only `.work`


@pytest.mark.slow
def test_moving_the_file_plans_nothing_and_editing_it_reruns_that_runs_generations(
    sweep: Sweep,
) -> None:
    assert _plan(sweep, sweep.config, "same")[0] == Counter()
    moved = copy.deepcopy(sweep.config)
    (sweep.work / "elsewhere").mkdir(exist_ok=True)
    shutil.copyfile(sweep.work / "templates" / "qa.jinja", sweep.work / "elsewhere" / "b.jinja")
    moved["runs"]["tpl"]["chat_template"] = str(sweep.work / "elsewhere" / "b.jinja")
    assert _plan(sweep, moved, "moved")[0] == Counter()
    (sweep.work / "elsewhere" / "b.jinja").write_text(QA_TEMPLATE.replace("ASSISTANT:", "BOT:"))
    jobs, out = _plan(sweep, moved, "edited")
    chain = Counter({"infer": 1, "generation": 2, "evaluate": 2, "aggregate": 1, "summary": 1})
    assert jobs == chain
    assert "ckpteval: rerun:" in out and "runs.tpl.chat_template: sha256:" in out
    auto = copy.deepcopy(sweep.config)
    auto["runs"]["tpl"]["chat_template"] = "auto"
    jobs, out = _plan(sweep, auto, "auto")
    assert jobs == chain
    warnings = [line for line in out.splitlines() if "have no chat template" in line]
    assert warnings == [
        f"ckpteval: warning: run tpl: checkpoint(s) {sweep.ckpt} have no chat template but task(s) "
        "arith, arith_harness ask for one: their prompts are plain (recorded as such); set "
        "runs.tpl.chat_template to a .jinja file or a known template "
        f"({', '.join(builtin_names())}), or to none"
    ]


# ---------------------------------------------------------------------------- aggregate


def _with_template(path: Path, sha: str | None, source: str = "checkpoint") -> Path:
    cell = _read(path)
    cell["chat_template"] = {"source": source, "sha256": sha}
    path.write_text(json.dumps(cell))
    return path


def test_deltas_flag_comparisons_across_templates(tmp_path: Path) -> None:
    passes = verdicts([1, 1, 0, 0, 1, 0])
    templates = {"base": "a" * 64, "step_1": "a" * 64, "step_2": "b" * 64, "step_3": None}
    paths = [
        _with_template(
            write_cell(
                tmp_path,
                "r",
                ckpt,
                0 if ckpt == "base" else int(ckpt[-1]),
                "t",
                "greedy-s1",
                metrics={"pass@1": 0.5},
                samples=passes,
                is_baseline=ckpt == "base",
            ),
            sha,
            "checkpoint" if sha else NO_TEMPLATE,
        )
        for ckpt, sha in templates.items()
    ]
    deltas = summarize(paths, bootstrap=50).deltas
    flags = {
        (c, r): bool(f)
        for c, r, f in zip(deltas["ckpt"], deltas["ref_ckpt"], deltas["chat_templates_differ"])
    }
    assert flags == {
        ("step_1", "base"): False,
        ("step_2", "base"): True,
        ("step_2", "step_1"): True,
        ("step_3", "base"): True,  # plain prompts vs a template
        ("step_3", "step_2"): True,
    }
    build_summary(paths, tmp_path / "summary", bootstrap=50)
    note = TEMPLATE_NOTE.format(n=4)
    assert note in (tmp_path / "summary" / "metrics.md").read_text()
    assert html.escape(note) in (tmp_path / "summary" / "report.html").read_text()
    assert pd.read_csv(tmp_path / "summary" / "deltas.csv")["chat_templates_differ"].sum() == 4


def test_cells_without_a_recorded_template_are_not_flagged(tmp_path: Path) -> None:
    paths = [
        write_cell(
            tmp_path,
            "r",
            f"step_{s}",
            s,
            "t",
            "greedy-s1",
            metrics={"pass@1": 0.5},
            samples=verdicts([1, 0, 1]),
        )
        for s in (1, 2)
    ]
    _with_template(paths[1], "c" * 64)
    deltas = summarize(paths, bootstrap=20).deltas
    assert list(deltas["chat_templates_differ"]) == [False]
    build_summary(paths, tmp_path / "summary", bootstrap=20)
    text = (tmp_path / "summary" / "metrics.md").read_text()
    assert not re.search("different chat templates", text)
