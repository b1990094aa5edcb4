// MultiheadAttention, TransformerEncoderLayer and TransformerEncoder as compositions of ops.
//
// MultiheadAttention projects in the input's own layout ([L, N, E] or [N, L, E]; an unbatched
// [L, E] is [L, 1, E]), so a seq-first input is never transposed before the GEMM; the heads are
// a view [.., H, D] permuted to [N, H, L, D] for scaled_dot_product_attention, and its output is
// permuted back and flattened for out_proj. Self-attention (query, key and value the same
// tensor) is one GEMM against the whole in_proj_weight, as PyTorch; key == value one GEMM for
// both. The masks (attn_mask, key_padding_mask, is_causal) are merged into one: a bool "takes
// part" mask when all are bool, else one float mask of the scores' dtype with -inf where a bool
// mask blocks, as PyTorch's merge.
#include "dltrain/nn/transformer.hpp"

#include <cmath>
#include <limits>
#include <tuple>

#include "dltrain/autograd/node.hpp"
#include "dltrain/nn/init.hpp"
#include "dltrain/ops/attention.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/linalg.hpp"
#include "dltrain/ops/reduction.hpp"
#include "src/nn/attention_mask.hpp"

namespace dltrain::nn {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

void check_positive(int64_t v, const char* op, const char* name) {
  DLTRAIN_CHECK(v > 0, op, ": ", name, " must be > 0 but is ", v);
}

void check_mask_dtype(const char* op, const Tensor& m, const char* name) {
  DLTRAIN_CHECK(m.dtype() == DType::b8 || is_floating(m.dtype()), op, ": ", name,
                " must be a bool tensor (true = masked out) or a floating one (added to the "
                "scores) but has dtype ",
                m.dtype(), "; convert it with .to(DType::b8)");
}

}  // namespace

