"""The workflow's planning (ckpteval.plan) asked without Snakemake: a config's cells, a cell made
stale by an edited reward function, which cells a self-test gates, a checkpoint that waits; and a
run path that finds no checkpoints where results exist, one line at `ckpteval check` and at
`snakemake -n`.

The sweeps are placeholder checkpoints (a directory with its completion marker) whose outputs
are written here as the jobs would write them (identities by ckpteval.contract), so nothing runs
a model: each test takes well under a second, the dry run a few.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import os
import re
import shutil
import time
import tokenize
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, dry_snakemake, forked_main

from ckpteval.checkpoints import hash_source, sync_source_identity
from ckpteval.config import build_plan, validate_config
from ckpteval.contract import generation_identity, model_identity, scoring_identity
from ckpteval.freshness import DAMAGED
from ckpteval.plan.layout import CellKey, Layout
from ckpteval.plan.sweep import SweepPlan
from ckpteval.verbs import Verbs

STEPS = (100, 200)
SUMMARY_FILES = (
    "metrics.parquet metrics.csv metrics.md seeds.csv configs.csv passk.csv errors.csv hacks.csv "
    "truncation.csv deltas.csv flips.csv missing.csv summary.json report.html"
).split()
VARIANT = "greedy-s42"


def make_run(work: Path, steps: tuple[int, ...] = STEPS) -> None:
    """Placeholder checkpoints `run/step_<N>/`, each with its completion marker."""
    for step in steps:
        ckpt = work / "run" / f"step_{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "DONE").touch()
    shutil.copy(REPO / "config/examples/verl/arith_reward.py", work / "reward.py")


def config(work: Path) -> dict[str, Any]:
    """A math task and a verl reward task (which self-tests in a job of its own)."""
    cfg = {
        "outdir": str(work / "results"),
        "runs": {"r": {"path": str(work / "run"), "complete_marker": "DONE"}},
        "tasks": {
            "arith": {},
            "arith_verl": {
                "problems": str(REPO / "config/examples/verl/arith_val.jsonl"),
                "checker": {
                    "reward_function": str(work / "reward.py"),
                    "self_test": "ground_truth",
                },
            },
        },
        "sampling": {"greedy": {"temperature": 0.0, "max_new_tokens": 8}},
        "consolidate": {"smoke": "none"},
    }
    validate_config(cfg)
    return cfg


def sweep(work: Path, **kwargs: Any) -> SweepPlan:
    return SweepPlan(build_plan(config(work), base_dir=work), **kwargs)


def write(path: str, obj: Any, mtime: float) -> None:
    """A job's output file: `obj` as JSON (a string as it is), dated `mtime`."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj) if not isinstance(obj, str) else obj)
    os.utime(path, (mtime, mtime))


def finish(work: Path) -> None:
    """Every output of the sweep as its jobs write them, older along the graph."""
    plan = build_plan(config(work), base_dir=work)
    layout, when = Layout(plan.outdir), time.time() - 3600

    for cell in plan.cell_keys:
        run, ckpt = cell.run, cell.ckpt
        weights = f"w-{ckpt}"
        source = str(plan.checkpoint(run, ckpt).path)
        card = {**model_identity(plan, run, ckpt).record(), "source": source}
        card |= {"weights_sha256": weights, "source_files": hash_source(Path(source))}
        write(layout.manifest(run, ckpt), card, when)
        Path(layout.model_dir(run, ckpt)).mkdir(exist_ok=True)
        manifest = Path(layout.manifest(run, ckpt))
        sync_source_identity(Path(source), Path(layout.source_id(run, ckpt)), manifest)
        text = '{"problem_id": 0, "completion": "42"}\n'
        write(layout.generation(cell), text, when + 1)
        meta = {
            **generation_identity(plan, run, cell.task, cell.variant).record(),
            **{"model_hash": weights, "model_identity": None, "generation_bytes": len(text)},
        }
        write(layout.generation_meta(cell), meta, when + 1)
        write(layout.score_samples(cell), '{"passed": true}\n', when + 2)
        scoring = scoring_identity(plan, run, cell.task, cell.variant).settings
        names = {"run": run, "ckpt": ckpt, "task": cell.task, "variant": cell.variant}
        write(layout.score(cell), {**names, "scoring": scoring, "metrics": {"acc": 1.0}}, when + 2)
    # the aggregate job's build (with the params it was built with), then rule summary's copy
    write(layout.summary_params(), SweepPlan(plan).aggregate_params(), when + 3)
    for name in SUMMARY_FILES:
        write(layout.summary_staged(name), "{}", when + 3)
        write(layout.summary(name), "{}", when + 4)
    for summary in (layout.summary_staged("plots"), layout.summary("plots")):
        write(f"{summary}/arith-steps.png", "png", when + 4)


