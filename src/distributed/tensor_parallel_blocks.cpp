// Tensor-parallel blocks built from the column/row-parallel layers: the MLP, multi-head
// attention with its heads split over the group, and the transformer encoder layer
// (include/dltrain/distributed/tensor_parallel.hpp).
//
// Each is the ordinary module's forward with the local sizes (num_heads / p heads, embed_dim / p
// projected features, dim_feedforward / p hidden features) inside the parallel region, so it
// computes per head exactly what the ordinary module computes; only the row-parallel sums are
// split into p partial sums. Attention masks are merged by the ordinary module's own code
// (src/nn/attention_mask.hpp), then a per-head mask keeps this rank's heads. Every block built
// from a seed builds the ordinary module(s) first, in the ordinary constructor's order, and
// takes its slices, so the generator advances exactly as it would for the ordinary model.
// Dropout inside the region draws from tensor_parallel_generator (a mask per shard), outside
// from the default generator (the same on every rank).
#include <tuple>

#include "dltrain/autograd/node.hpp"
#include "dltrain/distributed/tensor_parallel.hpp"
#include "dltrain/ops/attention.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/linalg.hpp"
#include "dltrain/ops/loss.hpp"
#include "dltrain/ops/reduction.hpp"
#include "dltrain/ops/shape.hpp"
#include "src/nn/attention_mask.hpp"

namespace dltrain::distributed {

namespace {

void check_activation(const char* op, const std::string& activation) {
  DLTRAIN_CHECK(activation == "relu" || activation == "gelu", op,
                ": activation must be \"relu\" or \"gelu\" but is \"", activation, "\"");
}

Tensor activate(const std::string& activation, const Tensor& x) {
  return activation == "gelu" ? gelu(x) : relu(x);
}

void check_divisible(int64_t n, const ProcessGroup& g, const char* op, const char* what) {
  DLTRAIN_CHECK(n % g.size() == 0, op, ": ", what, " (", n,
                ") must be divisible by the tensor-parallel group size (", g.size(), "); choose ",
                what, " as a multiple of ", g.size(), " or a group whose size divides ", n);
}

// A LayerNorm with `n`'s configuration and a copy of its values.
std::shared_ptr<nn::LayerNorm> copy_of(const nn::LayerNorm& n) {
  TensorOptions opts;
  if (n.weight.defined()) opts = TensorOptions(n.weight.dtype()).with_device(n.weight.device());
  auto c = std::make_shared<nn::LayerNorm>(n.normalized_shape, n.eps, n.weight.defined(), opts,
                                           n.bias.defined());
  c->load_state_dict(n.state_dict());
  return c;
}

}  // namespace

// --- TensorParallelMLP -------------------------------------------------------------------------

TensorParallelMLP::TensorParallelMLP(int64_t in, int64_t hidden, ProcessGroup& group,
                                     const TensorParallelMLPOptions& o, TensorOptions opts)
    : Module("TensorParallelMLP"), options(o) {
  check_activation("TensorParallelMLP", o.activation);
  check_divisible(hidden, group, "TensorParallelMLP", "hidden_features");
  // In this order (the generator's), as an ordinary block would build them.
  const nn::Linear l1(in, hidden, o.bias, opts);
  const nn::Linear l2(hidden, o.out_features > 0 ? o.out_features : in, o.bias, opts);
  init_from(l1, l2, group);
}

TensorParallelMLP::TensorParallelMLP(const nn::Linear& l1, const nn::Linear& l2,
                                     ProcessGroup& group, const TensorParallelMLPOptions& o)
    : Module("TensorParallelMLP"), options(o) {
  init_from(l1, l2, group);
}

void TensorParallelMLP::init_from(const nn::Linear& l1, const nn::Linear& l2, ProcessGroup& group) {
  const char* op = "TensorParallelMLP";
  check_activation(op, options.activation);
  DLTRAIN_CHECK(l1.out_features == l2.in_features, op, ": linear1 has ", l1.out_features,
                " output features but linear2 takes ", l2.in_features,
                "; pass two layers that compose (hidden sizes equal)");
  DLTRAIN_CHECK(options.dropout >= 0.0 && options.dropout <= 1.0, op,
                ": dropout must be in [0, 1] but is ", options.dropout);
  check_divisible(l1.out_features, group, op, "hidden_features");
  options.out_features = l2.out_features;
  options.bias = l1.bias.defined();
  linear1 = register_module("linear1",
                            std::make_shared<ColumnParallelLinear>(l1, group, /*gather=*/false));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(options.dropout));
  linear2 = register_module("linear2", std::make_shared<RowParallelLinear>(l2, group, true));
}

Tensor TensorParallelMLP::forward(const Tensor& x) {
  const Tensor a = activate(options.activation, linear1->forward(x));
  return linear2->forward(
      dltrain::dropout(a, dropout->p, is_training(), &tensor_parallel_generator(linear1->group())));
}

