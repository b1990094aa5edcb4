// Float GEMM through oneDNN's sgemm (backend::cpu::gemm hands products of at least 2e5 flops
// to it when oneDNN is built in) against the f64 Eigen product: every operand layout mm and
// linear produce (row-major, transposed, row-strided column slices), on one and two threads,
// with the path switched off for comparison, and linear's gradients. Without oneDNN the same
// checks run on the Eigen path.
#include <catch2/catch.hpp>

#include <tuple>

#include "dltrain/backend/cpu.hpp"
#include "dltrain/dltrain.hpp"

using namespace dltrain;

namespace {

double max_rel_diff(const Tensor& a, const Tensor& ref) {
  const Tensor d = abs(sub(a.to(DType::f64), ref));
  return max(d).item<double>() / (max(abs(ref)).item<double>() + 1e-30);
}

// a [n, k] and b [k, m] as f32 views of the layout asked for (transposed or column slices of a
// wider buffer), with the same values in f64 for the reference.
std::tuple<Tensor, Tensor> operand(int64_t rows, int64_t cols, int layout, Generator& g) {
  Tensor v = randn({rows, cols}, DType::f64, &g);
  Tensor f;
  if (layout == 0) f = v.to(DType::f32);                                        // row-major
  if (layout == 1) f = v.t().contiguous().to(DType::f32).t();                   // column-major
  if (layout == 2) f = cat({v, v, v}, 1).to(DType::f32).narrow(1, cols, cols);  // row stride 3 cols
  return {f, v};
}

}  // namespace

TEST_CASE("float mm through oneDNN's sgemm matches the f64 product in every layout",
          "[ops][linalg][dnnl]") {
  const int threads = get_num_threads();
  for (int t : {1, 2})
    for (bool dnnl : {true, false})
      for (int la = 0; la < 3; ++la)
        for (int lb = 0; lb < 3; ++lb) {
          set_num_threads(t);
          cpu::set_dnnl_enabled(dnnl);
          Generator g(7);
          auto [a, a64] = operand(301, 67, la, g);
          auto [b, b64] = operand(67, 45, lb, g);
          const Tensor c = mm(a, b);
          INFO("threads " << t << " dnnl " << dnnl << " layouts " << la << " " << lb);
          CHECK(c.dtype() == DType::f32);
          CHECK(max_rel_diff(c, mm(a64, b64)) < 1e-5);
          // the transposed product, so that the output is the transpose of a row-major view
          CHECK(max_rel_diff(mm(b.t(), a.t()), mm(b64.t(), a64.t())) < 1e-5);
        }
  cpu::set_dnnl_enabled(true);
  set_num_threads(threads);
}

TEST_CASE("linear forward and gradients agree with and without oneDNN's sgemm",
          "[ops][linalg][dnnl]") {
  auto run = [](bool dnnl) {
    cpu::set_dnnl_enabled(dnnl);
    Generator g(3);
    Tensor x = randn({2000, 96}, DType::f32, &g).requires_grad_();
    Tensor w = mul(randn({64, 96}, DType::f32, &g), 0.1).detach().requires_grad_();
    Tensor b = randn({64}, DType::f32, &g).requires_grad_();
    Tensor y = linear(x, w, b);
    Tensor r = randn(y.shape(), DType::f32, &g);
    sum(mul(y, r)).backward();
    cpu::set_dnnl_enabled(true);
    return std::vector<Tensor>{y.detach(), x.grad(), w.grad(), b.grad()};
  };
  const std::vector<Tensor> on = run(true), off = run(false);
  for (size_t i = 0; i < on.size(); ++i) {
    INFO("output " << i);
    CHECK(max_rel_diff(on[i], off[i].to(DType::f64)) < 1e-5);
  }
}