def test_the_cells_of_a_config_and_their_files(tmp_path: Path) -> None:
    """Every checkpoint x task x variant, in step order, each file named once by the layout."""
    make_run(tmp_path)
    planned = sweep(tmp_path)
    assert planned.cells() == tuple(
        CellKey("r", f"step_{s}", t, VARIANT) for s in STEPS for t in ("arith", "arith_verl")
    )
    cell = CellKey("r", "step_100", "arith", VARIANT)
    out = tmp_path / "results"
    assert planned.layout.score(cell) == f"{out}/scores/r/step_100/arith/{VARIANT}.json"
    assert f"{out}/generations/r/step_200/arith_verl/{VARIANT}.meta.json" in planned.cell_files()
    assert len(planned.cell_files()) == 4 * 2  # per cell: its meta and its score cell
    assert [planned.stale(c).reason for c in planned.cells()] == ["missing"] * 4


def test_one_selftest_gates_the_reward_cells_to_score(tmp_path: Path) -> None:
    """A fresh sweep: both reward cells wait for one self-test verdict, the math cells for none
    (their checker self-tests in its evaluate job); a finished sweep gates nothing, unless the
    invocation forces evaluate."""
    make_run(tmp_path)
    gates = sweep(tmp_path).gates()
    [(verdict, cells)] = gates.items()
    assert verdict.startswith(f"{tmp_path}/results/staging/selftest/arith_verl.")
    assert cells == [CellKey("r", f"step_{s}", "arith_verl", VARIANT) for s in STEPS]
    finish(tmp_path)
    finished = sweep(tmp_path)
    assert [finished.rescored(c) for c in finished.cells()] == [None] * 4
    assert finished.gates() == {}
    forced = sweep(tmp_path, verbs=lambda: Verbs(rules=frozenset({"evaluate"})))
    assert list(forced.gates().values()) == [cells]


def test_an_edited_reward_function_restales_its_cells_only(tmp_path: Path) -> None:
    """A changed reward function rescores its task's cells, says why, and gates them on the
    self-test of the new function; the other task's cells stay current."""
    make_run(tmp_path)
    finish(tmp_path)
    reward = tmp_path / "reward.py"
    reward.write_text(reward.read_text() + "\n# a changed reward\n")
    planned = sweep(tmp_path)
    why = {c.task: planned.rescored(c) for c in planned.cells()}
    assert why["arith"] is None
    assert why["arith_verl"] and "reward_function" in why["arith_verl"], why
    [(verdict, cells)] = planned.gates().items()
    assert {c.task for c in cells} == {"arith_verl"} and len(cells) == len(STEPS)
    assert any("scores of arith_verl (2 cells)" in line for line in planned.rerun_lines())


def test_a_checkpoint_being_written_waits(tmp_path: Path) -> None:
    """A checkpoint without its completion marker, changed just now, waits: not a cell yet."""
    make_run(tmp_path)
    (tmp_path / "run" / "step_300").mkdir()
    (tmp_path / "run" / "step_300" / "model.safetensors").write_bytes(b"half")
    planned = sweep(tmp_path)
    assert planned.waiting() == ["r/step_300"]
    assert {c.ckpt for c in planned.cells()} == {"step_100", "step_200"}


@pytest.mark.parametrize("where", ["empty", "parent"])
def test_a_run_path_that_finds_no_checkpoints_where_results_exist_is_one_line(
    tmp_path: Path, where: str
) -> None:
    """A wrong run path (an empty directory, the run's parent) in a project with results: one
    line at `ckpteval check` and at `snakemake -n`, naming where it looked, what is there and
    how many checkpoints of the run have results; no traceback, a non-zero exit."""
    make_run(tmp_path)
    finish(tmp_path)
    cfg = config(tmp_path)
    (tmp_path / "empty").mkdir()
    cfg["runs"]["r"]["path"] = str(tmp_path / "empty" if where == "empty" else tmp_path)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))
    from ckpteval.cli import main

    check = forked_main(main, ["check"], tmp_path)
    dry = dry_snakemake(tmp_path)
    for proc in (check, dry):
        assert proc.returncode != 0
        assert "Traceback" not in proc.stderr and "Exception" not in proc.stderr, proc.stderr
        # Snakemake's own line about the profiles it uses aside, one line
        [line] = [s for s in proc.stderr.splitlines() if s.startswith("ckpteval:")]
        assert line.startswith("ckpteval: error: config: runs.r.path: no checkpoint in "), line
        assert f"has results for {len(STEPS)} checkpoint(s) of run r" in line
        assert ("(it is empty)" if where == "empty" else "(it holds config, empty, ") in line


