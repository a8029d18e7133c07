"""The plots and the self-contained HTML report."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import msgspec
import pandas as pd
import pytest
from test_aggregate import write_cell

from ckpteval.aggregate.training import TRAINING_COLUMNS
from ckpteval.report import _steps_figure, write_plots
from ckpteval.report.page import page_data
from ckpteval.report.plots import _excluding, _training_plots
from ckpteval.report.samples import decode_blob
from ckpteval.summary import build_summary, summarize

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
UNCOUNTED = "CPU time of child processes the kernel reaps itself (SIGCHLD ignored)"


def _cell(
    root: Path,
    run: str,
    ckpt: str,
    step: int,
    task: str,
    variant: str,
    passes: list[int],
    samples: int,
    *,
    is_baseline: bool = False,
) -> Path:
    """A cell whose problem i passes its first passes[i] samples; code tasks report pass@k."""
    sampling, seed = variant.rsplit("-s", 1)
    cell_dir = root / "scores" / run / ckpt / task
    cell_dir.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "task_id": f"p{i}",
            "sample_idx": s,
            "passed": s < n,
            "score": float(s < n),
            "error_type": None if s < n else "wrong_answer",
        }
        for i, n in enumerate(passes)
        for s in range(samples)
    ]
    (cell_dir / f"{variant}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    value = sum(passes) / (len(passes) * samples)
    name = "pass@1" if task == "code" else "accuracy"
    metrics = {name: {"value": value, "stderr": 0.05, "n": len(passes)}}
    failures = len(rows) - sum(passes)
    cell = {
        "run": run,
        "ckpt": ckpt,
        "step": step,
        "task": task,
        "variant": variant,
        "sampling": sampling,
        "seed": int(seed),
        "is_baseline": is_baseline,
        "scorer_version": "v1",
        "model_hash": "h",
        "metrics": metrics,
        "error_types": {"wrong_answer": failures - failures // 2, "compile_error": failures // 2}
        if task == "code"
        else {},
    }
    if task == "code":  # scored in a sandbox, here one run by a user who is not root
        cell.update(sandbox="bwrap", sandbox_mode="rootless", sandbox_uncounted=UNCOUNTED)
    path = cell_dir / f"{variant}.json"
    path.write_text(json.dumps(cell))
    return path


@pytest.fixture
def sweep(tmp_path: Path) -> list[Path]:
    """Two runs (only one with a baseline), a code task (4 samples) and a math task; run `with`
    drops sharply at step 300."""
    paths = []
    curve = {100: 10, 200: 20, 300: 4, 400: 30}
    for run in ("with", "without"):
        if run == "with":
            paths.append(
                _cell(tmp_path, run, "base", 0, "code", "t8-s1", [0] * 40, 4, is_baseline=True)
            )
        for step, solved in curve.items():
            solved = solved if run == "with" else 20
            passes = [4] * solved + [1] * 5 + [0] * (35 - solved)
            paths.append(_cell(tmp_path, run, f"step_{step}", step, "code", "t8-s1", passes, 4))
            paths.append(
                _cell(
                    tmp_path,
                    run,
                    f"step_{step}",
                    step,
                    "math",
                    "greedy-s1",
                    [1] * (step // 100) + [0] * 6,
                    1,
                )
            )
    return paths


def _blob(page: str, blob_id: str) -> object:
    text = page.split(f"id='blob-{blob_id}'>", 1)[1].split("</script>", 1)[0]
    return decode_blob(text)


def test_report_is_self_contained_with_tables_charts_and_sample_blobs(
    tmp_path: Path, sweep: list[Path]
) -> None:
    summary_dir = tmp_path / "summary"
    (summary_dir / "plots").mkdir(parents=True)
    (summary_dir / "plots" / "gone-steps.png").write_bytes(PNG_MAGIC)  # from an older build
    missing = tmp_path / "scores" / "with" / "step_500" / "code" / "t8-s1.json"
    build_summary([*sweep, missing], summary_dir, title="Demo <sweep>", bootstrap=300)

    pngs = sorted(p.name for p in (summary_dir / "plots").glob("*.png"))
    assert pngs == ["code-errors.png", "code-passk.png", "code-steps.png", "math-steps.png"]
    html = (summary_dir / "report.html").read_text()
    assert "<script src" not in html and "<link" not in html  # everything inlined
    markup = re.sub(r"<script[^>]*>.*?</script>", "", html, flags=re.S)
    assert re.findall(r"(?:src|href)=['\"]([^'\"]*)", markup)
    assert all(ref.startswith("#") for ref in re.findall(r"(?:src|href)=['\"]([^'\"]*)", markup))
    assert "vega-lite" in html.lower() and "sourceMappingURL" not in html

    data = page_data(html)
    assert [t["task"] for t in data["tasks"]] == ["code", "math"]
    assert {(g["task"], g["sampling"]) for g in data["groups"]} == {
        ("code", "t8"),
        ("math", "greedy"),
    }
    code = next(g for g in data["groups"] if g["task"] == "code")
    steps = ["step_100", "step_200", "step_300", "step_400"]
    assert code["ckpts"] == [
        "with:base",
        *(f"with:{s}" for s in steps),
        *(f"without:{s}" for s in steps),
    ]
    # step_300 of run "with": problems p0-p3 pass all 4 samples, p4-p8 one, the rest none
    matrix = _blob(html, code["verdicts"])
    at = code["ckpts"].index("with:step_300")
    assert matrix["passed"][at][:10] == [4, 4, 4, 4, 1, 1, 1, 1, 1, 0]
    assert set(matrix["n"][at]) == {4}
    scores = _blob(html, code["cells"][at][0]["id"])["s"]  # the score lines, as columns
    assert len(scores["task_id"]) == 40 * 4
    assert scores["task_id"][0] == "p0" and scores["passed"][0] is True
    assert scores["error_type"][-1] == "wrong_answer"
    # the regression at step 300 is flagged and points at its pair
    regression = [f for f in data["flags"] if f["kind"] == "regression"]
    assert any((f["a"], f["b"]) == ("step_200", "step_300") for f in regression)
    key = "with|step_300|code"
    # provenance: a blob per task, read when a cell is clicked
    [prov] = _blob(html, data["provenance"]["code"])[key]
    assert prov["source"].endswith("scores/with/step_300/code/t8-s1.json")
    assert prov["model_hash"] == "h" and prov["scorer_version"] == "v1"
    assert prov["sandbox"] == f"bwrap (rootless); not counted: {UNCOUNTED}"
    math_prov = _blob(html, data["provenance"]["math"])
    assert math_prov["with|step_300|math"][0]["sandbox"] is None  # no code was run

    assert "<h1>Demo &lt;sweep&gt;</h1>" in html  # escaped title
    for heading in (
        "Missing or unusable files",
        "Regressions",
        "Metrics",
        "Paired deltas",
        "Seeds: spread over seeds",
        "pass@k (seeds pooled)",
        "Error types",
    ):
        assert heading in html
    assert str(missing) in html
    assert html.count("<table") >= 7
    assert "<th>code/pass@1</th>" in html and "<th>math/accuracy</th>" in html
    assert "base (baseline)" in html
    # the drop at step 300 of run "with" is flagged in the regressions section
    regressions = html.split("<h2>Regressions</h2>")[1].split("<h2>")[0]
    assert "step_300" in regressions and "step_200" in regressions and "previous" in regressions


def test_steps_plot_lines_bands_and_baselines(sweep: list[Path]) -> None:
    summary = summarize(sweep, bootstrap=300)
    seeds = summary.seeds[(summary.seeds["task"] == "code") & (summary.seeds["metric"] == "pass@1")]
    fig = _steps_figure("code", "pass@1", seeds, summary.deltas)
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels.count("with") == 1 and labels.count("without") == 1
    assert "with baseline" in labels and "without baseline" not in labels
    assert "significant drop vs previous" in labels
    line = next(line for line in ax.get_lines() if line.get_label() == "with")
    assert list(line.get_xdata()) == [100, 200, 300, 400]
    assert len(ax.collections) == 2  # one 95% band per run


def test_no_plots_without_cells(tmp_path: Path) -> None:
    summary = summarize([tmp_path / "absent.json"])
    assert write_plots(summary, tmp_path / "plots") == []


def test_the_report_lists_broken_and_deleted_checkpoints(tmp_path: Path) -> None:

    cells = [
        write_cell(tmp_path, "r", f"step_{s}", s, "t", "greedy-s42", metrics={"acc": 0.5})
        for s in (1, 2)
    ]
    line = "run r: checkpoint step_3 looks broken: run/step_3/model.safetensors: truncated"
    build_summary(cells, tmp_path / "summary", deleted=["r/step_1"], broken=[line])
    report = (tmp_path / "summary" / "report.html").read_text()
    assert "Checkpoints that look broken" in report and "step_3/model.safetensors" in report
    assert "Checkpoints whose source was deleted" in report
    import pandas as pd

    table = pd.read_parquet(tmp_path / "summary" / "metrics.parquet")
    assert set(table[table.source_deleted]["ckpt"]) == {"step_1"}


def test_deleted_checkpoints_keep_their_point_drawn_hollow(tmp_path: Path) -> None:
    from ckpteval.report import _deleted

    cells = [
        write_cell(tmp_path, "r", f"step_{s}", s, "t", "greedy-s42", metrics={"acc": s / 10})
        for s in (1, 2, 3)
    ]
    summary = build_summary(cells, tmp_path / "summary", deleted=["r/step_2"])
    assert _deleted(summary) == {("r", "step_2")}
    steps = summary.seeds[summary.seeds["metric"] == "acc"]
    ax = _steps_figure("t", "acc", steps, summary.deltas, _deleted(summary)).axes[0]
    main = next(line for line in ax.get_lines() if line.get_label() == "r")
    assert list(main.get_xdata()) == [1, 2, 3]  # the deleted checkpoint stays on the curve
    hollow = [line for line in ax.get_lines() if line.get_label().startswith("source deleted")]
    assert len(hollow) == 1
    assert list(hollow[0].get_xdata()) == [2] and list(hollow[0].get_ydata()) == [0.2]
    assert hollow[0].get_markerfacecolor() == "white"
    plain = _steps_figure("t", "acc", steps, summary.deltas).axes[0]
    assert not [line for line in plain.get_lines() if "deleted" in line.get_label()]


def test_a_cell_whose_reward_function_errored_is_marked_in_overview_and_tables(
    tmp_path: Path,
) -> None:
    """step_2's float reward gave no score for 7 of 12 samples, 3 of source gsm8k's 6, none of
    source math's (4 had no source): the overview says, with the cell's own counts, that
    reward_mean and the gsm8k column are means over the others (not counted in n); the metrics
    table, the series behind the checkpoint x task table and the charts, and metrics.md mark
    those numbers; step_1 (no errors) and the math column are not marked."""
    gsm8k, math = "val-core/openai/gsm8k/reward/mean@1", "val-core/math/reward/mean@1"
    cells = []
    for s, errored in ((1, 0), (2, 7)):
        entries = {
            "reward_mean": {"value": 0.25, "stderr": 0.1, "n": 12 - errored},
            "reward_error_rate": {"value": errored / 12, "stderr": 0.1, "n": 12},
            gsm8k: {"value": 0.5, "stderr": 0.1, "n": 6 - 3 * bool(errored)},
            math: {"value": 0.5, "stderr": 0.1, "n": 6},
        }
        if errored:
            entries["reward_mean"]["excludes_errors"] = errored
            entries[gsm8k]["excludes_errors"] = 3
        cells.append(
            write_cell(tmp_path, "r", f"step_{s}", s, "gsm", "greedy-s42", metrics=entries)
        )
        cells[-1].write_text(
            json.dumps({**json.loads(cells[-1].read_text()), "primary_metric": "reward_mean"})
        )
    summary = build_summary(cells, tmp_path / "summary")
    page = (tmp_path / "summary" / "report.html").read_text()
    flags = [f for f in page_data(page)["flags"] if f["kind"] == "reward_errors"]
    assert [f["text"] for f in flags] == [
        "r step_2 gsm (greedy): the reward function gave no score for 7 of 12 samples. "
        "reward_mean: mean over the 5 samples that returned a score; 7 of 12 errored and are "
        f"excluded. {gsm8k}: mean over the 3 samples that returned a score; 3 of 6 errored and "
        "are excluded."
    ]
    assert "counted in" not in page  # no sentence says errors count in n
    assert "Reward function errors (how each number counts them)" in page  # overview heading
    table = page.split("<h2>Metrics</h2>")[1].split("</table>")[0]
    # rewards of unknown range (no per-sample scores here): mean ± 1.96 standard errors
    assert "0.250 [0.054, 0.446] (excludes 7 of 12 errored)" in table
    assert "0.500 [0.304, 0.696] (excludes 3 of 6 errored)" in table
    assert table.count("errored)") == 2  # step_2's two means: not math's, nothing of step_1
    series = {(r["ckpt"], r["metric"]): r for r in page_data(page)["series"]}
    assert series[("step_2", "reward_mean")]["errors_mark"] == "(excludes 7 of 12 errored)"
    assert series[("step_2", gsm8k)]["errors"] == (
        f"{gsm8k}: mean over the 3 samples that returned a score; 3 of 6 errored and are excluded"
    )
    assert "errors" not in series[("step_1", "reward_mean")]
    assert "errors" not in series[("step_1", gsm8k)] and "errors" not in series[("step_2", math)]
    # the PNG of the headline over steps crosses step_2's value and its caption says why
    [steps] = [
        p for p in write_plots(summary, tmp_path / "plots") if p.path.name == "gsm-steps.png"
    ]
    assert "crosses: means over the samples that returned a score" in steps.caption
    seeds = summary.seeds[summary.seeds["metric"] == "reward_mean"]
    crosses = {(r, c, s) for r, c, _, s, m in _excluding(summary) if m == "reward_mean"}
    figure = _steps_figure("gsm", "reward_mean", seeds, summary.deltas, excluding=crosses)
    [crossed] = [
        x for x in figure.axes[0].get_lines() if x.get_label() == "errored samples excluded"
    ]
    assert list(crossed.get_xdata()) == [2]
    markdown = (tmp_path / "summary" / "metrics.md").read_text()
    assert markdown.count("[^e1]") == 3  # reward_mean, the gsm8k column, the footnote
    assert f"[^e1]: {flags[0]['text']}" in markdown
    sources = [r for r in page_data(page)["series"] if r["metric"].startswith("val-core/")]
    assert {(r["ckpt"], r["mean"]) for r in sources} == {("step_1", 0.5), ("step_2", 0.5)}
    # beside the trainer's logged curve, the gsm8k column's step 2 is crossed, math's is not
    logged = pd.DataFrame(
        [
            ("r", "gsm", "greedy-s42", metric, metric, step, 0.5, 0.5, 0.4, 0.6, "match", False)
            for metric in (gsm8k, math)
            for step in (1, 2)
        ],
        columns=TRAINING_COLUMNS,
    )
    with_logs = dataclasses.replace(summary, training=logged)
    [training] = _training_plots(with_logs, tmp_path / "plots", _excluding(summary))
    assert (
        "Black crosses: ckpteval means over the samples that returned a score" in training.caption
    )
    without = dataclasses.replace(summary, training=logged[logged["metric"] == math])
    [plain] = _training_plots(without, tmp_path / "plots", _excluding(summary))
    assert "Black crosses" not in plain.caption


def test_the_best_section_is_what_ckpteval_best_prints(
    tmp_path: Path, sweep: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The report's best checkpoint is `ckpteval best`'s default choice on the same summary,
    with the same selection-aware interval and win rate (same cells, bootstrap and seed), and
    the page states the rule."""
    from ckpteval.cli import main

    build_summary(sweep, tmp_path / "summary", bootstrap=300)
    html = (tmp_path / "summary" / "report.html").read_text()
    shown = page_data(html)["best"]
    assert main(["best", "--outdir", str(tmp_path), "--bootstrap", "300", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert shown["best"] == printed["best"] == "with:step_400"  # code 30/40 and math 4/10
    assert shown["candidates"] == printed["candidates"] and len(shown["candidates"]) == 8
    for key in ("score", "low", "high", "naive_low", "naive_high"):
        assert shown[key] == pytest.approx(printed[key]), key
    assert shown["wins"] == pytest.approx(printed["wins"])
    assert shown["low"] < shown["naive_low"] < shown["score"] < shown["naive_high"] < shown["high"]
    section = html.split("<div id='best'>", 1)[1].split("</div>", 1)[0]
    assert "<b>with:step_400</b>" in section and "2 task(s) (code, math), weight 1" in section
    assert f"[{shown['low']:.3f}, {shown['high']:.3f}]" in section
    assert f"{shown['wins']['with:step_400']:.0%} of 300 resamples" in section


def test_the_best_section_says_why_no_checkpoint_is_chosen(tmp_path: Path) -> None:
    cells = [
        _cell(tmp_path, "r", "base", 0, "math", "greedy-s1", [1, 0, 0], 1, is_baseline=True),
        _cell(tmp_path, "r", "step_1", 1, "math", "greedy-s1", [1, 1, 0], 1),
    ]
    build_summary(cells, tmp_path / "summary", bootstrap=50)
    html = (tmp_path / "summary" / "report.html").read_text()
    assert page_data(html)["best"] == {
        "none": "best: 1 checkpoint(s) scored every task of the rule; need 2"
    }
    assert "No choice: best: 1 checkpoint(s) scored every task of the rule; need 2." in html


def test_a_large_report_keeps_its_blobs_in_files_the_page_loads(
    tmp_path: Path, sweep: list[Path]
) -> None:
    """Above the threshold every blob is a script file in report_files/ (what the page's data
    names), none is inside the page, and each file holds the blob the one-file page holds; a
    later build below the threshold empties the directory."""
    from ckpteval.report import files_dir, render_html, write_html

    summary = summarize(sweep, bootstrap=50)
    one_file = render_html(summary)
    path = tmp_path / "out" / "report.html"
    write_html(summary, [], path, external_blobs=0)
    page = path.read_text()
    data = page_data(page)
    assert data["blob_dir"] == "report_files" and "id='blob-" not in page
    files = {p.stem: p.read_text() for p in files_dir(path).glob("*.js")}
    assert sorted(files) == data["blob_ids"] and len(files) > 10
    for blob_id, text in files.items():
        match = re.fullmatch(r'ckptevalBlobText\("([^"]+)","([^"]+)"\);\n', text)
        assert match and match.group(1) == blob_id
        assert decode_blob(match.group(2)) == _blob(one_file, blob_id)
    write_html(summary, [], path)  # small: one file again
    assert "id='blob-" in path.read_text() and not list(files_dir(path).iterdir())


def _completions(page: str) -> set[str]:
    """Every completion in the cell blobs of a one-file report."""
    data = page_data(page)
    ids = [cell["id"] for group in data["groups"] for cells in group["cells"] for cell in cells]
    return {text for i in ids for text in _blob(page, i)["g"].get("completion", [])}


def test_a_rebuild_reads_only_the_cells_whose_files_changed(
    tmp_path: Path, sweep: list[Path]
) -> None:
    """With a cache (what the aggregate step passes) a rebuild gives the page a build without one
    gives; a cell whose generation file changed is read again, one whose file kept its size
    and time is not (the key is the files' identity); a cell no longer summarized leaves no
    entry."""
    from ckpteval.plan.layout import generation_of_score
    from ckpteval.report import render_html, write_html

    generations = {}
    for path in sweep:
        rows = [json.loads(line) for line in path.with_suffix(".jsonl").read_text().splitlines()]
        lines = [
            {**r, "prompt": f"solve {r['task_id']}", "completion": f"old {path.parent.parent.name}"}
            for r in rows
        ]
        gen = generation_of_score(path)
        gen.parent.mkdir(parents=True, exist_ok=True)
        gen.write_text("".join(json.dumps(line) + "\n" for line in lines))
        generations[path] = gen
    summary = summarize(sweep, bootstrap=50)
    page = tmp_path / "out" / "report.html"
    cache = tmp_path / "cache"
    expected = render_html(summary)
    write_html(summary, [], page, cache=cache)
    assert page.read_text() == expected
    assert _cache_entries(cache) == len(sweep)  # in a pack per checkpoint directory
    assert len(list(cache.glob("pack-*.json"))) == len({p.parent.parent for p in sweep})
    assert len(list(cache.glob("prompts-*.json"))) == 2  # a prompts file per task
    write_html(summary, [], page, cache=cache)  # every cell from the cache
    assert page.read_text() == expected

    gen = generations[sweep[-1]]
    stat = gen.stat()
    gen.write_text(gen.read_text().replace("old step_400", "new step_400"))  # same size
    os.utime(gen, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    write_html(summary, [], page, cache=cache)
    assert "old step_400" in _completions(page.read_text())
    os.utime(gen, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    write_html(summary, [], page, cache=cache)
    assert "new step_400" in _completions(page.read_text())
    assert page.read_text() == render_html(summary)

    write_html(summarize(sweep[1:], bootstrap=50), [], page, cache=cache)
    assert _cache_entries(cache) == len(sweep) - 1
    # the baseline's checkpoint had that one cell: its pack is gone
    assert len(list(cache.glob("pack-*.json"))) == len({p.parent.parent for p in sweep[1:]})


def _cache_entries(cache: Path) -> int:
    """The cells a report cache keeps an entry of."""
    return sum(len(json.loads(p.read_text())["entries"]) for p in cache.glob("pack-*.json"))


def test_the_aggregate_step_reads_again_only_the_cell_rescored_since_its_last_build(
    tmp_path: Path, sweep: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    """The aggregate job as the workflow runs it (`ckpteval.steps.aggregate`), twice, into a
    staging directory emptied in between as Snakemake empties it, one cell rescored between
    the two: the second build takes every other cell from the cache the first left beside the
    staging directory (its log line counts them), reads the rescored one again, and its
    report shows the new verdicts."""
    import logging
    import shutil
    from types import SimpleNamespace

    from ckpteval import steps
    from ckpteval.contract import summary_identity

    out = tmp_path / "results"
    staged = out / "staging" / "summary"
    config = {"aggregate": {"title": "t", "bootstrap": 20}, "runs": {}}
    smk = SimpleNamespace(
        input=SimpleNamespace(cells=[str(p) for p in sweep]),
        output=SimpleNamespace(staged=str(staged)),
        params=SimpleNamespace(
            identity=summary_identity(config).text, deleted=[], broken=[], sampling={}
        ),
        threads=2,  # the rule's `evaluate.workers`: the report reads cells in as many processes
    )

    def build() -> tuple[str, list[int]]:
        """The build's log line of cells from the cache; the rescored checkpoint's row of
        the math task's verdict matrix in its report."""
        shutil.rmtree(staged, ignore_errors=True)  # Snakemake empties a directory output
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="ckpteval.report.data"):
            steps.aggregate(smk)
        (line,) = [r.getMessage() for r in caplog.records if "from the cache" in r.getMessage()]
        page = (staged / "report.html").read_text()
        group = next(g for g in page_data(page)["groups"] if g["task"] == "math")
        matrix = _blob(page, group["verdicts"])
        return line, matrix["passed"][group["ckpts"].index("without:step_400")]

    line, row = build()
    assert line == f"report: 0 cells from the cache, {len(sweep)} read from their files"
    assert (out / "staging" / "_report_cache").is_dir()
    assert row == [1] * 4 + [0] * 6

    rescored = sweep[-1]  # run `without`, step_400, math: 4 of 10 solved, now all 10
    assert rescored.parts[-4:-1] == ("without", "step_400", "math")
    scores = rescored.with_suffix(".jsonl")
    rows = [json.loads(line) for line in scores.read_text().splitlines()]
    scores.write_text("".join(json.dumps({**r, "passed": True, "score": 1.0}) + "\n" for r in rows))
    cell = json.loads(rescored.read_text())
    cell["metrics"]["accuracy"]["value"] = 1.0
    rescored.write_text(json.dumps(cell))
    line, row = build()
    assert line == f"report: {len(sweep) - 1} cells from the cache, 1 read from their files"
    assert row == [1] * 10


def test_cells_read_in_processes_give_the_report_one_process_gives(
    tmp_path: Path, sweep: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build reads its cells in several processes (each job a run of one task's cells): the
    blobs, the verdict matrices and the prompts kept (a problem's first, in the cells' order)
    are those of a build in this process alone."""
    from ckpteval.plan.layout import generation_of_score
    from ckpteval.report import data
    from ckpteval.report.data import build_payload

    for index, path in enumerate(sweep):
        rows = [json.loads(line) for line in path.with_suffix(".jsonl").read_text().splitlines()]
        gen = generation_of_score(path)
        gen.parent.mkdir(parents=True, exist_ok=True)
        lines = [
            {**r, "prompt": f"solve {r['task_id']} ({index})", "completion": "x"} for r in rows
        ]
        gen.write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = summarize(sweep, bootstrap=20)
    monkeypatch.setattr(data, "PARALLEL_CELLS", 1)  # this sweep's 17 cells: in processes too
    monkeypatch.setattr(data, "JOB_CELLS", 2)  # a task's cells in several jobs
    one, three = (build_payload(summary, workers=n) for n in (1, 3))
    assert one.blobs == three.blobs and one.data == three.data
    prompts = decode_blob(one.blobs["p-math"])
    first = min(i for i, p in enumerate(sweep) if p.parent.name == "math")
    assert prompts["p0"] == f"solve p0 ({first})"


def test_a_process_reading_cells_that_fails_fails_the_build_with_its_traceback(
    sweep: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reading process sends what failed in it (the build stops with its traceback, not a
    report short of cells), and one that dies unannounced is named by its exit code."""
    from ckpteval.report import data
    from ckpteval.report.data import build_payload

    def failing(cells: list[tuple[str, str]], known: dict[str, set[str]]) -> Any:
        raise ValueError(f"unreadable {cells[0][0]}")

    def dying(cells: list[tuple[str, str]], known: dict[str, set[str]]) -> Any:
        os._exit(3)

    summary = summarize(sweep, bootstrap=20)
    monkeypatch.setattr(data, "PARALLEL_CELLS", 1)  # this sweep's 17 cells: in processes
    monkeypatch.setattr(data, "_read_entries", failing)
    with pytest.raises(RuntimeError, match="(?s)failed:.*ValueError: unreadable "):
        build_payload(summary, workers=2)
    monkeypatch.setattr(data, "_read_entries", dying)
    with pytest.raises(RuntimeError, match=r"ended \(exit code 3\)"):
        build_payload(summary, workers=2)


def test_lines_read_as_structs_give_the_columns_lines_read_as_dicts_give(tmp_path: Path) -> None:
    """Lines whose fields are the first line's are read into structs, their texts as JSON text
    (`msgspec.Raw`) copied into the blob: decoded, the columns are those of lines read as
    dicts, with long texts cut, nested fields left out (a kept one kept), missing fields null
    and escapes decoded; a file with a field its first line lacks is read as dicts."""
    from ckpteval.report import samples

    long = "é\\/\n" * samples.MAX_TEXT
    lines = [
        {
            "task_id": "p0",
            "n": 1,
            "text": 'a\u00e9\\/"',
            "out": None,
            "odd key": "x",
            "chat": "q",
            "passed": None,
        },
        {
            "task_id": "p1",
            "n": "n" * (samples.MAX_TEXT + 1),
            "text": long,
            "out": [1, 2],
            "passed": True,
        },
        {
            "task_id": "p2",
            "n": 3,
            "text": "[no list]",
            "out": "y",
            "chat": [{"role": "user"}],
            "passed": False,
        },
        {"task_id": "p3", "n": None, "text": "t" * (samples.MAX_TEXT - 1), "odd key": None},
    ]
    same = tmp_path / "same.jsonl"
    same.write_text("".join(json.dumps(line) + "\n\n" for line in lines))
    more = tmp_path / "more.jsonl"
    more.write_text("".join(json.dumps({**line, "later": 1}) + "\n" for line in lines[1:]))
    more.write_text(json.dumps(lines[0]) + "\n" + more.read_text())
    for path in (same, more):
        data = path.read_bytes()
        for kept in ((), {"chat", "out"}):
            fast = samples._read_columns(path, kept)
            dicts = samples._read_dict_columns(data, kept)
            assert fast.keys() == dicts.keys()
            for name in ("out", "chat"):
                assert (fast[name] is samples._NESTED) == (name not in kept)
                assert (dicts[name] is samples._NESTED) == (name not in kept)
            shown = {k: v for k, v in fast.items() if v is not samples._NESTED}
            decoded = json.loads(samples._ENCODER.encode(shown))
            assert decoded == {k: v for k, v in dicts.items() if v is not samples._NESTED}
            more_chars = len(long) - samples.MAX_TEXT
            assert decoded["text"][1].endswith(f"({more_chars} more characters in the file)")
            assert decoded["n"][1].endswith("(1 more characters in the file)")
            assert decoded["text"][0] == 'a\u00e9\\/"' and decoded["odd key"][1:] == [None] * 3
            assert samples._verdicts(fast)["passed"] == [0, 1, 0, 0]  # decoded, not JSON text
    lines = samples._line_decoder(same.read_bytes())
    assert lines is not None and len(lines[0].decode_lines(same.read_bytes())) == 4
    lines = samples._line_decoder(more.read_bytes())
    with pytest.raises(msgspec.ValidationError):
        lines[0].decode_lines(more.read_bytes())
