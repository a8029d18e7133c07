"""lm-evaluation-harness tasks: load them (offline-aware), run them on a backend through ckpteval's
request cache, and turn their samples into score files.

Running (infer step). `HarnessRunner` loads every harness task of the job before any engine starts,
so a dataset that cannot be found offline or a missing lm-eval extra fails in seconds with one
line. Non-code tasks go through lm-eval's `evaluate`, set up as `simple_evaluate` sets it up, on a
`CachedHarnessLM`: lm-eval builds prompts, few-shot context, filters and metrics exactly as
`lm_eval --model vllm` does, while every request is answered from ckpteval's cache or, in chunks,
by the backend's lm-eval model (the very engine ckpteval's own tasks use; its calls also carry
ckpteval's pending requests, so the engine sees one batch) and appended to the cache at once.
lm-eval's own sqlite cache skips sampled requests and writes only after a whole batch; this one
keys sampled requests by their seed and survives a kill mid-task. The engine loads only if a request is missing.

Code tasks (`humaneval`, `mbpp`, or `checker: python`) only take their requests from lm-eval: the
completions are generated like ckpteval's own tasks (with `n` samples for pass@k) and each line
carries its `problem`, so the evaluate step scores it in the python checker's sandbox, never with
lm-eval's `code_eval` (which loads from the hub and would execute code inside the GPU job).

Scoring (evaluate step). Non-code tasks were scored by lm-eval while they ran: the generation lines
carry its per-sample metrics (`metrics`, keyed `<metric>,<filter>`), which become ckpteval's
per-sample and per-cell files, checked against lm-eval's own aggregate (recorded in the generation
meta) so a conversion bug can never pass silently. The cell's length metrics
(`ckpteval.metrics.LengthTotals`) come from the lines' `completion_tokens` and, when a line
states it, `finish_reason`, as for ckpteval's own tasks.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ckpteval import __version__
from ckpteval.backends import Backend, Prompt, SamplingSpec
from ckpteval.errors import UserError
from ckpteval.io import iter_jsonl, read_json, write_json, write_jsonl
from ckpteval.metrics import LengthTotals, mean_and_stderr
from ckpteval.plan.layout import generation_meta_of
from ckpteval.reasoning import TRUNCATED, Reasoning, split, task_reasoning
from ckpteval.tasks import HARNESS_TASK_DIR, TaskSpec

log = logging.getLogger(__name__)

SCORER_VERSION = f"ckpteval-{__version__}/harness-1"

#: lm-eval's VLLM token budget of a request that sets no `max_gen_toks` (0.4.13).
HARNESS_MAX_GEN_TOKENS = 256

#: The generation line fields of a reasoning task (ckpteval.reasoning.Split).
REASONING_FIELDS = ("answer", "reasoning_tokens", "truncated_reasoning")

#: Fields of a code task's document that the python checker reads (HumanEval and MBPP shapes).
PYTHON_PROBLEM_KEYS = (
    "prompt",
    "test",
    "entry_point",
    "canonical_solution",
    "code",
    "test_list",
    "test_setup_code",
    "test_imports",
    "challenge_test_list",
)


class HarnessRunner:
    """Loads and runs the harness tasks of one infer job on its backend."""

    def __init__(
        self, backend: Backend, include_paths: Sequence[str] = (), *, chunk_size: int = 256
    ) -> None:
        self.backend = backend
        self.include_paths = [str(HARNESS_TASK_DIR), *[str(p) for p in include_paths]]
        self.chunk_size = chunk_size
        self._local: Any = None
        self._full: Any = None
        self._preloaded: dict[str, dict[str, Any]] = {}

    def manager(self, name: str) -> Any:
        """An lm-eval task index that knows `name`: ckpteval's and the configured YAMLs (fast),
        else every lm-eval task too (indexing all of lm-eval's YAMLs takes 10-20 s: once, and
        only when a task needs it)."""
        from lm_eval.tasks import TaskManager

        if self._local is None:
            self._local = TaskManager(include_path=self.include_paths, include_defaults=False)
        if name in self._local.all_tasks:
            return self._local
        if self._full is None:
            self._full = TaskManager(include_path=self.include_paths)
        return self._full

    def preflight(self, tasks: Iterable[TaskSpec]) -> None:
        """Load every harness task now, so a missing dataset or package fails before the engine."""
        for task in tasks:
            if task.kind == "harness" and task.name not in self._preloaded:
                if task.options.get("chat_template") and self.backend.name == "openai":
                    raise UserError(
                        f"config: tasks.{task.name}.chat_template: lm-eval tasks on an openai run "
                        "send plain completions; drop chat_template or use a vllm run"
                    )
                self._preloaded[task.name] = self.load(task)

    def load(self, task: TaskSpec) -> dict[str, Any]:
        """lm-eval's {tasks, groups} for `task`, or a `UserError` saying what is missing."""
        name = str(task.harness_task)
        manager = self.manager(name)
        if name not in manager.all_tasks:
            raise UserError(
                f"config: tasks.{task.name}.harness: lm-eval has no task {name!r}; "
                "`lm_eval ls tasks` lists them (local YAMLs: lm_eval.include_paths)"
            )
        started = time.monotonic()
        try:
            loaded = manager.load([name])
        except (ImportError, AssertionError) as exc:
            raise UserError(
                f"task {task.name}: lm-eval task {name!r} needs a package that is not installed "
                f"({_first_line(exc)}); install lm-eval's extra for it, e.g. pip install "
                "'lm-eval[ifeval]' or 'lm-eval[math]'"
            ) from None
        except (ConnectionError, OSError, ValueError) as exc:
            raise UserError(
                f"task {task.name}: lm-eval task {name!r} cannot load its dataset "
                f"({_first_line(exc)}); download it once on a machine with network into the "
                "shared Hugging Face cache (HF_HOME), or give a local lm-eval YAML "
                "(lm_eval.include_paths)"
            ) from None
        log.info("lm-eval task %s loaded in %.1f s", name, time.monotonic() - started)
        return dict(loaded)

    def _objects(self, task: TaskSpec) -> dict[str, Any]:
        """The preflight's objects the first time; freshly loaded ones after that (lm-eval runs
        mutate task configs, and every variant must start from the YAML's)."""
        return self._preloaded.pop(task.name, None) or self.load(task)

    # ------------------------------------------------------------------------- non-code tasks

    def run(self, job: Any, cache_file: Path) -> dict[str, Any]:
        """Run a non-code harness task through lm-eval; write its generation file; return stats."""
        s = job.variant.sampling
        if s.n != 1:
            raise UserError(
                f"task {job.task.name}: sampling {s.name} has n={s.n}; lm-eval tasks take one "
                "sample per request (use a task's `repeats` in its lm-eval YAML, or a seed list)"
            )
        opts = job.task.options
        gen_kwargs: dict[str, Any] = {}
        if s.temperature > 0:
            gen_kwargs = {
                "do_sample": True,
                "temperature": s.temperature,
                "top_p": s.top_p,
                "seed": job.variant.seed,
            }
        if opts.get("max_new_tokens"):
            gen_kwargs["max_gen_toks"] = int(opts["max_new_tokens"])
        loaded = self._objects(job.task)
        name = str(job.task.harness_task)
        lm = cached_harness_lm(
            self.backend,
            cache_file,
            chunk_size=self.chunk_size,
            label=f"{job.task.name} {job.variant.name}",
            reasoning=task_reasoning(opts),
            template=job.template.text,
        )
        results = run_lm_eval(
            lm,
            loaded,
            seed=job.variant.seed,
            gen_kwargs=gen_kwargs,
            num_fewshot=opts.get("num_fewshot"),
            limit=opts.get("limit"),
            chat=job.template.chat,
            system_prompt=opts.get("system_prompt"),
        )
        if not results:
            raise RuntimeError("lm-eval returned no results")
        rows = harness_lines(results["samples"], lm.details)
        write_jsonl(job.out, rows)
        leaves = list(loaded["tasks"])
        aggregate = results["results"].get(name) or (
            results["results"][leaves[0]] if len(leaves) == 1 else {}
        )
        return {
            "n_problems": len(rows),
            "n_samples": len(rows),
            "n_cached_prompts": lm.n_cached,
            "n_generated_prompts": lm.n_generated,
            "lm_eval_results": {k: v for k, v in aggregate.items() if k != "alias"},
            "lm_eval_config": {
                t: results.get("configs", {}).get(t, {}) for t in results["samples"]
            },
            "lm_eval_gen_kwargs": gen_kwargs or None,
            "prompt_tokens": None,
            "completion_tokens": lm.total_completion_tokens,
        }

    # ----------------------------------------------------------------------------- code tasks

    def code_requests(
        self, job: Any
    ) -> tuple[dict[str, dict[str, Any]], dict[str, Prompt], SamplingSpec]:
        """(problems, prompts, sampling) of a code task, from lm-eval's requests for it."""
        loaded = self._objects(job.task)
        if len(loaded["tasks"]) != 1:
            raise UserError(
                f"task {job.task.name}: code tasks must be one lm-eval task, not a "
                f"group of {len(loaded['tasks'])}"
            )
        task = next(iter(loaded["tasks"].values()))
        opts = job.task.options
        configure_task(
            task, num_fewshot=opts.get("num_fewshot"), gen_kwargs=None, seed=job.variant.seed
        )
        chat = job.template.chat
        task.build_all_requests(
            limit=opts.get("limit"),
            rank=0,
            world_size=1,
            system_instruction=opts.get("system_prompt"),
            apply_chat_template=chat,
            chat_template=functools.partial(chat_template, self.backend, template=job.template.text)
            if chat
            else None,
            tokenizer_name=_tokenizer_name(self.backend) if chat else "",
        )
        problems: dict[str, dict[str, Any]] = {}
        prompts: dict[str, Prompt] = {}
        kwargs: list[dict[str, Any]] = []
        for inst in task.instances:
            context, gen = inst.args
            doc = inst.doc
            tid = str(doc["task_id"]) if "task_id" in doc else f"{task.task_name}/{inst.doc_id}"
            problems[tid] = {k: doc[k] for k in PYTHON_PROBLEM_KEYS if k in doc}
            prompts[tid] = context
            kwargs.append(gen)
        if not prompts:
            raise UserError(f"task {job.task.name}: lm-eval built no requests")
        gen = kwargs[0]
        if any(k != gen for k in kwargs):
            raise UserError(
                f"task {job.task.name}: requests differ in generation settings; "
                "ckpteval samples a code task with one setting"
            )
        s = job.variant.sampling
        max_tokens = int(opts.get("max_new_tokens") or gen.get("max_gen_toks") or 256)
        until = gen.get("until") or []
        spec = SamplingSpec(
            n=s.n,
            temperature=s.temperature,
            top_p=s.top_p,
            max_tokens=max_tokens,
            seed=job.variant.seed,
            stop=tuple([until] if isinstance(until, str) else until),
        )
        return problems, prompts, spec


