"""The summary tables from hand-written cell files: tidy table, seeds, configs, pass@k, errors,
paired deltas, missing and corrupt cells, runs without a baseline."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from ckpteval.aggregate.cells import load_cells, load_samples
from ckpteval.aggregate.markdown import metrics_markdown
from ckpteval.aggregate.tables import TIDY_COLUMNS, reward_errors
from ckpteval.errors import UserError
from ckpteval.metrics import pass_at_k_table
from ckpteval.summary import build_summary, publish_summary, summarize


def write_cell(
    root: Path,
    run: str,
    ckpt: str,
    step: int | None,
    task: str,
    variant: str,
    *,
    metrics: dict[str, Any],
    samples: list[tuple[Any, int, bool]] | list[dict] | None = None,
    is_baseline: bool = False,
    error_types: dict[str, int] | None = None,
) -> Path:
    """Write `{variant}.json` (and `.jsonl` when `samples` is given) as the evaluate step does.

    `metrics` maps a name to a value or to a full `{"value", "stderr", "n"}` entry; `samples` are
    (task_id, sample_idx, passed) triples (score = passed) or complete per-sample dicts.
    """
    sampling, seed = variant.rsplit("-s", 1)
    cell_dir = root / "scores" / run / ckpt / task
    cell_dir.mkdir(parents=True, exist_ok=True)
    entries = {
        name: m if isinstance(m, dict) else {"value": m, "stderr": 0.01, "n": 10}
        for name, m in metrics.items()
    }
    cell = {
        "checker": "test",
        "scorer_version": "v1",
        "n_problems": 10,
        "n_samples": 1,
        "metrics": entries,
        "error_types": error_types or {},
        "input_errors": [],
        "duration_s": 0.1,
        "run": run,
        "ckpt": ckpt,
        "step": step,
        "task": task,
        "variant": variant,
        "sampling": sampling,
        "seed": int(seed),
        "model_hash": f"hash-{ckpt}",
        "generation_file": "g.jsonl",
        "generation_sha256": "0",
        "is_baseline": is_baseline,
    }
    path = cell_dir / f"{variant}.json"
    path.write_text(json.dumps(cell))
    if samples is not None:
        lines = [
            s
            if isinstance(s, dict)
            else {
                "task_id": s[0],
                "sample_idx": s[1],
                "passed": s[2],
                "score": float(s[2]),
                "error_type": None if s[2] else "wrong_answer",
            }
            for s in samples
        ]
        (cell_dir / f"{variant}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def write_solved(root: Path, solved: dict[tuple[str, str], int], n: int) -> Path:
    """A results directory of run `r`: per (checkpoint, task), one greedy cell of `n` problems of
    which the first `solved` pass (`base` is the baseline at step 0, `step_N` at step N), and its
    summary. Returns `root`."""
    for (ckpt, task), count in solved.items():
        write_cell(
            root,
            "r",
            ckpt,
            0 if ckpt == "base" else int(ckpt.split("_")[1]),
            task,
            "greedy-s42",
            metrics={"pass@1": count / n},
            samples=[(f"p{i}", 0, i < count) for i in range(n)],
            is_baseline=ckpt == "base",
        )
    build_summary(sorted((root / "scores").glob("*/*/*/*.json")), root / "summary", bootstrap=50)
    return root


def verdicts(passes: list[int], samples: int = 1) -> list[tuple[str, int, bool]]:
    """(task_id, sample_idx, passed) for problems p0, p1, ...: problem i passes its first
    `passes[i]` samples."""
    return [(f"p{i}", s, s < n) for i, n in enumerate(passes) for s in range(samples)]


# tidy table --------------------------------------------------------------------------------------


def test_tidy_table_from_hand_written_cells(tmp_path: Path) -> None:
    paths = [
        write_cell(
            tmp_path,
            "r",
            "step_1000",
            1000,
            "code",
            "greedy-s1",
            metrics={"pass@1": 0.6, "compile_rate": 0.9},
        ),
        write_cell(
            tmp_path,
            "r",
            "base",
            0,
            "code",
            "greedy-s1",
            is_baseline=True,
            metrics={"pass@1": {"value": 0.1, "stderr": "N/A", "n": 10}, "compile_rate": 0.5},
        ),
        write_cell(
            tmp_path,
            "r",
            "step_200",
            200,
            "code",
            "greedy-s1",
            metrics={"pass@1": 0.3, "compile_rate": 0.8},
        ),
    ]
    tidy = summarize(paths).tidy
    assert list(tidy.columns) == TIDY_COLUMNS
    # baseline first, then by step as a number (200 before 1000), metrics in the file's order
    assert list(zip(tidy["ckpt"], tidy["metric"])) == [
        ("base", "pass@1"),
        ("base", "compile_rate"),
        ("step_200", "pass@1"),
        ("step_200", "compile_rate"),
        ("step_1000", "pass@1"),
        ("step_1000", "compile_rate"),
    ]
    assert list(tidy["value"]) == [0.1, 0.5, 0.3, 0.8, 0.6, 0.9]
    assert math.isnan(tidy["stderr"][0])  # lm-eval's "N/A" stderr
    assert tidy["stderr"][1] == 0.01 and tidy["n"][1] == 10
    assert list(tidy["is_baseline"]) == [True, True, False, False, False, False]
    assert tidy["step"].dtype == "Int64" and list(tidy["step"].unique()) == [0, 200, 1000]
    first = tidy.iloc[2]
    assert (first["run"], first["task"], first["variant"], first["sampling"], first["seed"]) == (
        "r",
        "code",
        "greedy-s1",
        "greedy",
        1,
    )
    assert (first["scorer_version"], first["model_hash"]) == ("v1", "hash-step_200")
    assert first["source"] == str(paths[2])


def test_intervals_stay_in_range_and_are_clustered_by_problem(tmp_path: Path) -> None:
    """Wilson for scores in [0, 1] (not zero-width at 0: the per-source reward of 0.000 over 4
    problems), inflated by the design effect where a problem's samples agree; the normal
    interval for rewards outside [0, 1]; the seed table carries the same interval."""
    zero = {"value": 0.0, "stderr": 0.0, "n": 4}
    rw = write_cell(
        tmp_path,
        "r",
        "step_1",
        1,
        "rw",
        "greedy-s1",
        metrics={"reward_mean": zero, "val-core/src/reward/mean@1": zero},
        samples=[{"task_id": f"p{i}", "sample_idx": 0, "score": 0.0} for i in range(4)],
    )
    # 10 problems x 4 samples, each problem's samples all pass or all fail: design effect 4
    qa_samples = [(f"q{i}", j, i < 5) for i in range(10) for j in range(4)]
    qa = write_cell(
        tmp_path,
        "r",
        "step_1",
        1,
        "qa",
        "t07-s1",
        metrics={"accuracy": {"value": 0.5, "stderr": math.sqrt(0.25 / 39), "n": 40}},
        samples=qa_samples,
    )
    big = write_cell(
        tmp_path,
        "r",
        "step_1",
        1,
        "big",
        "greedy-s1",
        metrics={"reward_mean": {"value": 2.5, "stderr": 0.5, "n": 2}},
        samples=[{"task_id": f"b{i}", "sample_idx": 0, "score": 2.0 + i} for i in range(2)],
    )
    # 2 of 10 samples errored: the cell's own interval reaches the mean with them all at 1
    errored = {"value": 0.4, "stderr": 0.16, "n": 10, "errors_at": [0, 1], "interval": [0.1, 0.9]}
    err = write_cell(
        tmp_path,
        "r",
        "step_1",
        1,
        "err",
        "greedy-s1",
        metrics={"reward_mean": errored},
        samples=[{"task_id": f"e{i}", "sample_idx": 0, "score": i % 2} for i in range(8)],
    )
    for path, problems, samples in ((rw, 4, 4), (qa, 10, 40), (big, 2, 2), (err, 10, 10)):
        cell = json.loads(path.read_text())
        path.write_text(json.dumps({**cell, "n_problems": problems, "n_samples": samples}))
    summary = summarize([rw, qa, big, err])
    tidy = summary.tidy.set_index(["task", "metric"])
    for metric in ("reward_mean", "val-core/src/reward/mean@1"):
        row = tidy.loc[("rw", metric)]
        assert row["ci_method"] == "wilson" and row["n_eff"] == 4
        assert row["ci_low"] == 0 and row["ci_high"] == pytest.approx(0.49, abs=0.005)
    qa_row = tidy.loc[("qa", "accuracy")]
    assert qa_row["ci_method"] == "wilson"
    assert qa_row["n_eff"] == pytest.approx(39 / 4)  # 40 samples worth 10 problems
    assert qa_row["ci_low"] == pytest.approx(0.237, abs=0.005)
    assert qa_row["ci_high"] == pytest.approx(0.763, abs=0.005)
    big_row = tidy.loc[("big", "reward_mean")]
    assert big_row["ci_method"] == "normal"
    assert (big_row["ci_low"], big_row["ci_high"]) == pytest.approx((2.5 - 0.98, 2.5 + 0.98), 1e-3)
    err_row = tidy.loc[("err", "reward_mean")]
    assert err_row["ci_method"] == "wilson"  # Wilson's [0.17, 0.69] widened to the cell's own
    assert (err_row["ci_low"], err_row["ci_high"]) == (0.1, 0.9)
    seeds = summary.seeds.set_index(["task", "metric"])
    keys = [
        ("rw", "reward_mean"),
        ("qa", "accuracy"),
        ("big", "reward_mean"),
        ("err", "reward_mean"),
    ]
    for key in keys:
        assert seeds.loc[key, "ci_low"] == pytest.approx(tidy.loc[key, "ci_low"])
        assert seeds.loc[key, "ci_high"] == pytest.approx(tidy.loc[key, "ci_high"])


def test_seed_table_mean_std_stderr_over_seeds(tmp_path: Path) -> None:
    paths = [
        write_cell(
            tmp_path,
            "r",
            "step_1",
            1,
            "math",
            "t1-s1",
            metrics={"accuracy": {"value": 0.4, "stderr": 0.03, "n": 50}},
        ),
        write_cell(
            tmp_path,
            "r",
            "step_1",
            1,
            "math",
            "t1-s2",
            metrics={"accuracy": {"value": 0.6, "stderr": 0.04, "n": 50}},
        ),
        write_cell(
            tmp_path,
            "r",
            "step_1",
            1,
            "math",
            "greedy-s1",
            metrics={"accuracy": {"value": 0.55, "stderr": 0.05, "n": 50}},
        ),
    ]
    seeds = summarize(paths).seeds.set_index("sampling")
    t1 = seeds.loc["t1"]
    assert t1["mean"] == pytest.approx(0.5)
    assert t1["std"] == pytest.approx(math.sqrt(0.02))  # sample std of 0.4, 0.6
    assert t1["stderr"] == pytest.approx(0.1)  # std / sqrt(2)
    assert t1["n_seeds"] == 2 and t1["seeds"] == "1 2"
    assert t1["cell_stderr"] == pytest.approx(math.sqrt((0.03**2 + 0.04**2) / 2))
    greedy = seeds.loc["greedy"]
    assert greedy["n_seeds"] == 1 and math.isnan(greedy["std"])
    assert greedy["cell_stderr"] == pytest.approx(0.05)


def test_config_table_summarises_each_sampling_config(tmp_path: Path) -> None:
    paths = [
        write_cell(
            tmp_path, "r", "base", 0, "t", "greedy-s1", is_baseline=True, metrics={"acc": 0.1}
        )
    ]
    for step, value in [(100, 0.3), (200, 0.7), (300, 0.5)]:
        paths.append(
            write_cell(tmp_path, "r", f"s{step}", step, "t", "greedy-s1", metrics={"acc": value})
        )
    row = summarize(paths).configs.iloc[0]
    assert (row["n_ckpts"], row["n_seeds"]) == (3, 1)
    assert row["mean"] == pytest.approx(0.5)
    assert (row["first_step"], row["first_value"]) == (100, 0.3)
    assert (row["last_step"], row["last_value"]) == (300, 0.5)
    assert (row["max_step"], row["max_value"]) == (200, 0.7)
    assert row["baseline_value"] == 0.1


# missing and corrupt input -----------------------------------------------------------------------


def test_missing_and_corrupt_cells_are_listed_and_the_rest_is_built(tmp_path: Path) -> None:
    good = write_cell(
        tmp_path, "r", "s1", 1, "t", "greedy-s1", metrics={"acc": 0.5}, samples=verdicts([1, 0])
    )
    absent = tmp_path / "scores" / "r" / "s2" / "t" / "greedy-s1.json"
    truncated = write_cell(tmp_path, "r", "s3", 3, "t", "greedy-s1", metrics={"acc": 0.5})
    truncated.write_text(truncated.read_text()[:40])
    no_seed = write_cell(tmp_path, "r", "s4", 4, "t", "greedy-s1", metrics={"acc": 0.5})
    data = json.loads(no_seed.read_text())
    del data["seed"]
    no_seed.write_text(json.dumps(data))
    bad_metric = write_cell(tmp_path, "r", "s5", 5, "t", "greedy-s1", metrics={"acc": 0.5})
    bad_metric.write_text(bad_metric.read_text().replace('"value": 0.5', '"value": "high"'))
    bad_n = write_cell(
        tmp_path,
        "r",
        "s6",
        6,
        "t",
        "greedy-s1",
        metrics={"acc": {"value": 0.5, "stderr": 0.1, "n": 2.5}},
    )
    duplicate = tmp_path / "copy.json"
    duplicate.write_text(good.read_text())

    summary_dir = tmp_path / "summary"
    build_summary([good, absent, truncated, no_seed, bad_metric, bad_n, duplicate], summary_dir)

    missing = pd.read_csv(summary_dir / "missing.csv").set_index("path")
    assert missing.loc[str(absent), "reason"] == "file not found"
    assert missing.loc[str(absent), ["run", "ckpt", "task", "variant"]].tolist() == [
        "r",
        "s2",
        "t",
        "greedy-s1",
    ]
    assert missing.loc[str(truncated), "reason"].startswith("not valid JSON")
    assert "'seed'" in missing.loc[str(no_seed), "reason"]
    assert "metrics.acc" in missing.loc[str(bad_metric), "reason"]
    assert missing.loc[str(bad_n), "reason"] == "metrics.acc.n is not an integer"
    assert missing.loc[str(duplicate), "reason"] == f"duplicate of {good}"
    assert set(missing["kind"]) == {"cell"}
    tidy = pd.read_parquet(summary_dir / "metrics.parquet")
    assert list(tidy["ckpt"]) == ["s1"]
    html = (summary_dir / "report.html").read_text()
    for path in (absent, truncated, no_seed, bad_metric):
        assert str(path) in html


def test_bad_per_sample_files(tmp_path: Path) -> None:
    no_samples = write_cell(tmp_path, "r", "s1", 1, "t", "greedy-s1", metrics={"acc": 0.5})
    torn = write_cell(
        tmp_path, "r", "s2", 2, "t", "greedy-s1", metrics={"acc": 0.5}, samples=verdicts([1, 1, 0])
    )
    with open(torn.with_suffix(".jsonl"), "a") as handle:
        handle.write('{"task_id": "p3", "sample_id')  # a writer killed mid-line
    numeric = write_cell(
        tmp_path,
        "r",
        "s3",
        3,
        "t",
        "greedy-s1",
        metrics={"acc": 0.5},
        samples=[(7, 0, True), (8, 0, False)],
    )
    no_id = write_cell(
        tmp_path,
        "r",
        "s4",
        4,
        "t",
        "greedy-s1",
        metrics={"acc": 0.5},
        samples=[
            {"task_id": "p0", "sample_idx": 0, "passed": True, "score": 1.0},
            {"sample_idx": 1, "passed": True, "score": 1.0},
        ],
    )
    cells, problems = load_cells([no_samples, torn, numeric, no_id])
    assert not problems
    samples, sample_problems = load_samples(cells)
    notes = {Path(p.path).parent.parent.name: p.reason for p in sample_problems}
    assert notes["s1"].startswith("file not found")
    assert "1 malformed line(s) skipped" in notes["s2"]
    assert "without task_id or sample_idx" in notes["s4"]
    assert all(p.kind == "samples" for p in sample_problems)
    assert samples.groupby("cell").size().to_dict() == {1: 3, 2: 2, 3: 1}
    assert list(samples.loc[samples["cell"] == 2, "passed"]) == [1.0, 0.0]


def test_bootstrap_count_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="bootstrap"):
        build_summary([], tmp_path / "summary", bootstrap=0)


def test_summary_of_nothing_still_writes_every_file(tmp_path: Path) -> None:
    summary_dir = tmp_path / "summary"
    build_summary([tmp_path / "nope.json"], summary_dir)
    for name in (
        "metrics.parquet",
        "metrics.csv",
        "metrics.md",
        "seeds.csv",
        "configs.csv",
        "passk.csv",
        "errors.csv",
        "deltas.csv",
        "flips.csv",
        "missing.csv",
        "report.html",
    ):
        assert (summary_dir / name).exists(), name
    assert list(pd.read_parquet(summary_dir / "metrics.parquet").columns) == TIDY_COLUMNS
    assert "No scored cells." in (summary_dir / "metrics.md").read_text()


# paired deltas -----------------------------------------------------------------------------------


def test_deltas_against_baseline_and_previous_step(tmp_path: Path) -> None:
    # 4 problems, one sample each. base passes p0; s100 passes p0 p1; s200 passes p0 p1 p2.
    paths = [
        write_cell(
            tmp_path,
            "r",
            "base",
            0,
            "code",
            "greedy-s1",
            is_baseline=True,
            metrics={"pass@1": 0.25},
            samples=verdicts([1, 0, 0, 0]),
        ),
        write_cell(
            tmp_path,
            "r",
            "s200",
            200,
            "code",
            "greedy-s1",
            metrics={"pass@1": 0.75},
            samples=verdicts([1, 1, 1, 0]),
        ),
        write_cell(
            tmp_path,
            "r",
            "s100",
            100,
            "code",
            "greedy-s1",
            metrics={"pass@1": 0.5},
            samples=verdicts([1, 1, 0, 0]),
        ),
    ]
    deltas = summarize(paths, bootstrap=2000).deltas
    got = {(r.ckpt, r.comparison): r for r in deltas.itertuples()}
    assert set(got) == {("s100", "baseline"), ("s200", "baseline"), ("s200", "previous")}
    prev = got[("s200", "previous")]
    assert (prev.ref_ckpt, prev.step, prev.ref_step) == ("s100", 200, 100)
    assert (prev.metric, prev.seeds, prev.n_problems, prev.n_pairs) == ("pass@1", "1", 4, 4)
    # per-problem differences [0, 0, 1, 0]: see test_stats' hand-computed interval
    assert (prev.delta, prev.ci_low, prev.ci_high) == (0.25, 0.0, 0.75)
    assert not prev.significant and not prev.regression
    assert got[("s200", "baseline")].delta == pytest.approx(0.5)


def test_a_real_drop_is_flagged_as_regression(tmp_path: Path) -> None:
    good = [1] * 30 + [0] * 10
    worse = [1] * 15 + [0] * 25  # loses 15 problems the previous step solved
    paths = [
        write_cell(
            tmp_path,
            "r",
            "s1",
            1,
            "t",
            "greedy-s1",
            metrics={"pass@1": 0.75},
            samples=verdicts(good),
        ),
        write_cell(
            tmp_path,
            "r",
            "s2",
            2,
            "t",
            "greedy-s1",
            metrics={"pass@1": 0.375},
            samples=verdicts(worse),
        ),
    ]
    row = summarize(paths).deltas.iloc[0]
    assert row["delta"] == pytest.approx(-0.375)
    assert row["ci_high"] < 0 and row["significant"] and row["regression"]


def test_deltas_pool_seeds_and_pair_only_shared_samples(tmp_path: Path) -> None:
    # Seeds 1 and 2 for s1, only seed 1 for s2: pairs come from seed 1 only. Scores are partial
    # credit (the main metric is not pass@1), so `score` is compared, not `passed`.
    def rows(scores: list[float]) -> list[dict]:
        return [
            {"task_id": f"p{i}", "sample_idx": 0, "passed": s == 1.0, "score": s}
            for i, s in enumerate(scores)
        ]

    paths = [
        write_cell(
            tmp_path,
            "r",
            "s1",
            1,
            "t",
            "t7-s1",
            metrics={"acc": 0.5},
            samples=rows([0.5, 0.5, 0.5]),
        ),
        write_cell(
            tmp_path,
            "r",
            "s1",
            1,
            "t",
            "t7-s2",
            metrics={"acc": 0.0},
            samples=rows([0.0, 0.0, 0.0]),
        ),
        write_cell(
            tmp_path,
            "r",
            "s2",
            2,
            "t",
            "t7-s1",
            metrics={"acc": 0.75},
            samples=rows([0.75, 0.75, 0.75]),
        ),
    ]
    row = summarize(paths).deltas.iloc[0]
    assert (row["metric"], row["seeds"], row["n_pairs"], row["n_problems"]) == ("acc", "1", 3, 3)
    assert row["delta"] == pytest.approx(0.25)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((0.25, 0.25))


def test_declared_primary_metric_is_the_main_one(tmp_path: Path) -> None:
    # A harness cell: per-sample `score` holds its primary metric, which is not the first listed.
    path = write_cell(
        tmp_path,
        "r",
        "s1",
        1,
        "h",
        "greedy-s1",
        metrics={"exact_match,flexible-extract": 0.5, "exact_match,strict-match": 0.25},
        samples=verdicts([1, 0, 0, 0]),
    )
    data = json.loads(path.read_text())
    data["primary_metric"] = "exact_match,strict-match"
    path.write_text(json.dumps(data))
    other = write_cell(
        tmp_path,
        "r",
        "s2",
        2,
        "h",
        "greedy-s1",
        metrics={"exact_match,flexible-extract": 0.5, "exact_match,strict-match": 0.5},
        samples=verdicts([1, 1, 0, 0]),
    )
    summary = summarize([path, other])
    assert summary.main_metrics == {"h": "exact_match,strict-match"}
    assert summary.deltas["metric"].tolist() == ["exact_match,strict-match"]
    assert summary.deltas["delta"].tolist() == [0.25]
    # the config chooses another (tasks.h.main_metric): the summary and its deltas follow it;
    # one its cells do not report is one line naming the ones they do
    chosen = summarize([path, other], main_metric={"h": "exact_match,flexible-extract"})
    assert chosen.main_metrics == {"h": "exact_match,flexible-extract"}
    assert chosen.deltas["metric"].tolist() == ["exact_match,flexible-extract"]
    with pytest.raises(UserError, match=r"tasks\.h\.main_metric: its cells report no 'acc'"):
        summarize([path, other], main_metric={"h": "acc"})


def test_run_without_baseline_has_no_baseline_comparisons(tmp_path: Path) -> None:
    paths = []
    for run, has_base in (("with", True), ("without", False)):
        if has_base:
            paths.append(
                write_cell(
                    tmp_path,
                    run,
                    "base",
                    0,
                    "t",
                    "greedy-s1",
                    is_baseline=True,
                    metrics={"pass@1": 0.0},
                    samples=verdicts([0, 0]),
                )
            )
        for step in (1, 2):
            paths.append(
                write_cell(
                    tmp_path,
                    run,
                    f"s{step}",
                    step,
                    "t",
                    "greedy-s1",
                    metrics={"pass@1": 0.5},
                    samples=verdicts([1, 0]),
                )
            )
    summary = summarize(paths)
    by_run = summary.deltas.groupby("run")["comparison"].agg(lambda c: sorted(c))
    assert by_run["with"] == ["baseline", "baseline", "previous"]
    assert by_run["without"] == ["previous"]
    configs = summary.configs.set_index("run")
    assert configs.loc["with", "baseline_value"] == 0.0
    assert math.isnan(configs.loc["without", "baseline_value"])


# pass@k and errors -------------------------------------------------------------------------------


def test_passk_pools_seeds_and_matches_the_metrics_module(tmp_path: Path) -> None:
    seed1 = verdicts([2, 1, 0, 2], samples=2)
    seed2 = verdicts([1, 0, 0, 2], samples=2)
    paths = [
        write_cell(
            tmp_path, "r", "s1", 1, "code", "t8-s1", metrics={"pass@1": 0.625}, samples=seed1
        ),
        write_cell(
            tmp_path, "r", "s1", 1, "code", "t8-s2", metrics={"pass@1": 0.375}, samples=seed2
        ),
    ]
    passk = summarize(paths).passk
    # pooled: 4 samples per problem, passes 3, 1, 0, 4
    expected = pass_at_k_table([(4, 3), (4, 1), (4, 0), (4, 4)])
    assert list(passk["k"]) == [1, 2, 3, 4]
    for k, value, stderr in zip(passk["k"], passk["value"], passk["stderr"]):
        assert value == pytest.approx(expected[k][0])
        assert stderr == pytest.approx(expected[k][1])
    assert set(passk["seeds"]) == {"1 2"} and set(passk["min_samples"]) == {4}
    assert passk["value"].iloc[0] == pytest.approx(0.5)  # (3 + 1 + 0 + 4) / 16


def test_passk_only_for_tasks_reporting_pass_at_k(tmp_path: Path) -> None:
    paths = [
        write_cell(
            tmp_path,
            "r",
            "s1",
            1,
            "math",
            "t-s1",
            metrics={"accuracy": 0.5},
            samples=verdicts([1, 0], samples=2),
        )
    ]
    assert summarize(paths).passk.empty


def test_error_fractions_are_of_scored_samples(tmp_path: Path) -> None:
    paths = [
        write_cell(
            tmp_path,
            "r",
            "s1",
            1,
            "code",
            "greedy-s1",
            metrics={"pass@1": 0.25},
            samples=verdicts([1, 0, 0, 0]),
            error_types={"compile_error": 2, "timeout": 1},
        )
    ]
    errors = summarize(paths).errors.set_index("error_type")
    assert errors.loc["compile_error", "count"] == 2
    assert errors.loc["compile_error", "fraction"] == pytest.approx(0.5)
    assert errors.loc["timeout", "fraction"] == pytest.approx(0.25)


# markdown and files ------------------------------------------------------------------------------


def test_metrics_markdown_rows_by_step_columns_task_metric(tmp_path: Path) -> None:
    paths = [
        write_cell(
            tmp_path,
            "r",
            "s20",
            20,
            "code",
            "greedy-s1",
            metrics={"pass@1": {"value": 0.5, "stderr": 0.1, "n": 10}},
        ),
        write_cell(
            tmp_path,
            "r",
            "s3",
            3,
            "code",
            "greedy-s1",
            metrics={"pass@1": {"value": 0.25, "stderr": 0.05, "n": 10}},
        ),
        write_cell(
            tmp_path,
            "r",
            "base",
            0,
            "code",
            "greedy-s1",
            is_baseline=True,
            metrics={"pass@1": {"value": 0.0, "stderr": 0.0, "n": 10}},
        ),
        write_cell(tmp_path, "r", "s3", 3, "math", "greedy-s1", metrics={"acc": 0.1}),
        write_cell(tmp_path, "r", "s3", 3, "math", "t7-s1", metrics={"acc": 0.2}),
    ]
    text = metrics_markdown(summarize(paths).seeds, "demo")
    lines = text.splitlines()
    table = [line for line in lines if line.startswith("|")]
    assert lines[0] == "# demo"
    assert table[0] == "| run | ckpt | step | code/pass@1 | math/acc (greedy) | math/acc (t7) |"
    # Wilson's intervals over the 10 problems: not zero-width at 0, inside [0, 1]
    assert table[2] == "| r | base (baseline) | 0 | 0.000 [0.000, 0.278] |  |  |"
    assert table[3] == (
        "| r | s3 | 3 | 0.250 [0.081, 0.558] | 0.100 [0.018, 0.404] | 0.200 [0.057, 0.510] |"
    )
    assert table[4] == "| r | s20 | 20 | 0.500 [0.237, 0.763] |  |  |"


def test_build_summary_writes_consistent_atomic_files(tmp_path: Path) -> None:
    paths = [
        write_cell(
            tmp_path,
            "r",
            "base",
            0,
            "code",
            "t8-s1",
            is_baseline=True,
            metrics={"pass@1": 0.2, "compile_rate": 0.5},
            samples=verdicts([1, 0, 0], 2),
            error_types={"compile_error": 3},
        ),
        write_cell(
            tmp_path,
            "r",
            "s1",
            1,
            "code",
            "t8-s1",
            metrics={"pass@1": 0.5, "compile_rate": 0.9},
            samples=verdicts([2, 1, 0], 2),
            error_types={"wrong_answer": 3},
        ),
    ]
    summary_dir = tmp_path / "summary"
    build_summary(paths, summary_dir, title="t", bootstrap=200, seed=3)
    tidy = pd.read_parquet(summary_dir / "metrics.parquet")
    csv = pd.read_csv(summary_dir / "metrics.csv")
    assert list(csv.columns) == TIDY_COLUMNS
    np.testing.assert_allclose(tidy["value"], csv["value"])
    assert list(tidy["ckpt"]) == list(csv["ckpt"]) == ["base", "base", "s1", "s1"]
    assert not list(summary_dir.rglob("*.tmp")), "temp files left behind"
    deltas = pd.read_csv(summary_dir / "deltas.csv")
    assert list(deltas["comparison"]) == ["baseline"]
    first = (summary_dir / "deltas.csv").read_text()
    build_summary(paths, summary_dir, title="t", bootstrap=200, seed=3)
    assert (summary_dir / "deltas.csv").read_text() == first, "same seed, same intervals"


# errored reward samples ---------------------------------------------------------------------------

#: A per-source metric of the reward sweep below: a source whose samples errored (`A`) and one
#: whose did not (`B`).
SOURCE_A = "val-core/a/reward/mean@1"
SOURCE_B = "val-core/b/reward/mean@1"


def reward_cell(
    root: Path, ckpt: str, step: int, variant: str, errored: int, *, known: bool = False
) -> Path:
    """A reward cell of 20 samples as the evaluate step writes it, `errored` of them (all of
    source A's, which has 14 samples; B has 6) without a score: a float reward's means exclude
    them (`excludes_errors`); with `known` (a bool reward) they count at 0 (`includes_errors`)."""

    def mean(value: float, scored: int) -> dict[str, Any]:
        if not errored or scored == 6:  # source B: nothing errored
            return {"value": value, "stderr": 0.0, "n": scored}
        if known:
            return {
                "value": value,
                "stderr": 0.1,
                "n": scored + errored,
                "includes_errors": errored,
                "errors_at": [0, 1],
                "interval": [0.3, 0.9],
            }
        return {"value": value, "stderr": 0.0, "n": scored, "excludes_errors": errored}

    metrics = {
        "reward_error_rate": {"value": errored / 20, "stderr": 0.1, "n": 20},
        "reward_mean": mean(1.0, 20 - errored),
        "pass@1": {"value": 0.7, "stderr": 0.1, "n": 20},
        SOURCE_A: mean(1.0, 14 - errored),
        SOURCE_B: mean(1.0, 6),
    }
    path = write_cell(root, "r", ckpt, step, "gsm", variant, metrics=metrics)
    path.write_text(json.dumps({**json.loads(path.read_text()), "primary_metric": "reward_mean"}))
    return path


def test_a_mean_over_the_scored_samples_says_so_in_metrics_md_with_its_own_counts(
    tmp_path: Path,
) -> None:
    """A float reward's headline of 1.000 over 6 errored samples of 20 is marked with what it
    does (excludes them), the counts from its own entry; so is the per-source column whose
    samples errored, and pass@1 says it counts them as failures. The other source's column and
    a checkpoint without errors carry no mark, and no sentence claims the errors are in n."""
    paths = [
        reward_cell(tmp_path, "s1", 1, "greedy-s42", 6),
        reward_cell(tmp_path, "s2", 2, "greedy-s42", 0),
    ]
    summary = summarize(paths)
    errors = reward_errors(summary.tidy, summary.main_metrics)
    text = metrics_markdown(summary.seeds, "t", None, None, errors, summary.main_metrics)
    header, s1, s2 = [line for line in text.splitlines() if line.startswith("| ")]
    cells = dict(zip(*([c.strip(" |") for c in line.split(" | ")] for line in (header, s1))))
    assert cells["gsm/reward_mean"] == "1.000 (excludes 6 of 20 errored) [^e1]"
    assert cells[f"gsm/{SOURCE_A}"] == "1.000 (excludes 6 of 14 errored) [^e1]"
    assert cells[f"gsm/{SOURCE_B}"] == "1.000"
    # Wilson's interval, its 20 samples worth the cell's 10 problems
    assert cells["gsm/pass@1"] == "0.700 [0.397, 0.892] (6 errored, counted as failures) [^e1]"
    assert "errored" not in s2 and "[^e" not in s2
    assert (
        "[^e1]: r s1 gsm (greedy): the reward function gave no score for 6 of 20 samples. "
        "reward_mean: mean over the 14 samples that returned a score; 6 of 20 errored and are "
        "excluded. pass@1: its 6 errored samples count as failures. "
        f"{SOURCE_A}: mean over the 8 samples that returned a score; 6 of 14 errored and are "
        "excluded."
    ) in text.splitlines()
    assert "counted in" not in text and text.count("[^e") == 4  # three marks, one footnote
    tidy = summary.tidy
    rows = tidy[(tidy["ckpt"] == "s1")].set_index("metric")
    assert rows.loc["reward_mean", ["errored", "errored_as", "n"]].tolist() == [6, "excluded", 14]
    assert rows.loc["pass@1", ["errored", "errored_as"]].tolist() == [6, "failure"]
    assert rows.loc[SOURCE_B, ["errored", "errored_as"]].tolist() == [0, ""]
    assert (tidy[tidy["ckpt"] == "s2"]["errored"] == 0).all()


def test_errored_samples_counted_at_the_bottom_and_over_seeds_are_worded_so(
    tmp_path: Path,
) -> None:
    """A bool reward counts its errored samples at 0 and says how many of all; over two seeds,
    one without errors, a mean's counts add up over both (the scored samples of the seed
    without errors included) and name the seeds."""
    bottom = [reward_cell(tmp_path / "b", "s1", 1, "greedy-s42", 4, known=True)]
    entry = reward_errors(summarize(bottom).tidy, {"gsm": "reward_mean"})[
        ("r", "s1", "gsm", "greedy")
    ]
    assert entry.words() == (
        "the reward function gave no score for 4 of 20 samples. "
        "reward_mean: 4 of 20 samples errored and count as 0, the bottom of the scores' range. "
        "pass@1: its 4 errored samples count as failures. "
        f"{SOURCE_A}: 4 of 14 samples errored and count as 0, the bottom of the scores' range."
    )
    assert dict(entry.numbers)["reward_mean"].mark() == "4 of 20 errored, counted as 0"
    seeds = [
        reward_cell(tmp_path / "s", "s1", 1, "greedy-s1", 2),
        reward_cell(tmp_path / "s", "s1", 1, "greedy-s2", 0),
    ]
    entry = reward_errors(summarize(seeds).tidy, {"gsm": "reward_mean"})[
        ("r", "s1", "gsm", "greedy")
    ]
    assert entry.errored == 2 and entry.samples == 40
    assert dict(entry.numbers)["reward_mean"].words("reward_mean") == (
        "reward_mean (seeds 1 2): mean over the 38 samples that returned a score; 2 of 40 "
        "errored and are excluded"
    )
    assert SOURCE_B not in dict(entry.numbers)


def test_seeds_that_count_errored_samples_differently_are_worded_each_with_its_seed(
    tmp_path: Path,
) -> None:
    """Seed 1's scores were all bools (errors at 0), seed 2's floats (errors left out): the mean
    over the two seeds is worded once per way, each with its own seed's counts."""
    paths = [
        reward_cell(tmp_path, "s1", 1, "greedy-s1", 2, known=True),
        reward_cell(tmp_path, "s1", 1, "greedy-s2", 3),
    ]
    entry = summarize(paths).reward_errors[("r", "s1", "gsm", "greedy")]
    assert (entry.errored, entry.samples) == (5, 40)
    assert [e.words(m) for m, e in entry.numbers if m == "reward_mean"] == [
        "reward_mean (seed 1): 2 of 20 samples errored and count as 0, the bottom of the scores' "
        "range",
        "reward_mean (seed 2): mean over the 17 samples that returned a score; 3 of 20 errored "
        "and are excluded",
    ]
    assert dict(entry.numbers)["pass@1"].words("pass@1") == (
        "pass@1 (seeds 1 2): its 5 errored samples count as failures"
    )