namespace detail {

Tensor merge_attention_masks(const char* op, const Tensor& attn_mask,
                             const Tensor& key_padding_mask, bool is_causal, bool batched,
                             int64_t N, int64_t H, int64_t L, int64_t S,
                             const TensorOptions& scores) {
  Tensor blocked, additive;
  auto merge = [&](const Tensor& m) {
    if (m.dtype() == DType::b8) {
      blocked = blocked.defined() ? logical_or(blocked, m) : m;
    } else {
      const Tensor f = m.dtype() == scores.dtype ? m : m.to(scores.dtype);
      additive = additive.defined() ? add(additive, f) : f;
    }
  };
  if (attn_mask.defined()) {
    check_mask_dtype(op, attn_mask, "attn_mask");
    if (attn_mask.dim() == 2) {
      DLTRAIN_CHECK(attn_mask.size(0) == L && attn_mask.size(1) == S, op, ": the 2-d attn_mask ",
                    shape_str(attn_mask.shape()), " must be [L, S] = [", L, ", ", S,
                    "] (query length, key length)");
      merge(attn_mask);
    } else {
      const int64_t B = batched ? N * H : H;
      DLTRAIN_CHECK(attn_mask.dim() == 3 && attn_mask.size(0) == B && attn_mask.size(1) == L &&
                        attn_mask.size(2) == S,
                    op, ": attn_mask ", shape_str(attn_mask.shape()), " must be [L, S] = [", L,
                    ", ", S, "] or ",
                    batched ? "[N * num_heads, L, S] = [" : "[num_heads, L, S] = [", B, ", ", L,
                    ", ", S, "]");
      merge(attn_mask.reshape({batched ? N : 1, H, L, S}));
    }
  }
  if (key_padding_mask.defined()) {
    check_mask_dtype(op, key_padding_mask, "key_padding_mask");
    const bool ok = batched ? key_padding_mask.dim() == 2 && key_padding_mask.size(0) == N &&
                                  key_padding_mask.size(1) == S
                            : key_padding_mask.dim() == 1 && key_padding_mask.size(0) == S;
    DLTRAIN_CHECK(ok, op, ": key_padding_mask ", shape_str(key_padding_mask.shape()), " must be ",
                  batched ? "[N, S] = [" : "[S] = [", batched ? N : S,
                  batched ? ", " + std::to_string(S) : std::string(), "] (batch size, key length)");
    merge(key_padding_mask.reshape({batched ? N : 1, 1, 1, S}));
  }
  if (is_causal) merge(logical_not(causal_mask(L, S, scores.device)));
  Tensor mask;
  if (additive.defined()) {
    mask = blocked.defined() ? where(blocked, scalar_tensor(kNegInf, additive.options()), additive)
                             : additive;
  } else if (blocked.defined()) {
    mask = logical_not(blocked);
  }
  return mask;
}

AttentionInputs check_attention_inputs(const char* op, const Tensor& query, const Tensor& key,
                                       const Tensor& value, bool batch_first, int64_t embed_dim,
                                       int64_t kdim, int64_t vdim) {
  DLTRAIN_CHECK(query.defined() && key.defined() && value.defined(), op,
                ": query, key and value must all be defined (self-attention passes the same "
                "tensor three times)");
  const bool bf = batch_first;
  const char* layout = bf ? "[N, L, E]" : "[L, N, E]";
  DLTRAIN_CHECK(query.dim() == 3 || query.dim() == 2, op, ": query must be ", layout,
                " (batch_first = ", bf ? "true" : "false", ") or unbatched [L, E] but has shape ",
                shape_str(query.shape()));
  DLTRAIN_CHECK(key.dim() == query.dim() && value.dim() == query.dim(), op, ": key ",
                shape_str(key.shape()), " and value ", shape_str(value.shape()),
                " must have the query's rank (", query.dim(), "-d, query ",
                shape_str(query.shape()), ")");
  AttentionInputs in;
  in.batched = query.dim() == 3;
  in.sd = in.batched && bf ? 1 : 0;
  in.nd = 1 - in.sd;
  auto as3 = [&](const Tensor& t) { return in.batched ? t : t.unsqueeze(1); };
  in.q3 = as3(query);
  in.k3 = as3(key);
  in.v3 = as3(value);
  in.N = in.q3.size(in.nd);
  in.L = in.q3.size(in.sd);
  in.S = in.k3.size(in.sd);
  DLTRAIN_CHECK(in.q3.size(2) == embed_dim, op, ": query ", shape_str(query.shape()), " has ",
                in.q3.size(2), " features in its last dim but embed_dim is ", embed_dim);
  DLTRAIN_CHECK(in.k3.size(2) == kdim && in.v3.size(2) == vdim, op, ": key ",
                shape_str(key.shape()), " and value ", shape_str(value.shape()),
                " must have kdim = ", kdim, " and vdim = ", vdim, " features in their last dim");
  DLTRAIN_CHECK(in.k3.size(in.nd) == in.N && in.v3.size(in.nd) == in.N && in.v3.size(in.sd) == in.S,
                op, ": key ", shape_str(key.shape()), " and value ", shape_str(value.shape()),
                " must have the query's batch size ", in.N,
                " and the same sequence length; the layout is ", in.batched ? layout : "[S, E]");
  return in;
}

Projections project_qkv(const Tensor& q3, const Tensor& k3, const Tensor& v3, bool qk_same,
                        bool kv_same, const Tensor& in_proj_weight, const Tensor& in_proj_bias,
                        const Tensor& q_proj_weight, const Tensor& k_proj_weight,
                        const Tensor& v_proj_weight, int64_t W) {
  auto bias_rows = [&](int64_t chunk, int64_t n) {
    return in_proj_bias.defined() ? in_proj_bias.narrow(0, chunk * W, n * W) : Tensor();
  };
  Projections p;
  if (in_proj_weight.defined()) {
    if (kv_same && qk_same) {
      const Tensor qkv = linear(q3, in_proj_weight, in_proj_bias);
      p.q = qkv.narrow(2, 0, W);
      p.k = qkv.narrow(2, W, W);
      p.v = qkv.narrow(2, 2 * W, W);
    } else {
      p.q = linear(q3, in_proj_weight.narrow(0, 0, W), bias_rows(0, 1));
      if (kv_same) {
        const Tensor kv = linear(k3, in_proj_weight.narrow(0, W, 2 * W), bias_rows(1, 2));
        p.k = kv.narrow(2, 0, W);
        p.v = kv.narrow(2, W, W);
      } else {
        p.k = linear(k3, in_proj_weight.narrow(0, W, W), bias_rows(1, 1));
        p.v = linear(v3, in_proj_weight.narrow(0, 2 * W, W), bias_rows(2, 1));
      }
    }
  } else {
    p.q = linear(q3, q_proj_weight, bias_rows(0, 1));
    p.k = linear(k3, k_proj_weight, bias_rows(1, 1));
    p.v = linear(v3, v_proj_weight, bias_rows(2, 1));
  }
  return p;
}

Tensor split_heads(const Tensor& t, const AttentionInputs& in, int64_t len, int64_t H, int64_t D,
                   bool batch_first) {
  const bool bfb = batch_first && in.batched;
  Shape s = bfb ? Shape{in.N, len, H, D} : Shape{len, in.N, H, D};
  const Tensor h = t.reshape(s);
  return bfb ? h.permute({0, 2, 1, 3}) : h.permute({1, 2, 0, 3});
}

}  // namespace detail

// --- MultiheadAttention -------------------------------------------------------------

