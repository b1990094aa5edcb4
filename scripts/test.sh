#!/usr/bin/env bash
# The README's test command: installs what is missing, configures, builds, runs every
# test with ctest, then proves `find_package(dltrain)` works from an installed copy.
# Environment: BUILD_DIR (default build), SHARED_BUILD_DIR (BUILD_DIR-shared: the library as
# libdltrain.so, for the install check), DLTRAIN_CUDA (AUTO), JOBS (2), SANITIZE (1: then
# scripts/sanitize.sh runs the sanitizer and fuzzing builds).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${BUILD_DIR:-build}
jobs=${JOBS:-2}
# Paths relative to the repository in ccache's keys: the second (shared) tree below hits the
# first tree's cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}

# Each phase says when it starts (minutes since the start), so a CI log shows where the time
# goes (a cold run: docs/performance.md, "CI time").
phase() { echo "test.sh: [$((SECONDS / 60)) min $((SECONDS % 60)) s] $*"; }
phase "setup"
bash scripts/setup.sh

# This build runs where it is built: -march=native (the library's default is portable), and
# the GPU architectures of the machines it is tested on (sm_80, sm_90).
phase "configure and build $build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDLTRAIN_CUDA="${DLTRAIN_CUDA:-AUTO}" \
  -DDLTRAIN_NATIVE=ON -DDLTRAIN_CUDA_ARCHITECTURES="${DLTRAIN_CUDA_ARCHITECTURES:-80;90}" \
  -DDLTRAIN_BUILD_TESTS=ON -DDLTRAIN_BUILD_BENCHMARKS=ON
cmake --build "$build" -j "$jobs"
phase "ctest"
(cd "$build" && ctest --output-on-failure -j "$jobs")

# The installed package stands alone (tests/install/check_install.sh): installed into a scratch
# prefix, moved elsewhere, then, with the checkout out of reach (a private mount namespace over
# it, or the build tree and .deps renamed for the while), tests/install/ built against the
# moved prefix through CMake and pkg-config and run, and every installed program run.
phase "install checks (static, then shared)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
JOBS=$jobs bash tests/install/check_install.sh "$build" "$work/static"
installed=$work/static/elsewhere/dltrain
# The installed package records no absolute path to HDF5 or MPI (found again by name).
if grep -E '/(lib|lib64)/[^" ]*(hdf5|libmpi)' "$installed"/lib*/cmake/dltrain/dltrainTargets*.cmake; then
  echo "test.sh: the installed CMake package names HDF5/MPI by absolute path" >&2
  exit 1
fi

# The shared variant (DLTRAIN_SHARED=ON): the library and the tools in a second tree, whose
# objects compile exactly as the first tree's (ccache makes it a link; CCACHE_BASEDIR above),
# checked the same way. libdltrain.so must carry its SONAME and export nothing outside
# namespace dltrain (cmake/dltrain.map).
shared=${SHARED_BUILD_DIR:-$build-shared}
cmake -S . -B "$shared" -DCMAKE_BUILD_TYPE=Release -DDLTRAIN_CUDA="${DLTRAIN_CUDA:-AUTO}" \
  -DDLTRAIN_NATIVE=ON -DDLTRAIN_CUDA_ARCHITECTURES="${DLTRAIN_CUDA_ARCHITECTURES:-80;90}" \
  -DDLTRAIN_SHARED=ON -DDLTRAIN_BUILD_TESTS=OFF -DDLTRAIN_BUILD_EXAMPLES=OFF \
  -DDLTRAIN_BUILD_BENCHMARKS=OFF -DDLTRAIN_BUILD_TOOLS=ON > /dev/null
cmake --build "$shared" -j "$jobs"
JOBS=$jobs bash tests/install/check_install.sh "$shared" "$work/shared"
so=$(find "$work/shared/elsewhere/dltrain" -name 'libdltrain.so.*.*.*' | head -1)
if [[ -z "$so" ]] || ! readelf -d "$so" | grep -q 'SONAME.*libdltrain\.so\.'; then
  echo "test.sh: the shared install has no versioned libdltrain.so with a SONAME" >&2
  exit 1
fi
if nm -D --defined-only "$so" | awk '{print $3}' | c++filt | grep -v 'dltrain::' | grep .; then
  echo "test.sh: libdltrain.so exports the symbols above, outside namespace dltrain" >&2
  exit 1
fi

# AddressSanitizer + UndefinedBehaviorSanitizer on the CPU tests, the libFuzzer targets, and
# ThreadSanitizer on the loader and the thread pool (SANITIZE=0 skips them).
if [[ "${SANITIZE:-1}" != 0 ]]; then
  phase "sanitizers"
  JOBS=$jobs bash scripts/sanitize.sh
fi
phase "done"
