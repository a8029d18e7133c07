"""Paired comparisons on hand-made score files: McNemar columns of deltas.csv, flips.csv, the
`ckpteval compare` command (output, exit codes, JSON, unknown names, provenance warnings) and the
report's "Paired comparisons" section."""

from __future__ import annotations

import html
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from test_aggregate import write_cell

from ckpteval.aggregate.deltas import DELTA_COLUMNS, FLIP_COLUMNS
from ckpteval.compare import compare
from ckpteval.stats import paired_mde
from ckpteval.summary import build_summary

# Problems p0..p9, one greedy sample each. base solves p0-p4; step_100 solves p0-p2 and p5-p9;
# step_200 solves everything but p1 and has no sample of p9 (missing on that side).
SOLVED = {
    "base": {0, 1, 2, 3, 4},
    "step_100": {0, 1, 2, 5, 6, 7, 8, 9},
    "step_200": {0, 2, 3, 4, 5, 6, 7, 8},
}
STEPS = {"base": 0, "step_100": 100, "step_200": 200}


def _samples(ckpt: str) -> list[tuple[str, int, bool]]:
    problems = range(9) if ckpt == "step_200" else range(10)
    return [(f"p{i}", 0, i in SOLVED[ckpt]) for i in problems]


def _patch(path: Path, **fields: Any) -> None:
    cell = json.loads(path.read_text())
    cell.update(fields)
    path.write_text(json.dumps(cell))


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """results/scores: run r (baseline base, step_100, step_200) on a pass/fail task `code` and
    a task `qa` whose per-sample scores are F1 values, not 0/1."""
    for ckpt, step in STEPS.items():
        write_cell(
            tmp_path,
            "r",
            ckpt,
            step,
            "code",
            "greedy-s42",
            metrics={"pass@1": 0.5},
            samples=_samples(ckpt),
            is_baseline=ckpt == "base",
        )
        write_cell(
            tmp_path,
            "r",
            ckpt,
            step,
            "qa",
            "greedy-s42",
            metrics={"f1": 0.5},
            samples=[
                {
                    "task_id": f"q{i}",
                    "sample_idx": 0,
                    "passed": False,
                    "score": 0.1 * i + step / 1e3,
                }
                for i in range(5)
            ],
            is_baseline=ckpt == "base",
        )
    return tmp_path


def _cells(root: Path) -> list[Path]:
    return sorted((root / "scores").glob("*/*/*/*.json"))


