"""scripts/setup-env.sh in parts, as .ci/run calls it to overlap apt-get, pip and the MLflow
server's environment: an unknown part is refused, and the MLflow part is optional in a whole
setup (its test skips) but fails loudly when CI asks for it by name. Nothing is installed here:
the failing case gives the script a Python that cannot make a venv."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SETUP = REPO / "scripts" / "setup-env.sh"


def setup(*parts: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run setup-env.sh with `parts`, .venv being this interpreter's, the MLflow venv in tmp_path."""
    base = {
        **os.environ,
        "VENV": str(Path(sys.executable).parents[1]),
        "MLFLOW_VENV": str(tmp_path / "venv-mlflow"),
        "VERL_VENV": str(tmp_path / "venv-verl"),
        "DEEPSPEED_VENV": str(tmp_path / "venv-deepspeed"),
        "PYTHON": "/bin/false",  # `python -m venv` fails at once: nothing is downloaded
    }
    return subprocess.run(
        ["bash", str(SETUP), *parts],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_an_unknown_part_is_refused_in_one_line(tmp_path: Path) -> None:
    proc = setup("apt", tmp_path=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "setup: unknown part apt (system, venv, mlflow, verl, deepspeed)"


def test_the_mlflow_part_asked_for_by_name_fails_loudly(tmp_path: Path) -> None:
    proc = setup("mlflow", tmp_path=tmp_path)
    assert proc.returncode == 1
    assert "the full mlflow package did not install into" in proc.stderr


def test_the_mlflow_part_of_a_whole_setup_is_optional(tmp_path: Path) -> None:
    proc = setup(tmp_path=tmp_path, SETUP_PARTS="mlflow")
    assert proc.returncode == 0, proc.stderr
    assert "the MLflow server test will be skipped" in proc.stderr


def test_an_existing_mlflow_venv_is_kept(tmp_path: Path) -> None:
    mlflow = tmp_path / "venv-mlflow" / "bin" / "mlflow"
    mlflow.parent.mkdir(parents=True)
    mlflow.write_text("#!/bin/sh\n")
    mlflow.chmod(0o755)
    proc = setup("mlflow", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert mlflow.read_text() == "#!/bin/sh\n"


@pytest.mark.parametrize(
    ("part", "failed", "skipped"),
    [
        ("verl", "verl's model_merger", "verl's own merger"),
        ("deepspeed", "deepspeed", "DeepSpeed's zero_to_fp32"),
    ],
)
def test_a_comparison_part_fails_loudly_by_name_and_is_optional_in_a_whole_setup(
    tmp_path: Path, part: str, failed: str, skipped: str
) -> None:
    proc = setup(part, tmp_path=tmp_path)
    assert proc.returncode == 1
    assert f"{failed} did not install into" in proc.stderr
    proc = setup(tmp_path=tmp_path, SETUP_PARTS=part)
    assert proc.returncode == 0, proc.stderr
    assert f"the comparison with {skipped} will be skipped" in proc.stderr


def make_plan(target: str, tmp_path: Path) -> str:
    """What `make -n TARGET` would run on a fresh clone (no venv yet)."""
    proc = subprocess.run(
        ["make", "-n", target, f"VENV={tmp_path / 'venv'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout


def test_make_demo_sets_up_only_what_the_demo_needs_and_make_test_the_rest(tmp_path: Path) -> None:
    """`make demo` fetches no test-only environment (GBs: the MLflow server, verl, DeepSpeed);
    `make test` builds them, as optional parts (their tests skip when one did not install)."""
    demo = make_plan("demo", tmp_path)
    assert 'SETUP_PARTS="${SETUP_PARTS:-system venv}" bash scripts/setup-env.sh' in demo
    assert "mlflow" not in demo and "deepspeed" not in demo and "verl" not in demo
    test = make_plan("test", tmp_path)
    assert 'SETUP_PARTS="${SETUP_PARTS:-system venv}" bash scripts/setup-env.sh' in test
    assert 'SETUP_PARTS="mlflow verl deepspeed" bash scripts/setup-env.sh' in test