def test_a_deleted_plot_is_published_again(tmp_path: Path) -> None:
    """The plots are a directory output, which Snakemake sees only as a whole: a plot deleted
    from the published summary is a redo input of rule summary, which publishes the build
    again (and nothing else runs); a finished sweep plans nothing."""
    make_run(tmp_path)
    finish(tmp_path)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump(config(tmp_path)))
    assert sweep(tmp_path).summary_redo() is None
    plot = Path(sweep(tmp_path).layout.summary("plots")) / "arith-steps.png"
    plot.unlink()
    assert sweep(tmp_path).summary_redo() is not None
    dry = dry_snakemake(tmp_path)
    assert dry.returncode == 0, dry.stderr[-3000:]
    stats = dry.stdout.split("Job stats:", 1)[1].split("total", 1)[0]
    assert dict(re.findall(r"^(\w+)\s+(\d+)\s*$", stats, re.M)) == {
        "all": "1",
        "redo": "1",
        "summary": "1",
    }


def test_a_score_cell_copied_from_another_cell_is_redone(tmp_path: Path) -> None:
    """A score cell copied over another one (its neighbour checkpoint's, or another task's)
    parses and is newer than its inputs: before, `ckpteval status` called it done, `snakemake
    -n` planned only the summary, which then showed one checkpoint's scores twice and the other
    not at all (or, with `cp -p` from another task, status and the rerun line said stale and
    Snakemake planned nothing, for good). It is redone like a damaged cell."""
    from ckpteval.freshness import ANOTHER_CELL

    make_run(tmp_path)
    finish(tmp_path)
    planned = sweep(tmp_path)
    cell, other = (CellKey("r", f"step_{s}", "arith", VARIANT) for s in STEPS)
    for source in (other, CellKey("r", "step_100", "arith_verl", VARIANT)):
        copied = {"run": source.run, "ckpt": source.ckpt, "task": source.task}
        copied |= {"variant": source.variant, "scoring": {"n": 1}, "metrics": {}}
        Path(planned.layout.score(cell)).write_text(json.dumps(copied))
        planned = sweep(tmp_path)
        assert planned.rescored(cell) == ANOTHER_CELL
        assert planned.fresh.rescore_reason(cell, copied) == ANOTHER_CELL  # as status asks
        assert planned.evaluate_inputs(cell)["redo"] in planned.redo_targets()
        assert [planned.rescored(c) for c in planned.cells() if c != cell] == [None] * 3
    own = {"run": "r", "ckpt": "step_100", "task": "arith", "variant": VARIANT}
    scoring = scoring_identity(planned.plan, "r", "arith", VARIANT).settings
    Path(planned.layout.score(cell)).write_text(json.dumps({**own, "scoring": scoring}))
    assert sweep(tmp_path).rescored(cell) == DAMAGED  # no metrics: not a score cell
    Path(planned.layout.score(cell)).write_text(
        json.dumps({**own, "scoring": scoring, "metrics": {}})
    )
    assert sweep(tmp_path).rescored(cell) is None


def test_a_score_cell_that_is_no_score_cell_is_redone(tmp_path: Path) -> None:
    """`{}`, or a cell that lacks what every evaluate job records (the cell's names, its
    scoring settings, its metrics), parses as JSON: before, no field was held against it, so
    status called `{}` done, `snakemake -n` planned nothing, and the summary read it. It is
    redone like a damaged cell, by the plan and as status asks."""
    make_run(tmp_path)
    finish(tmp_path)
    planned = sweep(tmp_path)
    cell = CellKey("r", f"step_{STEPS[0]}", "arith", VARIANT)
    whole = json.loads(Path(planned.layout.score(cell)).read_text())
    forged = [{}, [], {k: v for k, v in whole.items() if k != "metrics"}]
    forged += [{**whole, "scoring": None}, {k: v for k, v in whole.items() if k != "variant"}]
    for body in forged:
        Path(planned.layout.score(cell)).write_text(json.dumps(body))
        planned = sweep(tmp_path)
        assert planned.rescored(cell) == DAMAGED, body
        if isinstance(body, dict):
            assert planned.fresh.rescore_reason(cell, body) == DAMAGED  # as status asks
        assert planned.evaluate_inputs(cell)["redo"] in planned.redo_targets()
        assert [planned.rescored(c) for c in planned.cells() if c != cell] == [None] * 3
    Path(planned.layout.score(cell)).write_text(json.dumps(whole))
    assert sweep(tmp_path).rescored(cell) is None


def _damage_score(layout: Layout, cell: CellKey, cfg: dict[str, Any], work: Path) -> None:
    Path(layout.score(cell)).write_text('{"scoring": ')


def _edit_reward(layout: Layout, cell: CellKey, cfg: dict[str, Any], work: Path) -> None:
    reward = work / "reward.py"
    reward.write_text(reward.read_text() + "\n# a changed reward\n")


def _change_task_setting(layout: Layout, cell: CellKey, cfg: dict[str, Any], work: Path) -> None:
    cfg["tasks"]["arith_verl"]["system_prompt"] = "Answer with a number."


