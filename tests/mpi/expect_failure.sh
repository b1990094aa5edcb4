#!/usr/bin/env bash
# Runs a fault-injection job and checks that it fails fast and says why:
#   expect_failure.sh SECONDS PATTERN NP PROGRAM [ARGS...]
# passes when the job exits non-zero within SECONDS, and its output contains PATTERN exactly
# once per job (the message is printed once, not by every rank).
set -uo pipefail
limit=$1 pattern=$2
shift 2
here=$(dirname "$0")
start=$(date +%s%N)
out=$(timeout $((limit + 30)) bash "$here/mpirun.sh" "$@" 2>&1)
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "$out" | tail -20
echo "exit code $rc after ${elapsed_ms} ms"
count=$(grep -c -- "$pattern" <<< "$out")
if [[ $rc -eq 0 ]]; then echo "FAIL: the job succeeded"; exit 1; fi
if [[ $rc -eq 124 ]]; then echo "FAIL: the job hung (killed by timeout)"; exit 1; fi
if (( elapsed_ms > limit * 1000 )); then echo "FAIL: took ${elapsed_ms} ms > ${limit} s"; exit 1; fi
if [[ $count -ne 1 ]]; then echo "FAIL: '$pattern' printed $count times (want 1)"; exit 1; fi
echo "PASS"
