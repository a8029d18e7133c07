"""What planning costs: ckpteval's `snakemake -n`, `ckpteval status` and `ckpteval check` on
synthetic sweeps, against a plain Snakefile with the same job graph.

Each size is a run of placeholder checkpoints (empty directories marked complete with `DONE`)
x 20 cells per checkpoint (5 built-in tasks x 4 variants: greedy, and one sampled config x 3
seeds), in two states:

- new: nothing done; every job is planned;
- finished: every output present and valid, written as plausible files (model cards, generation
  files with their metas, score cells with their samples, the summary), with identities
  computed by ckpteval.contract exactly as the jobs record them, not by running models. A dry
  run plans nothing.

The plain Snakefile has the same rules and files (consolidate, one engine job per checkpoint,
generation and evaluate per cell, aggregate, summary) as `shell: touch` jobs with static inputs:
what Snakemake itself costs for that graph. A second plain Snakefile, printed as an extra row, runs
the rules ckpteval runs as `script:` (consolidate, infer, evaluate, aggregate) as `script:` rules:
what any workflow with script rules pays Snakemake per job (it opens and formats each job's script
path), so the rest of the gap is ckpteval's own. In one run it prints, per size and state, the
seconds of each command, the ratio to the plain Snakefile, and how each grows with size; with
`--profile` it also writes a cProfile of each ckpteval command it times (ckpteval's new and
finished dry runs, `status`, `check`; top costs printed; the profiled runs' seconds are not the
figures). `--only` measures some of them: `--only status` builds and finishes the sweep and times
`ckpteval status` alone, minutes at 1,000 checkpoints where every dry run takes 20 or more.

    python bench/plan.py                       # 100, 300 and 1000 checkpoints
    python bench/plan.py --sizes 20 --profile  # one small size, profiled
    python bench/plan.py --sizes 1000 --only status
    python bench/plan.py --sizes 300 --only new --repeat 3   # medians of 3 runs each, in turn

Goals (issue 49): at 300 and 1,000 checkpoints x 20 cells, a new sweep's dry run within 1.3x the
plain (`shell:`) Snakefile's, a finished sweep's within 1.5x, and `ckpteval status` on 20,000
cells under 5 s. Run it alone on the machine (it is CPU-bound; under the shared lock on a shared
box).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TASKS = {"arith": {}, "pyfunc": {}, "rustfunc": {}, "humaneval": {}, "math_qwen": {}}
SAMPLING = {
    "greedy": {"temperature": 0.0},
    "hot": {"temperature": 0.7, "n": 2},
}


def config() -> dict[str, Any]:
    return {
        "runs": {"sweep": {"path": "run", "complete_marker": "DONE"}},
        "tasks": TASKS,
        "sampling": SAMPLING,
        "seeds": [1, 2, 3],
        "consolidate": {"smoke": "none"},
    }


def make_sweep(work: Path, checkpoints: int) -> None:
    """A working directory with `checkpoints` placeholder checkpoints and the config."""
    for c in range(checkpoints):
        ckpt = work / "run" / f"step_{(c + 1) * 100}"
        ckpt.mkdir(parents=True)
        (ckpt / "DONE").touch()
    (work / "config").mkdir()
    (work / "config" / "config.yaml").write_text(json.dumps(config()))


def finish(work: Path) -> int:
    """Write every output of the sweep as the jobs would (identities by ckpteval.contract),
    oldest first along the graph; returns the number of cells."""
    from ckpteval.checkpoints import hash_source, sync_source_identity
    from ckpteval.config import build_plan, validate_config
    from ckpteval.contract import model_identity
    from ckpteval.plan.layout import CellKey, Layout

    cfg = config()
    validate_config(cfg)
    cwd = os.getcwd()
    os.chdir(work)
    try:
        plan = build_plan(cfg, base_dir=work)
    finally:
        os.chdir(cwd)
    layout = Layout(str(work / "results"))
    base = time.time() - 3600
    cells = 0
    for run in plan.runs.values():
        for ckpt in run.checkpoints:
            manifest = Path(layout.manifest(run.name, ckpt.name))
            Path(layout.model_dir(run.name, ckpt.name)).mkdir(parents=True)
            weights = f"w-{run.name}-{ckpt.name}"
            card = {
                **model_identity(plan, run.name, ckpt.name).record(),
                "weights_sha256": weights,
                "identity_sha256": weights,
                "source_files": hash_source(Path(ckpt.path)),
            }
            _write(manifest, card, base + 1)
            os.utime(layout.model_dir(run.name, ckpt.name), (base + 1, base + 1))
            # The content identity as the first parse after the run leaves it (this cache is
            # written once per new content, not timed here).
            sync_source_identity(
                Path(ckpt.path), Path(layout.source_id(run.name, ckpt.name)), manifest
            )
            for task, variants in plan.task_variants.items():
                for variant in variants:
                    cells += 1
                    cell = CellKey(run.name, ckpt.name, task, variant)
                    _finish_cell(layout, plan, cell, weights, base)
    # the aggregate job's build (staging/_summary/, with the params it was built with), then
    # rule summary's copy of it (summary/)
    from ckpteval.plan.sweep import SweepPlan

    os.chdir(work)
    try:
        params = SweepPlan(plan).aggregate_params()
        verdicts = _self_test_verdicts(plan, layout)
    finally:
        os.chdir(cwd)
    for path, record in verdicts.items():  # each code task's self-test, before its scores
        _write(path, record, base + 2)
    _write(Path(layout.summary_params()), params, base + 4)
    for where, mtime in ((layout.summary_staging(), base + 4), (layout.summary_dir(), base + 5)):
        summary = Path(where)
        for name in (
            "metrics.parquet metrics.csv metrics.md seeds.csv configs.csv passk.csv errors.csv "
            "hacks.csv truncation.csv deltas.csv flips.csv missing.csv summary.json report.html"
        ).split():
            _write(summary / name, {}, mtime)
        for folder in ("plots", "report_files"):
            (summary / folder).mkdir(exist_ok=True)
            os.utime(summary / folder, (mtime, mtime))
        os.utime(summary, (mtime, mtime))
    return cells


def _finish_cell(layout: Any, plan: Any, cell: Any, weights: str, base: float) -> None:
    """A cell's generation pair and score pair as its jobs leave them (`layout`: the sweep's
    ckpteval.plan.layout.Layout, `cell` its CellKey)."""
    from ckpteval.contract import generation_identity, scoring_identity

    run, task, variant = cell.run, cell.task, cell.variant
    jsonl = Path(layout.generation(cell))
    jsonl.parent.mkdir(parents=True, exist_ok=True)
    text = '{"problem_id": 0, "completion": "42"}\n'
    jsonl.write_text(text)
    os.utime(jsonl, (base + 2, base + 2))
    meta = {
        **generation_identity(plan, run, task, variant).record(),
        "model_hash": weights,
        "model_identity": weights,
        "generation_bytes": len(text),
    }
    _write(Path(layout.generation_meta(cell)), meta, base + 2)
    score = scoring_identity(plan, run, task, variant)
    samples = Path(layout.score_samples(cell))
    samples.parent.mkdir(parents=True, exist_ok=True)
    samples.write_text('{"problem_id": 0, "passed": true}\n')
    os.utime(samples, (base + 3, base + 3))
    names = {"run": run, "ckpt": cell.ckpt, "task": task, "variant": variant}
    cell_json = {**names, "scoring": score.settings, "metrics": {"acc": 1.0}, "n": 1}
    _write(Path(layout.score(cell)), cell_json, base + 3)


def _self_test_verdicts(plan: Any, layout: Any) -> dict[Path, dict[str, Any]]:
    """The verdict of the self-test (rule selftest) of each code task and configuration, as a
    passed one records it: path -> record."""
    from ckpteval.selftest import plan_verdicts

    return {
        path: {
            "task": task,
            **identity.record(),
            "self_test": {"references_passed": 1, "known_wrong_failed": 2},
            "run_s": {},
        }
        for path, (task, identity) in plan_verdicts(plan, layout.out).items()
    }


def _write(path: Path, obj: Any, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    os.utime(path, (mtime, mtime))


PLAIN = """
import json
CKPTS = json.load(open("ckpts.json"))
CELLS = json.load(open("cells.json"))
localrules: all, aggregate, summary, generation
wildcard_constraints:
    ckpt=r"step_[0-9]+",
    cell=r"[^/]+/[^/]+",