def _newer_generations(layout: Layout, cell: CellKey, cfg: dict[str, Any], work: Path) -> None:
    later = time.time()
    os.utime(layout.generation(cell), (later, later))


@pytest.mark.parametrize(
    "change", [_damage_score, _edit_reward, _change_task_setting, _newer_generations]
)
def test_the_selftest_gate_and_a_deleted_checkpoints_kept_scores_agree(
    tmp_path: Path, change: Any
) -> None:
    """A live cell waits for its self-test exactly when the same change leaves a deleted
    checkpoint's cell out of the summary, for the same reason (`Freshness.rescore_reason`, the
    one function both ask): before the change both are current, after it neither is."""
    make_run(tmp_path)
    finish(tmp_path)
    shutil.rmtree(tmp_path / "run" / "step_200")  # its results stay: a deleted checkpoint
    live = CellKey("r", "step_100", "arith_verl", VARIANT)
    gone = CellKey("r", "step_200", "arith_verl", VARIANT)
    cfg = config(tmp_path)
    current = SweepPlan(build_plan(cfg, base_dir=tmp_path))
    assert current.plan.deleted and live in current.cells() and gone not in current.cells()
    assert current.selftest_input(live) is None
    assert current.layout.score(gone) in current.kept_deleted_cells()
    for cell in (live, gone):
        change(current.layout, cell, cfg, tmp_path)
    warnings: list[str] = []
    planned = SweepPlan(build_plan(cfg, base_dir=tmp_path), warn=warnings.append)
    why = planned.rescored(live)
    assert why is not None and planned.selftest_input(live) is not None
    assert planned.layout.score(gone) not in planned.kept_deleted_cells()
    [warning] = warnings
    assert f"({why.replace('step_100', 'step_200')})" in warning, (why, warning)


# ------------------------------------------------------------ Layout: the one place a path is spelled

#: The directories under `outdir` that `Layout` spells (the first name after `out` in each of
#: its paths, and the publish ledgers' under `summary`), and the names its helpers add beside
#: a file a job is given.
STEP_DIRS = "models sources generations scores staging cache assist summary published".split()
SUFFIXES = (".meta.json", ".request.json")
IN_FSTRING = (".done", ".claim")  # a round's done file, a staging directory's lock


def _spells(piece: str, formatted: bool) -> bool:
    """Whether a string literal's text (an f-string's text with `{}` for its fields) spells a
    path under `outdir`: a step directory between slashes or at a path's start, or a name
    `Layout`'s helpers put beside a file. Logs are not under `outdir` (`logs/<rule>/...`)."""
    if piece.startswith("logs/"):
        return False
    if any(re.search(rf"(?:^|/){step}/", piece) for step in STEP_DIRS):
        return True
    if any(s in piece for s in SUFFIXES):
        return True
    return formatted and piece.endswith(IN_FSTRING)


def _text(node: ast.expr) -> tuple[str, bool] | None:
    """A str constant's text, or an f-string's with `{}` for its fields (and True)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value, False
    if isinstance(node, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in node.values]
        return "".join(map(str, parts)), True
    return None


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant | ast.JoinedStr):
                found.add(id(body[0].value))
    return found


def _python_spellings(path: Path, source: str) -> list[str]:
    tree = ast.parse(source)
    skip, hits = _docstrings(tree), []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.JoinedStr):
            for value in node.values:  # its pieces are walked too: not again as constants
                skip.add(id(value))
        text = _text(node) if isinstance(node, ast.expr) else None
        if text is not None and _spells(*text):
            hits.append(f"{path}:{node.lineno}: {text[0]!r}")
        # `out / "scores"`: a step directory joined on as a path component
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            for side in (node.left, node.right):
                if isinstance(side, ast.Constant) and side.value in STEP_DIRS:
                    hits.append(f"{path}:{node.lineno}: / {side.value!r}")
    return hits


def _snakemake_spellings(path: Path, source: str) -> list[str]:
    """The same over a Snakemake file's string tokens (not Python: its rules are not
    statements `ast` reads), a function's docstring (the first string of its body) left out."""
    hits, in_header, docstring_next = [], False, False
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE):
            continue
        if tok.type == tokenize.STRING and not docstring_next:
            text = _text(ast.parse(tok.string, mode="eval").body)
            if text is not None and _spells(*text):
                hits.append(f"{path}:{tok.start[0]}: {text[0]!r}")
        docstring_next = in_header and tok.type == tokenize.INDENT
        in_header = (in_header and not docstring_next) or (tok.type, tok.string) == (
            tokenize.NAME,
            "def",
        )
    return hits


