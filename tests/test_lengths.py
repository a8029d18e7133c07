"""Length and truncation metrics: computed from the generation lines in the evaluate step (own
tasks, lm-eval tasks, `ckpteval score`), never a task's main metric, flagged above the threshold in
metrics.md, truncation.csv and the report, and drawn as curves over training step."""

from __future__ import annotations

import json
import re
import statistics
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from test_aggregate import write_cell

from ckpteval.aggregate.tables import main_metric, main_metrics
from ckpteval.cli import main
from ckpteval.evaluate import read_samples, score_samples
from ckpteval.harness import score_harness_file
from ckpteval.io import iter_jsonl
from ckpteval.metrics import LENGTH_METRICS, LengthTotals, mean_and_stderr, median_and_stderr
from ckpteval.report.page import page_data
from ckpteval.summary import build_summary, summarize

TASKS = Path(__file__).resolve().parents[1] / "src" / "ckpteval" / "data" / "tasks"
ARITH = {row["task_id"]: row for row in iter_jsonl(TASKS / "arith.jsonl")}


def _answer(task_id: str) -> str:
    return ARITH[task_id]["answer"].split("####")[-1].strip()


def _mixed_lines() -> list[dict[str, Any]]:
    """Ten arith samples: finish reasons stop/length/other/unknown/missing, token counts known
    and unknown, and reasoning fields on some."""
    ids = list(ARITH)[:10]
    rows: list[dict[str, Any]] = []
    reasons = ["stop", "length", "stop", None, "length", "abort", "stop", "length", "stop", None]
    tokens = [10, 48, 12, None, 48, 7, 20, 48, 9, 30]
    for i, (tid, reason, count) in enumerate(zip(ids, reasons, tokens)):
        row: dict[str, Any] = {
            "task_id": tid,
            "sample_idx": 0,
            "prompt": "q",
            "completion": f"#### {_answer(tid)}" if i % 2 == 0 else "#### -1",
            "finish_reason": reason,
            "prompt_tokens": 5,
            "completion_tokens": count,
        }
        if i == 9:
            del row["finish_reason"]  # a line without the field: unknown too
        if i < 4:
            row["reasoning_tokens"] = [30, 40, None, 6][i]
            row["truncated_reasoning"] = [False, True, False, False][i]
        rows.append(row)
    return rows


def _expected(rows: list[dict[str, Any]]) -> dict[str, tuple[float, int]]:
    """The length metrics of `rows`, recomputed by hand: name -> (value, n)."""
    reasons = [r["finish_reason"] for r in rows if r.get("finish_reason") is not None]
    tokens = [r["completion_tokens"] for r in rows if r.get("completion_tokens") is not None]
    thinking = [r["reasoning_tokens"] for r in rows if r.get("reasoning_tokens") is not None]
    cut = [r["truncated_reasoning"] for r in rows if "truncated_reasoning" in r]
    return {
        "completion_tokens_mean": (sum(tokens) / len(tokens), len(tokens)),
        "completion_tokens_median": (statistics.median(tokens), len(tokens)),
        "truncation_rate": (reasons.count("length") / len(reasons), len(reasons)),
        "reasoning_tokens_mean": (sum(thinking) / len(thinking), len(thinking)),
        "truncated_reasoning_rate": (sum(cut) / len(cut), len(cut)),
    }


