"""The Python heap of a process that starts a vLLM engine: its imports without the cyclic garbage
collector, then those objects frozen out of its scans.

`import vllm` and lm-eval's vLLM wrapper create about a million long-lived objects (modules,
classes, functions). While they load, Python's collector runs full collections over the growing
heap (~1 s of CPU here), and the engine start then calls `gc.collect()` itself several times
(after loading weights, after processing them, and vLLM's `freeze_gc_heap` at the end of its init):
each full collection walks every one of those objects again, ~3 s of a tiny model's 5 s engine
start on a 2-core CPU. Imported module state lives as long as the process, so nothing is lost by
never scanning it: `gc.freeze()` (Python's documented API for exactly this) moves it to the
permanent generation. Objects freed by reference counting are still freed; only cyclic garbage
made by the imports themselves (~17 thousand objects, a few MB, measured for vLLM 0.32) is kept.
Nothing in vLLM is changed and no result depends on it; `bench/startup.py` measures it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def engine_imports() -> Iterator[None]:
    """Run the block (the engine's imports) with the cyclic collector paused, then freeze every
    object alive so far out of later collections. The collector is running again afterwards,
    also when an import fails (then nothing is frozen)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()
    gc.freeze()
