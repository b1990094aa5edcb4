// The cuDNN convolution policies that need no GPU (src/backend/cuda/algo_policy.hpp), with fake
// rankings and a fake allocator: the heuristic's first usable algorithm is taken whatever its
// determinism (PyTorch's default), deterministic ones only when asked; the benchmark's
// workspace is halved on OutOfMemoryError alone, any other error propagates. Also the CUDA
// switches' defaults. The cuDNN calls themselves are in tests/cuda/test_dnn_cuda.cpp.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <memory>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "src/backend/cuda/algo_policy.hpp"

using dltrain::Error;
using dltrain::OutOfMemoryError;
using dltrain::backend::cuda::choose_algorithm;
using dltrain::backend::cuda::halving_allocation;

namespace {

struct Candidate {
  bool usable;
  bool deterministic;
};

int choose(const std::vector<Candidate>& c, bool deterministic_only) {
  return choose_algorithm(
      static_cast<int>(c.size()), [&](int i) { return c[static_cast<size_t>(i)].usable; },
      [&](int i) { return c[static_cast<size_t>(i)].deterministic; }, deterministic_only);
}

}  // namespace

TEST_CASE("cuDNN algorithm choice: the heuristic's first usable one, deterministic only on request",
          "[core][cudnn]") {
  // cuDNN's ranking: fastest first. The first is non-deterministic (an atomics backward-filter
  // kernel, typically), the second deterministic.
  const std::vector<Candidate> ranked{{true, false}, {true, true}, {true, true}};
  CHECK(choose(ranked, false) == 0);  // the former policy took 1 here (deterministic first)
  CHECK(choose(ranked, true) == 1);
  // Unusable ones (failed, too much workspace, a forbidden math type) are skipped either way.
  const std::vector<Candidate> skip{{false, true}, {false, false}, {true, false}, {true, true}};
  CHECK(choose(skip, false) == 2);
  CHECK(choose(skip, true) == 3);
  CHECK(choose({{true, false}, {false, true}}, true) == -1);  // no deterministic one fits
  CHECK(choose({}, false) == -1);
}

TEST_CASE("cuDNN workspace search halves on out-of-memory only, other errors propagate",
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

TEST_CASE("CUDA switches: deterministic and bf16 batch norm default off and toggle",
          "[core][cudnn]") {
  namespace cuda = dltrain::cuda;
  CHECK_FALSE(cuda::cudnn_deterministic());
  cuda::set_cudnn_deterministic(true);
  CHECK(cuda::cudnn_deterministic());
  cuda::set_cudnn_deterministic(false);
  CHECK_FALSE(cuda::cudnn_deterministic());
  // DLTRAIN_CUDNN_BF16_BN is read once, at the first query; ctest does not set it.
  if (std::getenv("DLTRAIN_CUDNN_BF16_BN") == nullptr) CHECK_FALSE(cuda::cudnn_bf16_batch_norm());
  const bool before = cuda::cudnn_bf16_batch_norm();
  cuda::set_cudnn_bf16_batch_norm(!before);
  CHECK(cuda::cudnn_bf16_batch_norm() == !before);
  cuda::set_cudnn_bf16_batch_norm(before);
}