rule all:
    input: "results/summary/metrics.parquet"
rule consolidate:
    input: ancient("run/{ckpt}/DONE")
    output: directory("results/models/sweep/{ckpt}"), "results/models/sweep/{ckpt}.json"
    shell: "mkdir -p {output[0]}; touch {output[1]}"
rule infer:
    input: "results/models/sweep/{ckpt}", "results/models/sweep/{ckpt}.json"
    output: "results/staging/sweep/{ckpt}/main.r1.done"
    shell: "touch {output}"
rule generation:
    input: ancient("results/staging/sweep/{ckpt}/main.r1.done"), "results/models/sweep/{ckpt}.json"
    output: "results/generations/sweep/{ckpt}/{cell}.jsonl", "results/generations/sweep/{ckpt}/{cell}.meta.json"
    shell: "touch {output}"
rule evaluate:
    input: "results/generations/sweep/{ckpt}/{cell}.jsonl", "results/models/sweep/{ckpt}.json"
    output: "results/scores/sweep/{ckpt}/{cell}.jsonl", "results/scores/sweep/{ckpt}/{cell}.json"
    shell: "touch {output}"
rule aggregate:
    input: expand("results/scores/sweep/{ckpt}/{cell}.json", ckpt=CKPTS, cell=CELLS)
    output: directory("results/staging/_summary")
    shell: "mkdir -p {output}"
