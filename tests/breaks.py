"""Five guarantees broken on purpose, one at a time, and the tests that must catch each: the proof
that a faster suite did not loosen what it checks (issue 38). Rerun it after changing how the
suite runs (shared sweeps, forked dry runs, fewer real runs): every break must still be caught.

Usage (minutes per break: sweeps and engines):

    .venv/bin/python tests/breaks.py [NAME...]

Each break is applied to a scratch copy of this checkout (tracked and new files; the checkout
itself is never touched), then the narrowest selection of tests that should catch it runs there
with that copy's package first on PYTHONPATH. The demo build is shared with the checkout's own
pytest cache. The script prints, per break, the tests that failed ("caught by"), or NOT CAUGHT,
and exits 1 if any break went uncaught or its code is no longer where the break expects it (then
update BREAKS: the guarantee still needs its break).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Edit:
    """One replacement in one file of the checkout: `old` must occur exactly once in `path`."""

    path: str  # relative to the checkout
    old: str
    new: str


@dataclass(frozen=True)
class Break:
    """A guarantee broken the way a real bug would break it: every file the bug needs changed
    (a break that only made the code crash would prove the crash is caught, not the guarantee)."""

    name: str
    guarantee: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]  # pytest node ids that must fail

    @property
    def paths(self) -> list[str]:
        return sorted({edit.path for edit in self.edits})


BREAKS = (
    Break(
        "force-file",
        "`-f` on a generation file regenerates that cell (the engine job is asked for it)",
        (Edit("src/ckpteval/verbs.py", "            or verbs.forces_file(jsonl, meta)\n", ""),),
        (
            "tests/test_contract_verbs.py::"
            "test_forcing_one_generation_file_regenerates_that_cell_only",
        ),
    ),
    Break(
        "failed-engine",
        "a failed engine job deletes no finished file (here: it clears its cells' files first)",
        (
            Edit(
                "src/ckpteval/engine/job.py",
                "        _clear_staged(staging, {(c.task, c.variant) for c in job.cells})\n",
                "        _clear_staged(staging, {(c.task, c.variant) for c in job.cells})\n"
                "        for c in job.cells:\n"
                "            cell = staging.parents[3] / 'generations' / smk.wildcards.run\n"
                "            for ext in ('.jsonl', '.meta.json'):\n"
                "                path = cell / smk.wildcards.ckpt / c.task / (c.variant + ext)\n"
                "                path.unlink(missing_ok=True)\n",
            ),
        ),
        ("tests/test_contract_verbs.py::test_a_failed_engine_job_deletes_no_finished_file",),
    ),
    Break(
        "sibling",
        "a sample sees only its own directory of the batch (here: the whole batch directory)",
        (
            Edit(
                "src/ckpteval/sandbox_driver/isolation.py",
                'paths = sorted({cwd if p == workdir else p for p in spec["binds"]}, key=len)',
                'paths = sorted(set(spec["binds"]), key=len)',
            ),
        ),
        (
            "tests/test_sandbox_isolation.py::test_a_command_sees_only_its_own_directory",
            "tests/test_checkers_python_isolation.py::test_a_sample_cannot_read_its_siblings_programs",
        ),
    ),
    # The task's options and definition leave the generations' identity, as a planner that
    # forgot them would; the generation job stops checking its task against the identity (a
    # bare KeyError there would crash the sweep's build, a catch that proves nothing about
    # reruns). A sweep still runs; a changed option must be caught by what it plans.
    Break(
        "task-option",
        "a changed task option reruns its cells (here: the task's settings leave the identity)",
        (
            Edit(
                "src/ckpteval/contract.py",
                '        "task.definition": plan.tasks[task].config_hash()[:16],\n',
                "",
            ),
            Edit(
                "src/ckpteval/contract.py",
                "    # Settings that name files count by content, not by their configured path "
                "(or name).\n    settings = dict(identity.settings)\n",
                "    settings = dict(identity.settings)\n"
                '    settings = {k: v for k, v in settings.items() if not k.startswith("tasks.")}\n',
            ),
            Edit(
                "src/ckpteval/jobs.py",
                '        if spec.config_hash()[:16] != self.identity.settings["task.definition"]:\n',
                "        if False:\n",
            ),
        ),
        (
            "tests/test_contract_walk.py::"
            "test_changing_a_key_plans_exactly_what_the_contract_promises[tasks.*.limit]",
        ),
    ),
    Break(
        "swap-check",
        "a weight swap is checked against the checkpoint (here: the check is skipped)",
        (
            Edit(
                "src/ckpteval/engine/swap.py",
                "    compared = verify_weights(llm, model_dir)\n",
                "    compared = 0\n",
            ),
        ),
        ("tests/test_swap.py::test_the_check_reads_the_weights_through_the_kernels",),
    ),
)


def scratch_copy(dest: Path) -> None:
    """The checkout's tracked and new (not ignored) files, copied to `dest`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def apply(root: Path, brk: Break) -> None:
    """Apply every edit of `brk` in the copy at `root`, in order (several may touch one file)."""
    for edit in brk.edits:
        path = root / edit.path
        text = path.read_text()
        if text.count(edit.old) != 1:
            raise LookupError(f"{edit.path} no longer holds {edit.old.strip()!r}: update BREAKS")
        path.write_text(text.replace(edit.old, edit.new))


def failed_tests(root: Path, brk: Break) -> tuple[list[str], str]:
    """The node ids that failed or errored in the broken copy (with pytest's one-line reason),
    and pytest's last lines."""
    cmd = [sys.executable, "-m", "pytest", "-n", "0", "-q", "-rfE", "--durations=0"]
    cmd += ["-o", f"cache_dir={REPO / '.pytest_cache'}", *brk.tests]
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    # `-rfE` summary lines: "FAILED node - why": the why tells an assertion from a crash.
    failed = [
        f"{node} ({kind}{': ' + why[:160] if why else ''})"
        for kind, node, why in re.findall(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$", out, re.M)
    ]
    return failed, "\n".join(out.rstrip().splitlines()[-3:])


def main(names: list[str]) -> int:
    chosen = [b for b in BREAKS if not names or b.name in names]
    uncaught = 0
    for brk in chosen:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"ckpteval-break-{brk.name}-") as tmp:
            root = Path(tmp)
            scratch_copy(root)
            try:
                apply(root, brk)
            except LookupError as exc:
                print(f"{brk.name}: CANNOT APPLY: {exc}", flush=True)
                uncaught += 1
                continue
            failed, tail = failed_tests(root, brk)
        seconds = time.monotonic() - started
        print(
            f"{brk.name}: broken: {brk.guarantee} ({', '.join(brk.paths)}; {seconds:.0f} s)",
            flush=True,
        )
        if failed:
            for node in failed:
                print(f"    caught by {node}", flush=True)
        else:
            uncaught += 1
            print(f"    NOT CAUGHT by {' '.join(brk.tests)}\n    {tail}", flush=True)
    return 1 if uncaught else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
