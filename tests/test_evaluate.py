"""score_samples: self-test, verdict lines, cell metrics, input errors, loud failures."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from ckpteval.checkers import Checker, Job, Verdict, register
from ckpteval.errors import UserError
from ckpteval.evaluate import SelfTestError, read_samples, score_samples
from ckpteval.io import iter_jsonl
from ckpteval.sandbox import isolation

TASKS = Path(__file__).resolve().parents[1] / "src" / "ckpteval" / "data" / "tasks"


def problems(name: str) -> dict[str, dict[str, Any]]:
    return {row["task_id"]: row for row in iter_jsonl(TASKS / f"{name}.jsonl")}


def test_python_cell(tmp_path: Path) -> None:
    probs = problems("pyfunc")
    samples = []
    for i, (task_id, p) in enumerate(probs.items()):
        samples.append({"task_id": task_id, "completion": p["canonical_solution"]})
        samples.append(
            {"task_id": task_id, "completion": "    return None\n" if i % 2 else "    return (\n"}
        )
    errors = ["gen.jsonl:3: malformed line (JSONDecodeError: ...)"]
    cell = score_samples(
        "python",
        probs,
        samples,
        tmp_path / "s.jsonl",
        tmp_path / "s.json",
        workers=2,
        timeout=5,
        provenance={"run": "demo", "step": 100},
        input_errors=errors,
    )
    lines = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert len(lines) == 16
    assert [(line["task_id"], line["sample_idx"]) for line in lines[:4]] == [
        ("pyfunc/0", 0),
        ("pyfunc/0", 1),
        ("pyfunc/1", 0),
        ("pyfunc/1", 1),
    ]
    assert set(lines[0]) >= {
        "passed",
        "score",
        "error_type",
        "compile_ok",
        "duration_s",
        "stderr_tail",
    }
    assert json.loads((tmp_path / "s.json").read_text()) == cell
    m = cell["metrics"]
    assert m["pass@1"] == {"value": 0.5, "stderr": 0.0, "n": 8}
    assert m["pass@2"]["value"] == 1.0
    assert m["compile_rate"]["value"] == 0.75 and m["compile_rate"]["n"] == 16
    assert cell["error_types"] == {"compile_error": 4, "wrong_answer": 4}
    assert cell["n_problems"] == 8 and cell["n_samples"] == 16
    assert cell["self_test"]["references_passed"] == 8
    assert cell["input_errors"] == errors
    assert cell["run"] == "demo" and cell["step"] == 100 and cell["sandbox"] == "bwrap"
    assert cell["sandbox_mode"] == ("root" if os.geteuid() == 0 else "rootless")
    assert cell["sandbox_uncounted"] == isolation("bwrap")["sandbox_uncounted"]
    assert cell["checker"] == "python" and cell["scorer_version"].startswith("ckpteval-")


def test_gsm8k_cell_from_the_demo_shapes(tmp_path: Path) -> None:
    probs = problems("arith")
    samples = [
        {"task_id": t, "completion": f" {p['answer']}\n", "sample_idx": 0} for t, p in probs.items()
    ]
    samples[0]["completion"] = " 3 + 4 = 7 #### 7\n"
    cell = score_samples(
        "gsm8k", probs, samples, tmp_path / "a.jsonl", tmp_path / "a.json", workers=2
    )
    assert cell["metrics"]["accuracy"]["value"] == pytest.approx((len(probs) - 1) / len(probs))
    assert cell["metrics"]["pass@1"]["value"] == cell["metrics"]["accuracy"]["value"]
    first = json.loads((tmp_path / "a.jsonl").read_text().splitlines()[0])
    assert first["extracted"] == "7" and first["error_type"] == "wrong_answer"
    assert "compile_rate" not in cell["metrics"]


def test_bad_samples_are_reported_and_skipped(tmp_path: Path) -> None:
    probs = problems("pyfunc")
    good = probs["pyfunc/0"]["canonical_solution"]
    path = tmp_path / "samples.jsonl"
    path.write_bytes(
        b"\n".join(
            [
                json.dumps({"task_id": "pyfunc/0", "completion": good}).encode(),
                b"{not json",
                json.dumps({"task_id": "nope/1", "completion": good}).encode(),
                b"\xff\xfe bytes",
                json.dumps({"task_id": "pyfunc/0", "completion": good, "sample_idx": 0}).encode(),
                json.dumps({"task_id": "pyfunc/1", "completion": 5}).encode(),
                json.dumps(
                    {"task_id": "pyfunc/1", "completion": "x" * 50_000_000}
                ).encode(),  # 50 MB
                b"",
            ]
        )
    )
    errors: list[str] = []
    cell = score_samples(
        "python",
        probs,
        read_samples(path, errors),
        tmp_path / "o.jsonl",
        tmp_path / "o.json",
        workers=1,
        input_errors=errors,
    )
    text = "\n".join(cell["input_errors"])
    assert f"{path}:2: malformed line" in text
    assert f"{path}:3: unknown task_id 'nope/1'" in text
    assert f"{path}:4: malformed line (UnicodeDecodeError" in text
    assert f"{path}:5: duplicate sample 0 of task pyfunc/0" in text
    assert f"{path}:6: completion missing or not a string" in text
    assert f"{path}:7: completion of 50,000,000 characters" in text
    lines = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [(line["task_id"], line["passed"], line["error_type"]) for line in lines] == [
        ("pyfunc/0", True, None),
        ("pyfunc/1", False, "too_large"),
    ]


def test_empty_samples_file_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(UserError, match="empty.jsonl: no samples"):
        score_samples(
            "python",
            problems("pyfunc"),
            read_samples(path, []),
            tmp_path / "o.jsonl",
            tmp_path / "o.json",
            workers=1,
        )


def test_failing_reference_stops_the_run_without_output(tmp_path: Path) -> None:
    probs = problems("pyfunc")
    probs["pyfunc/3"] = {**probs["pyfunc/3"], "canonical_solution": "    return False\n"}
    samples = [{"task_id": "pyfunc/0", "completion": probs["pyfunc/0"]["canonical_solution"]}]
    with pytest.raises(
        SelfTestError,
        match=r"reference solutions of 1 of 8 problems did not pass "
        r"\(pyfunc/3: wrong_answer",
    ):
        score_samples(
            "python", probs, samples, tmp_path / "o.jsonl", tmp_path / "o.json", workers=2
        )
    assert not (tmp_path / "o.jsonl").exists() and not (tmp_path / "o.json").exists()
    assert not (tmp_path / "o.jsonl.partial").exists()  # a failed self-test's verdicts are not kept


class _AlwaysPasses(Checker):
    """A broken checker: passes everything (what a harness that ignores exit codes does)."""

    name = "always-passes-test-double"

    def check_one(self, job: Job, timeout: float) -> Verdict:
        return Verdict(True)

    def reference_jobs(self, problems: Any) -> list[Job]:
        return []

    def known_wrong_jobs(self, problems: Any) -> list[Job]:
        task_id, problem = next(iter(problems.items()))
        return [Job(task_id, problem, "wrong")]


register("always-passes-test-double", _AlwaysPasses)


def test_checker_that_cannot_fail_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SelfTestError, match="known-wrong samples passed"):
        score_samples(
            "always-passes-test-double",
            {"t": {}},
            [{"task_id": "t", "completion": "x"}],
            tmp_path / "o.jsonl",
            tmp_path / "o.json",
            workers=1,
        )


def test_unknown_checker_and_option_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown checker 'cobol'"):
        score_samples("cobol", {"t": {}}, [], tmp_path / "o.jsonl", tmp_path / "o.json", workers=1)
    with pytest.raises(UserError, match="unknown option"):
        score_samples(
            "python",
            {"t": {}},
            [],
            tmp_path / "o.jsonl",
            tmp_path / "o.json",
            workers=1,
            checker_options={"sandbx": "none"},
        )


class _Flaky(Checker):
    """Passes `good` completions; its infrastructure dies at the call numbered `die_at`."""

    name = "flaky-test-double"
    calls: list[str] = []
    die_at: int | None = None

    def check_one(self, job: Job, timeout: float) -> Verdict:
        _Flaky.calls.append(job.completion)
        if _Flaky.die_at is not None and len(_Flaky.calls) >= _Flaky.die_at:
            raise RuntimeError("endpoint went away")
        return Verdict(True) if job.completion == "good" else Verdict(False, "wrong_answer")

    def reference_jobs(self, problems: Any) -> list[Job]:
        return [Job("t", problems["t"], "good")]

    def known_wrong_jobs(self, problems: Any) -> list[Job]:
        return [Job("t", problems["t"], "bad")]


register("flaky-test-double", _Flaky)


def test_a_run_that_dies_midway_resumes_where_it_stopped(tmp_path: Path) -> None:
    samples = [
        {"task_id": "t", "sample_idx": i, "completion": "good" if i % 2 else "bad"}
        for i in range(10)
    ]
    out, metrics = tmp_path / "s.jsonl", tmp_path / "s.json"
    _Flaky.calls, _Flaky.die_at = [], 2 + 6 + 1  # self-test, 6 samples, then the failure
    with pytest.raises(RuntimeError, match="went away"):
        score_samples("flaky-test-double", {"t": {}}, samples, out, metrics, workers=1)
    assert (tmp_path / "s.jsonl.partial").exists() and not out.exists()
    _Flaky.calls, _Flaky.die_at = [], None
    cell = score_samples("flaky-test-double", {"t": {}}, samples, out, metrics, workers=1)
    assert len(_Flaky.calls) == 2 + 4  # the self-test again, and only the 4 samples not yet judged
    assert cell["self_test"]["reused_verdicts"] == 6
    assert cell["metrics"]["pass@1"]["value"] == 0.5
    assert not (tmp_path / "s.jsonl.partial").exists()
    # Another timeout is another verdict: nothing is reused.
    _Flaky.calls = []
    score_samples("flaky-test-double", {"t": {}}, samples, out, metrics, workers=1, timeout=7)
    assert len(_Flaky.calls) == 2 + 10