rule summary:
    input: "results/staging/_summary"
    output: "results/summary/metrics.parquet"
    shell: "touch {output}"
"""


#: The rules ckpteval runs as `script:` jobs (its generation, model card and summary are `run:`).
SCRIPTED = ("consolidate", "infer", "evaluate", "aggregate")

TOUCH = """from pathlib import Path

for path in snakemake.output:
    Path(path).touch()
"""


def scripted(snakefile: str) -> str:
    """The plain Snakefile with SCRIPTED's rules as `script:` rules (one script, no params)."""
    blocks = snakefile.split("\nrule ")
    for i, block in enumerate(blocks):
        if block.split(":", 1)[0] in SCRIPTED:
            lines = block.splitlines()
            at = next(j for j, text in enumerate(lines) if text.startswith("    shell:"))
            lines[at] = '    script: "touch.py"'
            blocks[i] = "\n".join(lines)
    return "\nrule ".join(blocks)


def make_plain(work: Path, source: Path, script: bool = False) -> None:
    """The plain Snakefile (with `script:` rules if `script`) beside the same checkpoints and, if
    `source` is finished, the same output files (copied with their times)."""
    ckpts = sorted(p.name for p in (source / "run").iterdir())
    cells = [f"{t}/{v}" for t in TASKS for v in ("greedy-s42", "hot-s1", "hot-s2", "hot-s3")]
    shutil.copytree(source / "run", work / "run")
    if (source / "results").exists():
        shutil.copytree(
            source / "results", work / "results", ignore=shutil.ignore_patterns("sources")
        )
    (work / "ckpts.json").write_text(json.dumps(ckpts))
    (work / "cells.json").write_text(json.dumps(cells))
    (work / "Snakefile").write_text(scripted(PLAIN) if script else PLAIN)
    (work / "touch.py").write_text(TOUCH)
    os.utime(work / "touch.py", (0, 0))  # older than the outputs: no code change to rerun


