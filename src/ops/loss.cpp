// Softmax, log_softmax, dropout and the losses.
//
// softmax/log_softmax view the (contiguous) input as [outer, L, inner] with
// L the softmax dim and run one kernel over contiguous rows (inner == 1) or
// blocks of up to 64 inner columns, subtracting the per-line max before exp
// (stable) and computing in acc_t.
// cross_entropy is one fused kernel (log-softmax + weighted NLL + label
// smoothing + reduction) over logits [N, C, S] and targets [N, S]; it saves
// the per-sample log-sum-exp and its backward is (softmax - target
// distribution) scaled per sample. nll_loss is the same without the softmax.
// cross_entropy with class probabilities (a floating target) is a second fused CPU loop
// (cross_entropy_soft) and a composite of ops on CUDA.
// Losses accumulate in double; mean reductions divide by the summed class
// weight of non-ignored targets (PyTorch semantics). dropout draws its mask
// from a counter-based Generator, so a seed fixes the mask.
#include "dltrain/ops/loss.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/reduction.hpp"
#include "src/backend/cpu/cast.hpp"
#include "src/backend/cpu/loops.hpp"
#include "src/backend/cuda/loss.hpp"
#include "src/core/trace.hpp"
#include "src/ops/common.hpp"

namespace dltrain {

using backend::cpu::cast;

namespace {

constexpr int64_t kColBlock = 64;

using detail::Lines;
using detail::lines_of;

// Calls f(base, ncols) for every block of up to kColBlock inner columns of every outer index;
// element (l, j) of the block is at base + l * inner + j.
template <class F>
void for_line_blocks(const Lines& s, F f) {
  const int64_t nbj = (s.inner + kColBlock - 1) / kColBlock;
  const int64_t cost = std::max<int64_t>(1, s.L * std::min(s.inner, kColBlock));
  parallel_for(0, s.outer * nbj, std::max<int64_t>(1, 16384 / cost), [&](int64_t b, int64_t e) {
    for (int64_t u = b; u < e; ++u) {
      const int64_t o = u / nbj, j0 = (u % nbj) * kColBlock;
      f(o * s.L * s.inner + j0, std::min(kColBlock, s.inner - j0));
    }
  });
}

constexpr int64_t kLanes = 8;

// Max of a contiguous row in acc type (independent lanes so the loop is not latency-bound).
template <class T>
acc_t<T> row_max(const T* p, int64_t n) {
  using A = acc_t<T>;
  A m[kLanes];
  for (auto& v : m) v = -std::numeric_limits<A>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t u = 0; u < kLanes; ++u) m[u] = std::max(m[u], cast<A>(p[i + u]));
  for (; i < n; ++i) m[0] = std::max(m[0], cast<A>(p[i]));
  A r = m[0];
  for (int64_t u = 1; u < kLanes; ++u) r = std::max(r, m[u]);
  return r;
}

// Sum of exp(p[i] - mx) over a contiguous row; stores the exps in `out` when given.
template <class T, class S>
S row_sum_exp(const T* p, int64_t n, acc_t<T> mx, T* out) {
  using A = acc_t<T>;
  S acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t u = 0; u < kLanes; ++u) {
      const A e = std::exp(cast<A>(p[i + u]) - mx);
      if (out) out[i + u] = cast<T>(e);
      acc[u] += static_cast<S>(e);
    }
  for (; i < n; ++i) {
    const A e = std::exp(cast<A>(p[i]) - mx);
    if (out) out[i] = cast<T>(e);
    acc[0] += static_cast<S>(e);
  }
  S r = 0;
  for (int64_t u = 0; u < kLanes; ++u) r += acc[u];
  return r;
}

// Calls f(row) for every row of a [rows, L] contiguous view, in parallel.
template <class F>
void for_rows(int64_t rows, int64_t L, F f) {
  parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(L, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t r = b; r < e; ++r) f(r);
               });
}

Tensor softmax_forward(const Tensor& xc, const Lines& s, bool log, const char* op) {
  Tensor y = empty(xc.shape(), xc.options());
  if (xc.device().is_cuda()) {
    backend::cuda::softmax_forward(y, xc, s.outer, s.L, s.inner, log);
    return y;
  }
  dispatch_floating(xc.dtype(), op, [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = xc.data<T>();
    T* yp = y.data<T>();
    const int64_t in = s.inner;
    if (in == 1) {
      for_rows(s.outer, s.L, [&](int64_t r) {
        const T* xr = xp + r * s.L;
        T* yr = yp + r * s.L;
        const A mx = row_max(xr, s.L);
        const bool store = std::is_same_v<T, A> && !log;
        const A sm = row_sum_exp<T, A>(xr, s.L, mx, store ? yr : nullptr);
        if (log) {
          const A lse = mx + std::log(sm);
          for (int64_t l = 0; l < s.L; ++l) yr[l] = cast<T>(cast<A>(xr[l]) - lse);
        } else if (store) {
          const A inv = A(1) / sm;
          for (int64_t l = 0; l < s.L; ++l) yr[l] = cast<T>(cast<A>(yr[l]) * inv);
        } else {
          const A inv = A(1) / sm;
          for (int64_t l = 0; l < s.L; ++l) yr[l] = cast<T>(std::exp(cast<A>(xr[l]) - mx) * inv);
        }
      });
      return;
    }
    for_line_blocks(s, [&](int64_t base, int64_t nc) {
      A mx[kColBlock], sm[kColBlock];
      for (int64_t j = 0; j < nc; ++j) {
        mx[j] = -std::numeric_limits<A>::infinity();
        sm[j] = A(0);
      }
      for (int64_t l = 0; l < s.L; ++l)
        for (int64_t j = 0; j < nc; ++j) mx[j] = std::max(mx[j], cast<A>(xp[base + l * in + j]));
      for (int64_t l = 0; l < s.L; ++l)
        for (int64_t j = 0; j < nc; ++j) {
          const A e = std::exp(cast<A>(xp[base + l * in + j]) - mx[j]);
          sm[j] += e;
          if constexpr (std::is_same_v<T, A>) {
            if (!log) yp[base + l * in + j] = e;
          }
        }
      if (log) {
        for (int64_t j = 0; j < nc; ++j) sm[j] = mx[j] + std::log(sm[j]);
        for (int64_t l = 0; l < s.L; ++l)
          for (int64_t j = 0; j < nc; ++j)
            yp[base + l * in + j] = cast<T>(cast<A>(xp[base + l * in + j]) - sm[j]);
      } else {
        for (int64_t j = 0; j < nc; ++j) sm[j] = A(1) / sm[j];
        for (int64_t l = 0; l < s.L; ++l)
          for (int64_t j = 0; j < nc; ++j) {
            const int64_t i = base + l * in + j;
            if constexpr (std::is_same_v<T, A>)
              yp[i] *= sm[j];
            else
              yp[i] = cast<T>(std::exp(cast<A>(xp[i]) - mx[j]) * sm[j]);
          }
      }
    });
  });
  return y;
}

