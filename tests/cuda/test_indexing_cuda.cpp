// Indexing ops on CUDA against the CPU: index_select, gather, scatter_add, segment_sum /
// segment_mean, embedding (with padding_idx) and one_hot, forward and backward from the same
// random inputs. Scatter-adds use atomics on the GPU, so repeated indices may round in
// another order: floating results are compared within a few ulps, integers exactly.
// GPU-only: without a GPU, tests/cuda/main.cpp makes every test exit with ctest's skip code.
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "tests/cuda/cuda_test_util.hpp"

using namespace dltrain;

namespace {

const Device kDev = Device::cuda(0);

struct Tol {
  double rtol, atol;
};

Tol tol_for(DType dt) {
  switch (dt) {
    case DType::f64:
      return {1e-12, 1e-12};
    // Repeated indices add in another order, each addition rounding to the element type: a
    // sum of ~7 values of magnitude ~2 may differ by ~5 ulps (atol sized for sums near 0).
    case DType::f16:
      return {5e-3, 1e-2};
    case DType::bf16:
      return {2e-2, 8e-2};
    case DType::f32:
      return {1e-5, 1e-6};
    default:
      return {0.0, 0.0};
  }
}

void require_close(const Tensor& got, const Tensor& want, Tol tol, const std::string& what) {
  REQUIRE(got.dtype() == want.dtype());
  dltrain::test::check_close(got, want, tol.rtol, tol.atol, what);
}

struct Pair {
  Tensor cpu, gpu;
};

Pair pair_of(const Tensor& values, bool requires_grad) {
  Pair p{values.clone(), values.to(kDev)};
  if (requires_grad) {
    p.cpu.requires_grad_();
    p.gpu.requires_grad_();
  }
  return p;
}

Tensor random_of(const Shape& shape, DType dt) {
  if (is_floating(dt)) return randn(shape, DType::f64).to(dt);
  return randint(-50, 50, shape, TensorOptions(dt));
}

// Backpropagates the same random upstream gradient through both outputs.
void backward_both(const Tensor& yc, const Tensor& yg) {
  Tensor gy = randn(yc.shape(), DType::f64).to(yc.dtype());
  yc.backward(gy);
  yg.backward(gy.to(kDev));
}

const std::vector<DType> kTypes = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64};

}  // namespace

TEST_CASE("index_select on CUDA matches the CPU", "[cuda][gpu]") {
  for (DType dt : kTypes) {
    const bool fl = is_floating(dt);
    for (int64_t dim : {0, 1, 2}) {
      std::ostringstream what;
      what << dt << " dim " << dim;
      Pair x = pair_of(random_of({6, 7, 5}, dt), fl);
      Tensor idx = from_vector(std::vector<int64_t>{4, 0, 4, 2, 1, 4});
      Tensor yc = index_select(x.cpu, dim, idx);
      Tensor yg = index_select(x.gpu, dim, idx.to(kDev));
      require_close(yg, yc, tol_for(dt), what.str() + " forward");
      if (!fl) continue;
      backward_both(yc, yg);
      require_close(x.gpu.grad(), x.cpu.grad(), tol_for(dt), what.str() + " backward");
    }
  }
  // int32 indices and a non-contiguous input (base.t() is [9, 8]: dim 1 has 8 entries).
  Tensor base = randn({8, 9}, DType::f64).to(DType::f32);
  Tensor i32 = from_vector(std::vector<int32_t>{7, 1, 3});
  require_close(index_select(base.to(kDev).t(), 1, i32.to(kDev)), index_select(base.t(), 1, i32),
                tol_for(DType::f32), "int32 index, transposed input");
}

