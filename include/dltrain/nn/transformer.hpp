// Attention layers with PyTorch's constructor arguments, parameter names, initialisation and
// forward semantics, so a PyTorch state_dict loads as it is: nn::MultiheadAttention,
// nn::TransformerEncoderLayer and nn::TransformerEncoder.
//
// They are compositions of ops (linear, scaled_dot_product_attention, layer_norm, dropout), so
// every device, autocast rule and gradient of those ops applies. MultiheadAttention takes
// several tensors and returns two, so it declares its own typed forward (docs/design.md,
// "several inputs and outputs"); the encoder layer and the encoder also keep the one-tensor
// forward (self-attention without masks), so they nest in a Sequential.
//
// Mask conventions are PyTorch's and differ between the functional op and the modules:
// scaled_dot_product_attention's bool mask is true where a key takes part; the modules' bool
// attn_mask / key_padding_mask are true where a key is masked out. Float masks are added to the
// scores in both.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "dltrain/nn/containers.hpp"
#include "dltrain/nn/layers.hpp"
#include "dltrain/nn/module.hpp"

namespace dltrain::nn {

struct MultiheadAttentionOptions {
  /// Dropout probability on the attention weights (training mode only).
  double dropout = 0.0;
  /// Biases of the input and output projections (in_proj_bias, out_proj.bias).
  bool bias = true;
  /// Key / value feature sizes; 0 means embed_dim. When either differs from embed_dim the
  /// projections are the separate q_proj_weight, k_proj_weight, v_proj_weight.
  int64_t kdim = 0, vdim = 0;
  /// Inputs and outputs [N, L, E] instead of [L, N, E].
  bool batch_first = false;
};

/// Multi-head attention, torch.nn.MultiheadAttention. Parameters: in_proj_weight [3E, E] (or
/// q_proj_weight [E, E], k_proj_weight [E, kdim], v_proj_weight [E, vdim]), in_proj_bias [3E],
/// out_proj.weight [E, E], out_proj.bias [E]; initialised as PyTorch (xavier_uniform
/// projections, zero biases, out_proj.weight as Linear). add_bias_kv / add_zero_attn are not
/// provided. Errors (dltrain::Error): embed_dim not divisible by num_heads, inputs of the wrong
/// rank or feature size, masks of the wrong shape or dtype.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads,
                     const MultiheadAttentionOptions& options = {},
                     TensorOptions opts = TensorOptions());

  using Module::forward;
  /// query [L, N, E] ([N, L, E] with batch_first, [L, E] unbatched), key [S, N, kdim], value
  /// [S, N, vdim] -> {output [L, N, E], weights}. key_padding_mask [N, S] ([S] unbatched): bool
  /// true = ignore that key, or float added. attn_mask [L, S] or [N * num_heads, L, S]: bool
  /// true = not allowed, or float added. is_causal masks key j > query i (combined with any
  /// attn_mask given). weights (when need_weights) are [N, L, S] averaged over heads, or
  /// [N, num_heads, L, S] with average_attn_weights = false (no batch dim when unbatched),
  /// after dropout as PyTorch; undefined when !need_weights.
  std::pair<Tensor, Tensor> forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& key_padding_mask = Tensor(),
                                    bool need_weights = true, const Tensor& attn_mask = Tensor(),
                                    bool average_attn_weights = true, bool is_causal = false);
  std::pair<Tensor, Tensor> operator()(const Tensor& query, const Tensor& key, const Tensor& value,
                                       const Tensor& key_padding_mask = Tensor(),
                                       bool need_weights = true, const Tensor& attn_mask = Tensor(),
                                       bool average_attn_weights = true, bool is_causal = false) {
    return forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                   average_attn_weights, is_causal);
  }
  void reset_parameters();

  int64_t embed_dim, num_heads, head_dim, kdim, vdim;
  MultiheadAttentionOptions options;
  /// Undefined when kdim/vdim differ from embed_dim (then q/k/v_proj_weight are defined).
  Tensor in_proj_weight;
  Tensor q_proj_weight, k_proj_weight, v_proj_weight;
  /// Undefined without bias.
  Tensor in_proj_bias;
  std::shared_ptr<Linear> out_proj;
};