MultiheadAttention::MultiheadAttention(int64_t embed_dim_, int64_t num_heads_,
                                       const MultiheadAttentionOptions& options_,
                                       TensorOptions opts)
    : Module("MultiheadAttention"),
      embed_dim(embed_dim_),
      num_heads(num_heads_),
      head_dim(0),
      kdim(options_.kdim > 0 ? options_.kdim : embed_dim_),
      vdim(options_.vdim > 0 ? options_.vdim : embed_dim_),
      options(options_) {
  const char* op = "MultiheadAttention";
  check_positive(embed_dim, op, "embed_dim");
  check_positive(num_heads, op, "num_heads");
  DLTRAIN_CHECK(options.kdim >= 0 && options.vdim >= 0, op,
                ": kdim and vdim must be >= 0 (0 = embed_dim) but are ", options.kdim, " and ",
                options.vdim);
  DLTRAIN_CHECK(embed_dim % num_heads == 0, op, ": embed_dim (", embed_dim,
                ") must be divisible by num_heads (", num_heads,
                "); choose num_heads among the divisors of embed_dim or change embed_dim");
  DLTRAIN_CHECK(options.dropout >= 0.0 && options.dropout <= 1.0, op,
                ": dropout must be in [0, 1] but is ", options.dropout);
  head_dim = embed_dim / num_heads;
  opts.requires_grad = false;
  const int64_t E = embed_dim;
  if (kdim == E && vdim == E) {
    in_proj_weight = register_parameter("in_proj_weight", empty({3 * E, E}, opts));
  } else {
    q_proj_weight = register_parameter("q_proj_weight", empty({E, E}, opts));
    k_proj_weight = register_parameter("k_proj_weight", empty({E, kdim}, opts));
    v_proj_weight = register_parameter("v_proj_weight", empty({E, vdim}, opts));
  }
  if (options.bias) in_proj_bias = register_parameter("in_proj_bias", empty({3 * E}, opts));
  out_proj = register_module("out_proj", std::make_shared<Linear>(E, E, options.bias, opts));
  reset_parameters();
}

void MultiheadAttention::reset_parameters() {
  NoGradGuard ng;
  if (in_proj_weight.defined()) {
    init::xavier_uniform_(in_proj_weight);
  } else {
    init::xavier_uniform_(q_proj_weight);
    init::xavier_uniform_(k_proj_weight);
    init::xavier_uniform_(v_proj_weight);
  }
  if (in_proj_bias.defined()) {
    init::zeros_(in_proj_bias);
    init::zeros_(out_proj->bias);
  }
}

std::pair<Tensor, Tensor> MultiheadAttention::forward(const Tensor& query, const Tensor& key,
                                                      const Tensor& value,
                                                      const Tensor& key_padding_mask,
                                                      bool need_weights, const Tensor& attn_mask,
                                                      bool average_attn_weights, bool is_causal) {
  const char* op = "MultiheadAttention";
  const bool bf = options.batch_first;
  const detail::AttentionInputs in =
      detail::check_attention_inputs(op, query, key, value, bf, embed_dim, kdim, vdim);
  const bool batched = in.batched;
  const int64_t N = in.N, L = in.L, S = in.S, E = embed_dim, H = num_heads, D = head_dim;
  const detail::Projections pr = detail::project_qkv(
      in.q3, in.k3, in.v3, query.impl() == key.impl(), key.impl() == value.impl(), in_proj_weight,
      in_proj_bias, q_proj_weight, k_proj_weight, v_proj_weight, E);
  const Tensor qh = detail::split_heads(pr.q, in, L, H, D, bf),
               kh = detail::split_heads(pr.k, in, S, H, D, bf),
               vh = detail::split_heads(pr.v, in, S, H, D, bf);

  const Tensor mask = detail::merge_attention_masks(op, attn_mask, key_padding_mask, is_causal,
                                                    batched, N, H, L, S, qh.options());

  const double p = is_training() ? options.dropout : 0.0;
  Tensor oh, w;
  if (need_weights)
    std::tie(oh, w) = scaled_dot_product_attention_with_weights(qh, kh, vh, mask, p);
  else
    oh = scaled_dot_product_attention(qh, kh, vh, mask, p);
  // [N, H, L, D] -> the input's layout, heads concatenated.
  const Tensor o = bf && batched ? oh.permute({0, 2, 1, 3}).reshape({N, L, E})
                                 : oh.permute({2, 0, 1, 3}).reshape({L, N, E});
  Tensor out = out_proj->forward(o);
  if (w.defined() && average_attn_weights) w = mean(w, {1});
  if (!batched) {
    out = out.squeeze(1);
    if (w.defined()) w = w.squeeze(0);
  }
  return {out, w};
}

