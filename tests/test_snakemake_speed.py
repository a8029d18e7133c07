"""ckpteval.plan.snakemake_speed: Snakemake's per-job check of a `script:` rule's script runs once
per rule when the path has no braces, and still per job when it has; a missing script still stops
the dry run with Snakemake's own error, as it does unpatched; a Snakemake whose check is not the
one read is left alone. The counting cases are real `snakemake -n` runs of a small Snakefile that
counts the checks it makes (Snakemake's `script.get_source`, which the check calls)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import snakemake
import snakemake.api  # noqa: F401  (before snakemake.dag: a circular import otherwise)
from snakemake.dag import ScriptProcessor

from ckpteval.plan import snakemake_speed

PATCHED = """
import atexit
import snakemake.script as _script

from ckpteval.plan.snakemake_speed import check_scripts_once_per_rule

if {patch}:
    check_scripts_once_per_rule()
_calls = []
_get_source = _script.get_source


def _counted(path, *args, **kwargs):
    _calls.append(str(path))
    return _get_source(path, *args, **kwargs)


_script.get_source = _counted
atexit.register(lambda: open("checks.txt", "w").write("\\n".join(_calls)))

N = range(5)

rule all:
    input: expand("out/a{{i}}.txt", i=N), expand("out/b{{i}}.txt", i=N), expand("out/c{{i}}.txt", i=N)

rule a:
    output: "out/a{{i}}.txt"
    script: "{a_script}"

rule b:
    output: "out/b{{i}}.txt"
    script: "touch.py"

rule c:
    output: "out/c{{i}}.txt"
    script: "scripts/{{wildcards.i}}.py"
"""


def dry_run(
    tmp_path: Path, patch: bool, a_script: str = "touch.py", without: int | None = None
) -> tuple[int, str, list[str]]:
    """`snakemake -n` of PATCHED (rule c's script for job `without` left out): its exit code,
    output, and the script paths Snakemake checked."""
    (tmp_path / "Snakefile").write_text(PATCHED.format(patch=patch, a_script=a_script))
    (tmp_path / "touch.py").write_text("open(snakemake.output[0], 'w').close()\n")
    (tmp_path / "scripts").mkdir(exist_ok=True)
    for i in range(5):
        if i == without:
            continue
        (tmp_path / "scripts" / f"{i}.py").write_text("open(snakemake.output[0], 'w').close()\n")
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--quiet", "rules"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    checks = (tmp_path / "checks.txt").read_text().splitlines()
    return proc.returncode, proc.stdout + proc.stderr, checks


@pytest.mark.parametrize("patch", [False, True], ids=["as snakemake does", "once per rule"])
def test_a_script_is_checked_once_per_rule_unless_its_path_has_braces(
    tmp_path: Path, patch: bool
) -> None:
    code, output, checks = dry_run(tmp_path, patch)
    assert code == 0, output
    by_rule = {s: sum(1 for c in checks if c == s) for s in set(checks)}
    # rule c's path has wildcards: one check per job, patched or not
    assert sum(n for s, n in by_rule.items() if "wildcards" in s) == 5
    plain = {s: n for s, n in by_rule.items() if "wildcards" not in s}
    applied = snakemake_speed.source_digest(ScriptProcessor.process_job) == snakemake_speed.READ
    assert plain == {"touch.py": 2 if patch and applied else 10}, by_rule


def test_the_check_it_replaces_is_the_one_read() -> None:
    """The method was read in Snakemake 9.27; on another Snakemake, whatever the method's text,
    the patch holds only if it is the same text."""
    digest = snakemake_speed.source_digest(ScriptProcessor.process_job)
    if snakemake.__version__.startswith("9.27."):
        assert digest == snakemake_speed.READ
    elif digest != snakemake_speed.READ:
        pytest.skip(
            f"Snakemake {snakemake.__version__} changed the script check: planned unpatched"
        )


def test_a_method_it_has_not_read_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def process_job(self: object, job: object) -> None:  # another Snakemake's, say
        return None

    monkeypatch.setattr(ScriptProcessor, "process_job", process_job)
    assert snakemake_speed.check_scripts_once_per_rule() is False
    assert ScriptProcessor.process_job is process_job


@pytest.mark.parametrize("patch", [False, True], ids=["as snakemake does", "once per rule"])
def test_a_missing_script_still_stops_the_dry_run(tmp_path: Path, patch: bool) -> None:
    code, output, _ = dry_run(tmp_path, patch, a_script="gone.py")
    assert code != 0
    assert f"No such file or directory: '{tmp_path / 'gone.py'}'" in output, output


def test_a_missing_script_behind_a_wildcard_is_found_in_its_own_job(tmp_path: Path) -> None:
    code, output, _ = dry_run(tmp_path, patch=True, without=3)
    assert code != 0
    assert f"No such file or directory: '{tmp_path / 'scripts' / '3.py'}'" in output, output
