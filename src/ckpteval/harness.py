"""Score files for lm-eval (harness) tasks: lm-eval already scored each sample in the infer job.

Non-code lm-eval tasks are scored by lm-eval's own filters and metrics while they run; the
generation lines carry those per-sample values (`metrics`, keyed `<metric>,<filter>`). This module
turns them into ckpteval's per-sample and per-cell score files, so harness and ckpteval tasks land
in one table, and checks that the means agree with lm-eval's own aggregate (recorded in the
generation's meta file) so a conversion bug can never pass silently.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from ckpteval import __version__
from ckpteval.io import iter_jsonl, read_json, write_json, write_jsonl
from ckpteval.metrics import mean_and_stderr

SCORER_VERSION = f"ckpteval-{__version__}/harness-1"


def score_harness_file(
    generations: Path, out_jsonl: Path, out_json: Path, *, provenance: dict[str, Any]
) -> dict[str, Any]:
    """Write per-sample verdicts and cell metrics for one harness generation file."""
    started = time.monotonic()
    errors: list[str] = []
    rows = list(iter_jsonl(generations, errors=errors))
    meta_path = generations.with_suffix(".meta.json")
    reference = read_json(meta_path).get("lm_eval_results", {}) if meta_path.exists() else {}
    keys = sorted({k for r in rows for k in r.get("metrics", {})})
    primary = keys[0] if keys else None
    verdicts = []
    for r in rows:
        score = r.get("metrics", {}).get(primary, math.nan) if primary else math.nan
        verdicts.append({"task_id": r["task_id"], "sample_idx": r.get("sample_idx", 0),
                         "passed": score == 1.0, "score": score,
                         "error_type": None if score == 1.0 else "wrong_answer",
                         "compile_ok": None, "duration_s": 0.0, "stderr_tail": "",
                         "metrics": r.get("metrics", {})})
    metrics: dict[str, dict[str, Any]] = {}
    for key in keys:
        values = [r["metrics"][key] for r in rows if key in r.get("metrics", {})]
        mean, stderr = mean_and_stderr(values)
        ref = reference.get(key)
        if ref is not None and not math.isclose(float(ref), mean, abs_tol=1e-9):
            raise RuntimeError(
                f"{generations}: {key} mean {mean} disagrees with lm-eval's own {ref}; "
                "the per-sample conversion is wrong"
            )
        metrics[key] = {"value": mean, "stderr": stderr, "n": len(values)}
    write_jsonl(out_jsonl, verdicts)
    cell = {"checker": "harness", "scorer_version": SCORER_VERSION, "n_problems": len(rows),
            "n_samples": len(rows), "metrics": metrics,
            "error_types": {"wrong_answer": sum(1 for v in verdicts if not v["passed"])},
            "input_errors": errors, "primary_metric": primary,
            "duration_s": round(time.monotonic() - started, 3), **provenance}
    write_json(out_json, cell)
    return cell