// softmax: dx = y * (g - sum(g * y)); log_softmax: dx = g - exp(y) * sum(g).
Tensor softmax_backward(const Tensor& gc, const Tensor& y, const Lines& s, bool log) {
  Tensor dx = empty(y.shape(), y.options());
  if (y.device().is_cuda()) {
    backend::cuda::softmax_backward(dx, gc, y, s.outer, s.L, s.inner, log);
    return dx;
  }
  dispatch_floating(y.dtype(), log ? "log_softmax_backward" : "softmax_backward", [&]<class T>() {
    using A = acc_t<T>;
    const T* gp = gc.data<T>();
    const T* yp = y.data<T>();
    T* dp = dx.data<T>();
    const int64_t in = s.inner;
    if (in == 1) {
      for_rows(s.outer, s.L, [&](int64_t r) {
        const T* gr = gp + r * s.L;
        const T* yr = yp + r * s.L;
        T* dr = dp + r * s.L;
        A acc[kLanes] = {};
        int64_t l = 0;
        for (; l + kLanes <= s.L; l += kLanes)
          for (int64_t u = 0; u < kLanes; ++u)
            acc[u] += log ? cast<A>(gr[l + u]) : cast<A>(gr[l + u]) * cast<A>(yr[l + u]);
        for (; l < s.L; ++l) acc[0] += log ? cast<A>(gr[l]) : cast<A>(gr[l]) * cast<A>(yr[l]);
        A t = A(0);
        for (int64_t u = 0; u < kLanes; ++u) t += acc[u];
        if (log) {
          for (l = 0; l < s.L; ++l) dr[l] = cast<T>(cast<A>(gr[l]) - std::exp(cast<A>(yr[l])) * t);
        } else {
          for (l = 0; l < s.L; ++l) dr[l] = cast<T>(cast<A>(yr[l]) * (cast<A>(gr[l]) - t));
        }
      });
      return;
    }
    for_line_blocks(s, [&](int64_t base, int64_t nc) {
      A acc[kColBlock];
      for (int64_t j = 0; j < nc; ++j) acc[j] = A(0);
      for (int64_t l = 0; l < s.L; ++l)
        for (int64_t j = 0; j < nc; ++j) {
          const int64_t i = base + l * in + j;
          acc[j] += log ? cast<A>(gp[i]) : cast<A>(gp[i]) * cast<A>(yp[i]);
        }
      for (int64_t l = 0; l < s.L; ++l)
        for (int64_t j = 0; j < nc; ++j) {
          const int64_t i = base + l * in + j;
          dp[i] = log ? cast<T>(cast<A>(gp[i]) - std::exp(cast<A>(yp[i])) * acc[j])
                      : cast<T>(cast<A>(yp[i]) * (cast<A>(gp[i]) - acc[j]));
        }
    });
  });
  return dx;
}

Tensor softmax_impl(const Tensor& x, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  detail::check_defined(op, x, "input");
  DLTRAIN_CHECK(is_floating(x.dtype()), op, ": expected a floating-point input but got ", x.dtype(),
                "; convert it with .to(DType::f32)");
  const Lines s = lines_of(x.shape(), wrap_dim(dim, x.dim(), op));
  Tensor xc = x.detach().contiguous();
  Tensor y = softmax_forward(xc, s, log, op);
  autograd::record(
      op, {x}, {y},
      [ys = autograd::SavedOutput(y), s, log,
       d = wrap_dim(dim, x.dim(), op)](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled()) {  // create_graph: the formula with ops
          const Tensor yv = ys.get();
          const Tensor gy = g[0].to(yv.dtype());
          if (log) return std::vector<Tensor>{sub(gy, mul(exp(yv), sum(gy, {d}, true)))};
          return std::vector<Tensor>{mul(yv, sub(gy, sum(mul(gy, yv), {d}, true)))};
        }
        const Tensor& yd = ys.data();
        Tensor gc = (g[0].dtype() == yd.dtype() ? g[0] : g[0].to(yd.dtype())).contiguous();
        return std::vector<Tensor>{softmax_backward(gc, yd, s, log)};
      },
      autograd::HigherOrder::Supported);
  return y;
}

// --- class-index targets ------------------------------------------------------------

struct ClassTargets {
  std::vector<int64_t> t;  // [N * S], sample i = n * S + s (CPU only)
  int64_t N = 0, C = 0, S = 1;
};

// Checks input [N, C, d...] against target [N, d...] (int64/int32), the optional class weight
// and the devices; returns the geometry without reading the targets.
ClassTargets check_class_args(const char* op, const Tensor& input, const Tensor& target,
                              const Tensor& weight) {
  detail::check_defined(op, input, "input");
  detail::check_defined(op, target, "target");
  detail::check_same_device(op, {&input, &target, &weight});
  DLTRAIN_CHECK(is_floating(input.dtype()), op, ": expected floating-point scores but got dtype ",
                input.dtype(), "; convert them with .to(DType::f32)");
  DLTRAIN_CHECK(target.dtype() == DType::i64 || target.dtype() == DType::i32, op,
                ": target must hold class indices of dtype int64 (or int32) but has dtype ",
                target.dtype(), "; convert it with .to(DType::i64)");
  DLTRAIN_CHECK(input.dim() >= 2, op, ": expected input of shape [N, C] or [N, C, d...] but got ",
                shape_str(input.shape()));
  bool ok = target.dim() == input.dim() - 1 && target.size(0) == input.size(0);
  for (int64_t d = 1; ok && d < target.dim(); ++d) ok = target.size(d) == input.size(d + 1);
  DLTRAIN_CHECK(ok, op, ": target of shape ", shape_str(target.shape()),
                " does not match input of shape ", shape_str(input.shape()),
                "; for input [N, C, d...] the target must be [N, d...]");
  ClassTargets ct;
  ct.N = input.size(0);
  ct.C = input.size(1);
  for (int64_t d = 2; d < input.dim(); ++d) ct.S *= input.size(d);
  if (weight.defined()) {
    DLTRAIN_CHECK(is_floating(weight.dtype()), op,
                  ": class weight must be floating-point but has dtype ", weight.dtype());
    DLTRAIN_CHECK(weight.dim() == 1 && weight.size(0) == ct.C, op, ": class weight has shape ",
                  shape_str(weight.shape()), " but the input has ", ct.C,
                  " classes; pass a weight of shape [", ct.C, "]");
  }
  return ct;
}

