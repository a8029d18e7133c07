#!/usr/bin/env bash
# Run pytest with the given arguments, then print its ten slowest test modules (what to shorten or
# start first, tests/conftest.py's LONGEST_FIRST), and exit with pytest's own status: a failure
# and "no tests collected" (status 5) fail the caller as they would without this wrapper.
#
# Usage: scripts/pytest-table.sh PYTHON [PYTEST ARGS...]   (`make test` and `make test-fast` use it)
# pytest's whole output is kept in a temporary file whose path is printed with the table.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=$1
shift
log=$(mktemp "${TMPDIR:-/tmp}/ckpteval-pytest.XXXXXX")
"$PYTHON" -m pytest "$@" --durations=0 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
echo "slowest test modules (seconds summed over setup, call and teardown; full log: $log):"
"$PYTHON" "$REPO/scripts/module_durations.py" "$log" 10
exit "$status"
