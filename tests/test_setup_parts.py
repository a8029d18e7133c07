"""scripts/setup-env.sh in parts, as .ci/run calls it to overlap apt-get, pip and the MLflow
server's environment: an unknown part is refused, and the MLflow part is optional in a whole
setup (its test skips) but fails loudly when CI asks for it by name. Nothing is installed here:
the failing case gives the script a Python that cannot make a venv. And setup by a user who is
not root, on a machine without an optional tool (rustc): one line says what is skipped, and the
demo plans without its Rust task."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import dry_snakemake, path_without, write_config
from safetensors.numpy import save_file

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


def test_setup_as_a_user_without_rustc_says_what_is_skipped_in_one_line() -> None:
    """A user who is not root (`nobody`), on a machine with bubblewrap and without rustc: the
    system part succeeds and says in one line what is left out; without bubblewrap (the
    sandbox, which only an admin can install), or with one the kernel refuses this user a
    namespace for, it stops, saying so in one line."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root (to become nobody) and runuser")
    bin_dir = Path(tempfile.mkdtemp(prefix="ckpteval-path-"))  # nobody cannot enter tmp_path
    try:
        bin_dir.chmod(0o755)

        def as_nobody(path: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [str(shutil.which("runuser")), "-u", "nobody", "--", "/usr/bin/env", "-i"]
                + [f"PATH={path}", "bash", str(SETUP), "system"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )

        system = "/usr/local/bin:/usr/bin:/bin"  # a user's PATH (root's may hold rustup's)
        proc = as_nobody(path_without(bin_dir / "a", "rustc", path=system))
        assert proc.returncode == 0, proc.stderr
        said = [line for line in proc.stderr.splitlines() if "rustc" in line]
        assert said == [
            "setup: rustc not found: the demo's Rust task (tasks.rustfunc) is left out, the Rust "
            "tests skip; install it with: sudo apt-get install rustc"
        ]
        assert all(line.startswith("setup: ") for line in proc.stderr.splitlines())
        proc = as_nobody(path_without(bin_dir / "b", "rustc", "bwrap", path=system))
        assert proc.returncode == 1
        assert proc.stderr.splitlines() == [
            "setup: bubblewrap not found: the sandbox every task's generated code runs in; an "
            "admin installs it (sudo apt-get install bubblewrap), the rest of the setup needs no "
            "root"
        ]
        # A kernel that refuses this user a namespace (cannot be set here: a stand-in bwrap
        # answers as bubblewrap does under Ubuntu's AppArmor restriction).
        refusing = bin_dir / "c"
        refusing.mkdir(mode=0o755)
        (refusing / "bwrap").write_text(
            "#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n"
        )
        (refusing / "bwrap").chmod(0o755)
        proc = as_nobody(f"{refusing}:{path_without(bin_dir / 'd', 'rustc', path=system)}")
        assert proc.returncode == 1
        assert proc.stderr.splitlines()[-1] == (
            "setup: bubblewrap cannot make a sandbox as nobody (bwrap: setting up uid map: "
            "Permission denied); an admin allows user namespaces (Ubuntu: sysctl "
            "kernel.apparmor_restrict_unprivileged_userns=0)"
        )
    finally:
        shutil.rmtree(bin_dir)


def test_the_demo_plans_without_rustc_leaving_out_its_rust_task_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """config/config.yaml's tasks, planned by Snakemake on a machine without rustc: everything
    but the Rust task is planned, and the parse says so once. ~5-15 s (one parse of the demo's
    seven tasks, lm-eval's task index included): the line is the Snakefile's to print, which
    only a parse shows; tests/test_config.py checks the plan itself."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    assert config["tasks"]["rustfunc"] == {"optional": True}
    run = tmp_path / "run" / "step_10"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    save_file({"w": np.zeros(4, dtype=np.float32)}, str(run / "model.safetensors"))
    config["runs"] = {"demo": {"path": str(run.parent)}}
    verl = config["tasks"]["arith_verl"]
    verl["problems"] = str(REPO / verl["problems"])
    verl["checker"]["reward_function"] = str(REPO / verl["checker"]["reward_function"])
    work = tmp_path / "work"
    write_config(work, config)
    monkeypatch.setenv("PATH", path_without(tmp_path / "bin", "rustc"))
    proc = dry_snakemake(work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "rustfunc" in line]
    assert said == [
        "ckpteval: warning: task rustfunc left out: it is optional and its checker runs rustc, "
        "not found on PATH; install rustc (Debian: sudo apt-get install rustc) to run it"
    ]
    assert "pyfunc/greedy-s42" in proc.stdout + proc.stderr  # the rest is planned


def test_tests_that_compile_rust_skip_without_rustc_counted_in_one_line(tmp_path: Path) -> None:
    """`make test` on a machine without rustc: a module of Rust tests (marked needs("rustc"))
    skips, each test saying why, and the run ends with one line counting them. A pytest of its
    own (~4 s of CPU, most of it importing the module's ckpteval imports), without plugins."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_rust_neighbours.py", "-q"]
        + ["-p", "no:cacheprovider"],
        cwd=REPO,
        env={
            **os.environ,
            "PATH": path_without(tmp_path / "bin", "rustc"),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = proc.stdout.splitlines()
    assert (
        "rustc not found: 4 test(s) that need it skipped (sudo apt-get install rustc to run them)"
        in lines
    )
    assert any("4 skipped" in line for line in lines), lines[-3:]
