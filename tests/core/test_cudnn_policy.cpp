// The cuDNN convolution policy that needs no GPU (src/backend/cuda/algo_policy.hpp), with a fake
// allocator: the benchmark's workspace is halved on OutOfMemoryError alone, any other error
// propagates. The cuDNN calls themselves are in tests/cuda/test_dnn_cuda.cpp.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "src/backend/cuda/algo_policy.hpp"

using dltrain::Error;
using dltrain::OutOfMemoryError;
using dltrain::backend::cuda::halving_allocation;

TEST_CASE("cuDNN workspace search halves on out-of-memory only; other errors propagate",
          "[core][cudnn]") {
  std::vector<size_t> tried;
  // A device with 300 bytes free.
  auto alloc = [&](size_t size) {
    tried.push_back(size);
    if (size > 300) throw OutOfMemoryError("CUDA out of memory (fake)");
    return std::make_shared<size_t>(size);
  };
  size_t got = 0;
  auto ws = halving_allocation(1000, alloc, got);
  CHECK(got == 250);
  REQUIRE(ws != nullptr);
  CHECK(*ws == 250);
  CHECK(tried == std::vector<size_t>{1000, 500, 250});

  // Nothing fits: no workspace (cudnnFind*Ex then times the algorithms that need none).
  tried.clear();
  auto none = halving_allocation(
      4,
      [&](size_t size) -> std::shared_ptr<size_t> {
        tried.push_back(size);
        throw OutOfMemoryError("fake");
      },
      got);
  CHECK(got == 0);
  CHECK(none == nullptr);
  CHECK(tried == std::vector<size_t>{4, 2, 1});

  // A sticky CUDA fault at the allocation is not out-of-memory: it is raised at once, not
  // swallowed into a zero-byte workspace that fails somewhere else later.
  tried.clear();
  got = 7;
  CHECK_THROWS_WITH(halving_allocation(
                        1000,
                        [&](size_t size) -> std::shared_ptr<size_t> {
                          tried.push_back(size);
                          throw Error("cudaMallocAsync failed: cudaErrorIllegalAddress");
                        },
                        got),
                    Catch::Contains("cudaErrorIllegalAddress"));
  CHECK(tried == std::vector<size_t>{1000});
  CHECK(got == 7);  // untouched

  // OutOfMemoryError is a dltrain::Error: code that catches Error still catches it.
  CHECK_THROWS_AS(throw OutOfMemoryError("x"), Error);
}
