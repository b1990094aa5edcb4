#!/usr/bin/env bash
# The sanitizer part of CI (scripts/test.sh runs it after the main build):
#   asan: the CPU library and its tests built with clang + AddressSanitizer +
#         UndefinedBehaviorSanitizer (and libFuzzer's coverage instrumentation), every test
#         binary run, then the libFuzzer targets (tests/fuzz/, ctest label fuzz) for
#         FUZZ_SECONDS each on their committed seed corpus;
#   tsan: ThreadSanitizer on the threaded code: the data loader (worker threads, persistent
#         workers, the prefetcher's CPU path) and the thread pool (test_data, test_core).
# Usage: scripts/sanitize.sh [asan] [tsan]   (default: both)
# Environment: ASAN_BUILD_DIR (build-asan), TSAN_BUILD_DIR (build-tsan), JOBS (2),
#              FUZZ_SECONDS (30).
# Both trees are CPU-only (no CUDA, no oneDNN: oneDNN and libgomp are not instrumented, so
# their threads give TSan false reports and hide ASan's) and built at -O1 -g1 (line tables:
# file:line in reports, a faster build than -g).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-2}
phase() { echo "sanitize: [$((SECONDS / 60)) min $((SECONDS % 60)) s] $*"; }
what=("$@")
((${#what[@]})) || what=(asan tsan)
common=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1"
        -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" -DDLTRAIN_CUDA=OFF -DDLTRAIN_DNNL=OFF
        -DDLTRAIN_NATIVE=OFF -DDLTRAIN_BUILD_EXAMPLES=OFF -DDLTRAIN_BUILD_BENCHMARKS=OFF
        -DDLTRAIN_BUILD_TOOLS=OFF -DDLTRAIN_BUILD_TESTS=ON)
# A skipped Catch2 test exits with 4 (SKIP_RETURN_CODE); anything else non-zero fails.
# The binaries run $jobs at a time (each is single-threaded under the sanitizers' cost, and
# they took most of this script's time one after another), each into its own log, printed
# whole when it fails. Every binary runs even after a failure, so one CI run reports every
# finding.
run_tests() {
  local dir=$1
  shift
  local t rc failed=() logs
  logs=$(mktemp -d)
  # shellcheck disable=SC2016
  printf '%s\n' "$@" | xargs -P "$jobs" -I{} bash -c \
    'start=$SECONDS; rc=0; "$1/tests/$2" > "$3/$2.log" 2>&1 || rc=$?; echo "$rc" > "$3/$2.rc"
     echo "sanitize: $1/tests/$2 exit $rc in $((SECONDS - start)) s"' _ "$dir" {} "$logs"
  for t in "$@"; do
    rc=$(cat "$logs/$t.rc" 2> /dev/null || echo 127)
    if ((rc != 0 && rc != 4)); then
      echo "sanitize: $t failed under $(basename "$dir") (exit $rc); its output:" >&2
      cat "$logs/$t.log" >&2
      failed+=("$t")
    else
      tail -n 3 "$logs/$t.log"
    fi
  done
  rm -rf "$logs"
  if ((${#failed[@]})); then
    echo "sanitize: failed under $(basename "$dir"): ${failed[*]}" >&2
    return 1
  fi
}
# Test binaries per tree. ASan: every CPU test binary, whole. TSan: the threaded code only.
asan_tests=(test_core test_autograd test_ops test_nn test_optim test_data test_io test_train
            test_amp test_distributed)
tsan_tests=(test_core test_data)

for w in "${what[@]}"; do
  case $w in
    asan)
      dir=${ASAN_BUILD_DIR:-build-asan}
      CC=clang-14 CXX=clang++-14 cmake -S . -B "$dir" "${common[@]}" -DDLTRAIN_MPI=OFF \
        -DDLTRAIN_SANITIZE=address,undefined -DDLTRAIN_FUZZ=ON \
        -DDLTRAIN_FUZZ_SECONDS="${FUZZ_SECONDS:-30}" > /dev/null
      targets=("${asan_tests[@]}")
      for f in idx jpeg safetensors pth checkpoint packed packed_restamp; do targets+=("fuzz_$f"); done
      phase "asan: build"
      cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
      phase "asan: tests"
      export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
      # libhdf5 1.10 leaks ~1 KiB inside itself per open it rejects (the corrupt-pack tests
      # make hundreds); allocations made in libhdf5 only (tests/fuzz/lsan_hdf5.supp).
      export LSAN_OPTIONS=suppressions=$PWD/tests/fuzz/lsan_hdf5.supp:print_suppressions=0
      export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
      run_tests "$dir" "${asan_tests[@]}"
      phase "asan: fuzzers"
      (cd "$dir" && ctest -L '^fuzz$' -j "$jobs" --output-on-failure)
      ;;
    tsan)
      dir=${TSAN_BUILD_DIR:-build-tsan}
      cmake -S . -B "$dir" "${common[@]}" -DDLTRAIN_MPI=OFF -DDLTRAIN_SANITIZE=thread \
        > /dev/null
      phase "tsan: build"
      cmake --build "$dir" -j "$jobs" --target "${tsan_tests[@]}"
      phase "tsan: tests"
      export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
      run_tests "$dir" "${tsan_tests[@]}"
      ;;
    *)
      echo "usage: scripts/sanitize.sh [asan] [tsan]" >&2
      exit 2
      ;;
  esac
done
echo "sanitize: ${what[*]} passed"
