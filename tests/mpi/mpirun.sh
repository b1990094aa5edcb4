#!/usr/bin/env bash
# mpirun for the tests: oversubscribe (CI has 2 cores), allow root (CI runs as root), and a
# short collective timeout so that a bug fails the test instead of hanging ctest.
# Usage: mpirun.sh NP PROGRAM [ARGS...]
set -euo pipefail
np=$1
shift
extra=()
if [[ $(id -u) -eq 0 ]]; then extra+=(--allow-run-as-root); fi
export DLTRAIN_COLLECTIVE_TIMEOUT=${DLTRAIN_COLLECTIVE_TIMEOUT:-120}
exec mpirun "${extra[@]}" --oversubscribe --bind-to none -np "$np" "$@"