TEST_CASE("gather and scatter_add on CUDA match the CPU", "[cuda][gpu]") {
  for (DType dt : kTypes) {
    const bool fl = is_floating(dt);
    for (int64_t dim : {0, 1, 2}) {
      std::ostringstream what;
      what << dt << " dim " << dim;
      const Shape xs = {4, 5, 6};
      Shape is = {3, 4, 5};
      is[dim] = 7;  // the indexed dim may be longer than the input's
      Tensor idx = randint(0, xs[dim], is);
      Pair x = pair_of(random_of(xs, dt), fl);
      Tensor gc = gather(x.cpu, dim, idx);
      Tensor gg = gather(x.gpu, dim, idx.to(kDev));
      require_close(gg, gc, tol_for(dt), what.str() + " gather");
      if (fl) {
        backward_both(gc, gg);
        require_close(x.gpu.grad(), x.cpu.grad(), tol_for(dt), what.str() + " gather backward");
      }

      Shape ss = is;
      for (auto& s : ss) s += 1;  // src larger than index in every dim
      Pair y = pair_of(random_of(xs, dt), fl);
      Pair src = pair_of(random_of(ss, dt), fl);
      Tensor sc = scatter_add(y.cpu, dim, idx, src.cpu);
      Tensor sg = scatter_add(y.gpu, dim, idx.to(kDev), src.gpu);
      require_close(sg, sc, tol_for(dt), what.str() + " scatter_add");
      if (fl) {
        backward_both(sc, sg);
        require_close(y.gpu.grad(), y.cpu.grad(), tol_for(dt), what.str() + " scatter_add dx");
        require_close(src.gpu.grad(), src.cpu.grad(), tol_for(dt),
                      what.str() + " scatter_add dsrc");
      }
    }
  }
  // A non-contiguous input to gather (base.t() is [6, 5]: indices along dim 1 are < 5).
  Tensor base = randn({5, 6}, DType::f64).to(DType::f32);
  Tensor idx = randint(0, 5, {6, 3});
  require_close(gather(base.to(kDev).t(), 1, idx.to(kDev)), gather(base.t(), 1, idx),
                tol_for(DType::f32), "gather on a transposed input");
}

TEST_CASE("segment_sum and segment_mean on CUDA match the CPU", "[cuda][gpu]") {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    std::ostringstream what;
    what << dt;
    Tensor ids = randint(0, 7, {50});  // unsorted, some segments empty
    Pair src = pair_of(random_of({50, 3, 4}, dt), true);
    Tensor sc = segment_sum(src.cpu, ids, 9);
    Tensor sg = segment_sum(src.gpu, ids.to(kDev), 9);
    require_close(sg, sc, tol_for(dt), what.str() + " segment_sum");
    backward_both(sc, sg);
    require_close(src.gpu.grad(), src.cpu.grad(), tol_for(dt), what.str() + " segment_sum grad");

    Pair m = pair_of(random_of({50, 3}, dt), true);
    Tensor mc = segment_mean(m.cpu, ids, 9);
    Tensor mg = segment_mean(m.gpu, ids.to(kDev), 9);
    require_close(mg, mc, tol_for(dt), what.str() + " segment_mean");
    backward_both(mc, mg);
    require_close(m.gpu.grad(), m.cpu.grad(), tol_for(dt), what.str() + " segment_mean grad");
  }
  Tensor isrc = randint(-9, 9, {20, 2});
  Tensor ids = randint(0, 4, {20});
  require_close(segment_sum(isrc.to(kDev), ids.to(kDev), 4), segment_sum(isrc, ids, 4),
                tol_for(DType::i64), "int64 segment_sum");
}

TEST_CASE("embedding on CUDA matches the CPU, padding_idx included", "[cuda][gpu]") {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (bool pad : {false, true}) {
      std::ostringstream what;
      what << dt << " padding " << pad;
      Pair w = pair_of(random_of({10, 16}, dt), true);
      Tensor idx = from_vector(std::vector<int64_t>{1, 3, 3, 9, 0, 3, 7, 1, 9, 3, 2, 2}, {3, 4});
      const std::optional<int64_t> padding = pad ? std::optional<int64_t>(-7) : std::nullopt;
      Tensor yc = embedding(w.cpu, idx, padding);
      Tensor yg = embedding(w.gpu, idx.to(kDev), padding);
      require_close(yg, yc, tol_for(dt), what.str() + " forward");
      backward_both(yc, yg);
      require_close(w.gpu.grad(), w.cpu.grad(), tol_for(dt), what.str() + " backward");
    }
  }
}

TEST_CASE("one_hot on CUDA matches the CPU", "[cuda][gpu]") {
  Tensor idx = randint(0, 6, {4, 5});
  require_close(one_hot(idx.to(kDev), 8), one_hot(idx, 8), tol_for(DType::i64), "given classes");
  require_close(one_hot(idx.to(kDev)), one_hot(idx), tol_for(DType::i64), "inferred classes");
  REQUIRE(one_hot(idx.to(kDev), 8).device() == kDev);
  // Inferring the classes reads the indices back, so a bad one still raises.
  Tensor bad = from_vector(std::vector<int64_t>{1, -2});
  REQUIRE_THROWS_WITH(one_hot(bad.to(kDev)), Catch::Contains("out of range"));
}

TEST_CASE("indexing ops refuse indices on another device", "[cuda][gpu]") {
  Tensor x = randn({4, 3}, DType::f32).to(kDev);
  Tensor idx = from_vector(std::vector<int64_t>{0, 2});
  REQUIRE_THROWS_WITH(index_select(x, 0, idx), Catch::Contains("one device"));
  REQUIRE_THROWS_WITH(embedding(x, idx), Catch::Contains("one device"));
}
