#!/usr/bin/env bash
# The README's test command: installs what is missing, configures, builds, runs every
# test with ctest, then proves `find_package(dltrain)` works from an installed copy.
# Environment: BUILD_DIR (default build), DLTRAIN_CUDA (AUTO), JOBS (2), SANITIZE (1: then
# scripts/sanitize.sh runs the sanitizer and fuzzing builds).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${BUILD_DIR:-build}
jobs=${JOBS:-2}

bash scripts/setup.sh

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDLTRAIN_CUDA="${DLTRAIN_CUDA:-AUTO}" \
  -DDLTRAIN_BUILD_TESTS=ON -DDLTRAIN_BUILD_BENCHMARKS=ON
cmake --build "$build" -j "$jobs"
(cd "$build" && ctest --output-on-failure -j "$jobs")

# Install into a scratch prefix and build the consumer project against it.
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix/usr" > /dev/null
cmake -S tests/install -B "$prefix/consumer" -DCMAKE_PREFIX_PATH="$prefix/usr" > /dev/null
cmake --build "$prefix/consumer" -j "$jobs" > /dev/null
"$prefix/consumer/consumer"

# AddressSanitizer + UndefinedBehaviorSanitizer on the CPU tests, the libFuzzer targets, and
# ThreadSanitizer on the loader and the thread pool (SANITIZE=0 skips them).
if [[ "${SANITIZE:-1}" != 0 ]]; then
  JOBS=$jobs bash scripts/sanitize.sh
fi
