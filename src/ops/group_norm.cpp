// group_norm and instance_norm with PyTorch's semantics. On the CPU group_norm is one kernel
// each way (below: per (sample, group) statistics in double, one pass writing the output; the
// standard backward with per-(sample, channel) partial sums for the parameter gradients); on
// CUDA it is composed from reductions and elementwise ops (a fused kernel is the follow-up).
// instance_norm is group_norm with one channel per group. Semantics: biased
// variance for normalising, eps inside the square root, per-channel affine after; instance
// norm's running statistics (when given) are updated with the batch mean of the per-instance
// means and unbiased variances, as torch's instance_norm (batch_norm on a [1, N*C, ...] view)
// does. 16-bit inputs compute in f32 (statistics and affine) and round once; the output has
// the input's dtype and memory format.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/norm.hpp"
#include "dltrain/ops/reduction.hpp"
#include "src/core/trace.hpp"
#include "src/ops/common.hpp"

namespace dltrain {

namespace {

// [1, C, 1, ...] view of a per-channel tensor for x of rank nd.
Tensor channel_view(const Tensor& t, int64_t C, int64_t nd) {
  Shape s(static_cast<size_t>(nd), 1);
  s[1] = C;
  return t.view(s);
}

void check_affine(const char* op, const Tensor& t, const char* name, int64_t C) {
  DLTRAIN_CHECK(!t.defined() || (t.dim() == 1 && t.size(0) == C), op, ": ", name, " must be [", C,
                "] (one per channel) but has shape ",
                t.defined() ? shape_str(t.shape()) : std::string());
}

Tensor affine(Tensor y, const Tensor& weight, const Tensor& bias, int64_t C, int64_t nd) {
  if (weight.defined()) y = mul(y, channel_view(weight, C, nd));
  if (bias.defined()) y = add(y, channel_view(bias, C, nd));
  return y;
}

MemoryFormat format_of(const Tensor& x) {
  return x.dim() == 4 ? x.suggest_memory_format() : MemoryFormat::Contiguous;
}

// group_norm written with differentiable ops: the CUDA path, and the reference that the CPU
// kernel's create_graph backward differentiates.
Tensor group_norm_composite(const Tensor& x, int64_t G, const Tensor& weight, const Tensor& bias,
                            double eps) {
  const DType dt = x.dtype();
  const bool low = dt == DType::f16 || dt == DType::bf16;
  const Tensor xc = low ? x.to(DType::f32) : x;
  const Tensor g = xc.reshape({x.size(0), G, -1});
  const Tensor mu = mean(g, {2}, true);
  const Tensor d = sub(g, mu);
  const Tensor var = mean(mul(d, d), {2}, true);
  Tensor y = mul(d, rsqrt(add(var, eps))).reshape(x.shape());
  // The affine part in the compute type too, so the output has x's dtype whatever the
  // parameters' (an f16 activation with f32 parameters, as batch_norm).
  const DType ct = xc.dtype();
  y = affine(y, weight.defined() && weight.dtype() != ct ? weight.to(ct) : weight,
             bias.defined() && bias.dtype() != ct ? bias.to(ct) : bias, x.size(1), x.dim());
  if (y.dtype() != dt) y = y.to(dt);
  const MemoryFormat fmt = format_of(x);
  return y.suggest_memory_format() == fmt ? y : y.contiguous(fmt);
}

// The CPU kernels: x contiguous [N, C, S] in T (float or double), one (n, group) of
// D = C/G * S elements per work item; sums in double. mean/rstd [N*G] are written by forward
// and read by backward. w, b may be null (no affine).
template <class T>
void gn_forward_cpu(const T* x, const T* w, const T* b, T* y, double* mean_out, double* rstd_out,
                    int64_t N, int64_t C, int64_t S, int64_t G, double eps) {
  const int64_t Cg = C / G, D = Cg * S;
  parallel_for(0, N * G, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t ng = lo; ng < hi; ++ng) {
      const T* p = x + ng * D;
      double s = 0;
      for (int64_t i = 0; i < D; ++i) s += p[i];
      const double mu = D > 0 ? s / static_cast<double>(D) : 0.0;
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += (p[i] - mu) * (p[i] - mu);
      const double r = 1.0 / std::sqrt((D > 0 ? ss / static_cast<double>(D) : 0.0) + eps);
      mean_out[ng] = mu;
      rstd_out[ng] = r;
      const int64_t c0 = (ng % G) * Cg;
      for (int64_t c = 0; c < Cg; ++c) {
        const T sc = static_cast<T>(r * (w ? static_cast<double>(w[c0 + c]) : 1.0));
        const T sh = static_cast<T>((b ? static_cast<double>(b[c0 + c]) : 0.0) -
                                    mu * static_cast<double>(sc));
        const T* pc = p + c * S;
        T* yc = y + ng * D + c * S;
        for (int64_t i = 0; i < S; ++i) yc[i] = pc[i] * sc + sh;
      }
    }
  });
}

