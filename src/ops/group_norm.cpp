// group_norm and instance_norm, composed from reductions and elementwise ops (so they run on
// every device and differentiate through those ops), with PyTorch's semantics: biased
// variance for normalising, eps inside the square root, per-channel affine after; instance
// norm's running statistics (when given) are updated with the batch mean of the per-instance
// means and unbiased variances, as torch's instance_norm (batch_norm on a [1, N*C, ...] view)
// does. 16-bit inputs compute in f32 (statistics and affine) and round once; the output has
// the input's dtype and memory format. A fused kernel (one pass for the statistics, one for the
// output) is the follow-up if profiles show these layers.
#include <algorithm>

#include "dltrain/autograd/node.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/norm.hpp"
#include "dltrain/ops/reduction.hpp"
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

}  // namespace

Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                  double eps) {
  if (auto ac = amp::detail::autocast_args(amp::Op::group_norm, {&x, &weight, &bias}))
    return group_norm((*ac)[0], num_groups, (*ac)[1], (*ac)[2], eps);
  const char* op = "group_norm";
  detail::check_defined(op, x, "input");
  detail::check_same_device(op, {&x, &weight, &bias});
  DLTRAIN_CHECK(x.dim() >= 2, "group_norm: expected an input [N, C, ...] but got shape ",
                shape_str(x.shape()));
  DLTRAIN_CHECK(is_floating(x.dtype()), "group_norm: input must be floating point but is ",
                x.dtype());
  const int64_t N = x.size(0), C = x.size(1);
  DLTRAIN_CHECK(num_groups > 0 && C % num_groups == 0, "group_norm: ", C, " channels of input ",
                shape_str(x.shape()), " are not divisible by num_groups (", num_groups, ")");
  check_affine(op, weight, "weight", C);
  check_affine(op, bias, "bias", C);
  const DType dt = x.dtype();
  const bool low = dt == DType::f16 || dt == DType::bf16;
  const Tensor xc = low ? x.to(DType::f32) : x;
  const Tensor g = xc.reshape({N, num_groups, -1});
  const Tensor mu = mean(g, {2}, true);
  const Tensor d = sub(g, mu);
  const Tensor var = mean(mul(d, d), {2}, true);
  Tensor y = mul(d, rsqrt(add(var, eps))).reshape(x.shape());
  // The affine part in the compute type too, so the output has x's dtype whatever the
  // parameters' (an f16 activation with f32 parameters, as batch_norm).
  const DType ct = xc.dtype();
  y = affine(y, weight.defined() && weight.dtype() != ct ? weight.to(ct) : weight,
             bias.defined() && bias.dtype() != ct ? bias.to(ct) : bias, C, x.dim());
  if (y.dtype() != dt) y = y.to(dt);
  const MemoryFormat fmt = format_of(x);
  return y.suggest_memory_format() == fmt ? y : y.contiguous(fmt);
}

Tensor instance_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& weight, const Tensor& bias, bool use_input_stats,
                     double momentum, double eps) {
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