def _ckpteval(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckpteval.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


# deltas.csv and flips.csv ---------------------------------------------------------------------


def test_deltas_carry_mcnemar_counts_p_and_mde(results: Path) -> None:
    build_summary(_cells(results), results / "summary", bootstrap=200)
    deltas = pd.read_csv(results / "summary" / "deltas.csv")
    assert list(deltas.columns) == DELTA_COLUMNS
    code = deltas[deltas["task"] == "code"].set_index(["ckpt", "ref_ckpt"])
    # step_100 vs base: gained p5-p9 (c=5), lost p3, p4 (b=2): p = 2 (1 + 7 + 21) / 2^7.
    row = code.loc[("step_100", "base")]
    assert (row["paired_test"], row["n_problems"], row["n_gained"], row["n_lost"]) == (
        "mcnemar-exact",
        10,
        5,
        2,
    )
    assert row["mcnemar_p"] == pytest.approx(58 / 128)
    assert row["delta"] == pytest.approx(0.3)
    assert row["mde"] == pytest.approx(paired_mde(10, 7))
    # step_200 vs base: p9 has no sample in step_200, so 9 problems; gained p5-p8, lost p1.
    row = code.loc[("step_200", "base")]
    assert (row["n_problems"], row["n_gained"], row["n_lost"]) == (9, 4, 1)
    assert row["mcnemar_p"] == pytest.approx(2 * (1 + 5) / 32)
    # step_200 vs step_100: gained p3, p4, lost p1: p = min(1, 2 (1 + 3) / 8).
    row = code.loc[("step_200", "step_100")]
    assert (row["n_problems"], row["n_gained"], row["n_lost"], row["mcnemar_p"]) == (9, 2, 1, 1.0)
    qa = deltas[deltas["task"] == "qa"]
    assert len(qa) == 3
    assert set(qa["paired_test"]) == {"none: scores not 0/1"}
    assert qa["mcnemar_p"].isna().all() and qa["mde"].isna().all()
    assert (qa["n_gained"] == 0).all() and (qa["n_lost"] == 0).all()


def test_flips_csv_lists_exactly_the_flipped_problems(results: Path) -> None:
    build_summary(_cells(results), results / "summary", bootstrap=50)
    flips = pd.read_csv(results / "summary" / "flips.csv")
    assert list(flips.columns) == FLIP_COLUMNS
    got = sorted(map(tuple, flips.astype(str).to_numpy().tolist()))
    expected = [
        ("r", "code", "greedy", a, b, f"p{i}", direction)
        for a, b, gained, lost in (
            ("base", "step_100", [5, 6, 7, 8, 9], [3, 4]),
            ("base", "step_200", [5, 6, 7, 8], [1]),
            ("step_100", "step_200", [3, 4], [1]),
        )
        for direction, ids in (("gained", gained), ("lost", lost))
        for i in ids
    ]
    assert got == sorted(expected)


def test_majority_of_samples_and_seeds_decides_a_problem(tmp_path: Path) -> None:
    """Three samples per problem and two seeds pooled: a problem is solved when more than half
    of its paired samples pass; samples one side lacks do not count."""
    verdicts = {
        # problem: (base's passing (seed, sample)s, step_1's passing (seed, sample)s)
        "a": ({(1, 0), (1, 1), (2, 0), (2, 1)}, {(1, 0)}),  # 4/6 -> 1/6: lost
        "b": (set(), {(1, 0), (1, 1), (1, 2), (2, 0)}),  # 0/6 -> 4/6: gained
        "c": ({(1, 0), (1, 1), (1, 2)}, {(1, 0), (1, 1), (1, 2)}),  # 3/6 both: unsolved both
    }
    for ckpt, side in (("base", 0), ("step_1", 1)):
        for seed in (1, 2):
            samples = [
                (problem, idx, (seed, idx) in passing[side])
                for problem, passing in verdicts.items()
                for idx in range(3)
                # step_1 has no sample 2 of problem a, seed 2 (that pair does not count)
                if not (ckpt == "step_1" and problem == "a" and seed == 2 and idx == 2)
            ]
            write_cell(
                tmp_path,
                "r",
                ckpt,
                1 if side else 0,
                "code",
                f"hot-s{seed}",
                metrics={"pass@1": 0.5},
                samples=samples,
                is_baseline=not side,
            )
    build_summary(_cells(tmp_path), tmp_path / "summary", bootstrap=50)
    row = pd.read_csv(tmp_path / "summary" / "deltas.csv").iloc[0]
    assert (row["n_problems"], row["n_pairs"], row["n_gained"], row["n_lost"]) == (3, 17, 1, 1)
    flips = pd.read_csv(tmp_path / "summary" / "flips.csv")
    assert dict(zip(flips["task_id"], flips["direction"])) == {"a": "lost", "b": "gained"}


# ckpteval compare ------------------------------------------------------------------------------


def test_compare_prints_delta_mcnemar_mde_and_flips(results: Path) -> None:
    proc = _ckpteval("compare", "r:base", "r:step_100", "--outdir", str(results))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    out = proc.stdout
    assert "r:step_100 minus r:base" in out
    assert "code (greedy, pass@1): 10 problems, 10 paired samples, seeds 42" in out
    assert "pass@1 0.500 -> 0.800, delta +0.300 [95% CI" in out
    assert f"McNemar exact p = {58 / 128:.4g} (gained 5, lost 2)" in out
    # Holm over the 2 comparisons shown: qa's (every problem +0.1: p = 0) is the smaller
    assert f"lost 2); Holm-adjusted over the 2 comparison(s) shown: {58 / 128:.4g}\n" in out
    assert (
        "  paired normal test p = 0; Holm-adjusted over the 2 comparison(s) shown: 0: "
        "significant gain\n" in out
    )
    assert f"MDE {paired_mde(10, 7):.3f}: at n=10" in out
    assert "gained (5): p5 p6 p7 p8 p9" in out
    assert "lost (2): p3 p4" in out
    assert "qa (greedy, f1): 5 problems" in out
    assert "no McNemar test (none: scores not 0/1)" in out


def test_compare_json_round_trip_agrees_with_deltas_csv(results: Path) -> None:
    proc = _ckpteval(
        "compare", "r:base", "r:step_200", "--outdir", str(results), "--task", "code", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert (document["a"], document["b"]) == ("r:base", "r:step_200")
    [cmp] = document["comparisons"]
    assert (cmp["task"], cmp["sampling"], cmp["metric"]) == ("code", "greedy", "pass@1")
    assert (cmp["gained"], cmp["lost"]) == (["p5", "p6", "p7", "p8"], ["p1"])
    build_summary(_cells(results), results / "summary", bootstrap=50)
    deltas = pd.read_csv(results / "summary" / "deltas.csv")
    row = deltas[(deltas["task"] == "code") & (deltas["ckpt"] == "step_200")]
    row = row[row["ref_ckpt"] == "base"].iloc[0]
    for key in ("n_problems", "n_pairs", "n_gained", "n_lost"):
        assert cmp[key] == row[key], key
    for key in ("delta", "mcnemar_p", "mde"):
        assert cmp[key] == pytest.approx(row[key]), key
    assert cmp["ci_low"] <= cmp["delta"] <= cmp["ci_high"]
    assert cmp["value_a"] == pytest.approx(5 / 9) and cmp["value_b"] == pytest.approx(8 / 9)
    assert cmp["delta"] == pytest.approx(3 / 9)
    qa = json.loads(
        _ckpteval(
            "compare", "r:base", "r:step_200", "--outdir", str(results), "--task", "qa", "--json"
        ).stdout
    )["comparisons"][0]
    assert qa["mcnemar_p"] is None and qa["paired_test"] == "none: scores not 0/1"
    assert qa["delta"] == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["r:base", "r:step_999"],
            "compare: run 'r' has no checkpoint 'step_999' in {root}/scores/r; its checkpoints: "
            "base, step_100, step_200",
        ),
        (
            ["x:base", "r:base"],
            "compare: run 'x' has no scores in {root}/scores; runs with scores: r",
        ),
        (
            ["r:base", "r:step_100", "--task", "nope"],
            "compare: task 'nope' is not scored for both r:base and r:step_100; tasks of both: "
            "code, qa",
        ),
        (
            ["r:base", "r:step_100", "--sampling", "hot"],
            "compare: sampling config 'hot' is not scored for both checkpoints (on the tasks "
            "asked); sampling configs of both: greedy",
        ),
        (["r-base", "r:step_100"], "compare: 'r-base': give a checkpoint as RUN:CKPT"),
    ],
)
def test_compare_unknown_names_are_one_line(results: Path, args: list[str], message: str) -> None:
    proc = _ckpteval("compare", *args, "--outdir", str(results))
    assert proc.returncode == 2
    assert proc.stdout == ""
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("ckpteval: error: " + message.format(root=results))


