"""Regenerate docs/dag.png, the README's picture of the demo's DAG for one checkpoint, and
docs/rulegraph.svg, docs/plan.md's picture of the rules, from the current workflow (`make
docs/dag.png`): the demo config's tasks on one placeholder checkpoint (an empty directory marked
complete), planned from scratch, drawn by graphviz's `dot`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def demo_tasks() -> dict:
    """The demo config's tasks, with the files they name made absolute."""
    tasks = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["tasks"]
    for options in tasks.values():
        if not isinstance(options, dict):
            continue
        if isinstance(options.get("problems"), str):
            options["problems"] = str(REPO / options["problems"])
        checker = options.get("checker")
        if isinstance(checker, dict) and isinstance(checker.get("reward_function"), str):
            checker["reward_function"] = str(REPO / checker["reward_function"])
    return tasks


def main() -> None:
    if shutil.which("dot") is None:
        sys.exit("dag: graphviz's dot not found; install it with: sudo apt-get install graphviz")
    with tempfile.TemporaryDirectory(prefix="ckpteval-dag-") as tmp:
        work = Path(tmp)
        (work / "run" / "step_300").mkdir(parents=True)
        (work / "run" / "step_300" / "DONE").touch()
        config = {
            "runs": {"demo": {"path": str(work / "run"), "complete_marker": "DONE"}},
            "tasks": demo_tasks(),
            "sampling": {"greedy": {"temperature": 0.0, "max_new_tokens": 128}},
        }
        (work / "dag.yaml").write_text(yaml.safe_dump(config))
        for graph_flag, fmt, out in (
            ("--dag", "png", REPO / "docs" / "dag.png"),
            ("--rulegraph", "svg", REPO / "docs" / "rulegraph.svg"),
        ):
            graph = _graph(work, graph_flag)
            subprocess.run(["dot", f"-T{fmt}", "-o", str(out)], input=graph, text=True, check=True)
            print(f"wrote {out.relative_to(REPO)}")


def _graph(work: Path, flag: str) -> str:
    """`snakemake <flag>` (--dag, --rulegraph) of the placeholder sweep in `work`, as dot."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(work),
            "--configfile",
            str(work / "dag.yaml"),
            "--cores",
            "1",
            flag,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"snakemake {flag} failed:\n{done.stderr[-3000:]}")
    return done.stdout[done.stdout.index("digraph") :]


if __name__ == "__main__":
    main()
