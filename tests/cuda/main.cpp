// Catch2 main for the GPU-only tests: without a CUDA device every test exits with
// code 4, which ctest reports as skipped (SKIP_RETURN_CODE), so a CPU-only CI run
// shows these tests as "Skipped" instead of counting them as passed. A failure exits 1, never
// 4 (Catch's own status is the number of failed assertions: four read as "skipped").
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstring>
#include <iostream>

#include "src/backend/cuda/cuda_backend.hpp"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::strncmp(argv[i], "--list", 6) == 0;
  if (!listing && dltrain::backend::cuda::device_count() == 0) {
    std::cout << "SKIPPED: no CUDA device visible (CUDA compiled in: "
              << (dltrain::backend::cuda::compiled() ? "yes" : "no") << ")\n";
    return 4;
  }
  return Catch::Session().run(argc, argv) == 0 ? 0 : 1;
}
