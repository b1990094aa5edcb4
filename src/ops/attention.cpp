// Scaled dot-product attention composed of differentiable ops: query scaled, one matmul for the
// scores, the mask applied (masked_fill with -inf for a bool mask, add for a float one), softmax
// over the keys, optional dropout, one matmul with the values. Each step records its own node,
// so the gradient (and the double backward the engine is gaining) needs no code here, and every
// device and autocast rule of matmul/softmax applies unchanged.
//
// The query is scaled before the product (as PyTorch's nn.MultiheadAttention does): L * E
// multiplications instead of L * S, and the same rounding as PyTorch's reference path.
#include "dltrain/ops/attention.hpp"

#include <cmath>
#include <limits>
#include <string>

#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/linalg.hpp"
#include "dltrain/ops/loss.hpp"
#include "src/core/trace.hpp"
#include "src/ops/common.hpp"

namespace dltrain {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

// The scores' shape [..., L, S] after broadcasting the batch dims of query and key (value's
// batch dims are checked against it too).
Shape check_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                 double dropout_p, bool is_causal) {
  detail::check_defined(kOp, q, "query");
  detail::check_defined(kOp, k, "key");
  detail::check_defined(kOp, v, "value");
  detail::check_same_device(kOp, {&q, &k, &v, &mask});
  DLTRAIN_CHECK(is_floating(q.dtype()) && k.dtype() == q.dtype() && v.dtype() == q.dtype(), kOp,
                ": query, key and value must share one floating dtype but have ", q.dtype(), ", ",
                k.dtype(), " and ", v.dtype(), "; convert them with .to(dtype)");
  DLTRAIN_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, kOp,
                ": query [..., L, E], key [..., S, E] and value [..., S, Ev] need at least 2 dims "
                "but have shapes ",
                shape_str(q.shape()), ", ", shape_str(k.shape()), " and ", shape_str(v.shape()),
                "; add a sequence dim with unsqueeze");
  DLTRAIN_CHECK(q.size(-1) == k.size(-1), kOp, ": query ", shape_str(q.shape()), " and key ",
                shape_str(k.shape()), " must have the same embedding size E in their last dim (",
                q.size(-1), " vs ", k.size(-1), ")");
  DLTRAIN_CHECK(k.size(-2) == v.size(-2), kOp, ": key ", shape_str(k.shape()), " and value ",
                shape_str(v.shape()),
                " must have the same number of keys S in their second to last dim (", k.size(-2),
                " vs ", v.size(-2), ")");
  DLTRAIN_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, kOp, ": dropout_p must be in [0, 1) but is ",
                dropout_p);
  DLTRAIN_CHECK(!(is_causal && mask.defined()), kOp,
                ": attn_mask and is_causal = true were both given; pass one (combine a causal "
                "mask into attn_mask with logical_and(attn_mask, causal_mask(L, S)))");
  const Shape bq(q.shape().begin(), q.shape().end() - 2),
      bk(k.shape().begin(), k.shape().end() - 2), bv(v.shape().begin(), v.shape().end() - 2);
  Shape batch;
  try {
    batch = broadcast_shapes(broadcast_shapes(bq, bk, kOp), bv, kOp);
  } catch (const Error&) {
    DLTRAIN_FAIL(kOp, ": the leading (batch) dims of query ", shape_str(q.shape()), ", key ",
                 shape_str(k.shape()), " and value ", shape_str(v.shape()),
                 " do not broadcast; give them equal batch/head dims (or 1 where shared)");
  }
  Shape scores = batch;
  scores.push_back(q.size(-2));
  scores.push_back(k.size(-2));
  if (mask.defined()) {
    DLTRAIN_CHECK(mask.dtype() == DType::b8 || mask.dtype() == q.dtype(), kOp,
                  ": attn_mask must be bool (true = takes part) or of the query's dtype ",
                  q.dtype(), " (added to the scores) but has dtype ", mask.dtype(),
                  "; convert it with .to(DType::b8) or .to(", q.dtype(), ")");
    bool ok = mask.dim() <= static_cast<int64_t>(scores.size());
    if (ok) {
      try {
        ok = broadcast_shapes(mask.shape(), scores, kOp) == scores;
      } catch (const Error&) {
        ok = false;
      }
    }
    DLTRAIN_CHECK(ok, kOp, ": attn_mask of shape ", shape_str(mask.shape()),
                  " does not broadcast to the attention scores' shape ", shape_str(scores),
                  " ([..., L, S] with L = query length ", q.size(-2), ", S = key length ",
                  k.size(-2), "); give it shape [L, S] or [..., L, S]");
  }
  return scores;
}

// True where key j must not be seen from query i (j > i), [L, S].
Tensor causal_blocked(int64_t L, int64_t S, Device device) {
  const TensorOptions io = TensorOptions(DType::i64).with_device(device);
  return lt(arange(0.0, static_cast<double>(L), 1.0, io).unsqueeze(1),
            arange(0.0, static_cast<double>(S), 1.0, io).unsqueeze(0));
}

std::pair<Tensor, Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale, Generator* gen) {
  check_args(q, k, v, mask, dropout_p, is_causal);
  const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  const double ninf = -std::numeric_limits<double>::infinity();
  Tensor scores = matmul(s == 1.0 ? q : mul(q, s), k.transpose(-2, -1));
  if (is_causal) {
    scores = masked_fill(scores, causal_blocked(q.size(-2), k.size(-2), q.device()), ninf);
  } else if (mask.defined()) {
    if (mask.dtype() == DType::b8)
      scores = masked_fill(scores, logical_not(mask), ninf);
    else
      scores = add(scores, mask.dtype() == scores.dtype() ? mask : mask.to(scores.dtype()));
  }
  Tensor w = softmax(scores, -1);
  if (dropout_p > 0.0) w = dropout(w, dropout_p, /*training=*/true, gen);
  Tensor out = matmul(w.dtype() == v.dtype() ? w : w.to(v.dtype()), v);
  return {out, w};
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale, Generator* gen) {
  DLTRAIN_OP_SCOPE("scaled_dot_product_attention", query, key, value);
  return attention(query, key, value, attn_mask, dropout_p, is_causal, scale, gen).first;
}

std::pair<Tensor, Tensor> scaled_dot_product_attention_with_weights(
    const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& attn_mask,
    double dropout_p, bool is_causal, std::optional<double> scale, Generator* gen) {
  DLTRAIN_OP_SCOPE("scaled_dot_product_attention", query, key, value);
  return attention(query, key, value, attn_mask, dropout_p, is_causal, scale, gen);
}

Tensor causal_mask(int64_t L, int64_t S, Device device) {
  DLTRAIN_CHECK(L >= 0 && S >= 0, "causal_mask: sizes must be >= 0 but are L = ", L, ", S = ", S);
  return logical_not(causal_blocked(L, S, device));
}

}  // namespace dltrain