// check_class_args, then reads the (CPU) targets and range-checks them.
ClassTargets class_targets(const char* op, const Tensor& input, const Tensor& target,
                           int64_t ignore_index, const Tensor& weight) {
  ClassTargets ct = check_class_args(op, input, target, weight);
  ct.t = target.detach().to_vector<int64_t>();
  for (size_t i = 0; i < ct.t.size(); ++i) {
    const int64_t v = ct.t[i];
    DLTRAIN_CHECK(v == ignore_index || (v >= 0 && v < ct.C), op, ": target value ", v,
                  " at flat position ", i, " is out of range for ", ct.C,
                  " classes; valid range is [0, ", ct.C, ") or ignore_index (", ignore_index, ")");
  }
  return ct;
}

// --- class-index losses on CUDA ---------------------------------------------------------

backend::cuda::ClassLoss cuda_class_loss(const ClassTargets& ct, int64_t ignore, Reduction r) {
  backend::cuda::ClassLoss a;
  a.N = ct.N;
  a.C = ct.C;
  a.S = ct.S;
  a.ignore_index = ignore;
  a.reduction = r == Reduction::None   ? backend::cuda::LossReduction::None
                : r == Reduction::Mean ? backend::cuda::LossReduction::Mean
                                       : backend::cuda::LossReduction::Sum;
  return a;
}

// What the CUDA class-loss kernels read: int64 targets and f64 weights, contiguous.
// A class loss written with differentiable ops, the reference that create_graph backward
// differentiates: per sample -sum_c A[c] lp[c] with A = (1-eps) w_t [c == t] + eps/C w_c
// (0 for an ignored target), reduced as forward did (mean: divided by total_w, the summed
// weight of the counted targets). lp [N, C, d...] are log-probabilities, target [N, d...].
Tensor class_loss_reference(const Tensor& lp, const Tensor& target, const Tensor& weight,
                            int64_t ignore, double eps, Reduction red, const Tensor& total_w,
                            const Shape& out_shape) {
  const int64_t C = lp.size(1);
  const DType dt = lp.dtype();
  const TensorOptions on = TensorOptions(dt).with_device(lp.device());
  Shape cshape(static_cast<size_t>(lp.dim()), 1);
  cshape[1] = C;
  const Tensor cls = arange(static_cast<double>(C), DType::i64).to(lp.device()).reshape(cshape);
  const Tensor tt = target.detach().to(DType::i64).to(lp.device()).unsqueeze(1);
  const Tensor onehot = eq(cls, tt).to(dt);
  const Tensor valid = ne(tt, static_cast<double>(ignore)).to(dt);
  const Tensor wv =
      weight.defined() ? weight.detach().to(dt).to(lp.device()).reshape(cshape) : ones(cshape, on);
  const Tensor a =
      mul(valid, add(mul(mul(onehot, wv), 1.0 - eps), mul(wv, eps / static_cast<double>(C))));
  const Tensor per = neg(sum(mul(a, lp), {1}));
  switch (red) {
    case Reduction::None:
      return per.reshape(out_shape);
    case Reduction::Sum:
      return sum(per);
    case Reduction::Mean:
      break;
  }
  return div(sum(per), total_w.to(dt));
}

// create_graph backward of a class loss: differentiates the reference at `input`.
std::vector<Tensor> class_loss_grad(const Tensor& input, const Tensor& target, const Tensor& weight,
                                    int64_t ignore, double eps, Reduction red,
                                    const Tensor& total_w, bool log_softmax_first,
                                    const Shape& out_shape, const Tensor& g) {
  return autograd::grad_by_recompute(
      [=](const std::vector<Tensor>& xs) {
        const bool unbatched = xs[0].dim() == 1;
        Tensor x = unbatched ? xs[0].unsqueeze(0) : xs[0];
        Tensor lp = log_softmax_first ? log_softmax(x, 1) : x;
        Tensor t = unbatched ? target.reshape({1}) : target;
        return std::vector<Tensor>{
            class_loss_reference(lp, t, weight, ignore, eps, red, total_w, out_shape)};
      },
      {input}, {g});
}

Tensor cuda_targets(const Tensor& target) { return target.detach().to(DType::i64).contiguous(); }
Tensor cuda_weights(const Tensor& weight) {
  return weight.defined() ? weight.detach().to(DType::f64).contiguous() : Tensor();
}

// The upstream gradient of a class loss as the kernels read it: the input dtype, contiguous.
Tensor cuda_loss_grad(const Tensor& g, DType dt) {
  return (g.dtype() == dt ? g : g.to(dt)).contiguous();
}

Tensor cross_entropy_cuda(const Tensor& logits_in, const Tensor& logits, const Tensor& target,
                          const CrossEntropyOptions& opts, bool unbatched) {
  const char* op = "cross_entropy";
  const ClassTargets ct = check_class_args(op, logits, target, opts.weight);
  const backend::cuda::ClassLoss a = cuda_class_loss(ct, opts.ignore_index, opts.reduction);
  const double eps = opts.label_smoothing;
  const Device dev = logits.device();
  Tensor xc = logits.detach().contiguous();
  Tensor tc = cuda_targets(target);
  Tensor wc = cuda_weights(opts.weight);
  Tensor lse =
      empty({ct.N * ct.S},
            TensorOptions(xc.dtype() == DType::f64 ? DType::f64 : DType::f32).with_device(dev));
  Tensor total_w = opts.reduction == Reduction::Mean
                       ? empty({}, TensorOptions(DType::f64).with_device(dev))
                       : Tensor();
  const Shape out_shape =
      opts.reduction == Reduction::None ? (unbatched ? Shape{} : target.shape()) : Shape{};
  Tensor out = empty(out_shape, logits.options());
  backend::cuda::cross_entropy_forward(out, lse, total_w, xc, tc, wc, a, eps);
  autograd::record(
      op, {logits_in}, {out},
      [xc, lse, tc, wc, total_w, a, eps, in_shape = logits_in.shape(), li = logits_in,
       target = target.detach(), weight = opts.weight, ignore = opts.ignore_index,
       red = opts.reduction, out_shape](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())
          return class_loss_grad(li, target, weight, ignore, eps, red, total_w, true, out_shape,
                                 g[0]);
        Tensor dx = empty(xc.shape(), xc.options());
        backend::cuda::cross_entropy_backward(dx, cuda_loss_grad(g[0], xc.dtype()), xc, lse,
                                              total_w, tc, wc, a, eps);
        return std::vector<Tensor>{dx.reshape(in_shape)};
      },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor nll_loss_cuda(const Tensor& log_probs, const Tensor& target, const NLLLossOptions& opts) {
  const char* op = "nll_loss";
  const ClassTargets ct = check_class_args(op, log_probs, target, opts.weight);
  const backend::cuda::ClassLoss a = cuda_class_loss(ct, opts.ignore_index, opts.reduction);
  const Device dev = log_probs.device();
  Tensor xc = log_probs.detach().contiguous();
  Tensor tc = cuda_targets(target);
  Tensor wc = cuda_weights(opts.weight);
  Tensor total_w = opts.reduction == Reduction::Mean
                       ? empty({}, TensorOptions(DType::f64).with_device(dev))
                       : Tensor();
  Tensor out =
      empty(opts.reduction == Reduction::None ? target.shape() : Shape{}, log_probs.options());
  backend::cuda::nll_loss_forward(out, total_w, xc, tc, wc, a);
  autograd::record(
      op, {log_probs}, {out},
      [tc, wc, total_w, a, shape = log_probs.shape(), opt = log_probs.options(), li = log_probs,
       target = target.detach(), weight = opts.weight, ignore = opts.ignore_index,
       red = opts.reduction, out_shape = out.shape()](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())
          return class_loss_grad(li, target, weight, ignore, 0.0, red, total_w, false, out_shape,
                                 g[0]);
        Tensor dx = empty(shape, opt);
        backend::cuda::nll_loss_backward(dx, cuda_loss_grad(g[0], opt.dtype), total_w, tc, wc, a);
        return std::vector<Tensor>{dx};
      },
      autograd::HigherOrder::Supported);
  return out;
}