// gx (may be null), and per-(n, c) partial sums of gy * xhat and gy into pw, pb [N*C] (null
// when not needed).
template <class T>
void gn_backward_cpu(const T* x, const T* w, const T* gy, const double* mean, const double* rstd,
                     T* gx, double* pw, double* pb, int64_t N, int64_t C, int64_t S, int64_t G) {
  const int64_t Cg = C / G, D = Cg * S;
  parallel_for(0, N * G, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t ng = lo; ng < hi; ++ng) {
      const int64_t n = ng / G, c0 = (ng % G) * Cg;
      const double mu = mean[ng], r = rstd[ng];
      double s1 = 0, s2 = 0;  // sum of gxhat and of gxhat * xhat over the group
      for (int64_t c = 0; c < Cg; ++c) {
        const T* xc = x + ng * D + c * S;
        const T* gc = gy + ng * D + c * S;
        const double wc = w ? static_cast<double>(w[c0 + c]) : 1.0;
        double sg = 0, sgx = 0;
        for (int64_t i = 0; i < S; ++i) {
          const double xh = (xc[i] - mu) * r;
          sg += gc[i];
          sgx += gc[i] * xh;
        }
        if (pw) pw[n * C + c0 + c] = sgx;
        if (pb) pb[n * C + c0 + c] = sg;
        s1 += wc * sg;
        s2 += wc * sgx;
      }
      if (!gx) continue;
      const double m1 = s1 / static_cast<double>(D), m2 = s2 / static_cast<double>(D);
      for (int64_t c = 0; c < Cg; ++c) {
        const T* xc = x + ng * D + c * S;
        const T* gc = gy + ng * D + c * S;
        T* oc = gx + ng * D + c * S;
        const double wc = w ? static_cast<double>(w[c0 + c]) : 1.0;
        for (int64_t i = 0; i < S; ++i) {
          const double xh = (xc[i] - mu) * r;
          oc[i] = static_cast<T>(r * (wc * gc[i] - m1 - xh * m2));
        }
      }
    }
  });
}

// group_norm of a CPU tensor through the kernels above, with its node.
Tensor group_norm_cpu(const Tensor& x, int64_t G, const Tensor& weight, const Tensor& bias,
                      double eps) {
  const DType dt = x.dtype();
  const DType ct = dt == DType::f64 ? DType::f64 : DType::f32;
  const int64_t N = x.size(0), C = x.size(1), S = N * C > 0 ? x.numel() / (N * C) : 0;
  const Tensor xc = x.detach().to(ct).contiguous();
  const Tensor wc = weight.defined() ? weight.detach().to(ct).contiguous() : Tensor();
  const Tensor bc = bias.defined() ? bias.detach().to(ct).contiguous() : Tensor();
  Tensor y = empty(x.shape(), TensorOptions(ct));
  Tensor mean = empty({N * G}, TensorOptions(DType::f64));
  Tensor rstd = empty({N * G}, TensorOptions(DType::f64));
  dispatch_floating(ct, "group_norm", [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
      gn_forward_cpu<T>(xc.data<T>(), wc.defined() ? wc.data<T>() : nullptr,
                        bc.defined() ? bc.data<T>() : nullptr, y.data<T>(), mean.data<double>(),
                        rstd.data<double>(), N, C, S, G, eps);
  });
  const MemoryFormat fmt = format_of(x);
  if (ct != dt) y = y.to(dt);
  if (fmt != MemoryFormat::Contiguous) y = y.contiguous(fmt);
  const bool rx = x.requires_grad(), rw = weight.defined() && weight.requires_grad(),
             rb = bias.defined() && bias.requires_grad();
  autograd::record(
      "group_norm", {x, weight, bias}, {y},
      [xs = autograd::SavedInput(x, xc), wi = weight, bi = bias, eps, xc, wc, mean, rstd, N, C, S,
       G, dt, ct, fmt, wdt = weight.defined() ? weight.dtype() : dt,
       bdt = bias.defined() ? bias.dtype() : dt, rx, rw, rb](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())
          return autograd::grad_by_recompute(
              [G, eps](const std::vector<Tensor>& in) {
                return std::vector<Tensor>{group_norm_composite(in[0], G, in[1], in[2], eps)};
              },
              {xs.get(), wi, bi}, {g[0]});

        const Tensor gy = g[0].to(ct).contiguous();
        Tensor gx, pw, pb;
        if (rx) gx = empty({N, C, S}, TensorOptions(ct));
        if (rw) pw = empty({N, C}, TensorOptions(DType::f64));
        if (rb) pb = empty({N, C}, TensorOptions(DType::f64));
        dispatch_floating(ct, "group_norm_backward", [&]<class T>() {
          if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
            gn_backward_cpu<T>(xc.data<T>(), wc.defined() ? wc.data<T>() : nullptr, gy.data<T>(),
                               mean.data<double>(), rstd.data<double>(),
                               rx ? gx.data<T>() : nullptr, rw ? pw.data<double>() : nullptr,
                               rb ? pb.data<double>() : nullptr, N, C, S, G);
        });
        Tensor gxo, gwo, gbo;
        if (rx) {
          gxo = gx.view(xc.shape()).to(dt);
          if (fmt != MemoryFormat::Contiguous) gxo = gxo.contiguous(fmt);
        }
        if (rw) gwo = sum(pw, {0}).to(wdt);
        if (rb) gbo = sum(pb, {0}).to(bdt);
        return std::vector<Tensor>{gxo, gwo, gbo};
      },
      autograd::HigherOrder::Supported);
  return y;
}

}  // namespace

Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                  double eps) {
  DLTRAIN_OP_SCOPE("group_norm", x, weight, bias);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x, weight, bias}, {{"num_groups", num_groups}, {"eps", eps}},
                                  [&] { return group_norm(x, num_groups, weight, bias, eps); });
    });
  if (auto ac = amp::detail::autocast_args(amp::Op::group_norm, {&x, &weight, &bias}))
    return group_norm((*ac)[0], num_groups, (*ac)[1], (*ac)[2], eps);
  const char* op = "group_norm";
  detail::check_defined(op, x, "input");
  detail::check_same_device(op, {&x, &weight, &bias});
  DLTRAIN_CHECK(x.dim() >= 2, "group_norm: expected an input [N, C, ...] but got shape ",
                shape_str(x.shape()));
  DLTRAIN_CHECK(is_floating(x.dtype()), "group_norm: input must be floating point but is ",
                x.dtype());
  const int64_t C = x.size(1);
  DLTRAIN_CHECK(num_groups > 0 && C % num_groups == 0, "group_norm: ", C, " channels of input ",
                shape_str(x.shape()), " are not divisible by num_groups (", num_groups, ")");
  check_affine(op, weight, "weight", C);
  check_affine(op, bias, "bias", C);
  if (x.device().is_cpu()) return group_norm_cpu(x, num_groups, weight, bias, eps);
  return group_norm_composite(x, num_groups, weight, bias, eps);
}