// --- TransformerEncoderLayer --------------------------------------------------------------

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model_, int64_t nhead_,
                                                 const TransformerEncoderLayerOptions& options_,
                                                 TensorOptions opts)
    : Module("TransformerEncoderLayer"), d_model(d_model_), nhead(nhead_), options(options_) {
  const char* op = "TransformerEncoderLayer";
  check_positive(options.dim_feedforward, op, "dim_feedforward");
  DLTRAIN_CHECK(options.activation == "relu" || options.activation == "gelu", op,
                ": activation must be \"relu\" or \"gelu\" but is \"", options.activation, "\"");
  self_attn = register_module(
      "self_attn",
      std::make_shared<MultiheadAttention>(
          d_model, nhead,
          MultiheadAttentionOptions{
              .dropout = options.dropout, .bias = options.bias, .batch_first = options.batch_first},
          opts));
  linear1 = register_module(
      "linear1", std::make_shared<Linear>(d_model, options.dim_feedforward, options.bias, opts));
  dropout = register_module("dropout", std::make_shared<Dropout>(options.dropout));
  linear2 = register_module(
      "linear2", std::make_shared<Linear>(options.dim_feedforward, d_model, options.bias, opts));
  norm1 =
      register_module("norm1", std::make_shared<LayerNorm>(Shape{d_model}, options.layer_norm_eps,
                                                           true, opts, options.bias));
  norm2 =
      register_module("norm2", std::make_shared<LayerNorm>(Shape{d_model}, options.layer_norm_eps,
                                                           true, opts, options.bias));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(options.dropout));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(options.dropout));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const Tensor& src_mask,
                                        const Tensor& src_key_padding_mask, bool is_causal) {
  DLTRAIN_CHECK(src.defined() && (src.dim() == 2 || src.dim() == 3),
                "TransformerEncoderLayer: src must be ",
                options.batch_first ? "[N, L, E]" : "[L, N, E]", " or unbatched [L, E] but is ",
                src.defined() ? shape_str(src.shape()) : std::string("undefined"));
  auto sa = [&](const Tensor& x) {
    return dropout1->forward(self_attn
                                 ->forward(x, x, x, src_key_padding_mask, /*need_weights=*/false,
                                           src_mask, true, is_causal)
                                 .first);
  };
  auto ff = [&](const Tensor& x) {
    const Tensor h = linear1->forward(x);
    const Tensor a = options.activation == "gelu" ? gelu(h) : relu(h);
    return dropout2->forward(linear2->forward(dropout->forward(a)));
  };
  if (options.norm_first) {
    const Tensor x = add(src, sa(norm1->forward(src)));
    return add(x, ff(norm2->forward(x)));
  }
  const Tensor x = norm1->forward(add(src, sa(src)));
  return norm2->forward(add(x, ff(x)));
}

std::shared_ptr<TransformerEncoderLayer> TransformerEncoderLayer::clone() const {
  const Tensor& ref = linear1->weight;
  auto copy = std::make_shared<TransformerEncoderLayer>(
      d_model, nhead, options, TensorOptions(ref.dtype()).with_device(ref.device()));
  copy->load_state_dict(state_dict());
  copy->train(is_training());
  return copy;
}

// --- TransformerEncoder -------------------------------------------------------------------

TransformerEncoder::TransformerEncoder(const std::shared_ptr<TransformerEncoderLayer>& layer,
                                       int64_t num_layers_, std::shared_ptr<LayerNorm> norm_)
    : Module("TransformerEncoder"), num_layers(num_layers_), norm(std::move(norm_)) {
  DLTRAIN_CHECK(layer != nullptr, "TransformerEncoder: encoder_layer is null");
  check_positive(num_layers, "TransformerEncoder", "num_layers");
  layers = register_module("layers", std::make_shared<ModuleListOf<TransformerEncoderLayer>>());
  for (int64_t i = 0; i < num_layers; ++i) layers->push_back(layer->clone());
  if (norm) register_module("norm", norm);
}

Tensor TransformerEncoder::forward(const Tensor& src, const Tensor& mask,
                                   const Tensor& src_key_padding_mask, bool is_causal) {
  Tensor x = src;
  for (const auto& layer : layers->modules())
    x = layer->forward(x, mask, src_key_padding_mask, is_causal);
  return norm ? norm->forward(x) : x;
}

Tensor generate_square_subsequent_mask(int64_t sz, TensorOptions opts) {
  DLTRAIN_CHECK(sz >= 0, "generate_square_subsequent_mask: size must be >= 0 but is ", sz);
  DLTRAIN_CHECK(is_floating(opts.dtype),
                "generate_square_subsequent_mask: dtype must be floating "
                "but is ",
                opts.dtype);
  const Tensor blocked = logical_not(causal_mask(sz, sz, opts.device));
  return where(blocked, scalar_tensor(kNegInf, opts), zeros({}, opts));
}

}  // namespace dltrain::nn
