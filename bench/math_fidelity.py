"""Score the math fidelity set with ckpteval's math checker and lm-eval's minerva_math; compare.

    python bench/math_fidelity.py [--workers 2] [--show-all]

Rows: tests/data/math_fidelity.jsonl (written by tests/data/math_fidelity.py): labelled
completions in the shapes MATH answers take and the styles models write them in, near misses and
truncations included. Each row's problem is MATH-shaped: a solution that boxes the gold answer.
ckpteval scores it with the `math` checker; lm-eval 0.4.13 with `minerva_math`'s own
`process_results` on the document its `process_docs` makes of that solution (`exact_match`, which
reads minerva's "Final Answer" sentence, and `math_verify`, which parses the whole completion).

Prints each scorer's agreement with the labels on the unambiguous rows, its false passes on near
misses and truncations, and every row where ckpteval and lm-eval's math_verify disagree
(`--show-all`: also where ckpteval and the label disagree, which the test forbids). Target:
ckpteval at least 99%, above lm-eval's math_verify, and no false pass. Exit status 1 if missed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
DATA = REPO / "tests" / "data" / "math_fidelity.jsonl"


def solution(row: dict) -> str:
    return f"Working.\nSo the answer is $\\boxed{{{row['gold']}}}$."


def run_ckpteval(rows: list[dict], workers: int) -> list[bool]:
    from ckpteval.checkers import Job, get_checker

    checker = get_checker("math")
    try:
        jobs = [Job(r["id"], {"solution": solution(r)}, r["completion"]) for r in rows]
        return [v.passed for v in checker.check(jobs, workers=workers)]
    finally:
        checker.close()


def run_lm_eval(rows: list[dict]) -> list[dict[str, int]]:
    """minerva_math's process_results on each row, with the document process_docs would make."""
    logging.disable(logging.WARNING)
    from lm_eval.tasks.minerva_math import utils

    out = []
    for row in rows:
        sol = solution(row)
        answer = utils.normalize_final_answer(utils.remove_boxed(utils.last_boxed_only_string(sol)))
        doc = {"problem": "", "solution": sol, "answer": answer}
        out.append(utils.process_results(doc, [row["completion"]]))
    return out


def summary(name: str, verdicts: list[bool], rows: list[dict]) -> tuple[float, int]:
    """Print and return (agreement on unambiguous rows, false passes among them)."""
    pairs = [(v, r) for v, r in zip(verdicts, rows, strict=True) if not r["ambiguous"]]
    agree = sum(v == r["label"] for v, r in pairs)
    false_pass = sum(v and not r["label"] for v, r in pairs)
    false_fail = sum(r["label"] and not v for v, r in pairs)
    rate = agree / len(pairs)
    print(
        f"{name:<22} agrees {agree}/{len(pairs)} = {rate:.1%}   "
        f"false passes {false_pass}   false fails {false_fail}"
    )
    return rate, false_pass


def show(title: str, picked: list[tuple[dict, bool, bool]], other: str) -> None:
    print(f"\n{title}: {len(picked)}")
    for row, ours, theirs in picked:
        print(
            f"  {row['id']} {row['shape']}/{row['style']} label={row['label']} "
            f"ckpteval={ours} {other}={theirs}{' (ambiguous)' if row['ambiguous'] else ''}: "
            f"{row['note']}\n      {row['completion'][-90:]!r}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--show-all", action="store_true")
    args = parser.parse_args()
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    print(f"{len(rows)} rows, {sum(not r['ambiguous'] for r in rows)} unambiguous")
    start = time.monotonic()
    ours = run_ckpteval(rows, args.workers)
    middle = time.monotonic()
    theirs = run_lm_eval(rows)
    end = time.monotonic()
    print(f"ckpteval {middle - start:.1f} s ({args.workers} workers), lm-eval {end - middle:.1f} s")
    rate, false_pass = summary("ckpteval math", ours, rows)
    summary("lm-eval exact_match", [bool(t["exact_match"]) for t in theirs], rows)
    mv = [bool(t["math_verify"]) for t in theirs]
    mv_rate, _ = summary("lm-eval math_verify", mv, rows)
    differ = [(r, o, m) for r, o, m in zip(rows, ours, mv, strict=True) if o != m]
    show("rows where ckpteval and lm-eval math_verify disagree", differ, "math_verify")
    if args.show_all:
        wrong = [(r, o, m) for r, o, m in zip(rows, ours, mv, strict=True) if o != r["label"]]
        show("rows where ckpteval and the label disagree", wrong, "math_verify")
    ok = rate >= 0.99 and rate > mv_rate and false_pass == 0
    print(
        f"\ntarget (>= 99%, above lm-eval math_verify, no false pass): {'met' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