def path_spellings(root: Path) -> list[str]:
    """Every string in the code of the package and the workflow under `root`, outside
    `plan/layout.py`, that spells a path under `outdir` (docstrings and comments may name
    paths: they are prose)."""
    package = root / "src" / "ckpteval"
    hits = []
    for path in sorted(package.rglob("*.py")):
        if path != package / "plan" / "layout.py":
            hits += _python_spellings(path.relative_to(root), path.read_text())
    for path in sorted((root / "workflow").rglob("*.py")):
        hits += _python_spellings(path.relative_to(root), path.read_text())
    for path in [root / "Snakefile", *sorted((root / "workflow").rglob("*.smk"))]:
        hits += _snakemake_spellings(path.relative_to(root), path.read_text())
    return hits


def test_layout_is_the_only_place_a_results_path_is_spelled() -> None:
    """A path template spelled a second time drifts from Layout's (the score-cell path was once
    written out eight times); the rules, the verbs, the engine jobs and the report ask Layout."""
    assert path_spellings(REPO) == []


def test_the_spelling_check_finds_a_path_spelled_by_hand(tmp_path: Path) -> None:
    """The check above is no check if it cannot fail: each way of spelling a path by hand that
    the package once had is found; prose and names that merely resemble one are not."""
    package = tmp_path / "src" / "ckpteval"
    package.mkdir(parents=True)
    (tmp_path / "workflow" / "rules").mkdir(parents=True)
    (tmp_path / "Snakefile").write_text('include: "workflow/rules/x.smk"\n')
    (package / "by_hand.py").write_text(
        '"""Reads `scores/{run}/{ckpt}/{task}/{variant}.json` (prose)."""\n'
        "def cell(out, rel):\n"
        '    """Under `out/scores/`: prose."""\n'
        '    return f"{out}/scores/{rel}.json"\n'
        "def meta(base):\n"
        '    return base.with_suffix(".meta.json")\n'
        "def memo(outdir):\n"
        '    return outdir / "sources" / "content.json"\n'
        "def done(staging, token):\n"
        '    return staging.with_name(f"{staging.name}.{token}.done")\n'
        'EFFECTS = ("summary", "scores")  # names, not paths\n'
        'HTML = "<details><summary>prompt</summary></details>"\n'
    )
    (tmp_path / "workflow" / "rules" / "x.smk").write_text(
        "def get_x(wildcards):\n"
        '    """The file under results/scores/ (prose)."""\n'
        "    return 1\n\n\n"
        "rule redo:\n"
        "    output:\n"
        '        f"{OUT}/staging/redo/{{key}}",\n'
        "    log:\n"
        '        "logs/redo/{key}.log",\n'
    )
    hits = [hit.split(": ", 1)[0] for hit in path_spellings(tmp_path)]
    assert hits == [
        "src/ckpteval/by_hand.py:4",
        "src/ckpteval/by_hand.py:6",
        "src/ckpteval/by_hand.py:8",
        "src/ckpteval/by_hand.py:10",
        "workflow/rules/x.smk:8",
    ]


def test_a_replay_runs_solution_files_are_read_by_content(tmp_path: Path) -> None:
    """`runs.*.solutions` counts by content (its hash is in the model card): the replay job's
    solution files are `ByContent` inputs (`ancient` in common.smk). Before, a touched
    solutions file (or one copied without -p, same bytes) replayed and rescored its cell in
    `snakemake -n` while `ckpteval status` called every cell done."""
    from ckpteval.plan.sweep import ByContent

    for step in (1, 2):
        sol = tmp_path / "sol" / f"step_{step}" / "arith.jsonl"
        sol.parent.mkdir(parents=True)
        sol.write_text(json.dumps({"task_id": "arith/0", "completion": " #### 13"}) + "\n")
    cfg = {
        "outdir": str(tmp_path / "results"),
        "runs": {"rep": {"backend": "replay", "solutions": "sol/step_{step}/{task}.jsonl"}},
        "tasks": {"arith": {}},
    }
    validate_config(cfg)
    planned = SweepPlan(build_plan(cfg, base_dir=tmp_path))
    files = [f for cell in planned.cells() for f in planned.solutions(cell)]
    assert len(files) == 2 and all(isinstance(f, ByContent) for f in files), files


def _solutions(work: Path, task: str, steps: tuple[int, ...], answer: int = 0) -> None:
    for step in steps:
        sol = work / "sol" / f"step_{step}" / f"{task}.jsonl"
        sol.parent.mkdir(parents=True, exist_ok=True)
        line = {"task_id": f"{task}/0", "completion": f" #### {step + answer}"}
        sol.write_text(json.dumps(line) + "\n")


