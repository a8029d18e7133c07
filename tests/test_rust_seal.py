"""A compiled Rust batch, sealed (ckpteval.checkers.rust.checker `_seal`), runs in the sandbox
but no test process reads it: not its siblings' code, not the harness key that stops a sample
from re-running its own test binary (docs/evaluate.md, "the binary's key"). As root the test
processes are other uids than the binary's owner; rootless (ckpteval run by a user who is not
root) they are its owner, so the seal must deny the owner too (0111): at 0711 they read it. And
its scratch directory still goes once the batch is done, or once a killed process left it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, as_nobody_json

pytestmark = [
    pytest.mark.needs("rustc"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
]

#: What a test process tries on the sealed batch: read its binary, list its directory, chmod
#: the binary readable again.
PROBE = r"""
import json, os
out = {}
for what, call in [("read", lambda: open("batch1", "rb").read(4)),
                   ("list", lambda: os.listdir(".")),
                   ("chmod", lambda: os.chmod("batch1", 0o755))]:
    try:
        call()
        out[what] = "done"
    except OSError as exc:
        out[what] = exc.strerror
print(json.dumps(out))
"""

#: Seal a batch (a compiled binary, a source) in a scratch directory, run the binary and `PROBE`
#: in one sandbox, let the directory go; then seal one as a killed process would have left it
#: and sweep it. Its argv: the binary to copy, then `PROBE`.
SEAL = r"""
import json, os, shutil, stat, sys, tempfile, time
from pathlib import Path
from ckpteval import scratch
from ckpteval.checkers.rust.checker import _seal
from ckpteval.sandbox import Command, Limits, Sandbox
from ckpteval.scratch import PREFIX, scratch_dir, sweep

binary, probe = sys.argv[1], sys.argv[2]
root = Path(tempfile.mkdtemp())
os.chmod(root, 0o755)


def batch(work):
    os.chmod(work, 0o755)
    (work / "u0").mkdir()
    (work / "u0" / "main.rs").write_text("fn main() {}")
    shutil.copy(binary, work / "batch1")
    os.chmod(work / "batch1", 0o755)
    _seal(work)


out = {}
with scratch_dir("rs", str(root)) as work:
    batch(work)
    out["modes"] = {n: oct(os.stat(work / n).st_mode & 0o7777) for n in (".", "u0", "batch1")}
    out["source left"] = os.path.lexists(work / "u0" / "main.rs")
    commands = [
        Command([str(work / "batch1")], Limits(wall_s=20)),
        Command(["/usr/bin/python3", "-I", "-S", "-c", probe], Limits(wall_s=20)),
    ]
    ran, probed = Sandbox("bwrap").run_many(commands, workdir=work)
    out["ran"] = [ran.ok, ran.stdout.decode().strip(), ran.stderr.decode()[-300:]]
    out["probe"] = json.loads(probed.stdout.decode() or "{}")
    out["probe stderr"] = probed.stderr.decode()[-300:]
scratch._removers[os.getpid()].shutdown(wait=True)
out["removed"] = not os.path.lexists(work)
left = root / (PREFIX + "rs-killed")  # a killed process's: no one holds it
left.mkdir()
batch(left)
os.utime(left, (time.time() - 600,) * 2)
out["swept"] = sweep(str(root)) == [left.name] and not os.path.lexists(left)
out["root left"] = os.listdir(root)
os.rmdir(root)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def binary() -> Iterator[Path]:
    """A Rust program compiled by root's rustc, where `nobody` may read it (a user's sandbox
    need not find a toolchain: what is sealed is the binary)."""
    folder = Path(tempfile.mkdtemp(prefix="ckpteval-seal-"))  # not root's tmp_path
    os.chmod(folder, 0o755)
    (folder / "main.rs").write_text('fn main() { println!("batch ran"); }\n')
    subprocess.run(
        [str(shutil.which("rustc")), "-O", "-o", str(folder / "batch1"), str(folder / "main.rs")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    os.chmod(folder / "batch1", 0o755)
    yield folder / "batch1"
    shutil.rmtree(folder)


def _sealed(who: str, binary: Path, tmp_path: Path) -> dict[str, Any]:
    if who == "rootless":
        with tempfile.TemporaryDirectory(prefix="ckpteval-rootless-") as tmp:
            work = Path(tmp)
            os.chmod(work, 0o755)
            (work / "seal.py").write_text(SEAL)
            return as_nobody_json(work / "seal.py", str(binary), PROBE, cwd=work, tmpdir="/tmp")
    if os.geteuid() != 0:
        pytest.skip("the uid split needs root")
    (tmp_path / "seal.py").write_text(SEAL)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "seal.py"), str(binary), PROBE],
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("who", ["root", "rootless"])
def test_a_sealed_batch_runs_but_no_test_process_reads_it(
    who: str, binary: Path, tmp_path: Path
) -> None:
    """Guards: the binary and its directories are execute (traverse) only, the owner included,
    so a test process (rootless: the owner) neither reads the binary nor lists the directory,
    and cannot chmod it back (the work directory is bound read-only); the binary still runs.
    Then the scratch directory is removed, by its process or by a sweep after a kill, though
    its owner (rootless: not root) may not list it."""
    out = _sealed(who, binary, tmp_path)
    assert out["modes"] == {".": "0o111", "u0": "0o111", "batch1": "0o111"}
    assert out["source left"] is False
    assert out["ran"][:2] == [True, "batch ran"], out["ran"]
    assert out["probe"], out["probe stderr"]
    assert "done" not in out["probe"].values(), out["probe"]  # before the fix, rootless: read
    assert out["removed"] and out["swept"] and out["root left"] == []
