"""The trainer's logged validation curve read back (ckpteval.trainlogs): real TensorBoard event
files written by torch's SummaryWriter (what verl's Tracking uses), verl's file-logger JSONL, and
the side-by-side comparison's flags."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ckpteval.errors import UserError
from ckpteval.trainlogs import (
    compare_curves,
    masked_crc32c,
    read_curves,
    read_event_scalars,
    settings_differences,
)

METRIC = "val-core/openai/gsm8k/reward/mean@1"


def write_events(directory: Path, values: dict[int, float], *, new_style: bool = False) -> Path:
    tensorboard = pytest.importorskip("torch.utils.tensorboard")
    writer = tensorboard.SummaryWriter(str(directory))
    for step, value in values.items():
        writer.add_scalar(METRIC, value, step, new_style=new_style)
        writer.add_scalar("critic/score/mean", value * 2, step)
        writer.add_histogram(
            "noise", np.array([0.1, 0.2, step]), step
        )  # a record that is no scalar
    writer.close()
    (found,) = directory.glob("events.out.tfevents.*")
    return found


def test_crc32c_is_tfrecords_checksum() -> None:
    # CRC-32C of "123456789" is 0xE3069283 (RFC 3720's check value), masked as TFRecord does.
    crc = 0xE3069283
    assert masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@pytest.mark.parametrize("new_style", [False, True], ids=["simple_value", "tensor"])
def test_summarywriters_scalars_are_read_back_by_step(tmp_path: Path, new_style: bool) -> None:
    values = {0: 0.125, 5: 0.5, 10: 0.875}  # exact in float32: the file stores float32
    write_events(tmp_path, values, new_style=new_style)
    assert read_curves(tmp_path, [METRIC]) == {METRIC: values}
    both = read_curves(tmp_path)
    assert both["critic/score/mean"] == {s: 2 * v for s, v in values.items()}
    assert "noise" not in both


def test_a_file_cut_while_written_ends_at_its_last_whole_record(tmp_path: Path) -> None:
    path = write_events(tmp_path, {s: s / 16 for s in range(8)})
    whole = list(read_event_scalars(path))
    data = path.read_bytes()
    for cut in (len(data) - 3, len(data) // 2, 20):
        path.write_bytes(data[:cut])
        got = list(read_event_scalars(path))
        assert got == whole[: len(got)], cut  # a prefix: nothing misread from a cut record
    path.write_bytes(b"\x00" * 5 + data)  # misframed from the start: nothing, no exception
    assert list(read_event_scalars(path)) == []


def test_verls_file_logger_lines_and_a_resumed_run(tmp_path: Path) -> None:
    log = tmp_path / "proj" / "exp.jsonl"
    log.parent.mkdir()
    lines = [
        {"step": 1, "data": {"training/global_step": 1, "critic/score/mean": 0.1}},
        {"step": 5, "data": {METRIC: 0.25, "val-aux/num_turns/mean": 1}},
        "not json",
        {"step": 10, "data": {METRIC: 0.5}},
        {"step": 10, "data": {METRIC: 0.75}},  # resumed at step 10: the last one counts
    ]
    log.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    assert read_curves(tmp_path, [METRIC]) == {METRIC: {5: 0.25, 10: 0.75}}
    assert read_curves(log)["critic/score/mean"] == {1: 0.1}


def test_no_logs_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no TensorBoard event file"):
        read_curves(tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        read_curves(tmp_path / "nowhere")


def test_settings_that_differ_are_named_and_greedy_is_greedy() -> None:
    ours = {"temperature": 0.0, "max_new_tokens": 512}
    assert settings_differences({"n": 1, "do_sample": False, "temperature": 0.6}, ours, 1) == []
    diff = settings_differences({"n": 4, "temperature": 0.6, "response_length": 1024}, ours, 1)
    assert diff == [
        "n: trainer 4, ckpteval 1",
        "temperature: trainer 0.6, ckpteval 0.0",
        "response_length: trainer 1024, ckpteval 512",
    ]
    assert settings_differences({"top_p": 0.9}, ours, 1) == ["top_p: trainer 0.9, ckpteval None"]


def test_steps_outside_the_interval_are_flagged_only_when_settings_match() -> None:
    trainer = {0: 0.1, 5: 0.5, 10: 0.9}
    ours = [(0, 0.12, 0.05, 0.2), (5, 0.2, 0.1, 0.3), (10, 0.9, None, None), (15, 1.0, 0.9, 1.0)]
    points = compare_curves(trainer, ours, settings_match=True)
    assert [(p.step, p.flagged) for p in points] == [(0, False), (5, True), (10, False)]
    assert not any(p.flagged for p in compare_curves(trainer, ours, settings_match=False))


def test_a_summary_puts_each_logged_metric_beside_the_cells_by_step(tmp_path: Path) -> None:
    import pandas as pd

    from ckpteval.aggregate.training import training_table
    from ckpteval.contract import summary_identity
    from ckpteval.jobs import SummaryJob

    log = tmp_path / "exp.jsonl"
    lines = [{"step": s, "data": {METRIC: v}} for s, v in ((10, 0.5), (20, 0.9), (30, 0.1))]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    tidy = pd.DataFrame(
        [
            {"run": "r", "step": s, "task": "gsm", "variant": "greedy-s42", "metric": m, "value": v}
            | {"stderr": 0.05, "ci_low": v - 0.1, "ci_high": v + 0.1}
            for s, v in ((10, 0.52), (20, 0.5))
            for m in (METRIC, "reward_mean")
        ]
    )
    config = {
        "aggregate": {"title": "t", "bootstrap": 10},
        "runs": {"r": {"train_logs": {"path": str(log), "val_kwargs": {"n": 1}}}},
    }
    job = SummaryJob.decode(summary_identity(config).text)  # as the aggregate job gets it
    assert job.train_logs == {"r": {"path": str(log), "val_kwargs": {"n": 1}}}
    sampling = {"greedy": {"temperature": 0.0}}
    table = training_table(tidy, job.train_logs, sampling)
    assert table[["step", "trainer", "ckpteval", "settings", "flagged"]].to_dict("records") == [
        {"step": 10, "trainer": 0.5, "ckpteval": 0.52, "settings": "match", "flagged": False},
        {"step": 20, "trainer": 0.9, "ckpteval": 0.5, "settings": "match", "flagged": True},
    ]
    other = training_table(tidy, {"r": {"path": str(log), "val_kwargs": {"n": 4}}}, sampling)
    assert set(other["settings"]) == {"n: trainer 4, ckpteval 1"}
    assert not other["flagged"].any()
    renamed = {"path": str(log), "metrics": {"reward_mean": METRIC}}  # another name of ours
    both = training_table(tidy, {"r": renamed}, sampling)
    assert sorted(set(both["metric"])) == sorted({METRIC, "reward_mean"})
    assert set(both["settings"]) == {"not given"} and not both["flagged"].any()