def _replay_sweep(work: Path, tasks: tuple[str, ...] = ("arith",)) -> dict[str, Any]:
    """A finished replay sweep of `tasks` at steps 1 and 2, its files as the jobs write them
    (model card, generation file and meta, score cell, the summary), older along the graph."""
    for task in tasks:
        _solutions(work, task, (1, 2))
    cfg = {
        "outdir": str(work / "results"),
        "runs": {"rep": {"backend": "replay", "solutions": "sol/step_{step}/{task}.jsonl"}},
        "tasks": dict.fromkeys(tasks, {}),
    }
    validate_config(cfg)
    (work / "config").mkdir()
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))
    plan = build_plan(cfg, base_dir=work)
    layout, when = Layout(plan.outdir), time.time() - 3600

    for cell in plan.cell_keys:
        card = {**model_identity(plan, cell.run, cell.ckpt).record(), "identity_sha256": "c"}
        write(layout.manifest(cell.run, cell.ckpt), {**card, "weights_sha256": None}, when)
        text = json.dumps({"task_id": "arith/0", "completion": cell.ckpt}) + "\n"
        write(layout.generation(cell), text, when + 1)
        meta = generation_identity(plan, cell.run, cell.task, cell.variant).record()
        meta |= {"model_hash": None, "model_identity": "c", "generation_bytes": len(text)}
        meta["solutions_id"] = plan.solutions_id(cell)
        write(layout.generation_meta(cell), meta, when + 1)
        write(layout.score_samples(cell), '{"passed": true}\n', when + 2)
        scoring = scoring_identity(plan, cell.run, cell.task, cell.variant).settings
        names = {"run": cell.run, "ckpt": cell.ckpt, "task": cell.task, "variant": cell.variant}
        write(layout.score(cell), {**names, "scoring": scoring, "metrics": {}}, when + 2)
    write(layout.summary_params(), SweepPlan(plan).aggregate_params(), when + 3)
    for name in SUMMARY_FILES:
        write(layout.summary_staged(name), "{}", when + 3)
        write(layout.summary(name), "{}", when + 4)
    for summary in (layout.summary_staged("plots"), layout.summary("plots")):
        write(f"{summary}/arith-steps.png", "png", when + 4)
    return cfg


def _gone_generation(layout: Layout, cell: CellKey) -> None:
    Path(layout.generation(cell)).unlink()


def _truncated_generation(layout: Layout, cell: CellKey) -> None:
    Path(layout.generation(cell)).write_text("")


def _unreadable_meta(layout: Layout, cell: CellKey) -> None:
    Path(layout.generation_meta(cell)).write_text("{")


def _gone_model_card(layout: Layout, cell: CellKey) -> None:
    Path(layout.manifest(cell.run, cell.ckpt)).unlink()


def _copied_from_another_checkpoint(layout: Layout, cell: CellKey) -> None:
    other = CellKey(cell.run, "step_2", cell.task, cell.variant)
    for path in (layout.generation, layout.generation_meta):
        shutil.copy2(path(other), path(cell))
    meta = json.loads(Path(layout.generation_meta(cell)).read_text())
    meta["model_identity"] = "another card"
    Path(layout.generation_meta(cell)).write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "damage",
    [
        _gone_generation,
        _truncated_generation,
        _unreadable_meta,
        _gone_model_card,
        _copied_from_another_checkpoint,
    ],
)
def test_a_replay_cells_stale_generation_is_replayed(tmp_path: Path, damage: Any) -> None:
    """A replay job has no engine job to request its cells: Snakemake replays a cell only for a
    missing meta, a changed param or a newer input. Before, each damage here made the plan and
    `ckpteval status` call the cell stale while `snakemake -n` planned nothing (or, for a
    truncated file, scored it as it was), run after run. Now the replay job gets a redo input,
    and the plan and Snakemake agree."""
    cfg = _replay_sweep(tmp_path)
    cell = CellKey("rep", "step_1", "arith", VARIANT)
    assert SweepPlan(build_plan(cfg, base_dir=tmp_path)).replay_redo(cell) is None
    damage(Layout(str(tmp_path / "results")), cell)
    planned = SweepPlan(build_plan(cfg, base_dir=tmp_path))
    assert planned.rescored(cell) is not None
    redo = planned.replay_redo(cell)
    assert redo is not None and redo in planned.redo_targets()
    assert [planned.replay_redo(c) for c in planned.cells() if c != cell] == [None]
    if damage is _unreadable_meta:  # one dry run: Snakemake replays and rescores the cell
        dry = dry_snakemake(tmp_path)
        assert dry.returncode == 0, dry.stderr[-3000:]
        stats = dry.stdout.split("Job stats:", 1)[1].split("total", 1)[0]
        jobs = dict(re.findall(r"^(\w+)\s+(\d+)\s*$", stats, re.M))
        assert {k: jobs.get(k) for k in ("redo", "replay", "evaluate")} == dict.fromkeys(
            ("redo", "replay", "evaluate"), "1"
        ), jobs