struct TransformerEncoderLayerOptions {
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  /// "relu" or "gelu".
  std::string activation = "relu";
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  /// Pre-norm (x + sa(norm1(x)), x + ff(norm2(x))) instead of post-norm.
  bool norm_first = false;
  /// Biases of the linear layers, the attention projections and the layer norms.
  bool bias = true;
};

/// torch.nn.TransformerEncoderLayer: self-attention and a feed-forward block, each with a
/// residual connection and a LayerNorm (after, or before with norm_first). Children, in
/// PyTorch's order: self_attn, linear1, dropout, linear2, norm1, norm2, dropout1, dropout2.
class TransformerEncoderLayer : public Module {
 public:
  TransformerEncoderLayer(int64_t d_model, int64_t nhead,
                          const TransformerEncoderLayerOptions& options = {},
                          TensorOptions opts = TensorOptions());
  /// src [L, N, E] ([N, L, E] with batch_first, [L, E] unbatched); src_mask and
  /// src_key_padding_mask as MultiheadAttention's attn_mask and key_padding_mask.
  Tensor forward(const Tensor& src, const Tensor& src_mask,
                 const Tensor& src_key_padding_mask = Tensor(), bool is_causal = false);
  /// Without masks.
  Tensor forward(const Tensor& src) override { return forward(src, Tensor()); }
  Tensor operator()(const Tensor& src, const Tensor& src_mask = Tensor(),
                    const Tensor& src_key_padding_mask = Tensor(), bool is_causal = false) {
    return forward(src, src_mask, src_key_padding_mask, is_causal);
  }
  /// A new layer with this one's configuration, dtype, device, training mode and a copy of its
  /// weights (what PyTorch's TransformerEncoder does with copy.deepcopy).
  std::shared_ptr<TransformerEncoderLayer> clone() const;

  int64_t d_model, nhead;
  TransformerEncoderLayerOptions options;
  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2;
  std::shared_ptr<LayerNorm> norm1, norm2;
};

/// torch.nn.TransformerEncoder: num_layers copies of `encoder_layer` (each starting from its
/// weights, as PyTorch's deep copies; `encoder_layer` itself is not registered), then `norm`
/// when given. Children: layers (a ModuleList: "layers.0.self_attn.in_proj_weight", ...), norm.
class TransformerEncoder : public Module {
 public:
  TransformerEncoder(const std::shared_ptr<TransformerEncoderLayer>& encoder_layer,
                     int64_t num_layers, std::shared_ptr<LayerNorm> norm = nullptr);
  /// src and masks as TransformerEncoderLayer::forward.
  Tensor forward(const Tensor& src, const Tensor& mask,
                 const Tensor& src_key_padding_mask = Tensor(), bool is_causal = false);
  Tensor forward(const Tensor& src) override { return forward(src, Tensor()); }
  Tensor operator()(const Tensor& src, const Tensor& mask = Tensor(),
                    const Tensor& src_key_padding_mask = Tensor(), bool is_causal = false) {
    return forward(src, mask, src_key_padding_mask, is_causal);
  }

  int64_t num_layers;
  std::shared_ptr<ModuleListOf<TransformerEncoderLayer>> layers;
  std::shared_ptr<LayerNorm> norm;
};

/// Float [sz, sz] mask with -inf above the diagonal and 0 elsewhere: the causal attn_mask of
/// the modules (torch.nn.Transformer.generate_square_subsequent_mask).
Tensor generate_square_subsequent_mask(int64_t sz, TensorOptions opts = TensorOptions());

}  // namespace dltrain::nn