def configure_task(
    task: Any, *, num_fewshot: int | None, gen_kwargs: dict[str, Any] | None, seed: int
) -> None:
    """Apply config overrides to a loaded lm-eval task exactly as `lm_eval.simple_evaluate`
    (0.4.13) does: generation settings merged in, `num_fewshot` overriding the YAML's unless
    that is 0, a missing one meaning 0, and the few-shot sampler seeded."""
    if task.get_config("output_type") == "generate_until" and gen_kwargs:
        task.set_config(key="generation_kwargs", value=gen_kwargs, update=True)
    default = task.get_config("num_fewshot")
    if num_fewshot is not None:
        if default == 0:
            log.warning(
                "%s: num_fewshot is 0 in its lm-eval config; %s ignored (as lm-eval does)",
                task.task_name,
                num_fewshot,
            )
        else:
            task.set_config(key="num_fewshot", value=int(num_fewshot))
    elif default is None:
        task.set_config(key="num_fewshot", value=0)
    task.set_fewshot_seed(seed=seed)


def run_lm_eval(
    lm: Any,
    loaded: dict[str, Any],
    *,
    seed: int,
    gen_kwargs: dict[str, Any],
    num_fewshot: int | None,
    limit: int | None,
    chat: bool,
    system_prompt: str | None,
) -> dict[str, Any]:
    """`lm_eval.simple_evaluate(model=lm, ..., random/numpy/torch/fewshot seeds = seed)` on
    already loaded tasks, minus what only decorates its result (environment and git
    information, which costs a `pip list` subprocess per task): the seeds, the task overrides
    (`configure_task`) and `lm_eval.evaluator.evaluate` are the same calls."""
    import random

    import numpy as np
    from lm_eval.evaluator import evaluate
    from lm_eval.utils import set_torch_seed

    random.seed(seed)
    np.random.seed(seed)
    set_torch_seed(seed)
    for task in loaded["tasks"].values():
        configure_task(task, num_fewshot=num_fewshot, gen_kwargs=gen_kwargs, seed=seed)
    results = evaluate(
        lm=lm,
        task_dict=loaded,
        limit=limit,
        bootstrap_iters=0,
        log_samples=True,
        system_instruction=system_prompt,
        apply_chat_template=chat,
    )
    return dict(results) if results is not None else {}