// The loss output from per-sample losses (double): the losses themselves shaped
// none_shape (None), their sum (Sum), or their sum divided by total_w (Mean).
Tensor reduce_losses(const std::vector<double>& losses, const Shape& none_shape, Reduction red,
                     double total_w, DType dt) {
  if (red == Reduction::None) {
    if (none_shape.empty()) return scalar_tensor(losses.at(0), TensorOptions(dt));
    return from_vector<double>(losses, none_shape).to(dt);
  }
  double s = 0;
  for (double v : losses) s += v;
  if (red == Reduction::Mean) s /= total_w;
  return scalar_tensor(s, TensorOptions(dt));
}

// Per-sample upstream gradient (doubles) for a loss reduced with `red`.
std::vector<double> sample_grads(const Tensor& g, size_t n, Reduction red, double total_w) {
  if (red == Reduction::None) return g.detach().to_vector<double>();
  double v = g.detach().item<double>();
  if (red == Reduction::Mean) v /= total_w;
  return std::vector<double>(n, v);
}

// --- class-probability ("soft") targets -------------------------------------------------

// The soft-target cross-entropy written with differentiable ops (any device): per sample
// -sum_c w_c t'_c lp_c with t' = (1 - eps) t + eps/C, reduced; Mean divides by the number of
// samples N * d... (PyTorch: input.numel() / C), never by the weights. Class dim 1 (the
// unbatched form is unsqueezed by the caller). The CUDA path and the create_graph reference.
Tensor soft_ce_reference(const Tensor& logits, const Tensor& target, const Tensor& weight,
                         double eps, Reduction red, const Shape& out_shape) {
  const int64_t C = logits.size(1);
  const DType dt = logits.dtype();
  if (dt == DType::f16 || dt == DType::bf16)  // computed in f32, rounded once (as on the CPU)
    return soft_ce_reference(logits.to(DType::f32), target, weight, eps, red, out_shape).to(dt);
  Shape cshape(static_cast<size_t>(logits.dim()), 1);
  cshape[1] = C;
  const Tensor lp = log_softmax(logits, 1);
  Tensor a = target.dtype() == dt ? target : target.to(dt);
  if (eps > 0.0) a = add(mul(a, 1.0 - eps), eps / static_cast<double>(C));
  if (weight.defined()) a = mul(a, weight.detach().to(dt).reshape(cshape));
  const Tensor per = neg(sum(mul(a, lp), {1}));
  switch (red) {
    case Reduction::None:
      return per.reshape(out_shape);
    case Reduction::Sum:
      return sum(per);
    case Reduction::Mean:
      break;
  }
  return div(sum(per), static_cast<double>(per.numel()));
}