def test_a_replay_cells_own_files_decide_it(tmp_path: Path) -> None:
    """A replay cell counts its own files by content (the replay job's `solutions` param, in
    its meta). Before, the model card held every task's files: a task added to the config, or
    one task's new file, rewrote the card and replayed and rescored every cell of the step."""
    from ckpteval.freshness import NEW_SOLUTIONS

    cfg = _replay_sweep(tmp_path)
    arith = {s: CellKey("rep", f"step_{s}", "arith", VARIANT) for s in (1, 2)}
    changed = tmp_path / "sol" / "step_1" / "arith.jsonl"
    os.utime(changed)  # the same bytes, newer: nothing
    planned = SweepPlan(build_plan(cfg, base_dir=tmp_path))
    assert [planned.rescored(c) for c in planned.cells()] == [None, None]
    _solutions(tmp_path, "arith", (1,), answer=5)  # new bytes at step 1: that cell alone
    planned = SweepPlan(build_plan(cfg, base_dir=tmp_path))
    stale = planned.fresh.stale(arith[1])
    assert stale is not None and stale.reason == NEW_SOLUTIONS
    assert planned.replay_redo(arith[1]) in planned.redo_targets()  # whatever .snakemake/ holds
    assert planned.fresh.stale(arith[2]) is None and planned.rescored(arith[2]) is None
    assert planned.fresh.model_change("rep", "step_1") is None  # the model card stays
    # a task added: its own cells are new, the others' stay done
    _solutions(tmp_path, "arith", (1,))
    _solutions(tmp_path, "math_qwen", (1, 2))
    cfg["tasks"]["math_qwen"] = {}
    validate_config(cfg)
    planned = SweepPlan(build_plan(cfg, base_dir=tmp_path))
    assert {c: planned.rescored(c) for c in arith.values()} == dict.fromkeys(arith.values())
    new = [c for c in planned.cells() if c.task == "math_qwen"]
    assert len(new) == 2 and all(planned.fresh.stale(c).reason == "missing" for c in new)
    assert [planned.fresh.model_change("rep", f"step_{s}") for s in (1, 2)] == [None, None]


def test_a_replay_step_whose_files_go_keeps_its_scores_and_one_lacking_a_task_is_said(
    tmp_path: Path,
) -> None:
    """A replay step whose files are all gone keeps its scores in the summary, marked as a
    deleted checkpoint's are; a step that lacks one task's file is waiting, then broken, as a
    checkpoint being written is. Before, both dropped out of the plan and the report without a
    word (the summary lost the gone step's scores)."""
    cfg = _replay_sweep(tmp_path)
    gone = CellKey("rep", "step_2", "arith", VARIANT)
    shutil.rmtree(tmp_path / "sol" / "step_2")
    plan = build_plan(cfg, base_dir=tmp_path)
    assert [c.name for c in plan.runs["rep"].checkpoints] == ["step_1"]
    assert [(c.name, c.deleted) for c in plan.deleted["rep"]] == [("step_2", True)]
    planned = SweepPlan(plan)
    kept = [dataclasses.replace(gone, ckpt="step_1"), gone]
    assert planned.score_files() == [planned.layout.score(c) for c in kept]
    # a step with one task's file of two: waiting, then (settled) broken, never silent
    _solutions(tmp_path, "arith", (1, 3))
    _solutions(tmp_path, "math_qwen", (1,))
    cfg["tasks"]["math_qwen"] = {}
    validate_config(cfg)
    plan = build_plan(cfg, base_dir=tmp_path)
    assert [c.name for c in plan.runs["rep"].checkpoints] == ["step_1"]
    [line] = plan.waiting_lines()
    assert line.startswith("run rep: checkpoint step_3 waiting: being written (no file ")
    assert "math_qwen.jsonl yet" in line
    # step 2 (files gone) keeps its arith scores, and so would step 3 once scored
    assert [c.name for c in plan.deleted["rep"]] == ["step_2"]
    assert SweepPlan(plan).score_files()[-1] == planned.layout.score(gone)
    cfg["runs"]["rep"]["settle_seconds"] = 0
    [line] = build_plan(cfg, base_dir=tmp_path).broken_lines()
    assert "checkpoint step_3 looks broken" in line and "math_qwen.jsonl" in line
    # as the aggregate job's param: no path of this machine (a moved project rebuilds nothing)
    [line] = build_plan(cfg, base_dir=tmp_path).broken_lines(age=False)
    assert str(tmp_path) not in line and "step_3/math_qwen.jsonl" in line, line


def _snakemake_record(work: Path, output: str) -> None:
    """A record of the job that wrote `output` where Snakemake keeps it (.snakemake/metadata/,
    the path in base64: names here stay under the file system's 255)."""
    import base64

    name = base64.urlsafe_b64encode(output.encode()).decode()
    write(str(work / ".snakemake" / "metadata" / name), {"params": "..."}, time.time())