Tensor instance_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& weight, const Tensor& bias, bool use_input_stats,
                     double momentum, double eps) {
  DLTRAIN_OP_SCOPE("instance_norm", x, running_mean, running_var, weight, bias);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x, running_mean, running_var, weight, bias},
                                  {{"use_input_stats", use_input_stats}, {"eps", eps}}, [&] {
                                    return instance_norm(x, running_mean, running_var, weight, bias,
                                                         use_input_stats, momentum, eps);
                                  });
    });
  const char* op = "instance_norm";
  detail::check_defined(op, x, "input");
  detail::check_same_device(op, {&x, &running_mean, &running_var, &weight, &bias});
  DLTRAIN_CHECK(x.dim() >= 3,
                "instance_norm: expected an input [N, C, *] with spatial dims "
                "but got shape ",
                shape_str(x.shape()), "; add a batch dim with unsqueeze(0)");
  const int64_t N = x.size(0), C = x.size(1), nd = x.dim();
  DLTRAIN_CHECK(running_mean.defined() == running_var.defined(),
                "instance_norm: give both running_mean and running_var or neither");
  check_affine(op, running_mean, "running_mean", C);
  check_affine(op, running_var, "running_var", C);
  if (!use_input_stats) {
    DLTRAIN_CHECK(running_mean.defined(),
                  "instance_norm: use_input_stats = false needs running statistics");
    const Tensor rm = channel_view(running_mean.to(x.dtype()), C, nd);
    const Tensor rv = channel_view(running_var.to(x.dtype()), C, nd);
    return affine(mul(sub(x, rm), rsqrt(add(rv, eps))), weight, bias, C, nd);
  }
  if (running_mean.defined()) {
    NoGradGuard ng;
    const int64_t L = x.numel() / std::max<int64_t>(N * C, 1);
    DLTRAIN_CHECK(L > 1, "instance_norm: each instance of input ", shape_str(x.shape()),
                  " has one value, so its variance is undefined; use more spatial positions or "
                  "no running statistics");
    const Tensor g = x.detach().to(running_mean.dtype()).reshape({N, C, -1});
    const Tensor mu = mean(g, {2}, true);
    const Tensor d = sub(g, mu);
    const Tensor uvar = div(sum(mul(d, d), {2}), static_cast<double>(L - 1));  // [N, C]
    Tensor rm = running_mean, rv = running_var;
    rm.copy_(add(mul(rm, 1.0 - momentum), mul(mean(mu.squeeze(2), {0}), momentum)));
    rv.copy_(add(mul(rv, 1.0 - momentum), mul(mean(uvar, {0}), momentum)));
  }
  return group_norm(x, C, weight, bias, eps);
}

}  // namespace dltrain
