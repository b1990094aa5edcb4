// The mask merging of nn::MultiheadAttention, shared with its tensor-parallel form
// (distributed::TensorParallelMultiheadAttention) so that both read the same masks the same
// way: one definition of PyTorch's conventions (see include/dltrain/nn/transformer.hpp).
#pragma once

#include <cstdint>

#include "dltrain/core/tensor.hpp"

namespace dltrain::nn::detail {

/// attn_mask ([L, S] or [N * H, L, S], [H, L, S] unbatched), key_padding_mask ([N, S], [S]
/// unbatched) and is_causal, checked (errors name `op`) and merged into one mask for
/// scaled_dot_product_attention, broadcastable to [N, H, L, S] (N = 1 unbatched; its dim 1 is
/// H or 1): a bool "takes part" mask when every mask given is bool, else a float mask of
/// `scores`' dtype with -inf where a bool mask blocks. Undefined when there is none.
Tensor merge_attention_masks(const char* op, const Tensor& attn_mask,
                             const Tensor& key_padding_mask, bool is_causal, bool batched,
                             int64_t N, int64_t H, int64_t L, int64_t S,
                             const TensorOptions& scores);

}  // namespace dltrain::nn::detail
