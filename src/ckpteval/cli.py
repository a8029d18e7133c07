"""The `ckpteval` command: standalone scorers, sweep status, config checks, comparisons, gates.

A `UserError` anywhere below becomes one line on stderr and exit status 2; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ckpteval import __version__
from ckpteval.errors import UserError
from ckpteval.plan.layout import Layout


def _add_check_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "check", help="validate a config and list the checkpoints and tasks it would evaluate"
    )
    p.add_argument("--configfile", default="config/config.yaml", type=Path)
    p.set_defaults(func=_run_check)


def _run_check(args: argparse.Namespace) -> int:
    from ckpteval.chat_templates import missing_template_lines
    from ckpteval.config import build_plan, load_config, validate_config
    from ckpteval.tasks import check_harness_names

    config = load_config(args.configfile)
    validate_config(config)
    plan = build_plan(config)
    check_harness_names(plan.tasks, config["lm_eval"]["include_paths"])
    for run in plan.runs.values():
        steps = ", ".join(
            f"{c.name} (final, after step {c.step - 1})" if c.final else c.name
            for c in run.checkpoints
        )
        steps = steps or "none complete yet"
        print(f"run {run.name}: {len(run.checkpoints)} checkpoint(s): {steps}")
    for line in plan.waiting_lines():
        print(line)
    for name, task in plan.tasks.items():
        print(
            f"task {name}: {task.kind}, checker {task.checker}, "
            f"variants {', '.join(plan.task_variants[name])}"
        )
    print(f"{len(plan.cell_keys)} cells (checkpoint x task x variant)")
    for line in [*plan.left_out, *plan.broken_lines(), *missing_template_lines(plan)]:
        print(f"warning: {line}")
    return 0


def _add_aggregate_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "aggregate", help="summarize whatever cells of a sweep exist (missing ones are listed)"
    )
    p.add_argument("--configfile", default="config/config.yaml", type=Path)
    p.add_argument("--out", type=Path, help="summary directory (default: <outdir>/summary)")
    p.set_defaults(func=_run_aggregate)


def _run_aggregate(args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    from ckpteval.config import build_plan, load_config, validate_config
    from ckpteval.jobs import chosen_main_metrics
    from ckpteval.summary import build_summary, publish_summary

    config = load_config(args.configfile)
    validate_config(config)
    plan = build_plan(config)
    cells = [Path(p) for p in plan.score_files()]
    summary = args.out or Path(Layout(plan.outdir).summary_dir())
    summary.parent.mkdir(parents=True, exist_ok=True)
    # built beside it and published once complete: a failed build leaves the previous summary
    built = Path(tempfile.mkdtemp(prefix=f".{summary.name}.", dir=summary.parent))
    try:
        build_summary(
            cells,
            built,
            title=config["aggregate"]["title"],
            bootstrap=int(config["aggregate"]["bootstrap"]),
            truncation_threshold=config["aggregate"].get("truncation_threshold"),
            main_metric=chosen_main_metrics(config),
            train_logs={
                name: run["train_logs"]
                for name, run in config["runs"].items()
                if run.get("train_logs")
            },
            sampling=config.get("sampling") or {},
            report_cache=summary.parent / f".{summary.name}_report_cache",
        )
        publish_summary(built, [summary / p.name for p in built.iterdir()])
    finally:
        shutil.rmtree(built, ignore_errors=True)
    present = sum(p.exists() for p in cells)
    print(
        f"{summary}: {present} of {len(cells)} cells summarized"
        + (f"; missing ones in {summary / 'missing.csv'}" if present < len(cells) else "")
    )
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand's parser; for `command`, one of `_PLUGGED`'s, only that one's module is
    imported (the others bring the checkers and the aggregate tables: a quarter of a second of
    every `ckpteval status`, which a script may call in a loop)."""
    parser = argparse.ArgumentParser(prog="ckpteval", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"ckpteval {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_check_parser(subparsers)
    _add_aggregate_parser(subparsers)
    plugged = {command: _PLUGGED[command]} if command in _PLUGGED else _PLUGGED
    for module, adder in plugged.values():
        getattr(__import__(f"ckpteval.{module}", fromlist=[adder]), adder)(subparsers)
    return parser


# Subcommands that live beside the code they drive: name -> (module, function adding its parser).
_PLUGGED: dict[str, tuple[str, str]] = {
    "score": ("cli_score", "add_score_parser"),
    "publish": ("publish", "add_publish_parser"),
    "compare": ("compare", "add_compare_parser"),
    "gate": ("gate", "add_gate_parser"),
    "best": ("best", "add_best_parser"),
    "status": ("status", "add_status_parser"),
    "watch": ("watch", "add_watch_parser"),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"ckpteval: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ckpteval: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