def test_a_published_summary_replaces_the_old_one_file_by_file(tmp_path: Path) -> None:
    """`publish_summary` puts a complete build in place: each file linked (no second copy) and
    renamed over the old one, the plots swapped whole, an optional file the new summary has not
    removed; the build itself is left as it was (the workflow publishes it again from there)."""
    built, summary = tmp_path / "built", tmp_path / "summary"
    build_summary([tmp_path / "nope.json"], built, title="new")
    (summary / "plots").mkdir(parents=True)
    (summary / "plots" / "old-steps.png").write_bytes(b"old plot")
    (summary / "metrics.md").write_text("# old")
    (summary / "training_curve.csv").write_text("left from a config with train_logs")
    (summary / "published").mkdir()  # the publish target's ledgers: not the summary's
    (summary / "published" / "wandb.json").write_text("{}")
    (built / "plots" / "new-steps.png").write_bytes(b"new plot")
    names = sorted(p.name for p in built.iterdir())
    publish_summary(built, [summary / name for name in names])
    assert (summary / "metrics.md").read_text().startswith("# new")
    assert (summary / "metrics.md").stat().st_ino == (built / "metrics.md").stat().st_ino
    assert [p.name for p in (summary / "plots").iterdir()] == ["new-steps.png"]
    assert not (summary / "training_curve.csv").exists()
    assert (summary / "published" / "wandb.json").read_text() == "{}"
    assert sorted(p.name for p in built.iterdir()) == names
    assert sorted(p.name for p in summary.iterdir()) == sorted([*names, "published"])
    with pytest.raises(FileNotFoundError, match="did not write"):
        publish_summary(built, [summary / "training_curve.csv"])
    assert (built / "report_files").is_dir()  # the workflow declares it: always there
    shutil.rmtree(built / "report_files")  # a build by an older ckpteval: published empty
    publish_summary(built, [summary / "report_files"])
    assert (summary / "report_files").is_dir() and not list((summary / "report_files").iterdir())


