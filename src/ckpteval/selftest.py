"""A code task's self-test as a job of its own: a failing one costs no score, a passing one is
paid once per configuration, not once per cell.

Snakemake removes a job's outputs before the job runs. A self-test run inside the scoring
(evaluate) job therefore took the cell's previous scores with it when it failed; and a Python or
Rust self-test runs every problem's reference solution, which costs a fifth of a cell of 4
samples per problem. The workflow's `selftest` rule runs it apart instead, once per task and
checker configuration, and every evaluate job of the task that is (re)scored waits for it:

- **Its verdict file**, `<outdir>/staging/selftest/<task>.<key>.json`, is named by `key`, the
  digest of the self-test's identity: the cell's scoring identity (the checker, its version, the
  reward function's content and options, the evaluate settings it reads, the task's problems)
  less what only the cell's metrics read (`evaluate.ks`, the cell format). A changed function
  or setting is a file that does not exist yet, so the parse plans the job without writing
  anything, and the same configuration again finds its old verdict. It records the report and
  the references' run times (`reference_run_s`), from which the evaluate job calibrates its
  timeouts instead of running the self-test a second time.
- **A failed self-test** fails that job only, with its one line (function, rows, setting).
  Nothing of the task's score cells is touched: the evaluate jobs never start. The job leaves
  the line in `<task>.<key>.failed` beside (not an output, so Snakemake keeps it), which
  `ckpteval status` shows for every cell of the task as `blocked`, until a passing self-test
  removes it.

Tasks whose checker runs code self-test apart (`SEPARATE_CHECKERS`: python, rust, stdio and
reward functions); the math checkers, whose self-test takes milliseconds, still self-test in their
evaluate job. `ckpteval score`, outside the workflow, self-tests before it scores.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ckpteval.contract import Identity
from ckpteval.io import write_json
from ckpteval.plan.layout import Layout

#: Checkers whose self-test is a job of its own (rule `selftest`): those that run code. Their
#: self-test runs every problem's reference and the known-wrong samples (a fifth of a Rust or
#: Python cell's checks on a bench of 4 samples per problem), once per configuration instead of
#: once per cell; a math checker's self-test costs milliseconds and stays in its evaluate job.
SEPARATE_CHECKERS = frozenset({"reward_function", "python", "rust", "stdio"})
#: Scoring identity keys the self-test does not read (what only a cell's metrics depend on).
CELL_ONLY_KEYS = frozenset({"cell.format", "evaluate.ks"})


def separate(checker: str) -> bool:
    """Whether a task of `checker` self-tests in a job of its own."""
    return checker in SEPARATE_CHECKERS


def selftest_identity(scoring: Identity) -> Identity:
    """The self-test's identity: a cell's scoring identity less what only the cell reads."""
    return Identity({k: v for k, v in scoring.settings.items() if k not in CELL_ONLY_KEYS})


def verdict_path(outdir: Path | str, task: str, identity: Identity) -> Path:
    """Where the self-test of `task` with `identity` records its verdict (the rule's output)."""
    return Path(Layout(str(outdir)).selftest_verdict(task, identity.digest))


def failure_path(verdict: Path) -> Path:
    """Where a failed self-test leaves its line: beside its verdict, not an output."""
    return verdict.with_suffix(".failed")


def record(verdict: Path, task: str, identity: Identity, outcome: Mapping[str, Any]) -> None:
    """Write a passed self-test's verdict (`outcome`: its report and the references' run times)
    and remove the line a failed one of the same configuration left."""
    write_json(verdict, {"task": task, **identity.record(), **outcome})
    failure_path(verdict).unlink(missing_ok=True)


def record_failure(verdict: Path, line: str) -> None:
    """Leave a failed self-test's line beside its verdict, for `ckpteval status`."""
    path = failure_path(verdict)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(line.strip() + "\n", encoding="utf-8")


def read_verdict(path: Path) -> dict[str, Any]:
    """A passed self-test's `{"self_test": report, "run_s": {task_id: seconds}}`, as
    `ckpteval.evaluate.score_samples` takes it."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return {"self_test": data["self_test"], "run_s": data["run_s"]}


def failed_line(verdict: Path) -> str | None:
    """The line of the failed self-test of this configuration, if it failed and has not passed
    since; None otherwise."""
    if verdict.exists():
        return None
    try:
        return failure_path(verdict).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def plan_verdicts(plan: Any, outdir: Path | str | None = None) -> dict[Path, tuple[str, Identity]]:
    """Verdict path -> (task, identity) of every self-test the plan's cells wait for: one per
    task of a `separate` checker and configuration (a run whose settings differ has its own),
    under `outdir` (the plan's by default), in the order of the plan's cells."""
    from ckpteval.contract import scoring_identity

    found: dict[Path, tuple[str, Identity]] = {}
    seen: set[tuple[str, str, str]] = set()
    for cell in plan.cell_keys:
        where = (cell.run, cell.task, cell.variant)
        if where in seen or not separate(plan.tasks[cell.task].checker):
            continue
        seen.add(where)
        identity = selftest_identity(scoring_identity(plan, *where))
        found.setdefault(
            verdict_path(outdir or plan.outdir, cell.task, identity), (cell.task, identity)
        )
    return found


def blocked_tasks(plan: Any, outdir: Path | None = None) -> dict[str, str]:
    """`{task: why}` for the plan's tasks whose current self-test failed: their cells cannot be
    (re)scored until it passes (`plan_verdicts`: the first failed configuration's line)."""
    blocked: dict[str, str] = {}
    for verdict, (task, _) in plan_verdicts(plan, outdir).items():
        line = None if task in blocked else failed_line(verdict)
        if line is not None:
            blocked[task] = f"self-test failed: {line}"
    return blocked
