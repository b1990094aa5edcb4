// Gradient clipping (dltrain/optim/clip_grad.hpp): clip_grad_norm_ (total norm over every
// gradient, one scale) and clip_grad_value_.
#include "dltrain/optim/clip_grad.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "common.hpp"
#include "dltrain/autograd/node.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "src/backend/cuda/optim.hpp"
#include "src/optim/clip_grad_internal.hpp"

namespace dltrain::optim {

namespace {

// The gradients to clip: the defined ones, all on one device (CPU or one CUDA device).
std::vector<Tensor> gradients(const std::vector<Tensor>& params, const char* op) {
  std::vector<Tensor> out;
  for (size_t k = 0; k < params.size(); ++k) {
    DLTRAIN_CHECK(params[k].defined(), op, ": tensor ", k, " is undefined");
    Tensor g = params[k].grad();
    if (!g.defined()) continue;
    DLTRAIN_CHECK(is_floating(g.dtype()), op, ": the gradient of tensor ", k, " has dtype ",
                  g.dtype());
    DLTRAIN_CHECK(out.empty() || g.device() == out.front().device(), op,
                  ": the gradient of tensor ", k, " is on ", g.device(),
                  " but an earlier one is on ", out.front().device(),
                  "; clip the gradients of each device in a separate call");
    out.push_back(g);
  }
  return out;
}

void check_finite_norm(bool error_if_nonfinite, double total, double norm_type) {
  DLTRAIN_CHECK(!error_if_nonfinite || std::isfinite(total), "clip_grad_norm_: the total norm ",
                "of order ", norm_type, " of the gradients is ", total,
                ", so it cannot be clipped; fix the non-finite gradients or pass ",
                "error_if_nonfinite = false to scale by it anyway");
}

// CUDA: the norm and the coefficient stay on the device (multi-tensor reduction, then one
// multi-tensor scaling that reads the coefficient there), so nothing syncs the host unless
// error_if_nonfinite asks to look at the norm.
Tensor clip_grad_norm_cuda(const std::vector<Tensor>& grads, double max_norm, double norm_type,
                           bool error_if_nonfinite) {
  const TensorOptions f64 = TensorOptions(DType::f64).with_device(grads.front().device());
  Tensor norm = empty({}, f64), coef = empty({}, f64);
  std::vector<Tensor> dense;
  for (const Tensor& g : grads) dense.push_back(detail::is_dense(g) ? g : g.contiguous());
  backend::cuda::grad_norm(norm, coef, dense, norm_type, max_norm);
  if (error_if_nonfinite) check_finite_norm(true, norm.item<double>(), norm_type);
  backend::cuda::scale_grads(grads, coef);
  return norm.to(grads.front().dtype());
}

// sum of f(x[k]) over [lo, hi) in double with 8 independent partial sums: without
// -ffast-math the compiler may not reorder one running sum, and its add latency would bound
// the loop (2.5x slower); the fixed pattern keeps the result deterministic.
template <class T, class F>
double sum8(const T* x, int64_t lo, int64_t hi, F f) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = lo;
  for (; k + 8 <= hi; k += 8) {
    for (int j = 0; j < 8; ++j) s[j] += f(static_cast<double>(static_cast<acc_t<T>>(x[k + j])));
  }
  for (; k < hi; ++k) s[0] += f(static_cast<double>(static_cast<acc_t<T>>(x[k])));
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// sum |x|^p (or max |x| when p is infinite) over a dense tensor, in double, in fixed chunks
// so the result does not depend on the thread count.
double norm_part(const Tensor& dense, double p) {
  const int64_t n = dense.numel();
  if (n == 0) return 0.0;
  const int64_t chunks = (n + detail::kGrain - 1) / detail::kGrain;
  std::vector<double> part(static_cast<size_t>(chunks), 0.0);
  const bool inf = std::isinf(p);
  dispatch_floating(dense.dtype(), "clip_grad_norm_", [&]<class T>() {
    const T* x = dense.data<T>();
    parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t lo = c * detail::kGrain, hi = std::min(n, lo + detail::kGrain);
        double acc = 0.0;
        if (inf) {
          for (int64_t k = lo; k < hi; ++k) {
            const double a = std::fabs(static_cast<double>(static_cast<acc_t<T>>(x[k])));
            acc = (std::isnan(a) || a > acc) ? a : acc;
          }
        } else if (p == 2.0) {
          acc = sum8(x, lo, hi, [](double a) { return a * a; });
        } else if (p == 1.0) {
          acc = sum8(x, lo, hi, [](double a) { return std::fabs(a); });
        } else {
          for (int64_t k = lo; k < hi; ++k) {
            acc += std::pow(std::fabs(static_cast<double>(static_cast<acc_t<T>>(x[k]))), p);
          }
        }
        part[static_cast<size_t>(c)] = acc;
      }
    });
  });
  double total = 0.0;
  for (double v : part) {
    if (inf) {
      total = (std::isnan(v) || v > total) ? v : total;
    } else {
      total += v;
    }
  }
  return total;
}

}  // namespace

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  DLTRAIN_CHECK(norm_type > 0.0, "clip_grad_norm_: norm_type must be a positive p or infinity, ",
                "got ", norm_type);
  DLTRAIN_CHECK(!std::isnan(max_norm), "clip_grad_norm_: max_norm is NaN");
  autograd::NoGradGuard no_grad;
  const std::vector<Tensor> grads = gradients(params, "clip_grad_norm_");
  if (grads.empty()) return scalar_tensor(0.0);
  if (grads.front().device().is_cuda())
    return clip_grad_norm_cuda(grads, max_norm, norm_type, error_if_nonfinite);
  const bool inf = std::isinf(norm_type);
  double acc = 0.0;
  for (const Tensor& g : grads) {
    const double part = norm_part(detail::is_dense(g) ? g : g.contiguous(), norm_type);
    acc = inf ? ((std::isnan(part) || part > acc) ? part : acc) : acc + part;
  }
  const double total =
      inf ? acc : (norm_type == 2.0 ? std::sqrt(acc) : std::pow(acc, 1.0 / norm_type));
  check_finite_norm(error_if_nonfinite, total, norm_type);
  const double coef = std::min(max_norm / (total + 1e-6), 1.0);
  // min() drops a NaN coefficient; PyTorch's clamp keeps it (and poisons the gradients).
  const double clamped = std::isnan(total) ? total : coef;
  for (Tensor g : grads) mul_(g, clamped);
  return scalar_tensor(total, grads.front().options());
}