def _tokenizer_name(backend: Backend) -> str:
    tokenizer = getattr(backend, "tokenizer", None)
    return str(getattr(tokenizer, "name_or_path", backend.name)).replace("/", "__")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def harness_lines(
    samples: Mapping[str, list[dict[str, Any]]],
    details: Mapping[tuple[str, int], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Generation lines from lm-eval's logged samples: one per (task, doc), filters merged.

    `details` (`CachedHarnessLM.details`, keyed by the request's task and doc, so identical
    prompts of two docs cannot be confused) gives what lm-eval's samples lack: the raw
    completion, its finish reason and token count, and a reasoning task's split (the sample's
    response is then the answer lm-eval scored; the line's `completion` stays the raw text)."""
    lines: dict[tuple[str, int], dict[str, Any]] = {}
    for task_name, task_samples in samples.items():
        for sample in task_samples:
            doc_id = int(sample["doc_id"])
            completion = sample["resps"][0][0] if sample["resps"] and sample["resps"][0] else ""
            info = (details or {}).get((task_name, doc_id), {})
            line = lines.setdefault(
                (task_name, doc_id),
                {
                    "task_id": f"{task_name}/{doc_id}",
                    "sample_idx": 0,
                    "prompt": sample["arguments"][0][0],
                    "completion": info.get("completion", completion),
                    "finish_reason": info.get("finish_reason"),
                    "target": sample["target"],
                    "filtered": {},
                    "metrics": {},
                    "completion_tokens": info.get("tokens"),
                    **{k: info[k] for k in REASONING_FIELDS if k in info},
                },
            )
            filt = sample.get("filter", "none")
            line["filtered"][filt] = (
                sample["filtered_resps"][0] if sample["filtered_resps"] else None
            )
            for metric in sample.get("metrics", []):
                if metric in sample:
                    line["metrics"][f"{metric},{filt}"] = float(sample[metric])
    return [lines[k] for k in sorted(lines)]


@functools.cache
def _cached_lm_class() -> type:
    from lm_eval.api.model import LM

    return type("CachedHarnessLM", (CachedHarnessLM, LM), {})


def cached_harness_lm(
    backend: Backend,
    cache_file: Path,
    *,
    chunk_size: int = 256,
    label: str = "",
    reasoning: Reasoning | None = None,
    template: str | None = None,
) -> Any:
    """A `CachedHarnessLM` that is also an lm-eval `LM` (lm-eval is imported only here, so the
    evaluate step, which only scores, never pays for importing it)."""
    return _cached_lm_class()(
        backend,
        cache_file,
        chunk_size=chunk_size,
        label=label,
        reasoning=reasoning,
        template=template,
    )


def chat_template(
    backend: Backend,
    chat_history: list[dict[str, str]],
    add_generation_prompt: bool = True,
    template: str | None = None,
) -> str:
    """lm-eval's VLLM chat rendering, with the model's own tokenizer (no engine needed), through
    the run's chosen `template` (None: the tokenizer's own; ckpteval.chat_templates)."""
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:
        raise UserError(f"backend {backend.name} has no tokenizer to render a chat template")
    return str(
        tokenizer.apply_chat_template(
            chat_history,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
            chat_template=template,
        )
    )


class CachedHarnessLM:
    """An lm-eval model answering from ckpteval's cache, asking the backend's lm-eval model only
    for what is missing, chunk by chunk (each chunk is in the cache before the next starts).
    Build it with `cached_harness_lm`.

    A cache row of a `generate_until` request keeps the engine's finish reason and token count
    where the backend reports them (`Backend.harness_outputs`). With `reasoning`, each such
    request is sent without its `until` stop strings and with `max_gen_toks` raised by the
    reasoning budget; the row caches the raw text, and lm-eval gets the answer cut from it
    (`ckpteval.reasoning.split`: "" for truncated reasoning), so its filters and metrics see
    only the answer. This is done here, per task, rather than with lm-eval's `think_end_token`
    (model-wide, and it would hand a never-ended reasoning to the filters as the answer).
    `details` keeps, per (task, doc), what the generation line needs (`harness_lines`)."""

    def __init__(
        self,
        backend: Backend,
        cache_file: Path,
        *,
        chunk_size: int = 256,
        label: str = "",
        reasoning: Reasoning | None = None,
        template: str | None = None,
    ) -> None:
        super().__init__()
        self.backend = backend
        self.template = template
        self.cache_file = cache_file
        self.chunk_size = chunk_size
        self.label = label
        self.reasoning = reasoning
        self.n_cached = 0
        self.n_generated = 0
        self.details: dict[tuple[str, int], dict[str, Any]] = {}
        self.total_completion_tokens = 0

    @property
    def tokenizer_name(self) -> str:
        return _tokenizer_name(self.backend)

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        return chat_template(self.backend, chat_history, add_generation_prompt, self.template)

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        return self._answer("generate_until", requests)

    def loglikelihood(
        self, requests: list[Any], disable_tqdm: bool = False
    ) -> list[tuple[float, bool]]:
        return [tuple(r) for r in self._answer("loglikelihood", requests)]  # type: ignore[misc]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        return self._answer("loglikelihood_rolling", requests)

    def _sent(self, kind: str, req: Any) -> Any:
        """The request as the engine gets it: a reasoning task's generate_until without its
        stop strings and with the reasoning budget added to its token budget."""
        if kind != "generate_until" or self.reasoning is None:
            return req
        context, gen = req.args
        gen = dict(gen)
        gen["until"] = []
        if self.reasoning.budget:
            gen["max_gen_toks"] = int(gen.get("max_gen_toks", HARNESS_MAX_GEN_TOKENS)) + int(
                self.reasoning.budget
            )
        return dataclasses.replace(req, arguments=(context, gen))

    def _answer(self, kind: str, requests: list[Any]) -> list[Any]:
        from ckpteval.engine.cache import append_cache, read_cache, request_key

        ident = self.backend.harness_identity()
        sent = [self._sent(kind, req) for req in requests]
        keys = [request_key({"kind": kind, "args": list(req.args)}, ident) for req in sent]
        cached = read_cache(self.cache_file, set(keys))
        todo = [i for i, key in enumerate(keys) if key not in cached]
        self.n_cached += len(requests) - len(todo)
        self.n_generated += len(todo)
        log.info(
            "%s: %d lm-eval %s requests, %d cached, %d to run",
            self.label,
            len(requests),
            kind,
            len(requests) - len(todo),
            len(todo),
        )
        done = 0
        for start in range(0, len(todo), self.chunk_size):
            chunk = todo[start : start + self.chunk_size]
            model = self.backend.harness_model()
            self.backend.harness_outputs()  # drop what earlier calls left
            answers = getattr(model, kind)([sent[i] for i in chunk])
            engine = _by_context_and_text(self.backend.harness_outputs())
            rows = []
            for i, answer in zip(chunk, answers, strict=True):
                row = {"key": keys[i], "kind": kind, "value": answer}
                if kind == "generate_until":
                    found = engine.get((str(sent[i].args[0]), answer))
                    finish, tokens = found.pop(0) if found else (None, None)
                    row["tokens"] = tokens if tokens is not None else self.count_tokens(answer)
                    row["finish_reason"] = finish
                rows.append(row)
            append_cache(self.cache_file, rows)
            cached.update((r["key"], r) for r in rows)
            done += len(chunk)
            log.info("%s: %d/%d lm-eval requests run", self.label, done, len(todo))
        values = [cached[key]["value"] for key in keys]
        if kind != "generate_until":
            return values
        answers = []
        for req, key, value in zip(requests, keys, values, strict=True):
            row = cached[key]
            tokens = row.get("tokens")
            self.total_completion_tokens += tokens or 0
            info: dict[str, Any] = {
                "completion": value,
                "tokens": tokens,
                "finish_reason": row.get("finish_reason"),
            }
            if self.reasoning is not None:
                context, gen = req.args
                until = gen.get("until") or []
                info.update(
                    split(
                        value,
                        prompt=str(context),
                        cfg=self.reasoning,
                        stops=[until] if isinstance(until, str) else list(until),
                        engine_finish=row.get("finish_reason"),
                        count_tokens=self.count_tokens,
                        completion_tokens=tokens,
                        answer_budget=int(gen.get("max_gen_toks", HARNESS_MAX_GEN_TOKENS)),
                        keep_tokens=self.backend.keep_tokens,
                    ).fields()
                )
            if req.doc_id is not None:
                self.details[(str(req.task_name), int(req.doc_id))] = info
            answers.append(info.get("answer", value))
        return answers

    def count_tokens(self, text: str) -> int | None:
        return self.backend.count_tokens(text)


def _by_context_and_text(
    outputs: Sequence[tuple[str, str, str | None, int]],
) -> dict[tuple[str, str], list[tuple[str | None, int]]]:
    """Engine outputs by (context, answer). Two requests with the same context and the same
    answer text are taken in lm-eval's order; they could only differ in finish reason or token
    count if their generation settings differed and yet produced the very same text."""
    found: dict[tuple[str, str], list[tuple[str | None, int]]] = {}
    for context, text, finish, tokens in outputs:
        found.setdefault((context, text), []).append((finish, tokens))
    return found


# ----------------------------------------------------------------------------------- scoring


def score_harness_file(
    generations: Path,
    out_jsonl: Path,
    out_json: Path,
    *,
    provenance: dict[str, Any],
    workers: int = 2,
    timeout: float | None = None,
    timeout_factor: float | None = None,
    ks: Sequence[int] | None = None,
    checker_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write per-sample verdicts and cell metrics for one harness generation file.

    Code tasks (lines carrying `problem`) are scored by the python checker in its sandbox, with
    `workers`, `timeout`, `timeout_factor` (None: `score_samples`' default), `ks` and
    `checker_options` as for ckpteval's own tasks. They stream like ckpteval's own tasks: one
    pass collects the problems (one per task), a second feeds the samples to `score_samples`.
    """
    errors: list[str] = []
    meta_path = generation_meta_of(generations)
    meta = read_json(meta_path) if meta_path.exists() else {}
    first = next(iter_jsonl(generations, errors=[]), None)
    if first is not None and "problem" in first:
        from ckpteval.evaluate import DEFAULT_TIMEOUT_FACTOR, score_samples

        problems: dict[str, Any] = {}
        for row in iter_jsonl(generations, errors=[]):  # bad lines are reported by the second pass
            if "problem" in row and isinstance(row.get("task_id"), str):
                problems.setdefault(row["task_id"], row["problem"])
        rows = iter_jsonl(generations, errors=errors)
        return score_samples(
            meta.get("checker", "python"),
            problems,
            rows,
            out_jsonl,
            out_json,
            workers=workers,
            timeout=timeout,
            timeout_factor=(DEFAULT_TIMEOUT_FACTOR if timeout_factor is None else timeout_factor),
            ks=ks,
            checker_options=checker_options or {},
            provenance=provenance,
            input_errors=errors,
        )
    rows = list(iter_jsonl(generations, errors=errors))
    return _score_lm_eval_metrics(
        generations, rows, errors, meta.get("lm_eval_results", {}), out_jsonl, out_json, provenance
    )


def _score_lm_eval_metrics(
    generations: Path,
    rows: list[dict[str, Any]],
    errors: list[str],
    reference: dict[str, Any],
    out_jsonl: Path,
    out_json: Path,
    provenance: dict[str, Any],
) -> dict[str, Any]:
    started = time.monotonic()
    keys = sorted({k for r in rows for k in r.get("metrics", {})})
    primary = keys[0] if keys else None
    verdicts = []
    for r in rows:
        score = r.get("metrics", {}).get(primary, math.nan) if primary else math.nan
        truncated = r.get("truncated_reasoning") is True
        verdicts.append(
            {
                "task_id": r["task_id"],
                "sample_idx": r.get("sample_idx", 0),
                "passed": score == 1.0 and not truncated,
                "score": score,
                "error_type": TRUNCATED
                if truncated
                else (None if score == 1.0 else "wrong_answer"),
                "compile_ok": None,
                "duration_s": 0.0,
                "stderr_tail": "",
                "hack": None,
                "metrics": r.get("metrics", {}),
            }
        )
    metrics: dict[str, dict[str, Any]] = {}
    for key in keys:
        values = [r["metrics"][key] for r in rows if key in r.get("metrics", {})]
        mean, stderr = mean_and_stderr(values)
        ref = reference.get(key)
        if isinstance(ref, (int, float)) and not math.isclose(float(ref), mean, abs_tol=1e-9):
            raise RuntimeError(
                f"{generations}: {key} mean {mean} disagrees with lm-eval's own {ref}; "
                "the per-sample conversion is wrong"
            )
        metrics[key] = {"value": mean, "stderr": stderr, "n": len(values)}
    if verdicts:  # lm-eval metrics detect no reward hack: 0, so every cell has the curve
        metrics["hack_rate"] = {"value": 0.0, "stderr": 0.0, "n": len(verdicts)}
    lengths = LengthTotals()  # from the lines' own token counts and finish reasons, when given
    for r in rows:
        lengths.add(r)
    metrics.update(lengths.metrics())
    write_jsonl(out_jsonl, verdicts)
    cell = {
        "checker": "harness",
        "scorer_version": SCORER_VERSION,
        "n_problems": len(rows),
        "n_samples": len(rows),
        "metrics": metrics,
        "error_types": {
            "wrong_answer": 0,
            **Counter(v["error_type"] for v in verdicts if v["error_type"]),
        },
        "hack_types": {},
        "input_errors": errors,
        "primary_metric": primary,
        "duration_s": round(time.monotonic() - started, 3),
        **provenance,
    }
    write_json(out_json, cell)
    return cell
