"""What Snakemake repeats per job while it plans, done once per rule where the answer cannot differ.

Snakemake 9 checks, for every job of a `script:` rule, that the rule's script is readable: it
formats the path, parses it as a URI, copies the file into its source cache on the first job and
reads it again for every later one. A sweep is thousands of evaluate jobs of one rule with one
script, so on a new 300-checkpoint x 20-task sweep that check was 14% of `snakemake -n`.

A script path without braces names the same file for every job of its rule: the check of the
rule's first job answers for the rest. A path with braces (formatted with wildcards or params) is
still checked per job, and a missing script still stops the first job's check with Snakemake's
own error, in the dry run as before.

It replaces a method of Snakemake's (`snakemake.dag.ScriptProcessor.process_job`), and only the
method as read in Snakemake 9.27 (its source's digest, `READ`): another Snakemake, whose method
may do more per job, plans as Snakemake does, only slower.
"""

from __future__ import annotations

import hashlib
import inspect
from typing import Any

#: Set on the patched method: the patch is applied once per process.
_MARK = "_ckpteval_once_per_rule"
#: The sha256 (first 16 hex digits) of the source of the `process_job` this module replaces.
READ = "168fffa9284a4cdf"


def check_scripts_once_per_rule() -> bool:
    """Make Snakemake's script check run once per rule (see the module's text). True when it is
    in place; False when this Snakemake has no such check to patch (planning is then as
    Snakemake does it, only slower)."""
    try:
        import snakemake.api  # noqa: F401  (snakemake.dag alone is a circular import)
        from snakemake.dag import ScriptProcessor
    except ImportError:
        return False
    original = getattr(ScriptProcessor, "process_job", None)
    if original is None or getattr(ScriptProcessor, "script_type", None) != "script":
        return False
    if getattr(original, _MARK, False):
        return True
    if source_digest(original) != READ:
        return False

    def process_job(self: Any, job: Any) -> None:
        entry = getattr(job.rule, self.script_type, None)
        if entry is None or "{" in str(entry):
            original(self, job)
            return
        checked = self.__dict__.setdefault("_ckpteval_checked_rules", set())
        if job.rule in checked:
            return
        original(self, job)
        checked.add(job.rule)

    setattr(process_job, _MARK, True)
    ScriptProcessor.process_job = process_job
    return True


def source_digest(function: Any) -> str | None:
    """The sha256 (first 16 hex digits) of a function's source; None if it cannot be read."""
    try:
        return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]
    except (OSError, TypeError):
        return None
