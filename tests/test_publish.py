"""`ckpteval publish`: the tidy table's seed means at their training steps, in each tracker, read
back with the tracker's own reader (W&B offline: `wandb leet inspect --json` on the run's .wandb
log; TensorBoard: EventAccumulator; MLflow: a file store's get_metric_history).

One table of two runs: a baseline (step 0), trained checkpoints, a task under two sampling
configs (one with two seeds), and a checkpoint without a step. Each tracker gets a first publish,
an unchanged republish (nothing sent), and a republish with one rerun cell's value changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from ckpteval.aggregate.cells import Cell
from ckpteval.aggregate.tables import seed_table, tidy_table
from ckpteval.errors import UserError
from ckpteval.plan.layout import CellKey
from ckpteval.publish import mlflow_key, publish, table_points
from ckpteval.summary import write_parquet

PY = sys.executable
WANDB_BIN = Path(sys.executable).with_name("wandb")

# (run, ckpt, step, is_baseline, task, sampling, seed) -> {metric: value}
CELLS = {
    ("alpha", "base", 0, True, "arith", "greedy", 42): {"pass@1": 0.1},
    ("alpha", "step_100", 100, False, "arith", "greedy", 42): {"pass@1": 0.4},
    ("alpha", "step_200", 200, False, "arith", "greedy", 42): {"pass@1": 0.55},
    ("alpha", "base", 0, True, "code", "greedy", 42): {"pass@1": 0.0, "compile_rate": 0.5},
    ("alpha", "step_100", 100, False, "code", "greedy", 42): {"pass@1": 0.2, "compile_rate": 0.75},
    ("alpha", "step_100", 100, False, "code", "t08", 1): {"pass@1": 0.25, "compile_rate": 0.5},
    ("alpha", "step_100", 100, False, "code", "t08", 2): {"pass@1": 0.35, "compile_rate": 1.0},
    ("alpha", "step_200", 200, False, "code", "greedy", 42): {"pass@1": 0.3, "compile_rate": 1.0},
    ("beta", "step_50", 50, False, "arith", "greedy", 42): {"pass@1": 0.2},
    ("beta", "latest", None, False, "arith", "greedy", 42): {"pass@1": 0.9},
}


def expected_points(cells: dict) -> dict[tuple[str, str, int], float]:
    """(run, key, step) -> seed mean, computed here by hand, and `<key>/ci_low`, `<key>/ci_high`
    -> the seed table's interval: the published contract."""
    means = expected_means(cells)
    seeds = seed_table(table(cells))
    bounds = {}
    for row in seeds[seeds["step"].notna()].itertuples():
        middle = [row.sampling] if seeds[seeds.task == row.task].sampling.nunique() > 1 else []
        key = "/".join(["ckpteval", row.task, *middle, row.metric])
        for bound in ("ci_low", "ci_high"):
            bounds[(row.run, f"{key}/{bound}", int(row.step))] = getattr(row, bound)
    return {**means, **bounds}


def expected_means(cells: dict) -> dict[tuple[str, str, int], float]:
    """(run, key, step) -> seed mean, computed here by hand."""
    samplings: dict[str, set[str]] = {}
    for _run, _ckpt, _step, _base, task, sampling, _seed in cells:
        samplings.setdefault(task, set()).add(sampling)
    sums: dict[tuple[str, str, int], list[float]] = {}
    for (run, _ckpt, step, _base, task, sampling, _seed), metrics in cells.items():
        if step is None:
            continue
        for metric, value in metrics.items():
            middle = [sampling] if len(samplings[task]) > 1 else []
            key = "/".join(["ckpteval", task, *middle, metric])
            sums.setdefault((run, key, step), []).append(value)
    return {k: sum(v) / len(v) for k, v in sums.items()}


def write_table(summary: Path, cells: dict) -> None:
    summary.mkdir(parents=True, exist_ok=True)
    write_parquet(table(cells), summary / "metrics.parquet")


def table(cells: dict) -> pd.DataFrame:
    rows = [
        Cell(
            source=f"{run}/{ckpt}/{task}/{sampling}-s{seed}.json",
            key=CellKey(run, ckpt, task, f"{sampling}-s{seed}"),
            step=step,
            sampling=sampling,
            seed=seed,
            is_baseline=base,
            scorer_version="1",
            model_hash="h",
            metrics={m: (v, 0.01, 10) for m, v in metrics.items()},
        )
        for (run, ckpt, step, base, task, sampling, seed), metrics in cells.items()
    ]
    return tidy_table(rows)


