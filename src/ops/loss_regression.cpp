// Regression and distribution losses: l1, smooth_l1, huber, kl_div, binary_cross_entropy and
// gaussian_nll, each composed from differentiable elementwise ops and one reduction (as
// mse_loss), so they run on every device and their gradients are those ops' own. The
// formulas, edge rules (xlogy's 0 log 0 = 0, BCE's log clamp at -100, GaussianNLL's
// pass-through clamp of var at eps) and reductions follow torch.nn.functional; range checks
// that need the values (BCE's [0, 1], GaussianNLL's var >= 0) run on the CPU only, since on
// CUDA they would synchronise the host.
#include <cmath>
#include <numbers>

#include "dltrain/autograd/node.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/loss.hpp"
#include "dltrain/ops/reduction.hpp"
#include "src/core/trace.hpp"
#include "src/ops/common.hpp"

namespace dltrain {

namespace {

Tensor reduce(const Tensor& t, Reduction r) {
  switch (r) {
    case Reduction::None:
      return t;
    case Reduction::Sum:
      return sum(t);
    case Reduction::Mean:
      return mean(t);
  }
  return t;
}

void check_pair(const char* op, const Tensor& input, const Tensor& target) {
  detail::check_defined(op, input, "input");
  detail::check_defined(op, target, "target");
  detail::check_same_device(op, {&input, &target});
  DLTRAIN_CHECK(is_floating(input.dtype()) && is_floating(target.dtype()), op,
                ": input and target must be floating-point but have dtypes ", input.dtype(),
                " and ", target.dtype(), "; convert them with .to(DType::f32)");
  detail::check_loss_target_shape(op, input, target);
}

}  // namespace

Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  DLTRAIN_OP_SCOPE("l1_loss", input, target);
  if (auto ac = amp::detail::autocast_args(amp::Op::l1_loss, {&input, &target}))
    return l1_loss((*ac)[0], (*ac)[1], reduction);
  check_pair("l1_loss", input, target);
  return reduce(abs(sub(input, target)), reduction);
}

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction, double beta) {
  DLTRAIN_OP_SCOPE("smooth_l1_loss", input, target);
  if (auto ac = amp::detail::autocast_args(amp::Op::smooth_l1_loss, {&input, &target}))
    return smooth_l1_loss((*ac)[0], (*ac)[1], reduction, beta);
  check_pair("smooth_l1_loss", input, target);
  DLTRAIN_CHECK(beta >= 0, "smooth_l1_loss: beta must be non-negative but got ", beta);
  const Tensor d = abs(sub(input, target));
  if (beta == 0) return reduce(d, reduction);
  return reduce(where(lt(d, beta), mul(mul(d, d), 0.5 / beta), sub(d, 0.5 * beta)), reduction);
}

Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction, double delta) {
  DLTRAIN_OP_SCOPE("huber_loss", input, target);
  if (auto ac = amp::detail::autocast_args(amp::Op::huber_loss, {&input, &target}))
    return huber_loss((*ac)[0], (*ac)[1], reduction, delta);
  check_pair("huber_loss", input, target);
  DLTRAIN_CHECK(delta > 0, "huber_loss: delta must be positive but got ", delta);
  const Tensor d = abs(sub(input, target));
  return reduce(where(lt(d, delta), mul(mul(d, d), 0.5), mul(sub(d, 0.5 * delta), delta)),
                reduction);
}

Tensor kl_div(const Tensor& input, const Tensor& target, KLDivReduction reduction,
              bool log_target) {
  DLTRAIN_OP_SCOPE("kl_div", input, target);
  if (auto ac = amp::detail::autocast_args(amp::Op::kl_div, {&input, &target}))
    return kl_div((*ac)[0], (*ac)[1], reduction, log_target);
  check_pair("kl_div", input, target);
  Tensor pointwise;
  if (log_target) {
    pointwise = mul(exp(target), sub(target, input));
  } else {
    // xlogy(t, t) - t * input; log of 1 where t == 0 so that neither the value nor the
    // gradient sees 0 * log 0.
    const Tensor positive = gt(target, 0.0);
    const Tensor safe = where(positive, target, ones_like(target.detach()));
    pointwise = sub(mul(target, log(safe)), mul(target, input));
  }
  switch (reduction) {
    case KLDivReduction::None:
      return pointwise;
    case KLDivReduction::Sum:
      return sum(pointwise);
    case KLDivReduction::Mean:
      return mean(pointwise);
    case KLDivReduction::BatchMean:
      DLTRAIN_CHECK(input.dim() >= 1 && input.size(0) > 0,
                    "kl_div: batchmean divides by the batch size input.size(0), but input has "
                    "shape ",
                    shape_str(input.shape()), "; use Sum or Mean");
      return div(sum(pointwise), static_cast<double>(input.size(0)));
  }
  return pointwise;
}