// cross_entropy with a floating target of the input's shape (PyTorch >= 1.10). On the CPU one
// fused pass per sample saves the log-sum-exp and sum_c w_c t'_c; the backward is
//   d/dx_c = g (p_c sum_k w_k t'_k - w_c t'_c),   d/dt_c = -g (1 - eps) w_c lp_c
// (g the per-sample upstream gradient, divided by N * d... for Mean).
Tensor cross_entropy_soft(const Tensor& logits_in, const Tensor& target_in,
                          const CrossEntropyOptions& opts) {
  const char* op = "cross_entropy";
  detail::check_same_device(op, {&logits_in, &target_in, &opts.weight});
  DLTRAIN_CHECK(is_floating(logits_in.dtype()), op,
                ": expected floating-point scores but got dtype ", logits_in.dtype(),
                "; convert them with .to(DType::f32)");
  DLTRAIN_CHECK(logits_in.dim() >= 1, op,
                ": expected input of shape [C], [N, C] or [N, C, d...] but got a 0-d tensor");
  DLTRAIN_CHECK(target_in.shape() == logits_in.shape(), op, ": a floating-point target holds ",
                "class probabilities and must have the input's shape, but the target is ",
                shape_str(target_in.shape()), " and the input ", shape_str(logits_in.shape()),
                "; for class indices pass an int64 target of shape [N, d...] (.to(DType::i64))");
  // PyTorch refuses a class ignore_index (>= 0) with probabilities; the default -100 is fine.
  DLTRAIN_CHECK(opts.ignore_index < 0, op, ": ignore_index (", opts.ignore_index,
                ") does not apply to class-probability targets; leave it at its default (-100)");
  const bool unbatched = logits_in.dim() == 1;
  const Tensor logits = unbatched ? logits_in.unsqueeze(0) : logits_in;
  const Tensor target = unbatched ? target_in.unsqueeze(0) : target_in;
  const int64_t N = logits.size(0), C = logits.size(1);
  int64_t S = 1;
  for (int64_t d = 2; d < logits.dim(); ++d) S *= logits.size(d);
  if (opts.weight.defined()) {
    DLTRAIN_CHECK(is_floating(opts.weight.dtype()), op,
                  ": class weight must be floating-point but has dtype ", opts.weight.dtype());
    DLTRAIN_CHECK(opts.weight.dim() == 1 && opts.weight.size(0) == C, op,
                  ": class weight has shape ", shape_str(opts.weight.shape()),
                  " but the input has ", C, " classes; pass a weight of shape [", C, "]");
  }
  const double eps = opts.label_smoothing;
  const Reduction red = opts.reduction;
  Shape out_shape;
  if (red == Reduction::None && !unbatched) {
    out_shape.push_back(N);
    for (int64_t d = 2; d < logits.dim(); ++d) out_shape.push_back(logits.size(d));
  }
  if (logits.device().is_cuda()) {
    // Composite of CUDA ops (log_softmax is a fused kernel); differentiable to every order.
    const Tensor out = soft_ce_reference(logits, target, opts.weight, eps, red, out_shape);
    return unbatched && red == Reduction::None ? out.reshape({}) : out;
  }
  const int64_t n = N * S;
  const std::vector<double> w = opts.weight.defined()
                                    ? opts.weight.detach().to_vector<double>()
                                    : std::vector<double>(static_cast<size_t>(C), 1.0);
  const DType dt = logits.dtype();
  Tensor xc = logits.detach().contiguous();
  Tensor tc = (target.dtype() == dt ? target.detach() : target.detach().to(dt)).contiguous();
  auto lse = std::make_shared<std::vector<double>>(static_cast<size_t>(n));
  auto asum = std::make_shared<std::vector<double>>(static_cast<size_t>(n));
  std::vector<double> losses(static_cast<size_t>(n), 0.0);
  const Lines s{N, C, S};
  const double es = eps / static_cast<double>(C);
  dispatch_floating(dt, op, [&]<class T>() {
    const T* xp = xc.data<T>();
    const T* tp = tc.data<T>();
    for_line_blocks(s, [&](int64_t base, int64_t nc) {
      const int64_t nn = base / (C * S), j0 = base % (C * S);
      for (int64_t j = 0; j < nc; ++j) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t c = 0; c < C; ++c) mx = std::max(mx, (cast<double>(xp[base + c * S + j])));
        double se = 0;
        for (int64_t c = 0; c < C; ++c) se += std::exp((cast<double>(xp[base + c * S + j])) - mx);
        const double l = mx + std::log(se);
        double loss = 0, as = 0;
        for (int64_t c = 0; c < C; ++c) {
          const int64_t k = base + c * S + j;
          const double a = w[c] * ((1.0 - eps) * (cast<double>(tp[k])) + es);
          as += a;
          loss += a * (l - (cast<double>(xp[k])));
        }
        const int64_t i = nn * S + j0 + j;
        (*lse)[i] = l;
        (*asum)[i] = as;
        losses[i] = loss;
      }
    });
  });
  Tensor out = reduce_losses(losses, out_shape, red, static_cast<double>(n), dt);
  autograd::record(
      op, {logits_in, target_in}, {out},
      [xc, tc, lse, asum, w, eps, s, red, n, in_shape = logits_in.shape(),
       t_dtype = target_in.dtype(), li = logits_in, ti = target_in, weight = opts.weight,
       rx = logits_in.requires_grad(), rt = target_in.requires_grad(),
       out_shape](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())
          return autograd::grad_by_recompute(
              [=](const std::vector<Tensor>& in) {
                const bool ub = in[0].dim() == 1;
                const Tensor x = ub ? in[0].unsqueeze(0) : in[0];
                const Tensor t = ub ? in[1].unsqueeze(0) : in[1];
                const Tensor o = soft_ce_reference(x, t, weight, eps, red, out_shape);
                return std::vector<Tensor>{ub && red == Reduction::None ? o.reshape({}) : o};
              },
              {li, ti}, g);
        const int64_t C = s.L, S = s.inner;
        const std::vector<double> gs =
            sample_grads(g[0], static_cast<size_t>(n), red, static_cast<double>(n));
        Tensor dx = rx ? empty(xc.shape(), xc.options()) : Tensor();
        Tensor dt = rt ? empty(tc.shape(), tc.options()) : Tensor();
        dispatch_floating(xc.dtype(), "cross_entropy_backward", [&]<class T>() {
          const T* xp = xc.data<T>();
          const T* tp = tc.data<T>();
          T* dxp = rx ? dx.data<T>() : nullptr;
          T* dtp = rt ? dt.data<T>() : nullptr;
          const double es = eps / static_cast<double>(C);
          for_line_blocks(s, [&](int64_t base, int64_t nc) {
            const int64_t nn = base / (C * S), j0 = base % (C * S);
            for (int64_t j = 0; j < nc; ++j) {
              const int64_t i = nn * S + j0 + j;
              const double gi = gs[i], l = (*lse)[i], as = (*asum)[i];
              for (int64_t c = 0; c < C; ++c) {
                const int64_t k = base + c * S + j;
                const double lp = (cast<double>(xp[k])) - l;
                if (dxp) {
                  const double a = w[c] * ((1.0 - eps) * (cast<double>(tp[k])) + es);
                  dxp[k] = cast<T>(gi * (std::exp(lp) * as - a));
                }
                if (dtp) dtp[k] = cast<T>(-gi * (1.0 - eps) * w[c] * lp);
              }
            }
          });
        });
        return std::vector<Tensor>{rx ? dx.reshape(in_shape) : Tensor(),
                                   rt ? dt.reshape(in_shape).to(t_dtype) : Tensor()};
      },
      autograd::HigherOrder::Supported);
  return out;
}

// Softplus of -x, stable: log1p(exp(-|x|)) + max(-x, 0).
template <class A>
inline A softplus_neg(A x) {
  return std::log1p(std::exp(-std::abs(x))) + std::max(-x, A(0));
}

Tensor bce_elementwise(const Tensor& x, const Tensor& y, const Tensor& pw) {
  Tensor out = empty(x.shape(), x.options());
  if (x.device().is_cuda()) {
    backend::cuda::bce_with_logits(out, x, y, pw);
    return out;
  }
  dispatch_floating(x.dtype(), "binary_cross_entropy_with_logits", [&]<class T>() {
    using A = acc_t<T>;
    backend::cpu::ternary_map<T, T, T, T>(out, x, y, pw, [](T xv, T yv, T pv) {
      const A a = cast<A>(xv), t = cast<A>(yv), p = cast<A>(pv);
      return cast<T>((A(1) - t) * a + (A(1) + (p - A(1)) * t) * softplus_neg(a));
    });
  });
  return out;
}

Tensor softplus_neg_tensor(const Tensor& x) {
  Tensor out = empty(x.shape(), x.options());
  if (x.device().is_cuda()) {
    backend::cuda::softplus_neg(out, x);
    return out;
  }
  dispatch_floating(x.dtype(), "binary_cross_entropy_with_logits_backward", [&]<class T>() {
    using A = acc_t<T>;
    backend::cpu::unary_map<T, T>(out, x, [](T v) { return cast<T>(softplus_neg(cast<A>(v))); });
  });
  return out;
}