double detail::grad_norm_partial(const std::vector<Tensor>& params, double norm_type,
                                 const char* op) {
  DLTRAIN_CHECK(norm_type > 0.0, op, ": norm_type must be a positive p or infinity, got ",
                norm_type);
  autograd::NoGradGuard no_grad;
  const std::vector<Tensor> grads = gradients(params, op);
  if (grads.empty()) return 0.0;
  const bool inf = std::isinf(norm_type);
  if (grads.front().device().is_cuda()) {  // the device's norm, raised back to the power p
    const TensorOptions f64 = TensorOptions(DType::f64).with_device(grads.front().device());
    Tensor norm = empty({}, f64), coef = empty({}, f64);
    std::vector<Tensor> dense;
    for (const Tensor& g : grads) dense.push_back(detail::is_dense(g) ? g : g.contiguous());
    backend::cuda::grad_norm(norm, coef, dense, norm_type, 1.0);
    const double n = norm.item<double>();
    return inf ? n : std::pow(n, norm_type);
  }
  double acc = 0.0;
  for (const Tensor& g : grads) {
    const double part = norm_part(detail::is_dense(g) ? g : g.contiguous(), norm_type);
    acc = inf ? ((std::isnan(part) || part > acc) ? part : acc) : acc + part;
  }
  return acc;
}

double detail::clip_from_partial(const std::vector<Tensor>& params, double max_norm,
                                 double norm_type, double partial, bool error_if_nonfinite) {
  DLTRAIN_CHECK(!std::isnan(max_norm), "clip_grad_norm_: max_norm is NaN");
  autograd::NoGradGuard no_grad;
  const bool inf = std::isinf(norm_type);
  const double total =
      inf ? partial : (norm_type == 2.0 ? std::sqrt(partial) : std::pow(partial, 1.0 / norm_type));
  check_finite_norm(error_if_nonfinite, total, norm_type);
  const double coef = std::min(max_norm / (total + 1e-6), 1.0);
  const double clamped = std::isnan(total) ? total : coef;
  for (Tensor g : gradients(params, "clip_grad_norm_")) mul_(g, clamped);
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  DLTRAIN_CHECK(clip_value >= 0.0, "clip_grad_value_: clip_value must be >= 0, got ", clip_value);
  autograd::NoGradGuard no_grad;
  const std::vector<Tensor> grads = gradients(params, "clip_grad_value_");
  if (!grads.empty() && grads.front().device().is_cuda()) {
    backend::cuda::clamp_grads(grads, -clip_value, clip_value);
    return;
  }
  for (Tensor g : grads) {
    if (!detail::is_dense(g)) {
      g.copy_(clamp(g, -clip_value, clip_value));
      continue;
    }
    const int64_t n = g.numel();
    dispatch_floating(g.dtype(), "clip_grad_value_", [&]<class T>() {
      T* x = g.data<T>();
      using A = acc_t<T>;
      const A lo = static_cast<A>(-clip_value), hi = static_cast<A>(clip_value);
      parallel_for(0, n, detail::kGrain, [=](int64_t b, int64_t e) {
        for (int64_t k = b; k < e; ++k) {
          const A v = static_cast<A>(x[k]);
          x[k] = static_cast<T>(v < lo ? lo : (hi < v ? hi : v));
        }
      });
    });
  }
}

}  // namespace dltrain::optim
