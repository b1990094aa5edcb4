#!/usr/bin/env bash
# The README's main job: trains the Fashion-MNIST CNN example on the CPU, from a fresh
# machine. Installs what is missing (scripts/setup.sh: compiler, CMake, Eigen, the
# dataset-fashion-mnist package, ...), builds the example in Release (build-demo/), and
# runs it with the course-style flags given here (defaults: --batch-size 128 --epochs 3).
#   scripts/demo.sh [--batch-size N] [--epochs N] [--lr X] [--json PATH] ...
# Environment: BUILD_DIR (default build-demo), JOBS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-demo}

bash scripts/setup.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDLTRAIN_CUDA=OFF -DDLTRAIN_NATIVE=ON -DDLTRAIN_BUILD_TESTS=OFF \
  -DDLTRAIN_BUILD_BENCHMARKS=OFF -DDLTRAIN_BUILD_EXAMPLES=ON > /dev/null
cmake --build "$build" -j "${JOBS:-2}" --target fashion_mnist
exec "$build/examples/fashion_mnist" --data /usr/share/datasets/fashion-mnist "$@"
