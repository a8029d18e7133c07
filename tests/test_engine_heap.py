"""`ckpteval.engine.heap.engine_imports`: the engine's imports run with the cyclic collector
paused, every object alive afterwards is frozen out of later collections, and the collector always
runs again after the block, also when an import fails."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from ckpteval.engine.heap import engine_imports


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    """Give pytest's heap back to the collector after each test."""
    yield
    gc.unfreeze()
    gc.enable()


def test_imports_run_without_the_collector_and_their_objects_are_frozen() -> None:
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    with engine_imports():
        assert not gc.isenabled()
        kept = [[] for _ in range(1000)]  # long-lived state, as modules make
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + len(kept)
    assert not any(o is kept for o in gc.get_objects())  # out of every generation's scans


def test_a_failed_import_leaves_the_collector_running_and_freezes_nothing() -> None:
    frozen = gc.get_freeze_count()
    with pytest.raises(ModuleNotFoundError), engine_imports():
        import ckpteval_no_such_module  # noqa: F401
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_a_collector_the_caller_had_paused_stays_paused() -> None:
    gc.disable()
    with engine_imports():
        pass
    assert not gc.isenabled()