Tensor reduce(const Tensor& t, Reduction r) {
  switch (r) {
    case Reduction::None:
      return t;
    case Reduction::Sum:
      return sum(t);
    case Reduction::Mean:
      break;
  }
  return mean(t);
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  DLTRAIN_OP_SCOPE("softmax", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"dim", dim}}, [&] { return softmax(x, dim); });
    });
  if (auto ac = amp::detail::autocast_args(amp::Op::softmax, {&x})) return softmax((*ac)[0], dim);
  return softmax_impl(x, dim, false);
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  DLTRAIN_OP_SCOPE("log_softmax", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"dim", dim}}, [&] { return log_softmax(x, dim); });
    });
  if (auto ac = amp::detail::autocast_args(amp::Op::log_softmax, {&x}))
    return log_softmax((*ac)[0], dim);
  return softmax_impl(x, dim, true);
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  DLTRAIN_OP_SCOPE("dropout", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"p", p}, {"training", training}},
                                  [&] { return dropout(x, p, training, gen); });
    });
  const char* op = "dropout";
  detail::check_defined(op, x, "input");
  DLTRAIN_CHECK(p >= 0.0 && p <= 1.0, op, ": probability p must be in [0, 1] but is ", p);
  DLTRAIN_CHECK(is_floating(x.dtype()), op, ": expected a floating-point input but got ", x.dtype(),
                "; convert it with .to(DType::f32)");
  if (!training || p == 0.0) return x;
  if (p == 1.0) return mul(x, 0.0);
  const double keep = 1.0 - p;
  if (x.device().is_cuda()) {
    // Same generator draw as rand() below, so the mask equals the CPU's for the same state.
    Generator& rng = gen ? *gen : default_generator();
    const uint64_t seed = rng.seed();
    const uint64_t base = rng.reserve(static_cast<uint64_t>((x.numel() + 1) / 2));
    const MemoryFormat fmt = x.suggest_memory_format();
    Tensor out = empty(x.shape(), fmt, x.options());
    Tensor mask = empty(x.shape(), fmt, TensorOptions(DType::u8).with_device(x.device()));
    backend::cuda::dropout_forward(out, mask, x.detach(), keep, seed, base);
    autograd::record(
        op, {x}, {out},
        [mask, keep, fmt, opt = x.options()](const std::vector<Tensor>& g) {
          if (autograd::grad_mode_enabled())  // create_graph: linear in g
            return std::vector<Tensor>{mul(g[0], div(mask.to(g[0].dtype()), keep))};
          Tensor dx = empty(mask.shape(), fmt, opt);
          backend::cuda::dropout_backward(dx, g[0].dtype() == opt.dtype ? g[0] : g[0].to(opt.dtype),
                                          mask, keep);
          return std::vector<Tensor>{dx};
        },
        autograd::HigherOrder::Supported);
    return out;
  }
  const DType rdt = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor u = rand(x.shape(), TensorOptions(rdt), gen);
  // The mask scaled by 1 / keep in the compute type (f32 for f16/bf16): a 16-bit scale would
  // bias every kept element (bf16: 1/0.9 -> 1.109, -0.2%); x * scale then rounds once.
  const bool low = x.dtype() == DType::f16 || x.dtype() == DType::bf16;
  Tensor scale = empty(x.shape(), TensorOptions(low ? DType::f32 : x.dtype()));
  dispatch_floating(scale.dtype(), op, [&]<class T>() {
    const T s = cast<T>(1.0 / keep);
    dispatch_floating(rdt, op, [&]<class R>() {
      const R k = static_cast<R>(keep);
      backend::cpu::unary_map<T, R>(scale, u, [&](R v) { return v < k ? s : T(0); });
    });
  });
  Tensor y = mul(x, scale);  // gradient: g * mask / (1 - p)
  return low ? y.to(x.dtype()) : y;
}

namespace {
// Class weights that require grad would get no gradient (the losses are not differentiable
// with respect to them, as in PyTorch, which refuses them the same way): refused rather than
// left silently without one.
void check_class_weight_no_grad(const char* op, const Tensor& weight) {
  DLTRAIN_CHECK(!(weight.defined() && weight.requires_grad() && autograd::grad_mode_enabled()), op,
                ": the class weights require grad, but the loss is not differentiable with "
                "respect to them (as in PyTorch); pass weight.detach(), or to learn them compute "
                "the loss with reduction None and multiply it by weight.index_select(0, target)");
}
}  // namespace

