#!/usr/bin/env bash
# Static checks of the repository. Usage: scripts/lint.sh [PART...]; no PART runs them all.
#
#   ruff      ruff check (rules: pyproject.toml [tool.ruff])
#   format    ruff format --check
#   snakefmt  snakefmt --check Snakefile workflow/
#   smklint   snakemake --lint on the demo config (config/config.yaml)
#   dryrun    snakemake -n on config/test/{vllm,openai,replay}.yaml: every backend plans its jobs
#
# Tools come from .venv (or $VENV), else PATH. Snakemake parses this checkout's workflow and
# package (PYTHONPATH=src). smklint and dryrun work in a temporary directory with placeholder
# checkpoints (config.json + a one-tensor model.safetensors: discovery needs files, a dry run
# loads none) and replay solution files; nothing is written in the repository.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
VENV=${VENV:-.venv}
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"

tool() {  # tool NAME: the venv's copy, else the one on PATH
  if [ -x "$VENV/bin/$1" ]; then echo "$VENV/bin/$1"; else command -v "$1" || echo "$1"; fi
}
PYTHON=${PYTHON:-$(tool python)}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ckpteval-lint.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

fake_checkpoints() {  # fake_checkpoints DIR NAME...: placeholder HF checkpoints DIR/NAME
  "$PYTHON" - "$@" <<'EOF'
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

root = Path(sys.argv[1])
for name in sys.argv[2:]:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "config.json").write_text("{}")
    save_file({"w": np.zeros(4, dtype=np.float32)}, str(root / name / "model.safetensors"))
EOF
}

snakemake_in() {  # snakemake_in WORKDIR ARGS...: the repository's workflow in WORKDIR
  "$PYTHON" -m snakemake --snakefile "$REPO/Snakefile" --directory "$1" "${@:2}"
}

part_ruff() { "$(tool ruff)" check .; }
part_format() { "$(tool ruff)" format --check .; }
part_snakefmt() { "$(tool snakefmt)" --check Snakefile workflow/; }

part_smklint() {
  # One finding is accepted, by design (README, "Tests"): no rule names a conda environment or
  # container; every rule runs in the one environment of environment.yml / setup-env.sh. Any
  # other finding fails.
  local dir="$WORK/demo" out others
  mkdir -p "$dir/config"
  cp config/config.yaml "$dir/config/config.yaml"
  cp -r config/examples "$dir/config/examples"  # the demo's verl task and reward function
  fake_checkpoints "$dir/resources/demo/run" step_100 step_200
  fake_checkpoints "$dir/resources/demo" base
  out=$(snakemake_in "$dir" --lint 2>&1)
  others=$(printf '%s\n' "$out" | grep -E '^\s+\* ' | grep -v 'Specify a conda environment or container')
  if [ -n "$others" ]; then
    printf '%s\n' "$out"
    echo "lint: snakemake --lint findings other than the accepted one:" >&2
    printf '%s\n' "$others" >&2
    return 1
  fi
  echo "snakemake --lint: only the accepted finding (no per-rule conda environment)"
}

part_dryrun() {
  local backend dir out status=0
  for backend in vllm openai replay; do
    dir="$WORK/$backend"
    mkdir -p "$dir/config"
    cp "config/test/$backend.yaml" "$dir/config/config.yaml"
    case $backend in
      vllm)
        fake_checkpoints "$dir/run" step_100 step_200
        fake_checkpoints "$dir" base ;;
      replay)
        for step in 10 20; do
          mkdir -p "$dir/solutions/step_$step"
          echo '{"task_id": "arith/0", "completion": " #### 13"}' >"$dir/solutions/step_$step/arith.jsonl"
          echo '{"task_id": "pyfunc/0", "completion": "    return 0"}' >"$dir/solutions/step_$step/pyfunc.jsonl"
        done ;;
    esac
    if out=$(snakemake_in "$dir" --profile "$REPO/profiles/local" -n 2>&1); then
      local rule
      rule=$(case $backend in vllm) echo consolidate ;; openai) echo endpoint ;; replay) echo replay ;; esac)
      if grep -Eq "^$rule +[0-9]+" <<<"$out"; then
        echo "dryrun $backend: ok ($(grep -E '^total +[0-9]+' <<<"$out" | head -1 | awk '{print $2}') jobs)"
      else
        echo "dryrun $backend: no '$rule' job planned" >&2; echo "$out" | tail -30 >&2; status=1
      fi
    else
      echo "dryrun $backend: snakemake -n failed" >&2; echo "$out" | tail -30 >&2; status=1
    fi
  done
  return $status
}

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(ruff format snakefmt smklint dryrun)
failed=()
for part in "${parts[@]}"; do
  declare -F "part_$part" >/dev/null || { echo "lint: unknown part $part" >&2; exit 2; }
  echo "== lint: $part"
  "part_$part" || failed+=("$part")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "lint: failed: ${failed[*]}" >&2
  exit 1
fi
echo "lint: ok (${parts[*]})"
