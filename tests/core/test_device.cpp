// Device handling on a machine with or without a GPU.
#include <catch2/catch.hpp>

#include "dltrain/dltrain.hpp"
#include "src/backend/cuda/cuda_backend.hpp"

using namespace dltrain;

TEST_CASE("devices print, compare, and CUDA requests fail clearly without a GPU",
          "[core][device]") {
  REQUIRE(Device::cuda(1).str() == "cuda:1");
  REQUIRE(Device::cpu() == Device());
  REQUIRE(zeros({2}).device().is_cpu());
  const int n = backend::cuda::device_count();
  REQUIRE(n >= 0);
  // Asking for a device beyond those visible always raises a clear error, GPU or not (and
  // in a build without CUDA, one that says so).
  REQUIRE_THROWS_WITH(zeros({2}, Device::cuda(n)),
                      Catch::Contains("cuda:" + std::to_string(n)) &&
                          (Catch::Contains("visible") || Catch::Contains("built without CUDA")));
}
