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

# This build runs where it is built: -march=native (the library's default is portable), and
# the GPU architectures of the machines it is tested on (sm_80, sm_90).
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDLTRAIN_CUDA="${DLTRAIN_CUDA:-AUTO}" \
  -DDLTRAIN_NATIVE=ON -DDLTRAIN_CUDA_ARCHITECTURES="${DLTRAIN_CUDA_ARCHITECTURES:-80;90}" \
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
# The installed package records no absolute path to HDF5 or MPI (found again by name).
if grep -E '/(lib|lib64)/[^" ]*(hdf5|libmpi)' "$prefix"/usr/lib*/cmake/dltrain/dltrainTargets*.cmake; then
  echo "test.sh: the installed CMake package names HDF5/MPI by absolute path" >&2
  exit 1
fi
# pkg-config users: the same consumer built from dltrain.pc alone.
pc_dir=$(dirname "$(find "$prefix/usr" -name dltrain.pc | head -1)")
# shellcheck disable=SC2046
c++ -O1 -o "$prefix/consumer/consumer_pc" tests/install/main.cpp \
  $(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs dltrain)
pc_libs=$(PKG_CONFIG_PATH="$pc_dir" pkg-config --libs-only-L dltrain | sed 's/-L//g; s/ \+/:/g')
LD_LIBRARY_PATH="$pc_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$prefix/consumer/consumer_pc"

# AddressSanitizer + UndefinedBehaviorSanitizer on the CPU tests, the libFuzzer targets, and
# ThreadSanitizer on the loader and the thread pool (SANITIZE=0 skips them).
if [[ "${SANITIZE:-1}" != 0 ]]; then
  JOBS=$jobs bash scripts/sanitize.sh
fi