def test_compare_warns_about_chat_templates_checkers_and_scoring(results: Path) -> None:
    base = results / "scores/r/base/code/greedy-s42.json"
    new = results / "scores/r/step_100/code/greedy-s42.json"
    # Only one side records a template: nothing can be told, no warning.
    _patch(new, chat_template={"source": "tokenizer", "sha256": "b" * 64})
    proc = _ckpteval("compare", "r:base", "r:step_100", "--outdir", str(results))
    assert proc.returncode == 0 and proc.stderr == ""
    _patch(base, chat_template={"source": "tokenizer", "sha256": "a" * 64})
    proc = _ckpteval("compare", "r:base", "r:step_100", "--outdir", str(results))
    assert proc.returncode == 0
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(
        "ckpteval: warning: code (greedy): generated with different chat templates: r:base "
        "tokenizer (aaaaaaaaaaaa) vs r:step_100 tokenizer (bbbbbbbbbbbb)"
    )
    _patch(base, chat_template={"source": "tokenizer", "sha256": "b" * 64})
    _patch(new, checker_version="2")
    _patch(base, scoring={"evaluate.timeout": 10})
    _patch(new, scoring={"evaluate.timeout": 20})
    lines = _ckpteval("compare", "r:base", "r:step_100", "--outdir", str(results)).stderr
    assert lines.splitlines() == [
        "ckpteval: warning: code (greedy): scored with a different checker version: "
        "r:base None vs r:step_100 2",
        "ckpteval: warning: code (greedy): scored with different settings (the cells' scoring "
        'identity): r:base {"evaluate.timeout": 10} vs r:step_100 {"evaluate.timeout": 20}',
    ]