def changed_cells() -> dict:
    """The rerun cell: alpha/step_100 code t08 seed 2 got a new pass@1 (its seed mean moves)."""
    cells = {k: dict(v) for k, v in CELLS.items()}
    cells[("alpha", "step_100", 100, False, "code", "t08", 2)]["pass@1"] = 0.45
    return cells


CHANGED_KEY = ("alpha", "ckpteval/code/t08/pass@1", 100)


def test_points_are_seed_means_at_their_steps_and_stepless_checkpoints_are_noted(
    tmp_path: Path,
) -> None:
    write_table(tmp_path, CELLS)
    points, notes = table_points(pd.read_parquet(tmp_path / "metrics.parquet"))
    got = {(p.run, p.key, p.step): p.value for p in points}
    assert got == pytest.approx(expected_points(CELLS))
    assert got[("alpha", "ckpteval/code/t08/pass@1", 100)] == pytest.approx(0.3)
    assert got[("alpha", "ckpteval/arith/pass@1", 0)] == pytest.approx(0.1)  # the baseline
    assert notes == ["beta/latest: no training step; not published"]


def test_each_value_is_published_with_its_interval_bounds(tmp_path: Path) -> None:
    """`<key>/ci_low` and `<key>/ci_high` at the value's step, the seed table's interval: in
    [0, 1] around the value, and not zero-width at a score of 0 (Wilson's)."""
    write_table(tmp_path, CELLS)
    points, _ = table_points(pd.read_parquet(tmp_path / "metrics.parquet"))
    got = {(p.run, p.key, p.step): p.value for p in points}
    for (run, key, step), value in expected_means(CELLS).items():
        low, high = got[(run, f"{key}/ci_low", step)], got[(run, f"{key}/ci_high", step)]
        assert 0 <= low <= value <= high <= 1, key
    assert got[("alpha", "ckpteval/code/greedy/pass@1/ci_low", 0)] == 0
    assert got[("alpha", "ckpteval/code/greedy/pass@1/ci_high", 0)] > 0.1  # 0 of 10 solved
    assert mlflow_key("ckpteval/code/pass@1/ci_high") == "ckpteval/code/pass_at_1_ci_high"


def test_a_published_mean_that_leaves_errored_samples_out_is_noted_once_per_key(
    tmp_path: Path,
) -> None:
    """A tracker shows a number without its footnote: publishing says which keys exclude
    errored samples, and at how many steps; a key whose errors count in its mean is not named."""
    # alpha's arith cells: 3 of their 10 samples errored (the cell's reward_error_rate) and
    # pass@1 leaves them out; code's count them as failures
    cells = {
        key: {
            **metrics,
            **({"reward_error_rate": 0.3} if (key[0], key[4]) == ("alpha", "arith") else {}),
        }
        for key, metrics in CELLS.items()
    }
    write_table(tmp_path, cells)
    tidy = pd.read_parquet(tmp_path / "metrics.parquet")
    alpha = (tidy["run"] == "alpha") & (tidy["task"] == "arith") & (tidy["metric"] == "pass@1")
    tidy.loc[alpha, "errored"] = 3
    tidy.loc[alpha, "errored_as"] = "excluded"
    code = tidy["task"] == "code"
    tidy.loc[code, "errored"] = 2
    tidy.loc[code, "errored_as"] = "failure"
    points, notes = table_points(tidy)
    steps = {p.step for p in points if p.run == "alpha" and p.key == "ckpteval/arith/pass@1"}
    assert [n for n in notes if "errored" in n] == [
        f"alpha: ckpteval/arith/pass@1 leaves errored samples out of its mean at {len(steps)} "
        "step(s); a tracker shows it without saying so: read reward_error_rate beside it"
    ]


# ------------------------------------------------------------------------------ TensorBoard


