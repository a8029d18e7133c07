"""`ckpteval status`: cell states from the files, with a real Snakemake run for the markers."""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import (
    dry_snakemake,
    forked_main,
    run_snakemake,
    small_config,
    why_failed,
    write_config,
)

from ckpteval.cli import main
from ckpteval.errors import UserError
from ckpteval.plan.layout import CellKey
from ckpteval.status import (
    CELL_COLUMNS,
    add_status_parser,
    cell_states,
    format_status,
    matrix_from_cells,
    status_matrix,
)


def expected(
    ckpts: list[str], tasks: list[str], variants: tuple[str, ...] = ("greedy-s1",)
) -> dict[CellKey, int]:
    return {
        CellKey("r", c, t, v): int(c.split("_")[1]) for c in ckpts for t in tasks for v in variants
    }


def touch(path: Path, text: str = "", age_s: float = 0.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if age_s:
        stamp = time.time() - age_s
        os.utime(path, (stamp, stamp))
    return path


def marker(workdir: Path, output: str) -> None:
    """Snakemake's incomplete marker for `output` (a path relative to the working directory)."""
    name = base64.urlsafe_b64encode(output.encode()).decode()
    touch(workdir / ".snakemake" / "incomplete" / name, '{"external_jobid": null}')


def states(outdir: Path, cells: dict[CellKey, int]) -> dict[tuple[str, str], str]:
    frame = cell_states(outdir, cells)
    return {(r.ckpt, r.task): r.state for r in frame.itertuples()}


def test_states_from_files(tmp_path: Path) -> None:
    out = tmp_path / "results"
    cells = expected([f"step_{i}" for i in range(1, 9)], ["a", "b"])
    # done: the score json exists, even though an older attempt's log ends with an error
    touch(out / "scores/r/step_1/a/greedy-s1.json", "{}")
    touch(tmp_path / "logs/evaluate/r/step_1/a/greedy-s1.log", "ValueError: old attempt")
    # running: a fresh temp file of the generation; a stale one (a killed writer) is ignored
    touch(out / "generations/r/step_2/a/.greedy-s1.jsonl.k2j3x_9a.tmp")
    touch(out / "generations/r/step_2/b/.greedy-s1.jsonl.zz81qq0p.tmp", age_s=3600)
    # failed: the checkpoint's infer log ends with a traceback -> every task of step_3
    touch(
        tmp_path / "logs/infer/r/step_3.log",
        'loading\nTraceback (most recent call last):\n  File "x", line 1\n'
        "torch.OutOfMemoryError: CUDA out of memory\n\n",
    )
    # a log that ends normally says nothing
    touch(tmp_path / "logs/evaluate/r/step_4/a/greedy-s1.log", "scored 20 samples\n")
    # a one-line user error as the workflow's scripts print it
    touch(tmp_path / "logs/evaluate/r/step_4/b/greedy-s1.log", "ckpteval: error: task x: bad\n")
    # Snakemake's incomplete marker: running while a Snakemake holds the lock, else interrupted
    marker(tmp_path, "results/scores/r/step_5/a/greedy-s1.json")
    touch(tmp_path / ".snakemake/locks/0.output.lock", "results/scores/r/step_5/a/greedy-s1.json\n")
    marker(tmp_path, "results/generations/r/step_6/a/greedy-s1.jsonl")
    # the newest Snakemake log names a failed job's output; an older log is ignored
    touch(
        tmp_path / ".snakemake/log/2026-01-01T000000.000000.snakemake.log",
        textwrap.dedent("""\
        Error in rule evaluate:
            jobid: 9
            output: results/scores/r/step_8/a/greedy-s1.json
        """),
        age_s=100,
    )
    touch(
        tmp_path / ".snakemake/log/2026-01-02T000000.000000.snakemake.log",
        textwrap.dedent("""\
        [Sat Nov 21 06:22:01 2026]
        Error in rule evaluate:
            message: None
            jobid: 2
            output: results/scores/r/step_7/b/greedy-s1.jsonl, results/scores/r/step_7/b/s.json
            log: logs/evaluate/r/step_7/b/greedy-s1.log (check log file(s) for error details)
        Exiting because a job execution failed. Look above for error messages
        """),
    )

    got = states(out, cells)
    assert got == {
        ("step_1", "a"): "done",
        ("step_1", "b"): "missing",
        ("step_2", "a"): "running",
        ("step_2", "b"): "missing",
        ("step_3", "a"): "failed",
        ("step_3", "b"): "failed",
        ("step_4", "a"): "missing",
        ("step_4", "b"): "failed",
        ("step_5", "a"): "running",
        ("step_5", "b"): "missing",
        ("step_6", "a"): "failed",
        ("step_6", "b"): "missing",
        ("step_7", "a"): "missing",
        ("step_7", "b"): "failed",
        ("step_8", "a"): "missing",
        ("step_8", "b"): "missing",
    }
    detail = cell_states(out, cells).set_index(["ckpt", "task"])["detail"]
    assert "logs/infer/r/step_3.log: torch.OutOfMemoryError" in detail[("step_3", "b")]
    assert detail[("step_6", "a")].startswith("interrupted")
    assert detail[("step_7", "b")] == (
        "rule evaluate failed (see logs/evaluate/r/step_7/b/greedy-s1.log)"
    )


def test_a_killed_or_interrupted_job_is_neither_running_nor_done(tmp_path: Path) -> None:
    """Snakemake killed (SIGKILL of the whole tree) while a cell was being scored leaves the
    job's temp file and its incomplete marker: before, status said running for ten minutes
    (the temp file is recent), though no Snakemake was alive. Ctrl-C after the job wrote its
    score cell whole leaves the cell and the marker: before, status said done while `snakemake
    -n` planned the cell again (--rerun-incomplete). While a Snakemake holds the lock, both
    are running."""
    out = tmp_path / "results"
    cells = expected(["step_1", "step_2"], ["a"])
    touch(out / "scores/r/step_1/a/.greedy-s1.jsonl.kx19cblm.tmp")  # the killed writer's
    marker(tmp_path, "results/scores/r/step_1/a/greedy-s1.json")
    touch(out / "scores/r/step_2/a/greedy-s1.json", "{}")  # written whole, then Ctrl-C
    marker(tmp_path, "results/scores/r/step_2/a/greedy-s1.json")
    frame = cell_states(out, cells).set_index("ckpt")
    assert frame["state"].to_dict() == {"step_1": "failed", "step_2": "stale"}
    assert frame["detail"]["step_1"].startswith("interrupted")
    assert "scores it again" in frame["detail"]["step_2"]
    locks = "results/scores/r/step_1/a/greedy-s1.json\nresults/scores/r/step_2/a/greedy-s1.json\n"
    touch(tmp_path / ".snakemake/locks/0.output.lock", locks)  # a live Snakemake's (no owner)
    assert cell_states(out, cells)["state"].tolist() == ["running", "done"]


def test_matrix_folds_variants_and_prints(tmp_path: Path) -> None:
    out = tmp_path / "results"
    cells = expected(["step_10", "step_2"], ["a", "b"], variants=("greedy-s1", "t7-s1"))
    for variant in ("greedy-s1", "t7-s1"):
        touch(out / f"scores/r/step_10/a/{variant}.json", "{}")
    touch(out / "scores/r/step_10/b/greedy-s1.json", "{}")
    touch(out / "scores/r/step_2/a/.t7-s1.json.abcdefgh.tmp")
    touch(tmp_path / "logs/evaluate/r/step_2/b/t7-s1.log", "KeyboardInterrupt\n")

    matrix = status_matrix(out, cells)
    assert list(matrix.index) == [("r", "step_10"), ("r", "step_2")]  # the order given
    assert matrix.to_dict("index") == {
        ("r", "step_10"): {"a": "done", "b": "missing"},
        ("r", "step_2"): {"a": "running", "b": "failed"},
    }
    text = format_status(cell_states(out, cells))
    lines = text.splitlines()
    assert lines[0].split() == ["checkpoint", "a", "b"]
    assert lines[1].split() == ["r/step_10", "(10)", "done", "missing", "1/2"]
    assert lines[2].split() == ["r/step_2", "(2)", "running", "FAILED"]
    assert "3 done, 1 running, 1 failed, 3 missing (8 cells)" in text
    assert "r/step_2/b/t7-s1: " in text and "KeyboardInterrupt" in text


def test_a_cell_with_errored_samples_is_done_but_marked_and_a_failed_self_test_says_why(
    tmp_path: Path,
) -> None:
    import json

    out = tmp_path / "results"
    cells = expected(["step_1", "step_2"], ["gsm"])
    source = "val-core/openai/gsm8k/reward/mean@1"
    cell = {
        "primary_metric": "reward_mean",
        "metrics": {
            "reward_error_rate": {"value": 7 / 12, "stderr": 0.1, "n": 12},
            "pass@1": {"value": 0.25, "stderr": 0.1, "n": 12},
            "reward_mean": {"value": 1.0, "stderr": 0.0, "n": 5, "excludes_errors": 7},
            source: {"value": 1.0, "stderr": 0.0, "n": 2, "excludes_errors": 4},
            "val-core/math/reward/mean@1": {"value": 1.0, "stderr": 0.0, "n": 3},
        },
    }
    touch(out / "scores/r/step_1/gsm/greedy-s1.json", json.dumps(cell))
    why = (
        "ckpteval: error: reward function compute_score of reward.py (self_test: ground_truth) "
        "self-test failed: ground truths as completions (pass_threshold 1) of 3 of 3 problems "
        "did not pass (100: wrong_answer)"
    )
    touch(tmp_path / "logs/evaluate/r/step_2/gsm/greedy-s1.log", f"scoring\n{why}\n")
    frame = cell_states(out, cells).set_index("ckpt")
    assert frame.loc["step_1", "state"] == "done" and frame.loc["step_1", "errors"] == 7
    # what each number does with them, from the cell's own counts: its headline first; the
    # source without errors is not named
    assert frame.loc["step_1", "detail"].endswith(
        "greedy-s1.json: the reward function gave no score for 7 of 12 samples. reward_mean: "
        "mean over the 5 samples that returned a score; 7 of 12 errored and are excluded. "
        "pass@1: its 7 errored samples count as failures. "
        f"{source}: mean over the 2 samples that returned a score; 4 of 6 errored and are excluded"
    )
    assert frame.loc["step_2", "state"] == "failed" and why in frame.loc["step_2", "detail"]
    text = format_status(cell_states(out, cells))
    assert text.splitlines()[1].split() == ["r/step_1", "(1)", "done*"]
    listed = text.split("* done, with errored samples (what each number does with them):")[1]
    assert "r/step_1/gsm/greedy-s1: " in listed and "excluded" in listed
    assert "counted in n" not in text and "never left out" not in text
    touch(out / "scores/r/step_1/gsm/greedy-s1.json", "{}")  # no errors: not marked
    assert cell_states(out, cells).set_index("ckpt").loc["step_1", "errors"] == 0


def test_an_engine_jobs_cells_are_running_while_it_generates(tmp_path: Path) -> None:
    """An engine job's only output is its done file beside the staging directory: while it runs,
    the cells its request names are running (the demo's status showed all six as missing while
    step_450's engine generated them); another task of the checkpoint is not. Without a request
    file every cell of the checkpoint is concerned; with no Snakemake left, it was interrupted."""
    out = tmp_path / "results"
    cells = expected(["step_1", "step_2", "step_3"], ["a", "b"])
    staging = out / "staging/r/step_1"
    request = {"cells": [{"task": "a", "variant": "greedy-s1", "reason": "missing"}]}
    touch(staging / "main.r1.request.json", json.dumps(request))
    marker(tmp_path, "results/staging/r/step_1/main.r1.done")
    marker(tmp_path, "results/staging/r/step_2/main.r1.done")
    locks = "results/staging/r/step_1/main.r1.done\nresults/staging/r/step_2/main.r1.done\n"
    touch(tmp_path / ".snakemake/locks/0.output.lock", locks)
    got = states(out, cells)
    assert got == {
        ("step_1", "a"): "running",
        ("step_1", "b"): "missing",
        ("step_2", "a"): "running",
        ("step_2", "b"): "running",
        ("step_3", "a"): "missing",
        ("step_3", "b"): "missing",
    }
    (tmp_path / ".snakemake/locks/0.output.lock").unlink()
    after = cell_states(out, cells).set_index(["ckpt", "task"])
    assert after.loc[("step_1", "a"), "state"] == "failed"
    assert after.loc[("step_1", "a"), "detail"].startswith("interrupted")
    assert after.loc[("step_1", "b"), "state"] == "missing"


def test_nothing_expected() -> None:
    empty = pd.DataFrame(columns=CELL_COLUMNS)
    assert "No cells expected" in format_status(empty)
    assert matrix_from_cells(empty).empty


SNAKEFILE = """\
rule all:
    input:
        expand("results/scores/r/{ckpt}/t/greedy-s1.json", ckpt=["step_1", "step_2", "step_3"])

rule evaluate:
    output: "results/scores/{run}/{ckpt}/{task}/{variant}.json"
    log: "logs/evaluate/{run}/{ckpt}/{task}/{variant}.log"
    shell:
        '''
        case {wildcards.ckpt} in
          step_2) echo "ValueError: sample 3 is broken" > {log}; exit 1 ;;
          step_3) for i in $(seq 600); do [ -e go ] && break; sleep 0.1; done ;;
        esac
        echo '{{}}' > {output}
        '''
"""


def test_states_during_and_after_a_real_snakemake_run(tmp_path: Path) -> None:
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    cells = expected(["step_1", "step_2", "step_3", "step_4"], ["t"])
    out = tmp_path / "results"
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "-c2", "--keep-going", "--quiet", "all"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        seen_running = False
        while time.monotonic() < deadline and proc.poll() is None:
            if states(out, cells)[("step_3", "t")] == "running":
                seen_running = True
                break
            time.sleep(0.2)
        assert seen_running, "the waiting job never showed as running"
        assert states(out, cells)[("step_4", "t")] == "missing"
    finally:
        (tmp_path / "go").touch()  # let the waiting job finish, whatever happened above
        output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, output  # step_2 failed
    final = cell_states(out, cells).set_index("ckpt")
    assert list(final["state"]) == ["done", "failed", "done", "missing"]
    assert "logs/evaluate/r/step_2/t/greedy-s1.log" in final.loc["step_2", "detail"]


def test_status_command_reads_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for step in (5, 10):
        touch(tmp_path / f"run/step_{step}/DONE")
    (tmp_path / "cfg.yaml").write_text(
        "outdir: results\nruns:\n  r: {path: run, complete_marker: DONE}\ntasks:\n  arith: {}\n"
    )
    touch(tmp_path / "results/scores/r/step_5/arith/greedy-s42.json", "{}")
    touch(tmp_path / "logs/infer/r/step_10.log", "RuntimeError: engine died\n")
    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    add_status_parser(parser.add_subparsers())

    args = parser.parse_args(["status", "--configfile", "cfg.yaml"])
    assert args.func(args) == 1  # a failed cell
    printed = capsys.readouterr().out.splitlines()
    # A score cell without its samples file is damaged: the next run scores it again.
    assert printed[1].split() == ["r/step_5", "(5)", "stale"]
    assert printed[2].split() == ["r/step_10", "(10)", "FAILED"]
    assert "  r/step_5/arith/greedy-s42: damaged (truncated or unreadable)" in printed

    args = parser.parse_args(["status", "--configfile", "nope.yaml"])
    with pytest.raises(UserError, match="nope.yaml"):
        args.func(args)


def test_status_with_an_outdir_elsewhere_reads_snakemakes_files_where_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`outdir: /scratch/...` beside a clone: Snakemake keeps `.snakemake/` and `logs/` in the
    directory it runs in, not beside the outdir, so status run there must read them there (it
    read the outdir's parent, and showed a failed engine job's cells as missing)."""
    project = tmp_path / "clone"
    for step in (5, 10):
        touch(project / f"run/step_{step}/DONE")
    outdir = tmp_path / "scratch" / "results"
    (project / "cfg.yaml").write_text(
        f"outdir: {outdir}\nruns:\n  r: {{path: run, complete_marker: DONE}}\n"
        "tasks:\n  arith: {}\n"
    )
    touch(project / "logs/infer/r/step_10.r1.log", "RuntimeError: engine died\n")
    (project / ".snakemake").mkdir()
    monkeypatch.chdir(project)
    parser = argparse.ArgumentParser()
    add_status_parser(parser.add_subparsers())
    args = parser.parse_args(["status", "--configfile", "cfg.yaml"])
    assert args.func(args) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed[2].split() == ["r/step_10", "(10)", "FAILED"]
    assert printed[1].split() == ["r/step_5", "(5)", "missing"]


# ------------------------------------------------------------ status and `snakemake -n` agree

AGREE_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.split("####")[-1].strip() == str(ground_truth))
"""


def _agree_sweep(root: Path) -> dict:
    """A replayed run (no engine, no model: existing solutions) of two checkpoints x two reward
    tasks of two problems each: four cells, each with its self-test."""
    tasks = {}
    for name in ("a", "b"):
        rows = [
            {
                "data_source": "arith",
                "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
                "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
                "extra_info": {"index": i},
            }
            for i in (1, 2)
        ]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (root / f"{name}.py").write_text(AGREE_REWARD)
        tasks[name] = {
            "problems": str(root / f"{name}.jsonl"),
            "checker": {"reward_function": str(root / f"{name}.py"), "self_test": "ground_truth"},
        }
        for step in (1, 2):
            solutions = root / "sol" / f"step_{step}" / f"{name}.jsonl"
            solutions.parent.mkdir(parents=True, exist_ok=True)
            lines = [{"task_id": str(i), "completion": f"#### {2 * i}"} for i in (1, 2)]
            solutions.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = {"backend": "replay", "solutions": str(root / "sol" / "step_{step}" / "{task}.jsonl")}
    config = small_config(root, runs={"rep": run}, tasks=tasks, seeds=[42])
    write_config(root, config)
    return config


def _planned(work: Path) -> set[tuple[str, str]]:
    """(ckpt, task) of every evaluate job `snakemake -n` plans."""
    dry = dry_snakemake(work)
    assert dry.returncode == 0, dry.stderr[-3000:]
    blocks = re.findall(r"^(?:local)?rule evaluate:\n((?:[ \t]+.*\n)*)", dry.stdout, re.M)
    found = set()
    for block in blocks:
        wildcards = dict(
            item.split("=", 1) for item in re.search(r"wildcards: (.*)", block).group(1).split(", ")
        )
        found.add((wildcards["ckpt"], wildcards["task"]))
    return found


def _to_run(work: Path) -> set[tuple[str, str]]:
    """(ckpt, task) of every cell `ckpteval status` shows as missing or stale."""
    done = forked_main(main, ["status"], work, prog="ckpteval")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    tasks = lines[0].split()[1:]
    found = set()
    for line in lines[1 : lines.index("")]:
        label, _step, *states = line.split()
        ckpt = label.split("/")[1]
        found |= {(ckpt, t) for t, s in zip(tasks, states) if s in ("missing", "stale")}
    return found


@pytest.mark.slow
def test_status_and_a_dry_run_name_the_same_cells_to_rerun(tmp_path: Path) -> None:
    """After an edited reward function, an edited task setting and a deleted score file (each
    undone before the next), `ckpteval status` names as missing or stale exactly the cells
    `snakemake -n` plans to score. Before, status read only whether a score file was there and
    showed the first two as done. One real replayed sweep (no engine: ~50 s on a busy 2-core
    box, most of it Snakemake's parses and the jobs' interpreters), then five forked dry runs
    and status calls (a few seconds each)."""
    config = _agree_sweep(tmp_path)
    proc = run_snakemake(tmp_path)
    assert proc.returncode == 0, why_failed(proc, tmp_path)
    assert _to_run(tmp_path) == _planned(tmp_path) == set()

    reward = tmp_path / "a.py"
    reward.write_text(AGREE_REWARD + "\n# an edit: a new function is a new identity\n")
    assert _to_run(tmp_path) == _planned(tmp_path) == {("step_1", "a"), ("step_2", "a")}
    reward.write_text(AGREE_REWARD)
    assert _to_run(tmp_path) == _planned(tmp_path) == set()

    edited = json.loads(json.dumps(config))
    edited["tasks"]["b"]["limit"] = 1
    write_config(tmp_path, edited)
    assert _to_run(tmp_path) == _planned(tmp_path) == {("step_1", "b"), ("step_2", "b")}
    write_config(tmp_path, config)

    # A generation file rewritten with the same bytes (`-f` on it, from the cache) is newer
    # than its scores, yet Snakemake plans nothing for it (it compares the checksum it recorded
    # for a file under 1 MB); status said stale. New bytes plan it in both.
    generations = tmp_path / "results" / "generations" / "rep" / "step_1" / "a" / "greedy-s42.jsonl"
    later = time.time() + 5
    os.utime(generations, (later, later))
    assert _to_run(tmp_path) == _planned(tmp_path) == set()
    original = generations.read_bytes()
    generations.write_bytes(original.replace(b"####", b"#### ", 1))
    os.utime(generations, (later, later))
    assert _to_run(tmp_path) == _planned(tmp_path) == {("step_1", "a")}
    generations.write_bytes(original)
    os.utime(generations, (later, later))

    (tmp_path / "results" / "scores" / "rep" / "step_2" / "b" / "greedy-s42.json").unlink()
    assert _to_run(tmp_path) == _planned(tmp_path) == {("step_2", "b")}
