// copy_ and copy_scaled_ between views of one storage (docs/design.md, "Copies between
// overlapping views"): the same elements are a no-op, any other overlap reads the source as it
// was before the copy (staged through a temporary), and memory_overlap's classification. The
// CUDA path (where the equal-layout case is a cudaMemcpyAsync, undefined for overlapping
// ranges) is tested the same way in tests/cuda/test_copy_overlap_cuda.cpp.
#include <catch2/catch.hpp>

#include <vector>

#include "dltrain/dltrain.hpp"
#include "src/core/layout.hpp"

using namespace dltrain;
using dltrain::detail::memory_overlap;
using dltrain::detail::Overlap;

namespace {
std::vector<float> iota(int n) {
  std::vector<float> v;
  for (int i = 0; i < n; ++i) v.push_back(static_cast<float>(i));
  return v;
}
// 0, 1, ..., n - 1 in f32.
Tensor seq(int n) { return from_vector(iota(n), {n}); }
}  // namespace

TEST_CASE("memory_overlap tells disjoint, identical and partly overlapping views apart",
          "[ops][copy]") {
  Tensor t = arange(0, 16, 1);
  CHECK(memory_overlap(t, zeros({16})) == Overlap::None);
  CHECK(memory_overlap(t.narrow(0, 0, 8), t.narrow(0, 8, 8)) == Overlap::None);
  CHECK(memory_overlap(t, t) == Overlap::Full);
  CHECK(memory_overlap(t.view({4, 4}), t.view({4, 4})) == Overlap::Full);
  CHECK(memory_overlap(t.narrow(0, 1, 8), t.narrow(0, 0, 8)) == Overlap::Partial);
  Tensor sq = t.view({4, 4});
  CHECK(memory_overlap(sq, sq.t()) == Overlap::Partial);  // same bytes, other order
  // A broadcast source inside the destination is a partial overlap (dst[i] reads src[0]).
  CHECK(memory_overlap(t.narrow(0, 0, 8), t.select(0, 4)) == Overlap::Partial);
  // Size-1 dims' strides address nothing: still the same elements.
  Tensor a = t.view({16, 1});
  Tensor b = detail::make_view(t, {16, 1}, {1, 99}, 0);
  CHECK(memory_overlap(a, b) == Overlap::Full);
  CHECK(memory_overlap(t.to(DType::f64), t) == Overlap::None);
}

TEST_CASE("copy_ between overlapping views of one storage reads the source as it was",
          "[ops][copy]") {
  SECTION("shifted right by one: each element gets its left neighbour's old value") {
    // An element-by-element forward loop would smear t[0] over everything.
    Tensor t = seq(10);
    t.narrow(0, 1, 9).copy_(t.narrow(0, 0, 9));
    CHECK(t.to_vector<float>() == std::vector<float>{0, 0, 1, 2, 3, 4, 5, 6, 7, 8});
  }
  SECTION("shifted left by one") {
    Tensor t = seq(10);
    t.narrow(0, 0, 9).copy_(t.narrow(0, 1, 9));
    CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 9});
  }
  SECTION("a square matrix transposed in place") {
    Tensor a = seq(9).view({3, 3});
    a.copy_(a.t());
    CHECK(a.to_vector<float>() == std::vector<float>{0, 3, 6, 1, 4, 7, 2, 5, 8});
  }
  SECTION("f64, shifted right by two") {
    Tensor t = seq(6);
    Tensor wide = zeros({6}, DType::f64);
    wide.copy_(t);
    wide.narrow(0, 2, 4).copy_(wide.narrow(0, 0, 4));
    CHECK(wide.to_vector<double>() == std::vector<double>{0, 1, 0, 1, 2, 3});
  }
  SECTION("a broadcast element of the destination itself") {
    Tensor t = seq(8);
    t.narrow(0, 0, 6).copy_(t.select(0, 3));
    CHECK(t.to_vector<float>() == std::vector<float>{3, 3, 3, 3, 3, 3, 6, 7});
  }
  SECTION("interleaved views that never share an element: plain copies") {
    Tensor m = seq(8).view({4, 2});
    m.select(1, 0).copy_(m.select(1, 1));
    CHECK(m.reshape({-1}).to_vector<float>() == std::vector<float>{1, 1, 3, 3, 5, 5, 7, 7});
  }
  SECTION("the same elements: a no-op that leaves values and storage alone") {
    Tensor t = seq(6);
    const void* p = t.data_ptr();
    t.copy_(t);
    t.view({2, 3}).copy_(t.view({2, 3}));
    CHECK(t.data_ptr() == p);
    CHECK(t.to_vector<float>() == iota(6));
  }
}

TEST_CASE("copy_scaled_ between overlapping views reads the source as it was", "[ops][copy]") {
  Tensor t = seq(6);
  Tensor dst = t.narrow(0, 1, 5);
  copy_scaled_(dst, t.narrow(0, 0, 5), 2.0);
  CHECK(t.to_vector<float>() == std::vector<float>{0, 0, 2, 4, 6, 8});
  // The same elements: scaled in place.
  copy_scaled_(t, t, 0.5);
  CHECK(t.to_vector<float>() == std::vector<float>{0, 0, 1, 2, 3, 4});
}
