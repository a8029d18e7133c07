"""The report in a real browser: Debian's chromium, driven by playwright, opens report.html from
disk (no network) and every test fails on any console error or uncaught page error.

Hand-made cells with generation files give known flips (the fast tests); the demo swept end to end
gives the README's screenshots (the slow test). Skipped only where chromium is not installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import run_snakemake, small_config, write_config
from test_aggregate import write_cell

from ckpteval.report.page import CHROMIUM_ARGS
from ckpteval.summary import build_summary

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DOCS = Path(__file__).resolve().parent.parent / "docs"
# base solves p0-p4; step_100 solves p0-p2 and p5-p9; step_200 all but p1 (as in test_compare).
SOLVED = {
    "base": {0, 1, 2, 3, 4},
    "step_100": {0, 1, 2, 5, 6, 7, 8, 9},
    "step_200": {0, 2, 3, 4, 5, 6, 7, 8, 9},
}
STEPS = {"base": 0, "step_100": 100, "step_200": 200}

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="chromium is not installed (scripts/setup-env.sh as root)"
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """The system chromium (playwright never downloads a browser here)."""
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
        yield chromium
        chromium.close()


class Page:
    """A page with every console error and page error collected; `open` waits for the page's
    own "ready" mark (charts drawn, first drill-down loaded)."""

    def __init__(self, browser: Any, width: int = 1400) -> None:
        self.page = browser.new_page(viewport={"width": width, "height": 1000})
        self.errors: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        self.page.on("requestfailed", lambda req: self.errors.append(f"request: {req.url}"))

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text}")

    def open(self, path: Path) -> Any:
        self.page.goto(path.resolve().as_uri())
        self.page.wait_for_selector("body[data-ready=yes]", timeout=30_000)
        self.page.wait_for_selector("#cmp-out[data-state=ready]", timeout=30_000)
        return self.page

    def close(self) -> None:
        self.page.close()
        assert self.errors == []


def _generation(root: Path, ckpt: str, task: str, texts: dict[str, str]) -> None:
    path = root / "generations" / "r" / ckpt / task / "greedy-s42.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        {"task_id": tid, "sample_idx": 0, "prompt": f"Prompt of {tid}", "completion": text}
        for tid, text in texts.items()
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """Run r (baseline base, step_100, step_200): task `code` with known flips and a stderr tail
    on failures, and task `math` whose accuracy rises; generation files beside the scores."""
    for ckpt, step in STEPS.items():
        samples = [
            {
                "task_id": f"p{i}",
                "sample_idx": 0,
                "passed": i in SOLVED[ckpt],
                "score": float(i in SOLVED[ckpt]),
                "error_type": None if i in SOLVED[ckpt] else "runtime_error",
                "stderr_tail": "" if i in SOLVED[ckpt] else f"Traceback: p{i} at {ckpt}",
            }
            for i in range(10)
        ]
        metrics = {"pass@1": len(SOLVED[ckpt]) / 10}
        base = ckpt == "base"
        write_cell(
            tmp_path,
            "r",
            ckpt,
            step,
            "code",
            "greedy-s42",
            metrics=metrics,
            samples=samples,
            is_baseline=base,
        )
        _generation(
            tmp_path, ckpt, "code", {f"p{i}": f"def f{i}(): return '{ckpt}'" for i in range(10)}
        )
        math = [(f"m{i}", 0, i < step // 50) for i in range(6)]
        write_cell(
            tmp_path,
            "r",
            ckpt,
            step,
            "math",
            "greedy-s42",
            metrics={"accuracy": step / 300},
            samples=math,
            is_baseline=base,
        )
    build_summary(
        sorted((tmp_path / "scores").glob("*/*/*/*.json")), tmp_path / "summary", bootstrap=200
    )
    return tmp_path


def test_overview_panels_and_sortable_table(browser: Any, results: Path) -> None:
    view = Page(browser)
    page = view.open(results / "summary" / "report.html")
    assert page.locator("#grid canvas").count() == 1  # the small multiples: one faceted chart
    panels = page.locator(".task-panel").evaluate_all("els => els.map(e => e.dataset.task)")
    assert panels == ["code", "math"]
    page.locator("#task-math").scroll_into_view_if_needed()
    page.wait_for_selector("#task-math[data-drawn=yes]")
    assert page.locator("#task-math canvas").count() >= 1
    rows = "els => els.map(e => e.dataset.ckpt)"
    assert page.locator("#ckpt-task tbody tr").evaluate_all(rows) == [
        "base",
        "step_100",
        "step_200",
    ]
    page.click("#ckpt-task th[data-col='code']")  # descending pass@1: 0.9, 0.8, 0.5
    assert page.locator("#ckpt-task tbody tr").evaluate_all(rows) == [
        "step_200",
        "step_100",
        "base",
    ]
    page.click("#ckpt-task th[data-col='code']")
    assert page.locator("#ckpt-task tbody tr").evaluate_all(rows) == [
        "base",
        "step_100",
        "step_200",
    ]
    page.click("#ckpt-task tr[data-ckpt='step_100'] td[data-prov]")
    page.wait_for_selector("#provenance:not([hidden])")  # its task's blob read on the click
    provenance = page.locator("#provenance").inner_text()
    assert "scores/r/step_100/code/greedy-s42.json" in provenance and "hash-step_100" in provenance
    view.close()


def _flipped(page: Any) -> dict[str, str]:
    return dict(
        page.locator("#cmp-out .flip").evaluate_all(
            "els => els.map(e => [e.dataset.taskId, e.classList.contains('gained') ? 'gained' : 'lost'])"
        )
    )


def test_two_checkpoints_show_the_flipped_problems_with_both_completions(
    browser: Any, results: Path
) -> None:
    view = Page(browser)
    page = view.open(results / "summary" / "report.html")
    page.select_option("#cmp-group", "code|greedy")
    page.select_option("#cmp-a", "r:base")
    page.select_option("#cmp-b", "r:step_100")
    page.wait_for_function("document.querySelectorAll('#cmp-out .flip').length === 7")
    flips = pd.read_csv(results / "summary" / "flips.csv")
    known = flips[(flips.task == "code") & (flips.ckpt_a == "base") & (flips.ckpt_b == "step_100")]
    assert _flipped(page) == dict(zip(known.task_id, known.direction))
    assert _flipped(page) == {
        **{f"p{i}": "gained" for i in range(5, 10)},
        "p3": "lost",
        "p4": "lost",
    }
    lost = page.locator("#cmp-out .flip[data-task-id='p3']")
    sides = lost.locator(".side")
    assert "def f3(): return 'base'" in sides.nth(0).inner_text()
    assert "def f3(): return 'step_100'" in sides.nth(1).inner_text()
    assert "Traceback: p3 at step_100" in sides.nth(1).inner_text()
    assert "runtime_error" in sides.nth(1).inner_text() and "Prompt of p3" in lost.inner_text()
    view.close()


def test_one_problem_across_the_run(browser: Any, results: Path) -> None:
    view = Page(browser)
    page = view.open(results / "summary" / "report.html")
    page.select_option("#prob-group", "code|greedy")
    page.wait_for_selector("#prob-id option[value='p5']", state="attached")
    page.select_option("#prob-id", "p5")
    page.wait_for_function("document.querySelectorAll('#prob-out .verdict-cell').length === 3")
    classes = page.locator("#prob-out .verdict-cell").evaluate_all(
        "els => els.map(e => e.classList.contains('pass') ? 'pass' : 'fail')"
    )
    assert classes == ["fail", "pass", "pass"]
    page.click("#prob-out .verdict-cell[data-index='0']")
    page.wait_for_selector("#prob-sample .sample")
    assert "def f5(): return 'base'" in page.locator("#prob-sample").inner_text()
    view.close()


def test_compare_html_writes_the_pair_view(browser: Any, results: Path) -> None:
    out = results / "pair.html"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ckpteval.cli",
            "compare",
            "r:step_100",
            "r:step_200",
            "--outdir",
            str(results),
            "--html",
            str(out),
            "--task",
            "code",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "gained 2, lost 1" in proc.stdout  # the same flips as the page's
    view = Page(browser)
    page = view.open(out)
    assert page.locator("#cmp-a").input_value() == "r:step_100"
    assert page.locator("#cmp-b").input_value() == "r:step_200"
    assert _flipped(page) == {"p3": "gained", "p4": "gained", "p1": "lost"}
    view.close()


def test_compare_html_of_three_checkpoints_opens_each_completion_on_a_click(
    browser: Any, results: Path
) -> None:
    """The side-by-side page in the browser: the verdicts of a differing problem are folded and
    one click shows that checkpoint's completion; the page needs nothing from the network."""
    out = results / "three.html"
    proc = subprocess.run(
        [sys.executable, "-m", "ckpteval.cli", "compare", "r:base", "r:step_100", "r:step_200",
         "--outdir", str(results), "--html", str(out), "--task", "code", "--bootstrap", "50"],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    view = Page(browser)
    page = view.page
    page.goto(out.resolve().as_uri())
    row = page.locator("tr", has=page.locator("td", has_text="p3"))
    step_100 = row.locator("details").nth(2)  # prompt, base, step_100
    assert not step_100.locator("pre").is_visible()
    step_100.locator("summary").click()
    assert step_100.locator("pre").inner_text() == "def f3(): return 'step_100'"
    assert step_100.locator("summary").inner_text() == "0/1 ✗"
    view.close()


def test_a_report_without_cells_opens_without_errors(browser: Any, tmp_path: Path) -> None:
    build_summary([tmp_path / "absent.json"], tmp_path / "summary")
    view = Page(browser)
    page = view.open(tmp_path / "summary" / "report.html")
    assert "No scored cells." in page.locator("#grid").inner_text()
    assert page.locator(".task-panel").count() == 0
    view.close()


def test_large_tables_are_shown_on_demand(
    browser: Any, results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A section over LAZY_SECTION characters is a compressed blob behind a button (thousands of
    table rows in the DOM cost seconds at open); the button shows the same table."""
    from ckpteval.report import page as report_page

    monkeypatch.setattr(report_page, "LAZY_SECTION", 2000)
    out = results / "lazy"
    build_summary(sorted((results / "scores").glob("*/*/*/*.json")), out, bootstrap=200)
    view = Page(browser)
    page = view.open(out / "report.html")
    deltas = pd.read_csv(out / "deltas.csv")
    lazy = page.locator("h2:text-is('Paired deltas') + p + .lazy-section")
    assert lazy.locator("table").count() == 0
    lazy.locator("button").click()
    page.wait_for_selector(".lazy-section[data-shown=yes] table")
    assert lazy.locator("tbody tr").count() == len(deltas)
    view.close()


@pytest.fixture(scope="module")
def demo_sweep(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo (baseline and three checkpoints; arith and pyfunc) swept end to end."""
    work = tmp_path_factory.mktemp("demo-report")
    config = small_config(demo_dir / "run", tasks={"arith": {}, "pyfunc": {"limit": 3}})
    config["runs"]["demo"]["base_model"] = str(demo_dir / "base")
    write_config(work, config)
    proc = run_snakemake(work)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return work


@pytest.mark.slow
def test_demo_report_in_chromium_and_its_screenshots(browser: Any, demo_sweep: Path) -> None:
    """The demo's report: every task panel, the known flips of its last two checkpoints with
    both completions; its overview and drill-down are the README's screenshots
    (docs/report-overview.png, docs/report-drilldown.png)."""
    summary = demo_sweep / "results" / "summary"
    view = Page(browser)
    page = view.open(summary / "report.html")
    panels = page.locator(".task-panel").evaluate_all("els => els.map(e => e.dataset.task)")
    assert sorted(panels) == ["arith", "pyfunc"]
    page.screenshot(path=str(DOCS / "report-overview.png"))
    flips = pd.read_csv(summary / "flips.csv")
    last = flips[
        (flips.task == "arith") & (flips.ckpt_a == "step_450") & (flips.ckpt_b == "step_600")
    ]
    assert len(last) > 0
    page.select_option("#cmp-group", "arith|greedy")
    page.select_option("#cmp-a", "demo:step_450")
    page.select_option("#cmp-b", "demo:step_600")
    page.wait_for_function(f"document.querySelectorAll('#cmp-out .flip').length === {len(last)}")
    assert _flipped(page) == dict(zip(last.task_id, last.direction))
    first = page.locator("#cmp-out .flip").first
    assert first.locator(".side").count() == 2 and first.locator(".completion").count() == 2
    page.evaluate("document.getElementById('compare').scrollIntoView()")
    page.screenshot(path=str(DOCS / "report-drilldown.png"))
    view.close()


@pytest.mark.slow
def test_snakemake_report_packs_the_report(demo_sweep: Path) -> None:
    """`snakemake --report` still works and packs report.html and the PNG plots."""
    import zipfile

    proc = run_snakemake(demo_sweep, "--report", str(demo_sweep / "report.zip"))  # cwd: the repo
    assert proc.returncode == 0, proc.stderr[-4000:]
    packed = zipfile.ZipFile(demo_sweep / "report.zip")
    names = packed.namelist()
    [page] = [n for n in names if n.startswith("report/data/raw/") and n.endswith("/report.html")]
    ours = demo_sweep / "results" / "summary" / "report.html"
    assert packed.read(page) == ours.read_bytes()
    assert any(name.endswith("arith-steps.png") for name in names), names


def test_a_reward_task_shows_its_errors_and_its_data_sources(browser: Any, tmp_path: Path) -> None:
    """The checkpoint x task table marks the cell whose reward function errored with what its
    mean does (excludes them, with its counts), the overview lists it, and the task's panel
    draws the reward per data source, without a page error."""
    cells = [
        write_cell(
            tmp_path,
            "r",
            f"step_{s}",
            s,
            "gsm",
            "greedy-s42",
            metrics={
                "reward_mean": {"value": 0.2 * s, "stderr": 0.1, "n": 12 - round(12 * rate)}
                | ({"excludes_errors": 6} if rate else {}),
                "reward_error_rate": {"value": rate, "stderr": 0.1, "n": 12},
                "val-core/openai/gsm8k/reward/mean@1": {"value": 0.1 * s, "stderr": 0.1, "n": 6},
                "val-core/math/reward/mean@1": {"value": 0.3 * s, "stderr": 0.1, "n": 6},
            },
        )
        for s, rate in ((1, 0.0), (2, 0.5))
    ]
    logged = tmp_path / "val.jsonl"  # verl's file logger: the trainer's own curve
    metric = "val-core/openai/gsm8k/reward/mean@1"
    logged.write_text(
        "".join(json.dumps({"step": s, "data": {metric: 0.9}}) + "\n" for s in (1, 2))
    )
    build_summary(cells, tmp_path / "summary", train_logs={"r": {"path": str(logged)}})
    view = Page(browser)
    page = view.open(tmp_path / "summary" / "report.html")
    marked = page.locator("#ckpt-task td[data-prov]").evaluate_all(
        "els => els.map(e => [e.textContent, e.title])"
    )
    assert "⚠" not in marked[0][0] and "errored" not in marked[0][1]
    assert marked[1][0].endswith("⚠ (excludes 6 of 12 errored)")
    assert marked[1][1].endswith(
        "; reward_mean: mean over the 6 samples that returned a score; 6 of 12 errored and are "
        "excluded"
    )
    assert "gave no score for 6 of 12 samples" in page.locator("#flags").inner_text()
    page.locator("#task-gsm").scroll_into_view_if_needed()
    page.wait_for_selector("#task-gsm[data-drawn=yes]")
    assert page.locator("#task-gsm [data-chart='sources'] canvas").count() == 1
    assert page.locator("#task-gsm [data-chart='training'] canvas").count() == 1
    view.close()


def test_several_checkpoints_side_by_side_with_blobs_loaded_from_files(
    browser: Any, results: Path
) -> None:
    """The several-checkpoints view opens on the baseline, the best and the last checkpoint,
    lists the problems whose verdicts differ among them, and loads a verdict's completions on
    click, here from report_files/ beside the page (a large report's layout, forced by a zero
    threshold) opened from file://: nothing fails to load."""
    from ckpteval.report import files_dir, write_html
    from ckpteval.summary import summarize

    cells = sorted((results / "scores").glob("*/*/*/*.json"))
    path = results / "external" / "report.html"
    write_html(summarize(cells, bootstrap=200), [], path, external_blobs=0)
    assert "id='blob-" not in path.read_text()
    assert len(list(files_dir(path).glob("*.js"))) > 6  # cells, prompts, verdict matrices
    view = Page(browser)
    page = view.open(path)
    page.select_option("#sev-group", "code|greedy")
    page.wait_for_selector("#sev-out[data-state=ready]")
    chosen = page.locator("#sev-out table.several tbody tr").evaluate_all(
        "els => els.map(e => e.dataset.ckpt)"
    )
    # step_200 (0.9) beats step_100 (0.8), so the best is also the last: shown once
    assert chosen == ["r:base", "r:step_200"]
    assert "best" in page.locator("#sev-out tr[data-ckpt='r:step_200']").inner_text()
    page.select_option("#sev-ckpts select[data-slot='2']", "r:step_100")
    page.wait_for_function("document.querySelectorAll('#sev-out .several-problems tr').length")
    differing = page.locator("#sev-out .several-problems tbody tr").evaluate_all(
        "els => els.map(e => e.dataset.taskId)"
    )
    # base solves p0-p4, step_200 all but p1, step_100 p0-p2 and p5-p9
    assert differing == ["p1", "p3", "p4", "p5", "p6", "p7", "p8", "p9"]
    page.click("#sev-out tr[data-task-id='p3'] button[data-slot='2']")
    page.wait_for_selector("#sev-sample[data-state=ready]")
    shown = page.locator("#sev-sample").inner_text()
    assert "def f3(): return 'step_100'" in shown and "Traceback: p3 at step_100" in shown
    view.close()


def test_a_long_checkpoint_table_gets_every_row_as_the_reader_scrolls(
    browser: Any, tmp_path: Path
) -> None:
    """Past the first 100 checkpoints the table's rows are added as the reader scrolls near
    its end, and all of them before a sort; a late row's cell still opens its provenance."""
    for step in range(0, 120):
        ckpt = "base" if step == 0 else f"step_{step}"
        samples = [(f"p{i}", 0, (i + step) % 3 == 0) for i in range(3)]
        write_cell(
            tmp_path,
            "r",
            ckpt,
            step,
            "code",
            "greedy-s42",
            metrics={"pass@1": 1 / 3},
            samples=samples,
            is_baseline=step == 0,
        )
    build_summary(sorted((tmp_path / "scores").glob("*/*/*/*.json")), tmp_path / "s", bootstrap=20)
    every_row = "document.querySelectorAll('#ckpt-task tbody tr').length === 120"
    view = Page(browser)
    page = view.open(tmp_path / "s" / "report.html")
    page.locator("#ckpt-task tbody tr").last.scroll_into_view_if_needed()
    page.wait_for_function(every_row, timeout=10_000)
    page.click("#ckpt-task tr[data-ckpt='step_115'] td[data-prov]")
    page.wait_for_selector("#provenance:not([hidden])")
    assert "scores/r/step_115/code/greedy-s42.json" in page.locator("#provenance").inner_text()
    view.close()
    view = Page(browser)
    page = view.open(tmp_path / "s" / "report.html")
    assert page.locator("#ckpt-task tbody tr").count() < 120  # not scrolled: the first rows
    page.click("#ckpt-task th[data-col='code']")
    assert page.evaluate(every_row)
    view.close()