Tensor cross_entropy(const Tensor& logits_in, const Tensor& target_in,
                     const CrossEntropyOptions& opts) {
  DLTRAIN_OP_SCOPE("cross_entropy", logits_in, target_in);
  if (auto ac = amp::detail::autocast_args(amp::Op::cross_entropy,
                                           {&logits_in, &target_in, &opts.weight})) {
    CrossEntropyOptions o = opts;
    o.weight = (*ac)[2];
    return cross_entropy((*ac)[0], (*ac)[1], o);
  }
  const char* op = "cross_entropy";
  detail::check_defined(op, logits_in, "input");
  detail::check_defined(op, target_in, "target");
  check_class_weight_no_grad(op, opts.weight);
  DLTRAIN_CHECK(opts.label_smoothing >= 0.0 && opts.label_smoothing <= 1.0, op,
                ": label_smoothing must be in [0, 1] but is ", opts.label_smoothing);
  // A floating target holds class probabilities (PyTorch >= 1.10), an integer one indices.
  if (is_floating(target_in.dtype())) return cross_entropy_soft(logits_in, target_in, opts);
  DLTRAIN_CHECK(!(target_in.shape() == logits_in.shape() && logits_in.dim() >= 2), op,
                ": the target has the input's shape ", shape_str(logits_in.shape()),
                ", which means class probabilities, but its dtype is ", target_in.dtype(),
                "; convert it with .to(DType::f32), or pass class indices of shape [N, d...]");
  // Unbatched form: logits [C] with a 0-d target.
  const bool unbatched = logits_in.dim() == 1 && target_in.dim() == 0;
  const Tensor logits = unbatched ? logits_in.unsqueeze(0) : logits_in;
  const Tensor target = unbatched ? target_in.reshape({1}) : target_in;
  const double eps = opts.label_smoothing;
  if (logits.device().is_cuda() || target.device().is_cuda())
    return cross_entropy_cuda(logits_in, logits, target, opts, unbatched);
  ClassTargets ct = class_targets(op, logits, target, opts.ignore_index, opts.weight);
  const int64_t C = ct.C, S = ct.S, n = ct.N * S;
  const std::vector<double> w = opts.weight.defined()
                                    ? opts.weight.detach().to_vector<double>()
                                    : std::vector<double>(static_cast<size_t>(C), 1.0);
  double W = 0;
  for (double v : w) W += v;
  double total_w = 0;
  for (int64_t i = 0; i < n; ++i)
    if (ct.t[i] != opts.ignore_index) total_w += w[ct.t[i]];

  Tensor xc = logits.detach().contiguous();
  auto lse = std::make_shared<std::vector<double>>(static_cast<size_t>(n));
  std::vector<double> losses(static_cast<size_t>(n), 0.0);
  const Lines s{ct.N, C, S};
  const int64_t ignore = opts.ignore_index;
  dispatch_floating(xc.dtype(), op, [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = xc.data<T>();
    if (S == 1) {
      for_rows(ct.N, C, [&](int64_t i) {
        const T* xr = xp + i * C;
        const A mx = row_max(xr, C);
        const double l = double(mx) + std::log(row_sum_exp<T, double>(xr, C, mx, nullptr));
        (*lse)[i] = l;
        const int64_t t = ct.t[i];
        if (t == ignore) return;
        double loss = (1.0 - eps) * w[t] * (l - double(cast<A>(xr[t])));
        if (eps > 0) {
          double wx = 0;
          for (int64_t c = 0; c < C; ++c) wx += w[c] * double(cast<A>(xr[c]));
          loss += eps / static_cast<double>(C) * (W * l - wx);
        }
        losses[i] = loss;
      });
      return;
    }
    for_line_blocks(s, [&](int64_t base, int64_t nc) {
      const int64_t nn = base / (C * S), j0 = base % (C * S);
      A mx[kColBlock];
      double sm[kColBlock], wx[kColBlock];
      for (int64_t j = 0; j < nc; ++j) {
        mx[j] = -std::numeric_limits<A>::infinity();
        sm[j] = 0;
        wx[j] = 0;
      }
      for (int64_t c = 0; c < C; ++c)
        for (int64_t j = 0; j < nc; ++j) {
          const A v = cast<A>(xp[base + c * S + j]);
          mx[j] = std::max(mx[j], v);
          if (eps > 0) wx[j] += w[c] * double(v);
        }
      for (int64_t c = 0; c < C; ++c)
        for (int64_t j = 0; j < nc; ++j)
          sm[j] += double(std::exp(cast<A>(xp[base + c * S + j]) - mx[j]));
      for (int64_t j = 0; j < nc; ++j) {
        const int64_t i = nn * S + j0 + j;
        const double l = double(mx[j]) + std::log(sm[j]);
        (*lse)[i] = l;
        const int64_t t = ct.t[i];
        if (t == ignore) continue;
        const double xt = double(cast<A>(xp[base + t * S + j]));
        double loss = (1.0 - eps) * w[t] * (l - xt);
        if (eps > 0) loss += eps / static_cast<double>(C) * (W * l - wx[j]);
        losses[i] = loss;
      }
    });
  });
  Tensor out = reduce_losses(losses, unbatched ? Shape{} : target.shape(), opts.reduction, total_w,
                             logits.dtype());

  autograd::record(
      op, {logits_in}, {out},
      [xc, lse, tv = std::move(ct.t), w, W, total_w, eps, ignore, s, red = opts.reduction,
       in_shape = logits_in.shape(), li = logits_in, target = target_in.detach(),
       weight = opts.weight, out_shape = out.shape()](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())
          return class_loss_grad(li, target, weight, ignore, eps, red,
                                 scalar_tensor(total_w, TensorOptions(DType::f64)), true, out_shape,
                                 g[0]);
        const int64_t C = s.L, S = s.inner;
        const std::vector<double> gs = sample_grads(g[0], tv.size(), red, total_w);
        Tensor dx = empty(xc.shape(), xc.options());
        dispatch_floating(xc.dtype(), "cross_entropy_backward", [&]<class T>() {
          using A = acc_t<T>;
          const T* xp = xc.data<T>();
          T* dp = dx.data<T>();
          const double es = eps / static_cast<double>(C);
          for_line_blocks(s, [&](int64_t base, int64_t nc) {
            const int64_t nn = base / (C * S), j0 = base % (C * S);
            for (int64_t j = 0; j < nc; ++j) {
              const int64_t i = nn * S + j0 + j;
              const int64_t t = tv[i];
              if (t == ignore || gs[i] == 0.0) {
                for (int64_t c = 0; c < C; ++c) dp[base + c * S + j] = T(0);
                continue;
              }
              // d loss / d x_c = p_c * ((1-eps) w_t + eps/C W) - ((1-eps) w_t [c == t] + eps/C w_c)
              const double pscale = ((1.0 - eps) * w[t] + es * W) * gs[i];
              const A l = static_cast<A>((*lse)[i]);
              for (int64_t c = 0; c < C; ++c) {
                const int64_t k = base + c * S + j;
                double v = pscale * double(std::exp(cast<A>(xp[k]) - l)) - es * w[c] * gs[i];
                if (c == t) v -= (1.0 - eps) * w[t] * gs[i];
                dp[k] = cast<T>(v);
              }
            }
          });
        });
        return std::vector<Tensor>{dx.reshape(in_shape)};
      },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NLLLossOptions& opts) {
  DLTRAIN_OP_SCOPE("nll_loss", log_probs, target);
  if (auto ac =
          amp::detail::autocast_args(amp::Op::nll_loss, {&log_probs, &target, &opts.weight})) {
    NLLLossOptions o = opts;
    o.weight = (*ac)[2];
    return nll_loss((*ac)[0], (*ac)[1], o);
  }
  const char* op = "nll_loss";
  detail::check_defined(op, log_probs, "input");
  detail::check_defined(op, target, "target");
  check_class_weight_no_grad(op, opts.weight);
  if (log_probs.device().is_cuda() || target.device().is_cuda())
    return nll_loss_cuda(log_probs, target, opts);
  ClassTargets ct = class_targets(op, log_probs, target, opts.ignore_index, opts.weight);
  const int64_t C = ct.C, S = ct.S, n = ct.N * S;
  const std::vector<double> w = opts.weight.defined()
                                    ? opts.weight.detach().to_vector<double>()
                                    : std::vector<double>(static_cast<size_t>(C), 1.0);
  const int64_t ignore = opts.ignore_index;
  double total_w = 0;
  std::vector<double> losses(static_cast<size_t>(n), 0.0);
  Tensor xc = log_probs.detach().contiguous();
  dispatch_floating(xc.dtype(), op, [&]<class T>() {
    const T* xp = xc.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = ct.t[i];
      if (t == ignore) continue;
      total_w += w[t];
      losses[i] = -w[t] * double(cast<acc_t<T>>(xp[((i / S) * C + t) * S + i % S]));
    }
  });
  Tensor out = reduce_losses(losses, target.shape(), opts.reduction, total_w, log_probs.dtype());
  autograd::record(
      op, {log_probs}, {out},
      [tv = std::move(ct.t), w, C, S, ignore, total_w, red = opts.reduction,
       shape = log_probs.shape(), opt = log_probs.options(), li = log_probs,
       target = target.detach(), weight = opts.weight,
       out_shape = out.shape()](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())
          return class_loss_grad(li, target, weight, ignore, 0.0, red,
                                 scalar_tensor(total_w, TensorOptions(DType::f64)), false,
                                 out_shape, g[0]);
        const std::vector<double> gs = sample_grads(g[0], tv.size(), red, total_w);
        Tensor dx = zeros(shape, opt);
        dispatch_floating(opt.dtype, "nll_loss_backward", [&]<class T>() {
          T* dp = dx.data<T>();
          for (size_t i = 0; i < tv.size(); ++i) {
            const int64_t t = tv[i], ii = static_cast<int64_t>(i);
            if (t == ignore) continue;
            dp[((ii / S) * C + t) * S + ii % S] = cast<T>(-w[t] * gs[i]);
          }
        });
        return std::vector<Tensor>{dx};
      },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  DLTRAIN_OP_SCOPE("mse_loss", input, target);
  if (auto ac = amp::detail::autocast_args(amp::Op::mse_loss, {&input, &target}))
    return mse_loss((*ac)[0], (*ac)[1], reduction);
  const char* op = "mse_loss";
  detail::check_defined(op, input, "input");
  detail::check_defined(op, target, "target");
  detail::check_same_device(op, {&input, &target});
  DLTRAIN_CHECK(is_floating(input.dtype()) && is_floating(target.dtype()), op,
                ": input and target must be floating-point but have dtypes ", input.dtype(),
                " and ", target.dtype(), "; convert them with .to(DType::f32)");
  detail::check_loss_target_shape(op, input, target);
  Tensor d = sub(input, target);
  return reduce(mul(d, d), reduction);
}