def test_deltas_say_when_errored_samples_count_as_zero_in_the_pair(tmp_path: Path) -> None:
    """deltas.csv's errored_note names, per side, the samples the reward function gave no score
    (the cells' reward_error_rate counts) and that the delta counts them as 0; a comparison
    without any has none."""
    cells = []
    for ckpt, step, errored in (("base", 0, 0), ("step_1", 1, 2), ("step_2", 2, 0)):
        samples = [
            {"task_id": f"p{i}", "sample_idx": 0, "score": 0.0 if i < errored else 0.5}
            for i in range(4)
        ]
        metrics = {
            "reward_mean": {"value": 0.5, "stderr": 0.1, "n": 4 - errored},
            "reward_error_rate": {"value": errored / 4, "stderr": 0.1, "n": 4},
        }
        if errored:
            metrics["reward_mean"]["excludes_errors"] = errored
        cells.append(
            write_cell(
                tmp_path,
                "r",
                ckpt,
                step,
                "gsm",
                "greedy-s42",
                metrics=metrics,
                samples=samples,
                is_baseline=ckpt == "base",
            )
        )
    deltas = summarize(cells, bootstrap=50).deltas
    notes = {(c, r): n for c, r, n in zip(deltas.ckpt, deltas.ref_ckpt, deltas.errored_note)}
    said = (
        "step_1: the reward function gave no score for 2 of 4 samples; this delta's "
        "reward_mean counts them as 0 (their score lines' score)"
    )
    assert notes == {
        ("step_1", "base"): said,
        ("step_2", "base"): "",
        ("step_2", "step_1"): said,
    }