def _check(metrics: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    expected = _expected(rows)
    assert {k: metrics[k] for k in LENGTH_METRICS if k in metrics}.keys() == expected.keys()
    for name, (value, n) in expected.items():
        assert metrics[name]["value"] == pytest.approx(value), name
        assert metrics[name]["n"] == n, name


# ------------------------------------------------------------------------------ the computation


def test_length_totals_leave_unknowns_out_and_count_only_length_as_truncated() -> None:
    rows = _mixed_lines()
    totals = LengthTotals()
    for row in rows:
        totals.add(row)
    metrics = totals.metrics()
    _check(metrics, rows)
    assert metrics["truncation_rate"]["n"] == 8  # two unknown reasons left out; abort is not cut
    assert metrics["truncation_rate"]["value"] == pytest.approx(3 / 8)
    assert metrics["completion_tokens_mean"]["n"] == 9
    tokens = [r["completion_tokens"] for r in rows if r["completion_tokens"] is not None]
    assert metrics["completion_tokens_mean"]["stderr"] == pytest.approx(
        mean_and_stderr([float(t) for t in tokens])[1]
    )
    assert metrics["reasoning_tokens_mean"] == {
        "value": pytest.approx(76 / 3),
        "stderr": pytest.approx(mean_and_stderr([30.0, 40.0, 6.0])[1]),
        "n": 3,
    }
    assert metrics["truncated_reasoning_rate"]["value"] == pytest.approx(0.25)


def test_nothing_known_means_no_metric_never_a_zero() -> None:
    totals = LengthTotals()
    assert totals.metrics() == {}
    for _ in range(3):  # replayed samples: every field null
        totals.add({"finish_reason": None, "completion_tokens": None, "prompt_tokens": None})
    totals.add({"completion_tokens": True, "finish_reason": 3})  # not a count, not a reason
    assert totals.metrics() == {}
    totals.add({"completion_tokens": 4})
    assert set(totals.metrics()) == {"completion_tokens_mean", "completion_tokens_median"}


def test_median_stderr_is_the_order_statistic_interval_and_fits_a_normal_sample() -> None:
    values = [5, 1, 9, 3, 7]
    median, stderr = median_and_stderr(values)
    # n = 5: ranks max(1, floor(2.5 - 2.19)) = 1 and min(5, ceil(1 + 2.5 + 2.19)) = 5
    assert median == 5 and stderr == pytest.approx((9 - 1) / (2 * 1.959964))
    assert median_and_stderr([4]) == (4.0, 0.0)
    assert median_and_stderr([2, 3]) == (2.5, pytest.approx(1 / (2 * 1.959964)))
    rng = np.random.default_rng(1)
    sample = rng.normal(0.0, 1.0, 4000)
    _, estimate = median_and_stderr(sample.tolist())
    asymptotic = np.sqrt(np.pi / 2) / np.sqrt(len(sample))  # 1.2533 sigma / sqrt(n)
    assert estimate == pytest.approx(asymptotic, rel=0.25)


# ------------------------------------------------------------------------- the evaluate step


def _score(tmp_path: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    gen = tmp_path / "greedy-s1.gen.jsonl"
    gen.write_text("".join(json.dumps(r) + "\n" for r in rows))
    errors: list[str] = []
    return score_samples(
        "math",
        ARITH,
        read_samples(gen, errors),
        tmp_path / "greedy-s1.jsonl",
        tmp_path / "greedy-s1.json",
        workers=1,
        input_errors=errors,
    )


def test_own_task_cell_gets_length_metrics_from_its_generation_lines(tmp_path: Path) -> None:
    rows = _mixed_lines()
    # a duplicate and a line without task_id are not scored, so they are not counted either
    bad = [{**rows[1], "completion_tokens": 1000, "finish_reason": "length"}, {"completion": "x"}]
    cell = _score(tmp_path, rows + bad)
    _check(cell["metrics"], rows)
    assert len(cell["input_errors"]) == 2
    assert cell["metrics"]["accuracy"]["value"] == pytest.approx(0.5)  # scores are unchanged
    on_disk = json.loads((tmp_path / "greedy-s1.json").read_text())
    assert on_disk["metrics"]["truncation_rate"] == cell["metrics"]["truncation_rate"]


def test_replayed_samples_have_no_length_metrics(tmp_path: Path) -> None:
    rows = [
        {
            "task_id": tid,
            "completion": "#### 1",
            "finish_reason": None,
            "completion_tokens": None,
        }
        for tid in list(ARITH)[:4]
    ]
    cell = _score(tmp_path, rows)
    assert not set(LENGTH_METRICS) & set(cell["metrics"])
    assert "accuracy" in cell["metrics"]


@pytest.mark.slow
def test_a_huge_cell_streams_through_without_keeping_its_lines(tmp_path: Path) -> None:
    """4,000 samples of 12 kB completions (48 MB if kept, over 1.5x the 30 MiB bound) from a
    generator: the metrics are exact, and the scorer's peak memory stays far below the lines'
    size. The test's time grows with the bytes scored (tracemalloc is on), so the lines are only
    as large as the bound needs."""
    ids = list(ARITH)
    n = 4_000
    pad = " " * 12_000

    def lines() -> Iterator[dict[str, Any]]:
        for i in range(n):
            tid = ids[i % len(ids)]
            yield {
                "task_id": tid,
                "sample_idx": i // len(ids),
                "completion": f"{pad}#### {_answer(tid)}",
                "finish_reason": "length" if i % 10 == 0 else "stop",
                "completion_tokens": i % 97,
            }

    tracemalloc.start()
    try:
        cell = score_samples(
            "math",
            ARITH,
            lines(),
            tmp_path / "big.jsonl",
            tmp_path / "big.json",
            workers=2,
            chunk_size=256,
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    metrics = cell["metrics"]
    assert metrics["truncation_rate"] == {
        "value": 0.1,
        "stderr": pytest.approx((0.1 * 0.9 / (n - 1)) ** 0.5),
        "n": n,
    }
    counts = [i % 97 for i in range(n)]
    assert metrics["completion_tokens_mean"]["value"] == pytest.approx(sum(counts) / n)
    assert metrics["completion_tokens_median"]["value"] == statistics.median(counts)
    assert metrics["accuracy"]["value"] == 1.0
    bound = 30 << 20
    assert n * len(pad) > 1.5 * bound  # kept lines alone would break the bound
    assert peak < bound, f"peak {peak / 2**20:.0f} MiB: lines are being kept"


def test_lm_eval_cell_gets_length_metrics_and_uses_finish_reason_when_given(
    tmp_path: Path,
) -> None:
    def harness_rows(with_reason: bool) -> list[dict[str, Any]]:
        rows = []
        for i in range(6):
            row: dict[str, Any] = {
                "task_id": f"arith_harness/{i}",
                "sample_idx": 0,
                "prompt": "q",
                "completion": "x",
                "target": "1",
                "filtered": {"strict-match": "1"},
                "metrics": {"exact_match,strict-match": float(i % 2)},
                "completion_tokens": [3, 5, 8, None, 13, 21][i],
            }
            if with_reason:
                row["finish_reason"] = ["stop", "length", None, "stop", "length", "stop"][i]
            rows.append(row)
        return rows

    for with_reason in (False, True):
        rows = harness_rows(with_reason)
        gen = tmp_path / f"{with_reason}.gen.jsonl"
        gen.write_text("".join(json.dumps(r) + "\n" for r in rows))
        cell = score_harness_file(
            gen, tmp_path / f"{with_reason}.jsonl", tmp_path / f"{with_reason}.json", provenance={}
        )
        metrics = cell["metrics"]
        assert cell["primary_metric"] == "exact_match,strict-match"
        assert metrics["completion_tokens_mean"] == {
            "value": pytest.approx(50 / 5),
            "stderr": pytest.approx(mean_and_stderr([3.0, 5.0, 8.0, 13.0, 21.0])[1]),
            "n": 5,
        }
        assert metrics["completion_tokens_median"]["value"] == 8
        if with_reason:
            assert metrics["truncation_rate"]["value"] == pytest.approx(2 / 5)
            assert metrics["truncation_rate"]["n"] == 5
        else:  # today's harness lines: no finish reason, so no truncation rate
            assert "truncation_rate" not in metrics


def test_the_score_command_reports_length_metrics_of_its_samples_file(tmp_path: Path) -> None:
    rows = _mixed_lines()
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    status = main(
        [
            "score",
            "math",
            "--problems",
            str(TASKS / "arith.jsonl"),
            "--samples",
            str(samples),
            "--out",
            str(tmp_path / "r.jsonl"),
        ]
    )
    assert status == 0
    _check(json.loads((tmp_path / "r.json").read_text())["metrics"], rows)


# ------------------------------------------------------------------------- aggregate and report


def test_length_metrics_are_never_the_main_metric() -> None:
    names = [*LENGTH_METRICS, "hack_rate", "accuracy"]
    assert main_metric(names) == "accuracy"
    assert main_metric(["completion_tokens_mean", "truncation_rate", "pass@1"]) == "pass@1"


def _lengths(truncation: float, tokens: float, n: int = 100) -> dict[str, Any]:
    return {
        "completion_tokens_mean": {"value": tokens, "stderr": 2.0, "n": n},
        "completion_tokens_median": {"value": tokens - 3, "stderr": None, "n": n},
        "truncation_rate": {"value": truncation, "stderr": 0.01, "n": n},
        "reasoning_tokens_mean": {"value": tokens / 2, "stderr": 1.0, "n": n},
        "truncated_reasoning_rate": {"value": truncation / 2, "stderr": 0.01, "n": n},
    }


@pytest.fixture
def sweep(tmp_path: Path) -> list[Path]:
    """Task `think` (its length metrics listed before its accuracy) at steps 1-4: truncation rate
    0.0, exactly the 0.05 threshold (not flagged), 0.06 (flagged) and 0.5 (flagged, two seeds
    pooled); task `plain` reports no length metric at all."""
    rates = {1: 0.0, 2: 1 / 20, 3: 0.06, 4: 0.5}
    paths = []
    for step, rate in rates.items():
        for seed in (1, 2) if step == 4 else (1,):
            paths.append(
                write_cell(
                    tmp_path,
                    "r",
                    f"step_{step}",
                    step,
                    "think",
                    f"greedy-s{seed}",
                    metrics={
                        **_lengths(rate if seed == 1 else 0.3, 100.0 * step),
                        "accuracy": 0.1 * step,
                    },
                )
            )
        paths.append(
            write_cell(
                tmp_path, "r", f"step_{step}", step, "plain", "greedy-s1", metrics={"acc": 1}
            )
        )
    return paths


def test_main_metric_of_a_task_with_length_metrics_stays_its_score(sweep: list[Path]) -> None:
    from ckpteval.aggregate.cells import load_cells

    cells, _ = load_cells(sweep)
    assert main_metrics(cells) == {"think": "accuracy", "plain": "acc"}
    summary = summarize(sweep, bootstrap=20)
    tidy = summary.tidy
    assert set(tidy.loc[tidy["task"] == "think", "metric"]) == {*LENGTH_METRICS, "accuracy"}
    median = tidy[(tidy["metric"] == "completion_tokens_median") & (tidy["ckpt"] == "step_1")]
    assert median["value"].item() == 97.0 and median["stderr"].isna().all()


def test_truncation_flag_is_strictly_above_the_threshold(sweep: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "summary"
    build_summary(sweep, out, bootstrap=20)
    table = pd.read_csv(out / "truncation.csv")
    assert list(table["task"].unique()) == ["think"]  # `plain` has no truncation rate: no row
    flagged = table.set_index(["ckpt", "seed"])["flagged"]
    assert flagged.to_dict() == {
        ("step_1", 1): False,
        ("step_2", 1): False,  # exactly 0.05: at the threshold is not above it
        ("step_3", 1): True,
        ("step_4", 1): True,
        ("step_4", 2): True,
    }
    assert (table["threshold"] == 0.05).all()
    build_summary(sweep, out, bootstrap=20, truncation_threshold=0.4)
    table = pd.read_csv(out / "truncation.csv")
    assert list(table.loc[table["flagged"], "ckpt"]) == ["step_4"]


def test_metrics_md_marks_lower_bounds_and_has_a_length_table(
    sweep: list[Path], tmp_path: Path
) -> None:
    out = tmp_path / "summary"
    build_summary(sweep, out, bootstrap=20)
    text = (out / "metrics.md").read_text()
    main, lengths = text.split("## Length and truncation")
    header = main.splitlines()[[line.startswith("| run") for line in main.splitlines()].index(True)]
    assert "think/accuracy" in header and "completion_tokens" not in header
    rows = {line.split(" | ")[1]: line for line in main.splitlines() if line.startswith("| r |")}
    assert "[^t" not in rows["step_1"] and "[^t" not in rows["step_2"]
    assert "0.300 [0.280, 0.320] [^t1]" in rows["step_3"] and "[^t2]" in rows["step_4"]
    assert (
        "[^t1]: r step_3 think (greedy): score is a lower bound: 6% of samples hit the token "
        "budget" in lengths
    )
    assert "[^t2]: r step_4 think (greedy): score is a lower bound: 40% of samples" in lengths
    assert "think/truncation_rate" in lengths and "think/completion_tokens_mean" in lengths


def test_report_has_length_and_truncation_curves_and_states_lower_bounds(
    sweep: list[Path], tmp_path: Path
) -> None:
    out = tmp_path / "summary"
    build_summary(sweep, out, bootstrap=20)
    pngs = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert "lengths-think.png" in pngs and "truncation-think.png" in pngs
    assert "lengths-plain.png" not in pngs and "truncation-plain.png" not in pngs
    html = (out / "report.html").read_text()
    section = html[html.index("<h2>Length and truncation</h2>") :]
    section = section[: section.index("<h2>", 5)]
    series = page_data(html)["series"]  # what the page's per-task charts draw
    think = {r["metric"] for r in series if r["task"] == "think"}
    assert {"completion_tokens_mean", "truncation_rate"} <= think
    assert not {r["metric"] for r in series if r["task"] == "plain"} & set(LENGTH_METRICS)
    assert "r step_3 think (greedy): accuracy — score is a lower bound: 6%" in section
    assert "step_2 think" not in section.split("<ul>")[1].split("</ul>")[0]
    metrics = html[html.index("<h2>Metrics</h2>") :]
    assert "0.300 [0.280, 0.320] (lower bound)" in metrics
    assert not re.search(r"0\.100 \[[^]]*\] \(lower bound\)", metrics)


def test_length_curves_plot_mean_median_and_reasoning_per_run(sweep: list[Path]) -> None:
    from ckpteval.report import _lengths_figure, _truncation_figure

    summary = summarize(sweep, bootstrap=20)
    rows = summary.seeds[summary.seeds["task"] == "think"]
    ax = _lengths_figure("think", rows).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert lines["r median"].get_linestyle() == "--"
    assert list(lines["r mean"].get_xdata()) == [1, 2, 3, 4]
    assert list(lines["r mean"].get_ydata()) == [100, 200, 300, 400]
    assert list(lines["r reasoning mean"].get_ydata()) == [50, 100, 150, 200]
    ax = _truncation_figure("think", rows, 0.05).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["r truncated"].get_ydata()) == pytest.approx([0, 0.05, 0.06, 0.4])
    assert "threshold 5%" in lines
