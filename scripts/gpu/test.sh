#!/usr/bin/env bash
# Runs on the GPU machine after build.sh: the GPU tests, optionally the CPU tests, and the GPU
# tests again under compute-sanitizer memcheck, then a one-line summary per step.
#
#   bash scripts/gpu/test.sh                     # test_cuda + memcheck on a short filter
#   bash scripts/gpu/test.sh --cpu               # also ctest the CPU tests (needs build.sh --all)
#   bash scripts/gpu/test.sh --sanitize FILTER   # memcheck on this Catch2 filter instead
#   bash scripts/gpu/test.sh --no-sanitize       # skip memcheck
#   bash scripts/gpu/test.sh -- '[resnet]'       # Catch2 arguments for the plain test_cuda run
#
# Default memcheck filter: '[cuda]~[resnet]' (every GPU test but the end-to-end ResNet ones,
# which are slow under the sanitizer); it is stopped after SANITIZE_TIMEOUT s (default 300).
# Logs: $OUT/test.log (build-gpu/test.log without OUT). Exit status: 0 when every step that ran
# passed (a sanitizer time-out counts as a failure). Environment: BUILD_DIR, JOBS.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
build=${BUILD_DIR:-build-gpu}
jobs=${JOBS:-$(nproc)}
cpu=0
sanitize=1
filter='[cuda]~[resnet]'
catch_args=()
while (($#)); do
  case $1 in
    --cpu) cpu=1 ;;
    --sanitize) filter=$2; shift ;;
    --no-sanitize) sanitize=0 ;;
    --) shift; catch_args=("$@"); break ;;
    -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    *) echo "test.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
# shellcheck disable=SC1091
[[ -f .gpu-prefix/env.sh ]] && source .gpu-prefix/env.sh
bin=$build/tests/test_cuda
[[ -x $bin ]] || { echo "test.sh: $bin not built: run scripts/gpu/build.sh first" >&2; exit 1; }
logdir=${OUT:-$root/$build}
mkdir -p "$logdir"
log=$logdir/test.log
: > "$log"
summary=()
status=0
step() {  # step NAME CMD...: runs CMD with output to the console and the log, records the result
  local name=$1 t0=$SECONDS rc=0
  shift
  echo "==== $name: $*" | tee -a "$log"
  "$@" 2>&1 | tee -a "$log" || rc=$?
  local what=passed
  ((rc == 0)) || { what="FAILED (exit $rc)"; status=1; }
  ((rc == 124)) && what="TIMED OUT"
  ((rc == 4)) && [[ $name == test_cuda ]] && what="SKIPPED: no GPU"
  last_rc=$rc
  summary+=("$(printf '%-12s %-18s %4d s' "$name" "$what" $((SECONDS - t0)))")
}

last_rc=0
step test_cuda "$bin" --reporter compact --durations yes "${catch_args[@]}"
gpu_rc=$last_rc

if ((cpu)); then
  # The CPU tests through ctest, without test_cuda's (already run): select by test number.
  ids=$(cd "$build" && ctest -N --show-only=json-v1 | python3 -c '
import json, sys
tests = json.load(sys.stdin)["tests"]
# Skip test_cuda (run above) and the placeholders catch_discover_tests leaves for unbuilt binaries.
print(",".join(str(i) for i, t in enumerate(tests, 1)
               if "_NOT_BUILT" not in t["name"]
               and not (t.get("command") or [""])[0].endswith("/test_cuda")))')
  if [[ -n $ids ]]; then
    # Each test process gets 2 pool threads, so -j$jobs tests do not oversubscribe the cores.
    step ctest-cpu env DLTRAIN_NUM_THREADS="${DLTRAIN_NUM_THREADS:-2}" \
      ctest --test-dir "$build" -j "$jobs" --output-on-failure --timeout 600 -I "0,0,0,$ids"
  else
    summary+=("ctest-cpu    no CPU tests registered (build with build.sh --all)")
  fi
fi

if ((sanitize && gpu_rc == 4)); then
  summary+=("memcheck     not run: no GPU")
elif ((sanitize)); then
  cs=$(command -v compute-sanitizer || true)
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [[ -z $cs && -x $c ]] && cs=$c
  done
  if [[ -z $cs ]]; then
    summary+=("memcheck     compute-sanitizer not found")
  else
    step memcheck timeout "${SANITIZE_TIMEOUT:-300}" "$cs" --tool memcheck --error-exitcode 1 \
      --leak-check no "$bin" --reporter compact "$filter"
  fi
fi

echo
echo "==== summary ($build, log: $log)"
printf '%s\n' "${summary[@]}" | tee -a "$log"
exit "$status"