def test_compare_across_runs_ignores_the_run_name_in_scoring_keys(results: Path) -> None:
    other = write_cell(
        results,
        "q",
        "step_5",
        5,
        "code",
        "greedy-s42",
        metrics={"pass@1": 0.5},
        samples=_samples("base"),
    )
    _patch(other, scoring={"runs.q.chat_template": "none", "evaluate.timeout": 10})
    _patch(
        results / "scores/r/base/code/greedy-s42.json",
        scoring={"runs.r.chat_template": "none", "evaluate.timeout": 10},
    )
    proc = _ckpteval("compare", "r:base", "q:step_5", "--outdir", str(results))
    assert proc.returncode == 0 and proc.stderr == ""
    assert "code (greedy, pass@1): 10 problems" in proc.stdout
    assert "McNemar exact p = 1 (gained 0, lost 0)" in proc.stdout


# report -----------------------------------------------------------------------------------------


def test_report_has_the_paired_comparisons_section(results: Path) -> None:
    build_summary(_cells(results), results / "summary", bootstrap=50)
    page = (results / "summary" / "report.html").read_text()
    section = page.split("<h2>Paired comparisons</h2>", 1)[1].split("<h2>", 1)[0]
    assert "<h3>r</h3>" in section
    # the first and last checkpoint vs baseline, and each vs previous: every step's change
    assert "step_200 vs base" in section and "step_200 vs step_100" in section
    assert "step_100 vs base" in section
    assert "none: scores not 0/1" in section
    assert "<li>code (greedy) step_200 vs base: gained p5, p6, p7, p8; lost p1</li>" in section
    assert "<details><summary>Flipped problems" in section


def test_compare_unusable_cells_are_one_line(results: Path) -> None:
    (results / "scores/r/step_100/code/greedy-s42.jsonl").unlink()
    proc = _ckpteval("compare", "r:base", "r:step_100", "--outdir", str(results))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"ckpteval: error: compare: {results}/scores/r/step_100/code/greedy-s42.jsonl: "
        "per-sample file not found; rescore the cell"
    )
    (results / "scores/r/base/qa/greedy-s42.json").write_text("{not json")
    proc = _ckpteval("compare", "r:base", "r:step_100", "--outdir", str(results))
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"ckpteval: error: compare: {results}/scores/r/base/qa/greedy-s42.json")
    assert line.endswith("rescore the cell or remove it")
    # a task not asked for is not read
    proc = _ckpteval("compare", "r:base", "r:step_200", "--outdir", str(results), "--task", "code")
    assert proc.returncode == 0 and "code (greedy, pass@1)" in proc.stdout


def test_compare_names_tasks_without_a_common_sampling_config(results: Path) -> None:
    write_cell(
        results,
        "r",
        "step_100",
        100,
        "extra",
        "hot-s1",
        metrics={"pass@1": 0.5},
        samples=_samples("base"),
    )
    write_cell(
        results,
        "r",
        "base",
        0,
        "extra",
        "greedy-s42",
        metrics={"pass@1": 0.5},
        samples=_samples("base"),
        is_baseline=True,
    )
    proc = _ckpteval("compare", "r:base", "r:step_100", "--outdir", str(results))
    assert proc.returncode == 0
    assert proc.stderr.splitlines() == [
        "ckpteval: warning: extra: no sampling config scored by both; r:base: greedy; "
        "r:step_100: hot"
    ]
    assert "extra (" not in proc.stdout and "code (greedy, pass@1)" in proc.stdout