def test_every_0_1_lm_eval_metric_gets_wilson_not_only_the_primary(tmp_path: Path) -> None:
    """The demo's `arith_harness` reports `exact_match` under two filters; only the primary one
    is the per-sample score, and the other got the normal interval: [-0.048, 0.148] at 0.05 and
    zero-width [0, 0] at 0, against docs/statistics.md."""
    cells = []
    for ckpt, value in (("base", 0.0), ("step_1", 0.05)):
        stderr = math.sqrt(value * (1 - value) / 19)
        entry = {"value": value, "stderr": stderr, "n": 20}
        path = write_cell(
            tmp_path,
            "r",
            ckpt,
            0 if ckpt == "base" else 1,
            "h",
            "greedy-s1",
            metrics={
                "exact_match,flexible-extract": entry,
                "exact_match,strict-match": entry,
                "acc,none": entry,
                "acc_norm,none": entry,
            },
            samples=[(f"p{i}", 0, i < value * 20) for i in range(20)],
            is_baseline=ckpt == "base",
        )
        cell = json.loads(path.read_text())
        cell.update(n_problems=20, primary_metric="exact_match,flexible-extract")
        path.write_text(json.dumps(cell))
        cells.append(path)
    tidy = summarize(cells).tidy
    assert set(tidy["ci_method"]) == {"wilson"}
    assert (tidy["ci_low"] >= 0).all() and (tidy["ci_high"] > tidy["value"]).all()