namespace {

// The loss without its rescaling weight: what binary_cross_entropy_with_logits computes.
Tensor bce_with_logits(const Tensor& logits, const Tensor& target, Reduction reduction,
                       const Tensor& pos_weight) {
  DLTRAIN_OP_SCOPE("binary_cross_entropy_with_logits", logits, target, pos_weight);
  if (auto ac = amp::detail::autocast_args(amp::Op::binary_cross_entropy_with_logits,
                                           {&logits, &target, &pos_weight}))
    return bce_with_logits((*ac)[0], (*ac)[1], reduction, (*ac)[2]);
  const char* op = "binary_cross_entropy_with_logits";
  detail::check_defined(op, logits, "input");
  detail::check_defined(op, target, "target");
  detail::check_same_device(op, {&logits, &target, &pos_weight});
  DLTRAIN_CHECK(is_floating(logits.dtype()) && is_floating(target.dtype()), op,
                ": input and target must be floating-point but have dtypes ", logits.dtype(),
                " and ", target.dtype(), "; convert the target with .to(DType::f32)");
  detail::check_loss_target_shape(op, logits, target);
  if (pos_weight.defined()) {
    DLTRAIN_CHECK(is_floating(pos_weight.dtype()), op,
                  ": pos_weight must be floating-point but has dtype ", pos_weight.dtype());
    DLTRAIN_CHECK(broadcast_shapes(logits.shape(), pos_weight.shape(), op) == logits.shape(), op,
                  ": pos_weight of shape ", shape_str(pos_weight.shape()),
                  " does not broadcast to the input shape ", shape_str(logits.shape()),
                  "; pass one weight per class, shape [C]");
  }
  const DType dt = logits.dtype();
  Tensor x = logits.detach();
  Tensor y = target.dtype() == dt ? target.detach() : target.detach().to(dt);
  Tensor pw = pos_weight.defined()
                  ? (pos_weight.dtype() == dt ? pos_weight.detach() : pos_weight.detach().to(dt))
                  : scalar_tensor(1.0, TensorOptions(dt).with_device(logits.device()));
  Tensor out = bce_elementwise(x, y, pw);
  autograd::record(
      op, {logits, target, pos_weight}, {out},
      [x, y, pw, tdt = target.dtype(), pdt = pw.dtype(), pshape = pw.shape(),
       rx = logits.requires_grad(), ry = target.requires_grad(),
       rp = pos_weight.defined() && pos_weight.requires_grad(), li = logits, ti = target,
       pi = pos_weight](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled()) {
          // create_graph: (1 - y) x + (1 + (pw - 1) y) softplus(-x), with ops.
          return autograd::grad_by_recompute(
              [](const std::vector<Tensor>& in) {
                const DType dt = in[0].dtype();
                const Tensor yv = in[1].to(dt);
                const Tensor pv =
                    in[2].defined() ? in[2].to(dt) : scalar_tensor(1.0, in[0].options());
                const Tensor lw = add(mul(sub(pv, 1.0), yv), 1.0);
                return std::vector<Tensor>{
                    add(mul(1.0 - yv, in[0]), mul(lw, softplus(neg(in[0]))))};
              },
              {li, ti, pi}, g);
        }
        Tensor gx, gy, gp;
        Tensor sp = softplus_neg_tensor(x);  // log(1 + exp(-x))
        Tensor pm1 = sub(pw, 1.0);
        if (rx) {
          // d/dx = (1 - y) - (1 + (pw - 1) y) * sigmoid(-x)
          Tensor lw = add(mul(pm1, y), 1.0);
          gx = mul(g[0], sub(1.0 - y, mul(lw, sigmoid(neg(x)))));
        }
        if (ry) gy = mul(g[0], sub(mul(pm1, sp), x)).to(tdt);
        if (rp) gp = sum_to(mul(g[0], mul(y, sp)), pshape).to(pdt);
        return std::vector<Tensor>{gx, gy, gp};
      },
      autograd::HigherOrder::Supported);
  return reduce(out, reduction);
}

}  // namespace

Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        const BinaryCrossEntropyOptions& options) {
  const Tensor& w = options.weight;
  if (!w.defined()) return bce_with_logits(logits, target, options.reduction, options.pos_weight);
  const char* op = "binary_cross_entropy_with_logits";
  detail::check_defined(op, logits, "input");
  detail::check_same_device(op, {&logits, &w});
  DLTRAIN_CHECK(is_floating(w.dtype()), op, ": weight must be floating-point but has dtype ",
                w.dtype());
  DLTRAIN_CHECK(broadcast_shapes(logits.shape(), w.shape(), op) == logits.shape(), op,
                ": weight of shape ", shape_str(w.shape()),
                " does not broadcast to the input shape ", shape_str(logits.shape()));
  const Tensor pointwise = bce_with_logits(logits, target, Reduction::None, options.pos_weight);
  return reduce(mul(pointwise, w), options.reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        Reduction reduction, const Tensor& pos_weight) {
  return bce_with_logits(logits, target, reduction, pos_weight);
}

}  // namespace dltrain