def test_compare_reads_the_outdir_from_configfile_and_its_page_opens_on_the_biggest_change(
    results: Path, tmp_path: Path
) -> None:
    import yaml

    from ckpteval.report.page import page_data

    config = tmp_path / "mine.yaml"
    config.write_text(
        yaml.safe_dump(
            {"outdir": str(results), "runs": {"r": {"path": str(tmp_path)}}, "tasks": {"code": {}}}
        )
    )
    page = tmp_path / "pair.html"
    args = ["compare", "r:base", "r:step_200", "--configfile", str(config)]
    proc = _ckpteval(*args, "--json", "--html", str(page))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == f"ckpteval: wrote {page}\n"
    comparisons = json.loads(proc.stdout)["comparisons"]  # stdout is the JSON alone
    assert {c["task"] for c in comparisons} == {"code", "qa"}  # the config's outdir was read
    top = max(comparisons, key=lambda c: abs(c["delta"]))
    focus = page_data(page.read_text())["focus"]
    assert focus == ["r:base", "r:step_200", f"{top['task']}|{top['sampling']}"]
    config.write_text(  # the config's main metric for a task is the one compared
        yaml.safe_dump(
            {
                "outdir": str(results),
                "runs": {"r": {"path": str(tmp_path)}},
                "tasks": {"code": {"main_metric": "f1"}},
            }
        )
    )
    chosen = _ckpteval("compare", "r:base", "r:step_200", "--configfile", str(config))
    assert chosen.returncode != 0
    assert "tasks.code.main_metric: its cells report no 'f1'" in chosen.stderr
    missing = _ckpteval(
        "compare", "r:base", "r:step_200", "--configfile", str(tmp_path / "no.yaml")
    )
    assert missing.returncode != 0 and "config file not found" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_compare_says_what_its_values_do_with_errored_reward_samples(tmp_path: Path) -> None:
    """step_100's float reward gave no score for 2 of 5 samples: its cell's reward_mean (1.0)
    leaves them out, while compare's paired values take the score lines' score, 0 for them;
    compare says both, with the cell's counts, and nothing of base, which had no errors."""
    for ckpt, errored in (("base", 0), ("step_100", 2)):
        samples = [
            {
                "task_id": f"q{i}",
                "sample_idx": 0,
                "passed": i >= errored,
                "score": float(i >= errored),
                "error_type": "reward_error" if i < errored else None,
            }
            for i in range(5)
        ]
        mean = {"value": 1.0, "stderr": 0.0, "n": 5 - errored}
        path = write_cell(
            tmp_path,
            "r",
            ckpt,
            STEPS[ckpt],
            "gsm",
            "greedy-s42",
            metrics={
                "reward_mean": mean | ({"excludes_errors": errored} if errored else {}),
                "reward_error_rate": {"value": errored / 5, "stderr": 0.1, "n": 5},
            },
            samples=samples,
            is_baseline=ckpt == "base",
        )
        _patch(path, primary_metric="reward_mean")
    results, warnings = compare(tmp_path, ("r", "base"), ("r", "step_100"))
    assert (results[0].value_a, results[0].value_b) == (1.0, 0.6)
    assert warnings == [
        "gsm (greedy): r:step_100: the reward function gave no score for 2 of 5 samples; "
        "compare's reward_mean counts them as 0 (their score lines' score); the cell's "
        "reward_mean: mean over the 3 samples that returned a score; 2 of 5 errored and are "
        "excluded"
    ]


# ckpteval compare A B C: several checkpoints side by side ---------------------------------------

# Task `big`: 30 problems, one greedy sample each. base solves p0-p9; r:step_1 also p10-p29
# (gained 20: McNemar p = 2^-19); q:step_9, another run, also p10-p15 (gained 6: p = 2/64 =
# 0.031, below 0.05 alone). Task `qa`: F1 scores of 5 problems; step_1 is about 0.1 lower on
# each (the normal test: p ~ 0), q:step_9 equal to base (p = 1). Holm over these 4
# comparisons: step_1's two stay significant; q:step_9's `big` becomes 2 x 0.031 = 0.0625: no
# mark, which the uncorrected p would have given.
MANY = {("r", "base"): range(10), ("r", "step_1"): range(30), ("q", "step_9"): range(16)}
QA_DROP = {("r", "base"): [0.0] * 5, ("r", "step_1"): [0.1, 0.12, 0.09, 0.11, 0.1]}
TRICKY = 'if a < b: return "<ok>" & 1'  # escaped on the page