// --- TensorParallelMultiheadAttention ------------------------------------------------------------

TensorParallelMultiheadAttention::TensorParallelMultiheadAttention(
    int64_t embed_dim_, int64_t num_heads_, ProcessGroup& group,
    const nn::MultiheadAttentionOptions& options_, TensorOptions opts)
    : TensorParallelMultiheadAttention(
          nn::MultiheadAttention(embed_dim_, num_heads_, options_, opts), group) {}

TensorParallelMultiheadAttention::TensorParallelMultiheadAttention(
    const nn::MultiheadAttention& full, ProcessGroup& group)
    : TensorParallelModule("TensorParallelMultiheadAttention", group),
      embed_dim(full.embed_dim),
      num_heads(full.num_heads),
      head_dim(full.head_dim),
      kdim(full.kdim),
      vdim(full.vdim),
      heads_per_rank(per_rank(full.num_heads, "TensorParallelMultiheadAttention", "num_heads")),
      options(full.options) {
  const int64_t E = embed_dim, El = heads_per_rank * head_dim, r = group.rank();
  NoGradGuard ng;
  // Rows [chunk * E + r * El, + El): this rank's heads of the q (chunk 0), k (1) or v (2) part.
  auto rows = [&](const Tensor& t, int64_t chunk) {
    return t.detach().narrow(0, chunk * E + r * El, El);
  };
  if (full.in_proj_weight.defined()) {
    const Tensor& w = full.in_proj_weight;
    in_proj_weight = register_sharded_parameter(
        "in_proj_weight", cat({rows(w, 0), rows(w, 1), rows(w, 2)}, 0), {.dim = 0, .chunks = 3});
  } else {
    q_proj_weight =
        register_sharded_parameter("q_proj_weight", rows(full.q_proj_weight, 0).clone(), {});
    k_proj_weight =
        register_sharded_parameter("k_proj_weight", rows(full.k_proj_weight, 0).clone(), {});
    v_proj_weight =
        register_sharded_parameter("v_proj_weight", rows(full.v_proj_weight, 0).clone(), {});
  }
  if (full.in_proj_bias.defined()) {
    const Tensor& b = full.in_proj_bias;
    in_proj_bias = register_sharded_parameter(
        "in_proj_bias", cat({rows(b, 0), rows(b, 1), rows(b, 2)}, 0), {.dim = 0, .chunks = 3});
  }
  out_proj =
      register_module("out_proj", std::make_shared<RowParallelLinear>(*full.out_proj, group, true));
  train(full.is_training());
}

std::pair<Tensor, Tensor> TensorParallelMultiheadAttention::forward(
    const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& key_padding_mask,
    bool need_weights, const Tensor& attn_mask, bool average_attn_weights, bool is_causal) {
  const char* op = "TensorParallelMultiheadAttention";
  const bool bf = options.batch_first;
  const nn::detail::AttentionInputs in =
      nn::detail::check_attention_inputs(op, query, key, value, bf, embed_dim, kdim, vdim);
  const bool batched = in.batched;
  const int64_t N = in.N, L = in.L, S = in.S, H = num_heads, Hl = heads_per_rank, D = head_dim,
                El = Hl * D, r = group().rank();

  // Column-parallel projections of the replicated inputs (f on each distinct input).
  const bool kv_same = key.impl() == value.impl(), qk_same = query.impl() == key.impl();
  const Tensor qf = copy_to_tensor_parallel_region(in.q3, group());
  const Tensor kf = qk_same ? qf : copy_to_tensor_parallel_region(in.k3, group());
  const Tensor vf = kv_same ? kf : copy_to_tensor_parallel_region(in.v3, group());
  const nn::detail::Projections pr =
      nn::detail::project_qkv(qf, kf, vf, qk_same, kv_same, in_proj_weight, in_proj_bias,
                              q_proj_weight, k_proj_weight, v_proj_weight, El);
  const Tensor qh = nn::detail::split_heads(pr.q, in, L, Hl, D, bf),
               kh = nn::detail::split_heads(pr.k, in, S, Hl, D, bf),
               vh = nn::detail::split_heads(pr.v, in, S, Hl, D, bf);

  // The ordinary module's merged mask, then this rank's heads of a per-head one.
  Tensor mask = nn::detail::merge_attention_masks(op, attn_mask, key_padding_mask, is_causal,
                                                  batched, N, H, L, S, qh.options());
  if (mask.defined() && mask.dim() == 4 && mask.size(1) == H && H > 1)
    mask = mask.narrow(1, r * Hl, Hl);

  const double p = is_training() ? options.dropout : 0.0;
  Tensor oh, w;
  Generator* gen = p > 0.0 ? &tensor_parallel_generator(group()) : nullptr;
  if (need_weights)
    std::tie(oh, w) =
        scaled_dot_product_attention_with_weights(qh, kh, vh, mask, p, false, std::nullopt, gen);
  else
    oh = scaled_dot_product_attention(qh, kh, vh, mask, p, false, std::nullopt, gen);
  // [N, Hl, L, D] -> the input's layout, this rank's heads concatenated; out_proj sums the ranks.
  const Tensor o = bf && batched ? oh.permute({0, 2, 1, 3}).reshape({N, L, El})
                                 : oh.permute({2, 0, 1, 3}).reshape({L, N, El});
  Tensor out = out_proj->forward(o);
  if (w.defined()) {
    // All heads' weights: their mean is the sum of every rank's head sums over H; without
    // averaging, every rank's heads gathered (along a last dim made of the heads).
    w = average_attn_weights
            ? div(reduce_from_tensor_parallel_region(sum(w, {1}), group()), static_cast<double>(H))
            : gather_from_tensor_parallel_region(w.permute({0, 2, 3, 1}), group())
                  .permute({0, 3, 1, 2});
  }
  if (!batched) {
    out = out.squeeze(1);
    if (w.defined()) w = w.squeeze(0);
  }
  return {out, w};
}