def timed(cmd: list[str], cwd: Path, expect: str | None = None) -> float:
    """The CPU seconds (user + system) of `cmd`: planning is single-threaded, so on a quiet
    machine they are its wall seconds, and on a shared one they do not count the waits for a
    core that other processes cause (the wall seconds are printed beside them)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0 or (expect is not None and expect not in proc.stdout + proc.stderr):
        sys.exit(f"{' '.join(cmd)} in {cwd} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    WALL.append(wall)
    return cpu


#: Wall seconds of every timed command, in order (printed beside the CPU seconds).
WALL: list[float] = []


def dry_run(cwd: Path, snakefile: Path, nothing: bool, profile: Path | None = None) -> float:
    args = [
        "-m",
        "snakemake",
        "--snakefile",
        str(snakefile),
        "--directory",
        str(cwd),
        "--profile",
        str(REPO / "profiles" / "local"),
        "-n",
        "--quiet",
        "--cores",
        "32",
    ]
    prefix = [sys.executable]
    if profile is not None:
        prefix = [sys.executable, "-m", "cProfile", "-o", str(profile)]
    return timed([*prefix, *args], cwd, "Nothing to be done" if nothing else None)


def ckpteval(cwd: Path, command: str, profile: Path | None = None) -> float:
    prefix = [sys.executable]
    if profile is not None:
        prefix = [sys.executable, "-m", "cProfile", "-o", str(profile)]
    return timed([*prefix, "-m", "ckpteval.cli", command], cwd)


#: What one size measures, in this order (`--only` picks some): the new sweep's dry runs, the
#: finished sweep's, and the two verbs on the finished sweep.
MEASURES = ("new", "finished", "status", "check")


def measure(
    root: Path,
    checkpoints: int,
    profile: bool,
    only: tuple[str, ...] = MEASURES,
    repeat: int = 1,
) -> dict[str, float]:
    """CPU seconds of each command at one size (and `<name>_wall`, its wall seconds), for the
    measures in `only`; with `repeat`, the dry runs are made that many times, ckpteval's and the
    plain Snakefiles' in turn (a new sweep's from no results each time), and each figure is the
    median of its runs."""
    work = root / f"ckpteval-{checkpoints}"
    plain = root / f"plain-{checkpoints}"
    script = root / f"script-{checkpoints}"
    make_sweep(work, checkpoints)
    row: dict[str, float] = {}
    runs: dict[str, list[tuple[float, float]]] = {}

    def record(name: str, seconds: float) -> None:
        # Printed as soon as measured: a run stopped by a time limit still says what it got.
        runs.setdefault(name, []).append((seconds, WALL[-1]))
        row[name] = statistics.median(cpu for cpu, _ in runs[name])
        row[f"{name}_wall"] = statistics.median(wall for _, wall in runs[name])
        print(
            f"  {checkpoints} x 20 {name}: {seconds:.1f} s CPU [{WALL[-1]:.1f} s wall]", flush=True
        )

    profiles = {name: root / f"{name}-{checkpoints}.prof" for name in only if profile}

    def dry_runs(name: str, finished: bool) -> None:
        """ckpteval's dry run of the sweep as it is, then the two plain Snakefiles' (made anew:
        a plain one's outputs are the sweep's files as they are now)."""
        for attempt in range(repeat):
            if attempt and not finished:  # the first parse of a new sweep writes identities
                shutil.rmtree(work / "results", ignore_errors=True)
                shutil.rmtree(work / ".snakemake", ignore_errors=True)
            make_plain(plain, work)
            make_plain(script, work, script=True)
            record(name, dry_run(work, REPO / "Snakefile", finished, profiles.get(name)))
            record(f"{name}_plain", dry_run(plain, plain / "Snakefile", finished))
            record(f"{name}_script", dry_run(script, script / "Snakefile", finished))
            shutil.rmtree(plain)
            shutil.rmtree(script)

    if "new" in only:
        dry_runs("new", False)
    if set(only) - {"new"}:
        row["cells"] = finish(work)
    if "finished" in only:
        dry_runs("finished", True)
    for verb in ("status", "check"):
        if verb in only:
            record(verb, ckpteval(work, verb, profiles.get(verb)))
    for name, prof in profiles.items():
        print(f"cProfile of ckpteval's {name} ({checkpoints} checkpoints; wall seconds):")
        pstats.Stats(str(prof)).sort_stats("cumulative").print_stats(25)
    return row


def line(size: int, row: dict[str, float]) -> str:
    """One size's result: CPU seconds (wall in brackets) and the ratios to the plain Snakefile,
    of what was measured."""

    def sec(name: str) -> str:
        return f"{row[name]:.1f} s [{row[f'{name}_wall']:.1f}]"

    parts, extra = [], []
    for state in ("new", "finished"):
        if state in row:
            plain, script = row[f"{state}_plain"], row[f"{state}_script"]
            parts.append(
                f"{state} {sec(state)} (plain {sec(f'{state}_plain')}, {row[state] / plain:.2f}x)"
            )
            extra.append(
                f"{state} {sec(f'{state}_script')} ({script / plain:.2f}x plain; ckpteval "
                f"{row[state] / script:.2f}x it)"
            )
    parts += [f"{verb} {sec(verb)}" for verb in ("status", "check") if verb in row]
    cells = f"{row['cells']:.0f}" if "cells" in row else f"{size * 20}"
    text = f"{size} checkpoints, {cells} cells, CPU s [wall s]: " + "; ".join(parts)
    if extra:
        text += "\n  extra row, the plain Snakefile with script: rules: " + "; ".join(extra)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument(
        "--profile", action="store_true", help="cProfile ckpteval's dry runs and verbs measured"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=MEASURES,
        default=list(MEASURES),
        help="measure only these (e.g. `--only status` at 1000: minutes, not the dry runs' 20+)",
    )
    parser.add_argument("--keep", type=Path, help="build the sweeps here and keep them")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="make each dry run this many times, in turn with the plain ones; print medians",
    )
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="ckpteval-plan-"))
    rows = {}
    try:
        for size in args.sizes:
            rows[size] = measure(
                root,
                size,
                args.profile,
                tuple(m for m in MEASURES if m in args.only),
                repeat=args.repeat,
            )
            print(line(size, rows[size]), flush=True)
        sizes = sorted(rows)
        for a, b in zip(sizes, sizes[1:]):
            grow = {k: rows[b][k] / rows[a][k] for k in args.only}
            print(
                f"{a} -> {b} checkpoints ({b / a:.1f}x cells): "
                + ", ".join(f"{k} {v:.2f}x" for k, v in grow.items())
            )
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