@pytest.fixture
def many(tmp_path: Path) -> Path:
    """The three checkpoints above, with generation files whose completions need escaping."""
    for (run, ckpt), solved in MANY.items():
        share = len(solved) / 30
        path = write_cell(
            tmp_path,
            run,
            ckpt,
            int(ckpt.split("_")[-1]) if "_" in ckpt else 0,
            "big",
            "greedy-s42",
            metrics={
                "pass@1": {"value": share, "stderr": (share * (1 - share) / 30) ** 0.5, "n": 30}
            },
            samples=[(f"p{i}", 0, i in solved) for i in range(30)],
            is_baseline=ckpt == "base",
        )
        _patch(path, n_problems=30, n_samples=30)
        generations = tmp_path / "generations" / run / ckpt / "big" / "greedy-s42.jsonl"
        generations.parent.mkdir(parents=True)
        generations.write_text(
            "".join(
                json.dumps(
                    {
                        "task_id": f"p{i}",
                        "sample_idx": 0,
                        "prompt": f"Is {i} < 10?",
                        "completion": f"{TRICKY} {ckpt} {i}",
                    }
                )
                + "\n"
                for i in range(30)
            )
        )
        drop = QA_DROP.get((run, ckpt), [0.0] * 5)
        write_cell(
            tmp_path,
            run,
            ckpt,
            0,
            "qa",
            "greedy-s42",
            metrics={"f1": 0.7 - sum(drop) / 5},
            samples=[
                {"task_id": f"q{i}", "sample_idx": 0, "passed": False, "score": 0.5 + 0.1 * i - d}
                for i, d in enumerate(drop)
            ],
            is_baseline=ckpt == "base",
        )
    return tmp_path


def _wilson(p: float, n: int) -> tuple[float, float]:
    """Wilson's 95% score interval, written out here to check the page's independently."""
    z = 1.959963984540054
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return centre - half, centre + half