Tensor binary_cross_entropy(const Tensor& input, const Tensor& target,
                            const BinaryCrossEntropyOptions& options) {
  const Tensor& weight = options.weight;
  const Reduction reduction = options.reduction;
  DLTRAIN_OP_SCOPE("binary_cross_entropy", input, target, weight);
  const char* op = "binary_cross_entropy";
  DLTRAIN_CHECK(!options.pos_weight.defined(), op,
                ": pos_weight applies to binary_cross_entropy_with_logits only (as in PyTorch); "
                "pass the logits to that, or drop pos_weight");
  if (auto ac =
          amp::detail::autocast_args(amp::Op::binary_cross_entropy, {&input, &target, &weight}))
    return binary_cross_entropy((*ac)[0], (*ac)[1], {.reduction = reduction, .weight = (*ac)[2]});
  detail::check_defined(op, input, "input");
  detail::check_defined(op, target, "target");
  check_pair(op, input, target);
  detail::check_same_device(op, {&input, &weight});
  if (weight.defined())
    DLTRAIN_CHECK(broadcast_shapes(input.shape(), weight.shape(), op) == input.shape(), op,
                  ": weight of shape ", shape_str(weight.shape()),
                  " does not broadcast to the input shape ", shape_str(input.shape()));
  if (input.device().is_cpu() && input.numel() > 0) {
    NoGradGuard ng;
    const double lo = min(input).item<double>(), hi = max(input).item<double>();
    DLTRAIN_CHECK(lo >= 0 && hi <= 1, op, ": input holds probabilities in [0, 1] but ranges over [",
                  lo, ", ", hi,
                  "]; apply sigmoid first, or use binary_cross_entropy_with_logits on the logits");
  }
  const Tensor log_p = clamp(log(input), -100.0, std::nullopt);
  const Tensor log_q = clamp(log(1.0 - input), -100.0, std::nullopt);
  Tensor loss = neg(add(mul(target, log_p), mul(1.0 - target, log_q)));
  if (weight.defined()) loss = mul(loss, weight);
  return reduce(loss, reduction);
}

Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight,
                            Reduction reduction) {
  return binary_cross_entropy(input, target, {.reduction = reduction, .weight = weight});
}

Tensor gaussian_nll_loss(const Tensor& input, const Tensor& target, const Tensor& var, bool full,
                         double eps, Reduction reduction) {
  DLTRAIN_OP_SCOPE("gaussian_nll_loss", input, target, var);
  if (auto ac = amp::detail::autocast_args(amp::Op::gaussian_nll_loss, {&input, &target, &var}))
    return gaussian_nll_loss((*ac)[0], (*ac)[1], (*ac)[2], full, eps, reduction);
  const char* op = "gaussian_nll_loss";
  check_pair(op, input, target);
  detail::check_defined(op, var, "var");
  detail::check_same_device(op, {&input, &var});
  DLTRAIN_CHECK(is_floating(var.dtype()), op, ": var must be floating-point but has dtype ",
                var.dtype());
  DLTRAIN_CHECK(eps >= 0, op, ": eps must be non-negative but got ", eps);
  Tensor v = var;
  if (var.shape() != input.shape()) {
    const Shape& is = input.shape();
    const Shape lead(is.begin(), is.end() - (is.empty() ? 0 : 1));
    if (!is.empty() && var.shape() == lead) {
      v = var.unsqueeze(-1);  // one variance per sample, heteroscedastic over the last dim
    } else {
      DLTRAIN_CHECK(!is.empty() && var.dim() == input.dim() && var.size(-1) == 1 &&
                        Shape(var.shape().begin(), var.shape().end() - 1) == lead,
                    op, ": var of shape ", shape_str(var.shape()), " fits neither input ",
                    shape_str(is), " nor its shape without the last dim nor with a last dim of 1");
    }
  }
  if (var.device().is_cpu() && var.numel() > 0) {
    NoGradGuard ng;
    DLTRAIN_CHECK(min(var).item<double>() >= 0, op,
                  ": var has negative entries; variances must be >= 0 (predict log-variances "
                  "and exp them, or pass softplus(raw))");
  }
  // Clamp below at eps in value only: the gradient passes through unchanged.
  v = add(v, sub(clamp(v.detach(), eps, std::nullopt), v.detach()));
  const Tensor d = sub(input, target);
  Tensor loss = mul(add(log(v), div(mul(d, d), v)), 0.5);
  if (full) loss = add(loss, 0.5 * std::log(2 * std::numbers::pi));
  return reduce(loss, reduction);
}

}  // namespace dltrain