// --- TensorParallelTransformerEncoderLayer -------------------------------------------------------

TensorParallelTransformerEncoderLayer::TensorParallelTransformerEncoderLayer(
    int64_t d_model_, int64_t nhead_, ProcessGroup& group,
    const nn::TransformerEncoderLayerOptions& options_, TensorOptions opts)
    : Module("TensorParallelTransformerEncoderLayer"),
      d_model(d_model_),
      nhead(nhead_),
      options(options_) {
  const char* op = "TensorParallelTransformerEncoderLayer";
  check_divisible(nhead, group, op, "nhead");
  check_divisible(options.dim_feedforward, group, op, "dim_feedforward");
  init_from(nn::TransformerEncoderLayer(d_model, nhead, options, opts), group);
}

TensorParallelTransformerEncoderLayer::TensorParallelTransformerEncoderLayer(
    const nn::TransformerEncoderLayer& full, ProcessGroup& group)
    : Module("TensorParallelTransformerEncoderLayer"),
      d_model(full.d_model),
      nhead(full.nhead),
      options(full.options) {
  init_from(full, group);
}

void TensorParallelTransformerEncoderLayer::init_from(const nn::TransformerEncoderLayer& full,
                                                      ProcessGroup& group) {
  const char* op = "TensorParallelTransformerEncoderLayer";
  check_divisible(nhead, group, op, "nhead");
  check_divisible(options.dim_feedforward, group, op, "dim_feedforward");
  // PyTorch's child order (the state dict's).
  self_attn = register_module(
      "self_attn", std::make_shared<TensorParallelMultiheadAttention>(*full.self_attn, group));
  linear1 = register_module("linear1",
                            std::make_shared<ColumnParallelLinear>(*full.linear1, group, false));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(options.dropout));
  linear2 =
      register_module("linear2", std::make_shared<RowParallelLinear>(*full.linear2, group, true));
  norm1 = register_module("norm1", copy_of(*full.norm1));
  norm2 = register_module("norm2", copy_of(*full.norm2));
  dropout1 = register_module("dropout1", std::make_shared<nn::Dropout>(options.dropout));
  dropout2 = register_module("dropout2", std::make_shared<nn::Dropout>(options.dropout));
  train(full.is_training());
}

Tensor TensorParallelTransformerEncoderLayer::forward(const Tensor& src, const Tensor& src_mask,
                                                      const Tensor& src_key_padding_mask,
                                                      bool is_causal) {
  DLTRAIN_CHECK(src.defined() && (src.dim() == 2 || src.dim() == 3),
                "TensorParallelTransformerEncoderLayer: src must be ",
                options.batch_first ? "[N, L, E]" : "[L, N, E]", " or unbatched [L, E] but is ",
                src.defined() ? shape_str(src.shape()) : std::string("undefined"));
  auto sa = [&](const Tensor& x) {
    return dropout1->forward(self_attn
                                 ->forward(x, x, x, src_key_padding_mask, /*need_weights=*/false,
                                           src_mask, true, is_causal)
                                 .first);
  };
  auto ff = [&](const Tensor& x) {
    const Tensor a = activate(options.activation, linear1->forward(x));
    // In the region: this rank's generator (dropout1 / dropout2 act on replicated tensors).
    const Tensor d = dltrain::dropout(a, dropout->p, is_training(),
                                      &tensor_parallel_generator(linear1->group()));
    return dropout2->forward(linear2->forward(d));
  };
  if (options.norm_first) {
    const Tensor x = add(src, sa(norm1->forward(src)));
    return add(x, ff(norm2->forward(x)));
  }
  const Tensor x = norm1->forward(add(src, sa(src)));
  return norm2->forward(add(x, ff(x)));
}

}  // namespace dltrain::distributed