def tensorboard_points(logdir: Path) -> dict[tuple[str, str, int], list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[tuple[str, str, int], list[float]] = {}
    for run_dir in sorted(p for p in logdir.iterdir() if p.is_dir()):
        acc = EventAccumulator(str(run_dir))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            for event in acc.Scalars(tag):
                out.setdefault((run_dir.name, tag, event.step), []).append(event.value)
    return out


def test_tensorboard_has_exactly_the_table_and_one_value_per_step_after_a_rerun(
    tmp_path: Path,
) -> None:
    summary, logdir = tmp_path / "summary", tmp_path / "tb"
    settings = {"tensorboard": {"logdir": str(logdir)}}
    write_table(summary, CELLS)
    first = publish(summary, settings)["tensorboard"]
    expected = expected_points(CELLS)
    assert first["new"] == len(expected) and first["changed"] == 0
    got = tensorboard_points(logdir)
    assert {k: v[0] for k, v in got.items()} == pytest.approx(expected, rel=1e-6)  # float32
    assert all(len(v) == 1 for v in got.values())
    files = sorted(p.name for p in logdir.rglob("*.ckpteval"))

    again = publish(summary, settings)["tensorboard"]
    assert (again["new"], again["changed"], again["unchanged"]) == (0, 0, len(expected))
    assert sorted(p.name for p in logdir.rglob("*.ckpteval")) == files, "nothing rewritten"

    write_table(summary, changed_cells())
    rerun = publish(summary, settings)["tensorboard"]
    assert (rerun["new"], rerun["changed"]) == (0, 3)  # the mean and both interval bounds
    got = tensorboard_points(logdir)
    assert all(len(v) == 1 for v in got.values()), "exactly one value per step remains"
    assert {k: v[0] for k, v in got.items()} == pytest.approx(
        expected_points(changed_cells()), rel=1e-6
    )
    assert got[CHANGED_KEY] == [pytest.approx(0.35)]
    # one ckpteval file per run: alpha's rewritten, beta's (unchanged) kept as it was
    now = sorted(p.relative_to(logdir).as_posix() for p in logdir.rglob("*.ckpteval"))
    assert len(now) == 2 and [n for n in now if n.startswith("beta/")] == [
        f"beta/{f}" for f in files if (logdir / "beta" / f).exists()
    ]


def test_tensorboard_leaves_other_event_files_of_the_run_alone(tmp_path: Path) -> None:
    """A training run's own event file in the same directory survives every rewrite."""
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    summary, logdir = tmp_path / "summary", tmp_path / "tb"
    training = EventFileWriter(str(logdir / "alpha"))
    training.close()
    write_table(summary, CELLS)
    publish(summary, {"tensorboard": {"logdir": str(logdir)}})
    write_table(summary, changed_cells())
    publish(summary, {"tensorboard": {"logdir": str(logdir)}})
    assert Path(training._file_name).exists()


# ------------------------------------------------------------------------------ MLflow


def mlflow_points(uri: str, experiment: str) -> dict[tuple[str, str, int], list[tuple]]:
    """(run, key, step) -> [(timestamp, value)] in timestamp order, from MLflow's own client."""
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    out: dict[tuple[str, str, int], list[tuple]] = {}
    for run in client.search_runs([exp.experiment_id]):
        name = run.data.tags["ckpteval.run"]
        assert run.info.run_name == f"{name}-eval"
        for key in run.data.metrics:
            for m in client.get_metric_history(run.info.run_id, key):
                out.setdefault((name, key, m.step), []).append((m.timestamp, m.value))
    return {k: sorted(v) for k, v in out.items()}


def test_mlflow_has_the_table_and_a_rerun_logs_one_newer_point(tmp_path: Path) -> None:
    summary = tmp_path / "summary"
    uri = (tmp_path / "mlruns").as_uri()
    settings = {"mlflow": {"tracking_uri": uri, "experiment": "sweep"}}
    write_table(summary, CELLS)
    publish(summary, settings)
    expected = {(r, mlflow_key(k), s): v for (r, k, s), v in expected_points(CELLS).items()}
    got = mlflow_points(uri, "sweep")
    assert {k: [v for _, v in pts] for k, pts in got.items()} == {
        k: [pytest.approx(v)] for k, v in expected.items()
    }
    assert ("alpha", "ckpteval/code/t08/pass_at_1", 100) in got

    again = publish(summary, settings)["mlflow"]
    assert (again["new"], again["changed"]) == (0, 0)
    assert mlflow_points(uri, "sweep") == got, "nothing new"

    write_table(summary, changed_cells())
    publish(summary, settings)
    after = mlflow_points(uri, "sweep")
    key = ("alpha", mlflow_key(CHANGED_KEY[1]), 100)
    assert [v for _, v in after[key]] == [pytest.approx(0.3), pytest.approx(0.35)]
    assert after[key][1][0] >= after[key][0][0], "the newer value has the later timestamp"
    # the value and its interval bounds (`<key>_ci_low`: a file store cannot nest them)
    moved = {key, *((*key[:1], f"{key[1]}_{bound}", key[2]) for bound in ("ci_low", "ci_high"))}
    assert all(len(after[k]) == 2 for k in moved)
    assert {k: v for k, v in after.items() if k not in moved} == {
        k: v for k, v in got.items() if k not in moved
    }


# ------------------------------------------------------------------------------ W&B (offline)


def wandb_history(wandb_dir: Path, run_id: str) -> tuple[list[dict], list[dict]]:
    """(history rows, metric definitions) of every offline log of W&B run `run_id`, in order,
    read with wandb's own transaction-log reader."""
    rows, metrics = [], []
    for log in sorted(wandb_dir.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")):
        out = subprocess.run(
            [str(WANDB_BIN), "leet", "inspect", "--json", str(log)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for line in out.splitlines():
            record = json.loads(line)
            if record["type"] == "history":
                rows.append(record["history"]["item"])
            elif record["type"] == "metric":
                metrics.append(record["metric"])
            elif record["type"] == "run":
                assert record["run"]["run_id"] == run_id
    return rows, metrics


def wandb_points(rows: list[dict], run: str) -> Counter:
    """Counter of (run, key, step, value) over the history rows (step: ckpteval/train_step)."""
    got: Counter = Counter()
    for row in rows:
        step = row["ckpteval/train_step"]
        for key, value in row.items():
            if key.startswith("ckpteval/") and key != "ckpteval/train_step":
                got[(run, key, int(step), round(float(value), 9))] += 1
    return got


def _rounded(points: dict) -> Counter:
    return Counter({(r, k, s, round(v, 9)) for (r, k, s), v in points.items()})


@pytest.fixture()
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb

    wandb.teardown()  # wandb reads WANDB_DIR once per process: this test's, not an earlier one's
    return tmp_path


def test_wandb_offline_training_run_by_id_and_a_sibling_eval_run(wandb_offline: Path) -> None:
    summary = wandb_offline / "summary"
    settings = {"wandb": {"project": "rl", "mode": "offline", "run_ids": {"alpha": "train123"}}}
    write_table(summary, CELLS)
    report = publish(summary, settings)["wandb"]
    assert report["runs"]["alpha"] == {"run_id": "train123", "training_run": True}
    sibling = report["runs"]["beta"]["run_id"]
    assert sibling.startswith("ckpteval-") and report["runs"]["beta"]["training_run"] is False

    rows, metrics = wandb_history(wandb_offline, "train123")
    assert {"glob_name": "ckpteval/*", "step_metric": "ckpteval/train_step"} in [
        {k: m.get(k) for k in ("glob_name", "step_metric")} for m in metrics
    ], "the custom step axis is defined in the training run"
    beta_rows, _ = wandb_history(wandb_offline, sibling)
    expected = expected_points(CELLS)
    got = wandb_points(rows, "alpha") + wandb_points(beta_rows, "beta")
    assert got == _rounded(expected)
    assert [r["ckpteval/train_step"] for r in rows] == [0, 100, 200], "one row per step"

    again = publish(summary, settings)["wandb"]
    assert (again["new"], again["changed"]) == (0, 0)
    assert wandb_history(wandb_offline, "train123")[0] == rows, "nothing logged"

    write_table(summary, changed_cells())
    rerun = publish(summary, settings)["wandb"]
    assert (rerun["new"], rerun["changed"]) == (0, 3)  # the mean and both interval bounds
    expected_changed = [
        expected_points(changed_cells())[(*CHANGED_KEY[:1], f"{CHANGED_KEY[1]}/{b}", 100)]
        for b in ("ci_low", "ci_high")
    ]
    rows2, _ = wandb_history(wandb_offline, "train123")
    added = rows2[len(rows) :]
    assert len(added) == 1 and added[0]["ckpteval/train_step"] == 100
    assert {k: v for k, v in added[0].items() if k.startswith("ckpteval/")} == {
        "ckpteval/train_step": 100,
        "ckpteval/code/t08/pass@1": pytest.approx(0.35),
        "ckpteval/code/t08/pass@1/ci_low": pytest.approx(expected_changed[0]),
        "ckpteval/code/t08/pass@1/ci_high": pytest.approx(expected_changed[1]),
    }, "only the changed point (and its interval) is logged again, at its training step"
    assert wandb_history(wandb_offline, sibling)[0] == beta_rows, "beta unchanged: not resumed"


# ------------------------------------------------------------------ under the trainer's names

VAL = "val-core/openai/gsm8k/reward/mean@1"  # verl's name of the validation reward
VAL_ACC = "val-core/openai/gsm8k/acc/mean@1"  # what verl logs when the reward returns `acc`
# (run, ckpt, step, is_baseline, task, sampling, seed) -> {metric: value}: a reward task whose
# rows carry verl's data_source, plus a task the trainer never logged
REWARD_CELLS = {
    ("alpha", "step_100", 100, False, "gsm8k", "greedy", 42): {
        "reward_mean": 0.25,
        "acc": 0.2,
        VAL: 0.25,
    },
    ("alpha", "step_200", 200, False, "gsm8k", "greedy", 42): {
        "reward_mean": 0.5,
        "acc": 0.45,
        VAL: 0.5,
    },
    ("alpha", "step_100", 100, False, "arith", "greedy", 42): {"pass@1": 0.4},
}


def write_trainer_run(tmp_path: Path, summary: Path, cells: dict, metrics: dict) -> Path:
    """The trainer's validation curve as verl's file logger writes it (one `{"step", "data"}`
    line per step, training steps between validations too) and the summary's
    training_curve.csv built from it by the aggregate step's own code."""
    from ckpteval.aggregate.training import training_table

    log = tmp_path / "verl" / "alpha.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"step": s, "data": {"actor/pg_loss": 0.1 * s}} for s in (50, 150)]
    lines += [{"step": s, "data": {VAL: v, VAL_ACC: v - 0.05}} for s, v in ((100, 0.3), (200, 0.5))]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    write_table(summary, cells)
    logs = {"alpha": {"path": str(log), "metrics": metrics}}
    table = training_table(pd.read_parquet(summary / "metrics.parquet"), logs, {})
    table.to_csv(summary / "training_curve.csv", index=False)
    return log


def test_trainer_names_put_the_reward_beside_the_trainers_curve_in_each_tracker(
    tmp_path: Path, wandb_offline: Path
) -> None:
    """`trainer_names`: each metric the trainer logged too goes under the trainer's name, read
    back by the reader ckpteval reads the trainer's own logs with (TensorBoard) and by MLflow's
    client under the name verl's MLflow logger gives it (`@` -> `_at_`); everything else keeps
    ckpteval's keys; the training run's own directory gets nothing."""
    from ckpteval.trainlogs import read_curves

    summary, logdir = tmp_path / "summary", tmp_path / "tb"
    write_trainer_run(tmp_path, summary, REWARD_CELLS, {"acc": VAL_ACC})
    uri = (tmp_path / "mlruns").as_uri()
    settings = {
        "trainer_names": True,
        "tensorboard": {"logdir": str(logdir)},
        "mlflow": {"tracking_uri": uri, "experiment": "sweep"},
        "wandb": {"project": "rl", "mode": "offline"},
    }
    (logdir / "alpha").mkdir(parents=True)  # the training run's own directory
    reports = publish(summary, settings)
    assert not list((logdir / "alpha").iterdir()), "nothing into the training run's directory"
    assert reports["tensorboard"]["target"]["runs"] == "<run>-eval"
    curves = read_curves(logdir / "alpha-eval")
    assert curves[VAL] == pytest.approx({100: 0.25, 200: 0.5})
    assert curves[VAL_ACC] == pytest.approx({100: 0.2, 200: 0.45})  # mapped with `metrics:`
    assert curves["ckpteval/gsm8k/reward_mean"] == pytest.approx({100: 0.25, 200: 0.5})
    assert curves["ckpteval/arith/pass@1"] == pytest.approx({100: 0.4})
    assert "ckpteval/gsm8k/acc" not in curves and f"ckpteval/gsm8k/{VAL}" not in curves

    got = mlflow_points(uri, "sweep")
    verl_mlflow = VAL.replace("@", "_at_")  # verl's _MlflowLoggingAdapter
    assert [v for _, v in got[("alpha", verl_mlflow, 200)]] == [pytest.approx(0.5)]
    assert ("alpha", "ckpteval/gsm8k/reward_mean", 200) in got

    sibling = reports["wandb"]["runs"]["alpha"]["run_id"]
    rows, metrics = wandb_history(wandb_offline, sibling)
    assert {"name": VAL, "step_metric": "ckpteval/train_step"} in [
        {k: m.get(k) for k in ("name", "step_metric")} for m in metrics
    ], "the trainer's name is plotted over the training step"
    trainer_rows = sorted((r["ckpteval/train_step"], r[VAL]) for r in rows if VAL in r)
    assert trainer_rows == [(100, pytest.approx(0.25)), (200, pytest.approx(0.5))]

    again = publish(summary, settings)
    assert all((r["new"], r["changed"]) == (0, 0) for r in again.values())


def test_trainer_names_refuse_the_training_run_itself_and_name_no_ambiguous_cell(
    tmp_path: Path, wandb_offline: Path
) -> None:
    """Logging the trainer's names into the training run would interleave ckpteval's values
    with the trainer's: one line, nothing sent. A trainer name two cells claim (a task under two
    sampling configs) names neither, with a note. No training curve: one line."""
    summary = tmp_path / "summary"
    settings = {"wandb": {"project": "rl", "mode": "offline", "run_ids": {"alpha": "train1"}}}
    with pytest.raises(UserError, match="no run's metric was matched"):
        write_table(summary, REWARD_CELLS)
        publish(summary, {**settings, "trainer_names": True})
    write_trainer_run(tmp_path, summary, REWARD_CELLS, {})
    with pytest.raises(UserError, match=r"run alpha publishes into its training run .*alpha-eval"):
        publish(summary, {**settings, "trainer_names": True})
    assert not (summary / "published").exists(), "nothing sent, no ledger"

    cells = dict(REWARD_CELLS)
    cells[("alpha", "step_100", 100, False, "gsm8k", "t08", 1)] = {"reward_mean": 0.2, VAL: 0.2}
    write_trainer_run(tmp_path, summary, cells, {})
    report = publish(summary, {"trainer_names": True, "tensorboard": {"logdir": str(tmp_path)}})
    note = f"alpha: the trainer's {VAL} matches gsm8k/greedy/{VAL}, gsm8k/t08/{VAL}"
    assert any(n.startswith(note) for n in report["tensorboard"]["notes"])
    from ckpteval.trainlogs import read_curves

    keys = set(read_curves(tmp_path / "alpha-eval"))
    assert VAL not in keys and f"ckpteval/gsm8k/greedy/{VAL}" in keys


# ------------------------------------------------------------------------------ command line


def test_publish_without_a_table_or_tracker_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="metrics.parquet: no metrics table"):
        publish(tmp_path, {"tensorboard": {"logdir": str(tmp_path)}})
    write_table(tmp_path, CELLS)
    with pytest.raises(UserError, match="no tracker configured"):
        publish(tmp_path, {})
    with pytest.raises(UserError, match=r"publish\.wandb\.project: not set"):
        publish(tmp_path, {"wandb": {"mode": "offline"}})


def test_an_unreachable_tracker_is_one_line_fast_and_the_ledger_stays_empty(
    tmp_path: Path,
) -> None:
    """With MLflow's own retries (minutes of backoff on a refused connection) left as they are:
    the probe says so at once."""
    write_table(tmp_path, CELLS)
    import mlflow.tracking  # noqa: F401 - imported before the clock starts (slow on a busy machine)

    start = time.monotonic()
    with pytest.raises(UserError, match=r"^publish: mlflow: .*127\.0\.0\.1:9.*publish again") as e:
        publish(tmp_path, {"mlflow": {"tracking_uri": "http://127.0.0.1:9"}})
    assert time.monotonic() - start < 60  # MLflow's retries alone take about 4 minutes
    assert "cannot reach the tracking server http://127.0.0.1:9" in str(e.value)
    assert "\n" not in str(e.value)
    assert not list((tmp_path / "published").glob("mlflow-*.json")), "nothing recorded as sent"


def _cli(args: list[str], cwd: Path, block: str = "") -> subprocess.CompletedProcess:
    code = (
        "import sys\n"
        + (f"sys.modules[{block!r}] = None\n" if block else "")
        + "from ckpteval.cli import main\nsys.exit(main(sys.argv[1:]))"
    )
    return subprocess.run(
        [PY, "-c", code, *args], cwd=cwd, capture_output=True, text=True, env=os.environ.copy()
    )


def test_cli_publishes_and_reports_missing_tables_and_packages_in_one_line(tmp_path: Path) -> None:
    summary, logdir = tmp_path / "summary", tmp_path / "tb"
    args = ["publish", "--summary", str(summary), "--tensorboard-logdir", str(logdir)]
    missing = _cli(args, tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0 and "no metrics table" in missing.stderr

    write_table(summary, CELLS)
    blocked = _cli(args, tmp_path, block="tensorboard")
    assert blocked.returncode == 2 and blocked.stderr.strip().count("\n") == 0
    assert "pip install 'ckpteval[tensorboard]'" in blocked.stderr

    done = _cli(args, tmp_path)
    assert done.returncode == 0, done.stderr
    n = len(expected_points(CELLS))
    assert f"tensorboard: {n} new, 0 changed, 0 unchanged point(s) of {n}" in done.stdout
    assert "note: beta/latest: no training step; not published" in done.stdout
    report = json.loads((summary / "published" / "tensorboard.json").read_text())
    assert report["new"] == n and (summary / "published" / report["ledger"]).exists()
    again = _cli(args, tmp_path)
    assert f"tensorboard: 0 new, 0 changed, {n} unchanged" in again.stdout
    by_trainer = _cli([*args, "--trainer-names"], tmp_path)  # no train_logs: no training curve
    assert by_trainer.returncode == 2 and by_trainer.stderr.strip().count("\n") == 0
    assert "publish.trainer_names: " in by_trainer.stderr and "train_logs" in by_trainer.stderr


def _mlflow_server_command() -> list[str] | None:
    """The full `mlflow` package's server: $CKPTEVAL_MLFLOW, else the separate environment
    scripts/setup-env.sh makes (.venv-mlflow: the server's dependencies are too heavy for the
    project's own)."""
    explicit = os.environ.get("CKPTEVAL_MLFLOW")
    candidates = [Path(explicit)] if explicit else []
    candidates.append(Path(__file__).resolve().parent.parent / ".venv-mlflow" / "bin" / "mlflow")
    return next(([str(c)] for c in candidates if c.is_file()), None)


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    """A real `mlflow server` with a SQLite backend on a free loopback port; its URI."""
    import socket
    import urllib.request

    command = _mlflow_server_command()
    if command is None:
        pytest.skip("the full mlflow package is not installed (.venv-mlflow, scripts/setup-env.sh)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [
            *command,
            "server",
            "--backend-store-uri",
            f"sqlite:///{tmp_path / 'mlflow.db'}",
            "--default-artifact-root",
            str(tmp_path / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=open(tmp_path / "server.log", "wb"),  # noqa: SIM115 - closed with the process
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server did not start in 180 s"
            time.sleep(1)
        yield uri
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)


@pytest.mark.slow
def test_mlflow_server_reads_back_every_point_at_its_step_and_a_second_publish_adds_none(
    tmp_path: Path, mlflow_server: str
) -> None:
    """Against a real tracking server (SQLite backend), not the file store MLflow 3 deprecates."""
    summary = tmp_path / "summary"
    settings = {"mlflow": {"tracking_uri": mlflow_server, "experiment": "sweep"}}
    write_table(summary, CELLS)
    first = publish(summary, settings)["mlflow"]
    expected = {(r, mlflow_key(k), s): v for (r, k, s), v in expected_points(CELLS).items()}
    got = mlflow_points(mlflow_server, "sweep")
    assert first["new"] == len(expected)
    assert {k: [v for _, v in pts] for k, pts in got.items()} == {
        k: [pytest.approx(v)] for k, v in expected.items()
    }
    again = publish(summary, settings)["mlflow"]
    assert (again["new"], again["changed"]) == (0, 0)
    assert mlflow_points(mlflow_server, "sweep") == got, "the second publish added none"
