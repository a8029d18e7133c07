"""Offline data loaders for ckpteval's own lm-eval task YAMLs (referenced as `!function utils.X`)."""

from __future__ import annotations

from typing import Any


def load_arith(**_: Any) -> dict[str, Any]:
    """The demo arithmetic problems from the installed ckpteval package, as a test split."""
    import datasets

    from ckpteval.tasks import BUILTINS

    rows = [{"question": r["question"], "answer": r["answer"]} for r in BUILTINS["arith"].load()]
    return {"test": datasets.Dataset.from_list(rows, split=datasets.Split.TEST)}