def _main(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`ckpteval` in this process (fast; the one-line error handling is `cli.main`'s)."""
    from ckpteval.cli import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_compare_three_checkpoints_text_and_page(
    many: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page_path = tmp_path / "side.html"
    code, out, err = _main(
        "compare", "r:base", "r:step_1", "q:step_9", "--outdir", str(many), "--html",
        str(page_path), "--bootstrap", "200", capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    assert err == f"ckpteval: wrote {page_path}\n"  # where the page went, on stderr alone
    lines = out.splitlines()
    assert lines[0].startswith("r:step_1, q:step_9 against r:base")
    assert "Holm's correction over the 4 comparisons shown" in lines[0]
    big = lines[lines.index("big (greedy, pass@1)") :]
    low, high = _wilson(10 / 30, 30)
    assert big[1].split() == ["r:base", "0.333", f"[{low:.3f},", f"{high:.3f}]"]
    assert big[2].startswith(f"  r:step_1  1.000 [{_wilson(1.0, 30)[0]:.3f}, 1.000]  delta +0.667")
    assert "delta +0.667" in big[2] and f"McNemar exact p = {2**-19:.4g}" in big[2]
    assert big[2].endswith("significant gain ▲")
    assert (
        f"McNemar exact p = {2 / 64:.4g}; Holm-adjusted over the 4 comparison(s) shown: "
        f"{4 / 64:.4g}"
    ) in big[3]
    assert not big[3].endswith("▲")
    assert big[4] == "  verdicts differ on 20 problem(s) all scored"
    assert big[5].split() == ["problem", "r:base", "r:step_1", "q:step_9"]
    assert big[6].split() == ["p10", "0/1", "✗", "1/1", "✓", "1/1", "✓"]
    assert big[6 + 6].split() == ["p16", "0/1", "✗", "1/1", "✓", "0/1", "✗"]
    assert big[6 + 20] == ""  # all 20 listed: the next task follows
    qa = lines[lines.index("qa (greedy, f1)") :]
    assert "paired normal test" in qa[2] and qa[2].endswith("significant drop ▼")
    assert "paired normal test p = 1;" in qa[3] and not qa[3].endswith("▲")
    assert [line.split()[1] for line in qa[1:4]] == ["0.700", "0.596", "0.700"]
    assert qa[4] == "  verdicts differ on 5 problem(s) all scored"
    assert qa[6].split() == ["q0", "0.500", "0.400", "0.500"]

    page = page_path.read_text()
    assert "<script" not in page and "http" not in page.split("<body>")[1]  # self-contained
    assert "Holm-adjusted over the 4 comparisons on this page" in page
    section = page.split('<h2 id="big|greedy">', 1)[1].split("<h2", 1)[0]
    assert f'<td>r:base</td><td class="num">0.333 [{low:.3f}, {high:.3f}]</td>' in section
    rows = section.split("<tr>")
    step_1 = next(r for r in rows if r.startswith("<td>r:step_1</td>"))
    assert '<span class="gain">▲</span>' in step_1
    q = next(r for r in rows if r.startswith("<td>q:step_9</td>"))
    assert f"{2 / 64:.4g} (McNemar)" in q and f'<td class="num">{4 / 64:.4g}</td>' in q
    assert "▲" not in q
    assert "Problems whose verdicts differ (20)" in section
    differing = [r.split("</td>", 1)[0] for r in rows if r.startswith("<td>p")]
    assert differing == [f"<td>p{i}" for i in range(10, 30)]
    p12 = next(r for r in rows if r.startswith("<td>p12</td>"))
    for ckpt in ("base", "step_1", "step_9"):  # every checkpoint's completion, escaped
        assert f"<pre>{html.escape(TRICKY)} {ckpt} 12</pre>" in p12
    assert "<summary>prompt</summary><pre>Is 12 &lt; 10?</pre>" in p12  # once, escaped
    assert "<summary>1/1 ✓</summary>" in p12 and "<summary>0/1 ✗</summary>" in p12
    assert "seed 42, sample 0: failed (wrong_answer)" in p12
    assert TRICKY not in page  # never unescaped
    assert "<td>p5</td>" not in section  # solved by all: not listed
    qa_section = page.split('<h2 id="qa|greedy">', 1)[1]
    assert '<span class="drop">▼</span>' in qa_section
    assert "Problems whose verdicts differ (5)" in qa_section
    assert "no file " in qa_section  # qa has no generation files: said in place


def test_compare_three_checkpoints_json_has_scores_and_differing_problems(
    many: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _main(
        "compare", "r:base", "r:step_1", "q:step_9", "--outdir", str(many), "--task", "big",
        "--json", "--bootstrap", "50", capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    document = json.loads(out)
    assert document["checkpoints"] == ["r:base", "r:step_1", "q:step_9"]
    assert document["correction"] == "holm" and "b" not in document
    [task] = document["tasks"]
    assert [s["value"] for s in task["scores"]] == pytest.approx([10 / 30, 1.0, 16 / 30])
    assert all(s["ci_method"] == "wilson" for s in task["scores"])
    assert task["scores"][1]["ci_high"] == 1.0 and task["scores"][1]["ci_low"] < 1.0
    assert [p["task_id"] for p in task["differing"]] == [f"p{i}" for i in range(10, 30)]
    # with one task, the family is the 2 comparisons: q:step_9 is then significant
    assert [c["p_holm"] for c in document["comparisons"]] == pytest.approx([2 * 2**-19, 2 / 64])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["r:base"], "compare: give 2 to 6 checkpoints as RUN:CKPT, got 1"),
        ([f"r:c{i}" for i in range(7)], "compare: give 2 to 6 checkpoints as RUN:CKPT, got 7"),
        (
            ["r:base", "r:step_1", "q:step_1"],
            "compare: run 'q' has no checkpoint 'step_1' in {root}/scores/q; its checkpoints: "
            "step_9",
        ),
        (["r:base", "r:step_1", "r:base"], "compare: r:base is given twice"),
        (
            ["r:base", "r:step_1", "q:step_9", "--task", "nope"],
            "compare: task 'nope' is not scored for all of r:base, r:step_1, q:step_9; tasks of "
            "all: big, qa",
        ),
    ],
)
def test_compare_many_mistakes_are_one_line(
    many: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _main("compare", *args, "--outdir", str(many), capsys=capsys)
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert line.startswith("ckpteval: error: " + message.format(root=many))
