"""The parse-time check of harness task names (`check_harness_names`) with its cached index of
the local lm-eval YAMLs: a parse that finds every name in the cache imports no lm-eval, and the
cache never hides an edit, a new file or a removed file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckpteval.errors import UserError
from ckpteval.tasks import (
    HARNESS_TASK_DIR,
    TaskSpec,
    _lm_eval_version,
    check_harness_names,
    local_task_names,
)

YAML = """\
task: {name}
dataset_path: json
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache directory of the test's own, holding a stand-in for lm-eval's own task names (so
    that a miss, which also consults them, does not index all of lm-eval for 10-20 s)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(root))
    own = root / "ckpteval" / f"lm_eval-{_lm_eval_version()}-tasks.json"
    own.parent.mkdir(parents=True)
    own.write_text(json.dumps(["hellaswag"]))
    return root / "ckpteval"


def _harness(*names: str) -> dict[str, TaskSpec]:
    return {f"t{i}": TaskSpec(f"t{i}", "harness", "harness", name) for i, name in enumerate(names)}


def _write(path: Path, name: str, *, later_ns: int = 0) -> None:
    """Write a task YAML named `name`; `later_ns` moves its mtime on from the previous one (an
    edit in the same clock tick as the cache is the one case a stat cannot see)."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(YAML.format(name=name))
    if later_ns:
        os.utime(path, ns=(before + later_ns, before + later_ns))


def test_an_edited_task_name_is_seen_through_the_cache(tmp_path: Path, cache: Path) -> None:
    include = tmp_path / "tasks"
    (include / "sub").mkdir(parents=True)
    task_yaml = include / "sub" / "mine.yaml"
    _write(task_yaml, "mytask_one")
    check_harness_names(_harness("mytask_one", "ckpteval_arith"), [str(include)])
    assert list(cache.glob("lm_eval-*-local-*.json")), "the local index was not cached"

    # Same size, only the mtime moves; the old name asked first, while the cache still holds it
    # (a new name the cache lacks is indexed again anyway, which would hide a stale cache).
    _write(task_yaml, "mytask_two", later_ns=1_000_000_000)
    with pytest.raises(UserError, match=r"'mytask_one' is not an lm-eval task.*mytask_two"):
        check_harness_names(_harness("mytask_one"), [str(include)])
    check_harness_names(_harness("mytask_two"), [str(include)])

    (include / "sub" / "more.yaml").write_text(YAML.format(name="mytask_three"))
    check_harness_names(_harness("mytask_three", "mytask_two"), [str(include)])
    task_yaml.unlink()
    with pytest.raises(UserError, match="'mytask_two' is not an lm-eval task"):
        check_harness_names(_harness("mytask_two"), [str(include)])
    (include / "sub" / "__pycache__").mkdir()  # lm-eval skips it: so does the cache's signature
    (include / "sub" / "__pycache__" / "stale.yaml").write_text(YAML.format(name="mytask_four"))
    with pytest.raises(UserError, match="'mytask_four' is not an lm-eval task"):
        check_harness_names(_harness("mytask_four"), [str(include)])


def test_a_cache_that_lacks_a_name_or_is_damaged_is_indexed_again(
    tmp_path: Path, cache: Path
) -> None:
    include = tmp_path / "tasks"
    include.mkdir()
    _write(include / "mine.yaml", "mytask_one")
    paths = [str(HARNESS_TASK_DIR), str(include)]
    assert "mytask_one" in local_task_names(paths)
    (index,) = cache.glob("lm_eval-*-local-*.json")

    kept = json.loads(index.read_text())
    index.write_text(json.dumps({**kept, "names": []}))  # right signature, wrong names
    check_harness_names(_harness("mytask_one"), [str(include)])
    index.write_text("{not json")
    check_harness_names(_harness("mytask_one"), [str(include)])
    assert "mytask_one" in json.loads(index.read_text())["names"]


def test_a_parse_whose_names_are_cached_imports_no_lm_eval(tmp_path: Path, cache: Path) -> None:
    """The point of the cache: `import lm_eval.tasks` pulls `datasets` and pandas (~2 s of CPU in
    every workflow parse). Run in fresh interpreters, since pytest's has lm-eval imported."""
    include = tmp_path / "tasks"
    include.mkdir()
    _write(include / "mine.yaml", "mytask_one")
    code = (
        "import sys\n"
        "from ckpteval.tasks import TaskSpec, check_harness_names\n"
        "check_harness_names({'t': TaskSpec('t', 'harness', 'harness', 'mytask_one'),"
        " 'u': TaskSpec('u', 'harness', 'harness', 'ckpteval_arith')}, [sys.argv[1]])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lm_eval', 'datasets')))\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(cache.parent)}
    runs = [
        subprocess.run(
            [sys.executable, "-c", code, str(include)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for _ in range(2)
    ]
    assert "lm_eval.tasks" in runs[0]  # the first parse indexes for real
    assert runs[1] == "[]", runs[1]
