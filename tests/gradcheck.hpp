// Finite-difference gradient checking in float64 for the op tests.
//
// gradcheck(f, inputs) computes the analytical gradient of sum(f(inputs) * w)
// (w a fixed random weight, so every output element matters) with backward(),
// and compares it with central differences (eps 1e-6) on every element of every
// input that requires grad. Inputs may be non-contiguous or channels-last views:
// the perturbation goes through the view, so layouts are exercised as given.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <sstream>
#include <vector>

#include "dltrain/dltrain.hpp"

namespace dltrain::testing {

/// Leaf in f64 with random values; `requires_grad` set.
inline Tensor leaf(const Shape& shape, uint64_t seed, double scale = 1.0) {
  Generator g(seed);
  Tensor t = mul(randn(shape, DType::f64, &g), scale);
  t.requires_grad_();
  return t;
}

/// Random normal values (drawn in f64 from `seed`, then converted to dt), no grad.
inline Tensor rnd(const Shape& s, uint64_t seed, DType dt = DType::f64) {
  Generator g(seed);
  return randn(s, DType::f64, &g).to(dt);
}

/// Checks analytical against numerical gradients; returns the worst abs error seen.
inline double gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                        std::vector<Tensor> inputs, double eps = 1e-6, double atol = 1e-5,
                        double rtol = 1e-4) {
  for (auto& t : inputs) t.set_grad(Tensor());
  Tensor out = f(inputs);
  REQUIRE(out.dtype() == DType::f64);
  Generator gw(1234);
  Tensor w = randn(out.shape(), DType::f64, &gw);
  sum(mul(out, w)).backward();
  double worst = 0.0;
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor x = inputs[k];
    if (!x.requires_grad()) continue;
    // No gradient reached x: the function does not depend on it (a second derivative that is
    // zero), which the central differences below must confirm.
    Tensor analytic = x.grad().defined() ? x.grad() : zeros(x.shape(), DType::f64);
    REQUIRE(analytic.shape() == x.shape());
    const std::vector<double> an = analytic.to_vector<double>();
    // Perturb through a flat index of the logical (row-major) order, writing via the view.
    Tensor xd = x.detach();
    const Shape st = contiguous_strides(x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) {
      int64_t off = xd.storage_offset(), rem = i;
      for (int64_t d = 0; d < x.dim(); ++d) {
        off += (rem / st[d]) * x.strides()[d];
        rem %= st[d];
      }
      double* p = static_cast<double*>(xd.storage().data()) + off;
      const double orig = *p;
      NoGradGuard ng;
      *p = orig + eps;
      const double fp = sum(mul(f(inputs), w)).item<double>();
      *p = orig - eps;
      const double fm = sum(mul(f(inputs), w)).item<double>();
      *p = orig;
      const double num = (fp - fm) / (2 * eps);
      const double err = std::abs(num - an[static_cast<size_t>(i)]);
      worst = std::max(worst, err);
      if (err > atol + rtol * std::abs(num)) {
        std::ostringstream os;
        os << "input " << k << " element " << i << ": analytical " << an[static_cast<size_t>(i)]
           << " numerical " << num;
        FAIL(os.str());
      }
    }
  }
  return worst;
}

/// Second-order check (PyTorch's gradgradcheck): the function (inputs, gy) -> the gradients
/// of <f(inputs), gy> with respect to the inputs that require grad, computed by
/// autograd::grad with create_graph, is itself checked by gradcheck, so the gradient of every
/// backward formula (with respect to the inputs and to the incoming gradient gy) is compared
/// with central differences. Returns the worst abs error seen.
inline double gradgradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                            std::vector<Tensor> inputs, double eps = 1e-6, double atol = 1e-5,
                            double rtol = 1e-4) {
  Tensor y0;
  {
    NoGradGuard ng;
    y0 = f(inputs);
  }
  std::vector<Tensor> all = inputs;
  all.push_back(leaf(y0.shape(), 4321));
  const size_t n = inputs.size();
  auto first_order = [&f, n](const std::vector<Tensor>& xs) {
    EnableGradGuard enable;  // gradcheck evaluates the perturbed points under NoGradGuard
    std::vector<Tensor> ins(xs.begin(), xs.begin() + static_cast<std::ptrdiff_t>(n)), wrt;
    for (const Tensor& x : ins)
      if (x.requires_grad()) wrt.push_back(x);
    Tensor y = f(ins);
    std::vector<Tensor> gs = autograd::grad({y}, wrt, {xs[n]}, true, true, true);
    std::vector<Tensor> flat;
    for (size_t i = 0; i < gs.size(); ++i)
      flat.push_back(gs[i].defined() ? gs[i].reshape({-1}) : zeros({wrt[i].numel()}, DType::f64));
    return cat(flat, 0);
  };
  return gradcheck(first_order, all, eps, atol, rtol);
}

}  // namespace dltrain::testing