def test_a_changed_setting_is_redone_when_snakemake_has_no_record_of_its_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Snakemake reruns a job for a changed param only when its metadata (.snakemake/) holds
    the old one: with .snakemake/ removed (the usual cure for a stale lock) or a project copied
    without it, a changed scoring setting, model setting or summary title planned nothing,
    while the rerun line and `ckpteval status` said the cells would be rescored, run after run.
    The plan compares what each output records (a score cell's `scoring`, a model card's
    identity, the build's params) and gives the job a redo input when Snakemake has no record.
    With a record, Snakemake sees the change itself, and the plan adds nothing."""
    monkeypatch.chdir(tmp_path)  # Snakemake's working directory: where .snakemake/ is
    make_run(tmp_path)
    finish(tmp_path)
    planned = sweep(tmp_path)
    assert planned.redo_targets() == [] and planned.aggregate_redo() == {}
    cfg = config(tmp_path)
    cfg["evaluate"] = {"ks": [1, 2]}
    cfg["consolidate"] = {"dtype": "float32"}
    cfg["aggregate"] = {"title": "Another"}
    validate_config(cfg)
    planned = SweepPlan(build_plan(cfg, base_dir=tmp_path))
    cells = planned.cells()
    assert all(planned.score_redo(c) for c in cells)
    assert all(planned.model_redo("r", f"step_{s}") for s in STEPS)
    assert planned.aggregate_redo()["redo"] in planned.redo_targets()
    assert len(planned.redo_targets()) == len(cells) + len(STEPS) + 1
    # Snakemake's records of the jobs: it sees each change itself
    for cell in cells:
        _snakemake_record(tmp_path, planned.layout.score(cell))
    for step in STEPS:
        _snakemake_record(tmp_path, planned.layout.manifest("r", f"step_{step}"))
    _snakemake_record(tmp_path, planned.layout.summary_staging())
    planned = SweepPlan(build_plan(cfg, base_dir=tmp_path))
    assert planned.redo_targets() == [] and planned.aggregate_redo() == {}
    assert all(planned.rescored(c) for c in cells)  # stale all the same: a param says so


def test_a_model_card_rewritten_alike_rescores_nothing(tmp_path: Path) -> None:
    """A model card newer than its scores with the bytes they were scored with (`-f` on it,
    a touch): Snakemake compares the checksum it recorded and plans nothing, so neither may the
    plan (before, `ckpteval status` called every cell of the checkpoint stale, for good). The
    score cell records the card's sha256; a cell without that record (scored before it was
    recorded), or with other bytes, goes by the modification time as Snakemake's does."""
    from ckpteval.io import sha256_file

    make_run(tmp_path)
    finish(tmp_path)
    layout = sweep(tmp_path).layout
    for step, recorded in ((100, True), (200, False)):
        card = layout.manifest("r", f"step_{step}")
        for task in ("arith", "arith_verl"):
            score = Path(layout.score(CellKey("r", f"step_{step}", task, VARIANT)))
            cell = json.loads(score.read_text())
            if recorded:
                cell["manifest_sha256"] = sha256_file(card)
            mtime = score.stat().st_mtime
            score.write_text(json.dumps(cell))
            os.utime(score, (mtime, mtime))
        os.utime(card)  # touched: newer than its scores, same bytes
    planned = sweep(tmp_path)
    why = {(c.ckpt, c.task): planned.rescored(c) for c in planned.cells()}
    assert why[("step_100", "arith")] is None and why[("step_100", "arith_verl")] is None
    assert "is newer than its scores" in why[("step_200", "arith")]
    card = Path(layout.manifest("r", "step_100"))
    card.write_text(card.read_text() + " ")  # other bytes: Snakemake reruns, and so the plan
    assert "is newer than its scores" in sweep(tmp_path).rescored(
        CellKey("r", "step_100", "arith", VARIANT)
    )


def test_a_damaged_self_test_verdict_is_made_again_when_a_cell_waits_for_it(
    tmp_path: Path,
) -> None:
    """A verdict that does not parse (truncated, overwritten) exists, so Snakemake never made
    it again: before, every evaluate job of its task that was rescored failed on it (a
    JSONDecodeError in its log), run after run. It gets a redo input when a cell this
    invocation scores waits for it, and none when no cell does."""
    make_run(tmp_path)
    finish(tmp_path)
    forced = sweep(tmp_path, verbs=lambda: Verbs(rules=frozenset({"evaluate"})))
    [verdict] = forced.gates()
    Path(verdict).parent.mkdir(parents=True, exist_ok=True)
    Path(verdict).write_text('{"self_test": ')
    [(task, key)] = forced.selftest_identities()
    assert forced.selftest_redo(task, key) in forced.redo_targets()
    assert forced.selftest_redo_input(task, key) == {"redo": forced.selftest_redo(task, key)}
    assert sweep(tmp_path).selftest_redo(task, key) is None  # no cell waits for it
    Path(verdict).write_text("{}")
    forced = sweep(tmp_path, verbs=lambda: Verbs(rules=frozenset({"evaluate"})))
    assert forced.selftest_redo(task, key) is None
