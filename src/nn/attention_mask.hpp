// The pieces of nn::MultiheadAttention's forward that its tensor-parallel form
// (distributed::TensorParallelMultiheadAttention) shares: the checks and 3-d views of query,
// key and value, the q/k/v projections, the split into heads and the mask merging, so that both
// read their inputs and masks the same way: one definition of PyTorch's conventions (see
// include/dltrain/nn/transformer.hpp). The projections run the same ops in the same order as
// before they were shared, so results are unchanged bit for bit.
#pragma once

#include <cstdint>

#include "dltrain/core/tensor.hpp"

namespace dltrain::nn::detail {

/// query, key and value checked (errors name `op`) and viewed as 3-d: batched tensors as they
/// are ([N, L, E] with batch_first, else [L, N, E]); unbatched [L, E] as seq-first [L, 1, E].
struct AttentionInputs {
  Tensor q3, k3, v3;
  bool batched = true;
  int64_t sd = 0, nd = 1;       // the sequence and batch dims of the 3-d views
  int64_t N = 0, L = 0, S = 0;  // batch, query length, key length
};
AttentionInputs check_attention_inputs(const char* op, const Tensor& query, const Tensor& key,
                                       const Tensor& value, bool batch_first, int64_t embed_dim,
                                       int64_t kdim, int64_t vdim);

/// The q, k and v projections of q3, k3, v3 (width W each): through in_proj_weight [3W, E] and
/// in_proj_bias [3W] when defined (one matmul when query, key and value are one tensor,
/// `qk_same` and `kv_same`; two when key and value are), else through q/k/v_proj_weight.
struct Projections {
  Tensor q, k, v;
};
Projections project_qkv(const Tensor& q3, const Tensor& k3, const Tensor& v3, bool qk_same,
                        bool kv_same, const Tensor& in_proj_weight, const Tensor& in_proj_bias,
                        const Tensor& q_proj_weight, const Tensor& k_proj_weight,
                        const Tensor& v_proj_weight, int64_t W);

/// [.., H * D] in the inputs' layout -> [N, H, len, D].
Tensor split_heads(const Tensor& t, const AttentionInputs& in, int64_t len, int64_t H, int64_t D,
                   bool batch_first);

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
