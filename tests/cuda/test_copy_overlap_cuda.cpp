// copy_ and copy_scaled_ between overlapping views of one CUDA storage (the CPU cases of
// tests/ops/test_copy_overlap.cpp on the GPU): equal dense layouts used to take the
// cudaMemcpyAsync fast path, undefined for overlapping ranges, and the strided kernel reads
// elements other threads are writing. Now the source is staged (the same elements: a no-op).
// GPU-only: without a GPU, tests/cuda/main.cpp skips every test (exit code 4).
#include <catch2/catch.hpp>

#include <vector>

#include "dltrain/dltrain.hpp"
#include "tests/cuda/cuda_test_util.hpp"

using namespace dltrain;
using dltrain::test::kCuda;

namespace {
// 0, 1, ..., n - 1 in f32 on the GPU.
Tensor seq(int64_t n) { return arange(0, static_cast<double>(n), 1).to(kCuda); }
std::vector<float> host(const Tensor& t) {
  return t.contiguous().to(Device::cpu()).to_vector<float>();
}
std::vector<float> shifted_right(int64_t n, int64_t by) {
  std::vector<float> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<float>(i < by ? i : i - by));
  return v;
}
}  // namespace

TEST_CASE("cuda: copy_ between overlapping views reads the source as it was", "[cuda][copy]") {
  // Large enough for many blocks and a memcpy that runs in chunks (a forward copy would read
  // values it has already overwritten, or not, depending on the chunking).
  const int64_t n = 1 << 22;
  SECTION("shifted right: equal dense layouts (the former memcpy path)") {
    for (int64_t by : {1, 3, 1000}) {
      Tensor t = seq(n);
      t.narrow(0, by, n - by).copy_(t.narrow(0, 0, n - by));
      CHECK(host(t) == shifted_right(n, by));
    }
  }
  SECTION("shifted left") {
    Tensor t = seq(n);
    t.narrow(0, 0, n - 1).copy_(t.narrow(0, 1, n - 1));
    std::vector<float> want;
    for (int64_t i = 0; i < n; ++i) want.push_back(static_cast<float>(i + 1 < n ? i + 1 : n - 1));
    CHECK(host(t) == want);
  }
  SECTION("a square matrix transposed in place (the strided kernel)") {
    const int64_t k = 1024;
    Tensor a = seq(k * k).view({k, k});
    a.copy_(a.t());
    CHECK(host(a) == host(seq(k * k).view({k, k}).t()));
  }
  SECTION("shifted right in f16 (2-byte elements; integers to 2048 are exact)") {
    Tensor t = seq(2048).to(DType::f16);
    t.narrow(0, 1, 2047).copy_(t.narrow(0, 0, 2047));
    CHECK(host(t.to(DType::f32)) == shifted_right(2048, 1));
  }
  SECTION("the same elements: a no-op") {
    Tensor t = seq(1000);
    t.copy_(t);
    t.view({10, 100}).copy_(t.view({10, 100}));
    CHECK(host(t) == host(seq(1000)));
  }
}

TEST_CASE("cuda: copy_scaled_ between overlapping views reads the source as it was",
          "[cuda][copy]") {
  const int64_t n = 1 << 20;
  Tensor t = seq(n);
  Tensor dst = t.narrow(0, 1, n - 1);
  copy_scaled_(dst, t.narrow(0, 0, n - 1), 2.0);
  std::vector<float> want = shifted_right(n, 1);
  for (int64_t i = 1; i < n; ++i) want[static_cast<size_t>(i)] *= 2;
  CHECK(host(t) == want);
}
