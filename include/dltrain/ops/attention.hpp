// Scaled dot-product attention, PyTorch's F.scaled_dot_product_attention.
//
// Composed of differentiable ops (matmul, masked_fill/add, softmax, dropout), so it runs on
// every device those ops run on, autocast lowers its two products as it lowers matmul, and
// its gradients (and higher-order ones where the ops have them) come from those ops' nodes.
// The attention matrix [..., L, S] is materialised: memory grows with L * S per head.
#pragma once

#include <optional>
#include <utility>

#include "dltrain/core/generator.hpp"
#include "dltrain/core/tensor.hpp"

namespace dltrain {

/// softmax(query key^T * scale + mask) value, as torch.nn.functional.scaled_dot_product_attention.
///
/// query [..., L, E], key [..., S, E], value [..., S, Ev] (one floating dtype, one device;
/// the leading dims broadcast, e.g. [N, H, L, E] against [N, 1, S, E]) -> [..., L, Ev].
/// attn_mask, broadcastable to [..., L, S]: a bool tensor where true means "takes part"
/// (false positions get -inf before the softmax), or a floating tensor of query's dtype that
/// is added to the scores. is_causal masks key j > query i (top-left aligned, as PyTorch);
/// it excludes attn_mask. dropout_p > 0 drops attention weights with that probability
/// (always: pass 0 in evaluation, as PyTorch's functional form). scale defaults to
/// 1/sqrt(E). A query row whose keys are all masked gives NaN, as PyTorch's math kernel.
/// Errors (dltrain::Error naming the fix): mismatched E or S, dims < 2, non-broadcastable
/// batch dims or mask, a float mask of another dtype, attn_mask with is_causal, dropout_p
/// outside [0, 1).
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0.0,
                                    bool is_causal = false,
                                    std::optional<double> scale = std::nullopt,
                                    Generator* gen = nullptr);

/// The same computation, also returning the attention weights [..., L, S] (after dropout,
/// as nn.MultiheadAttention returns them): {output, weights}.
std::pair<Tensor, Tensor> scaled_dot_product_attention_with_weights(
    const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& attn_mask = Tensor(),
    double dropout_p = 0.0, bool is_causal = false, std::optional<double> scale = std::nullopt,
    Generator* gen = nullptr);

/// Bool [L, S] mask, true where key j may be attended from query i (j <= i): the causal mask
/// in scaled_dot_product_attention's convention, on `device`.
Tensor causal_mask(int64_t L, int64_t S, Device device = Device::cpu());

}  // namespace dltrain
