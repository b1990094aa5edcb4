// Tensor parallelism (Megatron-LM's scheme): layers whose weights are split over the ranks of a
// tensor-parallel group, and the four differentiable collectives that connect them.
//
// A ColumnParallelLinear keeps the rows [r * out/p, (r + 1) * out/p) of the weight (output
// features) on rank r, a RowParallelLinear the columns [r * in/p, (r + 1) * in/p) (input
// features). Column then Row is the pair every block is made of (MLP: column, activation, row;
// attention: the q/k/v projection by column, so each rank owns num_heads/p whole heads, then
// the output projection by row): the activation between them stays split, and the pair costs one
// all-reduce of the output (batch x seq x hidden) in forward and one of the input gradient in
// backward. The collectives, as autograd functions that are each other's gradient:
//   f = copy_to_tensor_parallel_region:       identity forward, all-reduce(sum) backward
//   g = reduce_from_tensor_parallel_region:   all-reduce(sum) forward, identity backward
//   scatter_to_tensor_parallel_region:        own block of the last dim, all-gather backward
//   gather_from_tensor_parallel_region:       all-gather along the last dim, own block backward
//
// Invariants: every tensor outside the parallel region (the inputs of a column layer, the
// outputs of a row layer, layer norms, residual streams) is replicated: every rank holds the
// same values, so every rank computes the same loss and the gradients of replicated tensors
// are the same everywhere. The layers built from a seed are exactly the slices of the ordinary
// layer built from the same seed (the full layer is built, sliced and dropped, so building
// needs one full layer's memory at a time and the generator advances as the ordinary layer's
// would; every rank must build with the same generator state, as the replicated parameters
// require anyway). gather_state_dict returns the ordinary model's names and shapes on every
// rank, load_full_state_dict takes them back, so weights move between a tensor-parallel model,
// a single process and PyTorch.
//
// Dropout inside the parallel region (attention weights, the MLP's hidden activation) draws
// from tensor_parallel_generator(), seeded differently on each rank, so the shards of a layer
// get independent masks (Megatron's model-parallel generator); dropout on replicated tensors
// draws from the default generator, identical on every rank, so they stay replicated. With
// dropout the masks therefore differ from one process's: equivalence holds without dropout.
// Every collective is issued in the same order on every rank of the group (forward in module
// order, backward in the engine's order, which is the same graph on every rank).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dltrain/core/generator.hpp"
#include "dltrain/core/state_dict.hpp"
#include "dltrain/core/tensor.hpp"
#include "dltrain/distributed/process_group.hpp"
#include "dltrain/nn/layers.hpp"
#include "dltrain/nn/module.hpp"
#include "dltrain/nn/transformer.hpp"

namespace dltrain::optim {
class Optimizer;
}

namespace dltrain::distributed {

// --- the region operators ------------------------------------------------------------------

/// "f": returns `x` (a new tensor sharing nothing with it) in forward; in backward sums the
/// incoming gradient over the group. Put before the first op of a parallel region whose input
/// is replicated (a column-parallel layer).
Tensor copy_to_tensor_parallel_region(const Tensor& x, ProcessGroup& group);
/// "g": sums `x` over the group in forward; passes the gradient through in backward. Ends a
/// parallel region with partial sums (a row-parallel layer). Blocks until the sum is ready.
Tensor reduce_from_tensor_parallel_region(const Tensor& x, ProcessGroup& group);
/// This rank's block of the last dim of a replicated `x` (size divisible by the group size);
/// backward all-gathers the gradient.
Tensor scatter_to_tensor_parallel_region(const Tensor& x, ProcessGroup& group);
/// Concatenates every rank's `x` along the last dim (rank r's at block r); backward keeps this
/// rank's block of the gradient.
Tensor gather_from_tensor_parallel_region(const Tensor& x, ProcessGroup& group);

/// The generator of the dropouts inside tensor-parallel regions: one per process, seeded with
/// seed + 2718 + group.rank() so that every rank draws its own masks. manual_seed_tensor_parallel
/// seeds it (call it on every rank with the same seed, beside manual_seed); otherwise it is
/// seeded on first use from default_generator().seed(). Not saved in checkpoints: a resumed run
/// draws other in-region dropout masks than an uninterrupted one.
Generator& tensor_parallel_generator(const ProcessGroup& group);
void manual_seed_tensor_parallel(uint64_t seed, const ProcessGroup& group);

// --- the base of the tensor-parallel modules ----------------------------------------------------

/// How a parameter is split: the full tensor's dim `dim` is `chunks` equal parts (in_proj_weight:
/// q, k and v), each part split into group-size blocks, rank r holding block r of every part.
struct ShardSpec {
  int64_t dim = 0;
  int64_t chunks = 1;
};

/// A module with parameters split over a tensor-parallel group (its own parameters, not its
/// children's: those say their own). The others are replicated.
class TensorParallelModule : public nn::Module {
 public:
  ProcessGroup& group() const { return *group_; }
  /// The split of own parameter `name`, or null when it is replicated.
  const ShardSpec* shard_spec(const std::string& name) const;
  /// The full tensor of own parameter `name` from this rank's block `local` (of that
  /// parameter's shape: its value or its gradient). Collective over group().
  Tensor gather_shard(const std::string& name, const Tensor& local) const;
  /// This rank's block of `full`, the whole of own parameter `name` (a contiguous copy).
  /// Throws dltrain::Error naming the parameter when `full` has the wrong shape.
  Tensor slice_shard(const std::string& name, const Tensor& full) const;

 protected:
  TensorParallelModule(std::string type_name, ProcessGroup& group);
  /// register_parameter for a parameter split as `spec`; `local` is this rank's block.
  Tensor register_sharded_parameter(const std::string& name, Tensor local, ShardSpec spec);
  /// Checks `n` is divisible by the group size: "<op>: <what> (n) must be divisible by ...".
  int64_t per_rank(int64_t n, const char* op, const char* what) const;

 private:
  ProcessGroup* group_;
  std::vector<std::pair<std::string, ShardSpec>> specs_;
};

/// The state dict of the ordinary model: names and full shapes as `module.state_dict()` of the
/// same model built from ordinary layers, every sharded parameter gathered. Collective over
/// the groups of the tensor-parallel modules in `module`; every rank returns it.
StateDict gather_state_dict(const nn::Module& module);
/// Loads an ordinary model's state dict (gather_state_dict's, a single process's, PyTorch's):
/// every sharded parameter takes this rank's block. No communication. strict as
/// Module::load_state_dict; a full tensor of the wrong shape is an error naming it.
nn::LoadResult load_full_state_dict(nn::Module& module, const StateDict& full, bool strict = true);
/// The state dict of `optimizer` (over `module`'s parameters, sharded ones included) as the
/// same optimizer over the ordinary model saves it: each state tensor of a sharded parameter
/// with the parameter's local shape (Adam's moments, SGD's momentum, ...) gathered to the full
/// shape; scalars (a step count) and the other entries unchanged. Its flat indices are this
/// optimizer's, which are the ordinary model's when its groups are built by the same rule
/// (the tensor-parallel layers keep the ordinary ones' parameter names and order). Collective
/// like gather_state_dict; every rank returns it.
StateDict gather_optimizer_state_dict(const nn::Module& module, const optim::Optimizer& optimizer);
/// Loads such a state (gather_optimizer_state_dict's, a single process's) into `optimizer`:
/// the state tensors of sharded parameters take this rank's block. No communication.
void load_full_optimizer_state_dict(const nn::Module& module, optim::Optimizer& optimizer,
                                    const StateDict& full);
/// The gradients of `module`'s parameters under the ordinary model's names and shapes,
/// sharded ones gathered (a missing gradient counts as zeros there; undefined elsewhere).
/// Collective like gather_state_dict.
nn::NamedTensors gather_grads(const nn::Module& module);

/// clip_grad_norm_ (2-norm) for a model with tensor-parallel modules: the norm of the ordinary
/// model's gradients (each sharded parameter's squares summed over its group, replicated ones
/// counted once), then every gradient scaled by min(1, max_norm / (norm + 1e-6)). Returns the
/// norm, the same on every rank. Collective over the groups of the tensor-parallel modules in
/// `module`. Parameters without a gradient are skipped (every rank must agree on which).
double clip_grad_norm_tensor_parallel_(const nn::Module& module, double max_norm);

// --- linear layers ---------------------------------------------------------------------

struct ColumnParallelLinearOptions {
  bool bias = true;
  /// All-gather the output to [.., out_features] on every rank (a drop-in nn::Linear); false
  /// leaves rank r with its block [.., out_features / p], what a RowParallelLinear with
  /// input_is_parallel takes.
  bool gather_output = true;
};

/// nn::Linear with the weight split by output features: weight [out_features / p, in_features]
/// and bias [out_features / p] hold rank r's rows of the ordinary layer's. Input replicated
/// [*, in_features] (through copy_to_tensor_parallel_region: its gradient is all-reduced).
/// Errors (dltrain::Error): out_features not divisible by the group size, input features.
class ColumnParallelLinear : public TensorParallelModule {
 public:
  /// Built from the generator as nn::Linear(in, out, bias, opts) would be, then sliced.
  ColumnParallelLinear(int64_t in_features, int64_t out_features, ProcessGroup& group,
                       const ColumnParallelLinearOptions& options = {},
                       TensorOptions opts = TensorOptions());
  /// This rank's slice of `full` (a copy, on full's device and dtype); bias as full has one.
  ColumnParallelLinear(const nn::Linear& full, ProcessGroup& group, bool gather_output = true);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  int64_t in_features, out_features, out_features_per_rank;
  ColumnParallelLinearOptions options;
  Tensor weight, bias;
};

struct RowParallelLinearOptions {
  bool bias = true;
  /// The input is already split ([.., in_features / p], rank r's block: a ColumnParallelLinear
  /// without gather_output); false takes the full input and keeps this rank's block.
  bool input_is_parallel = false;
};

/// nn::Linear with the weight split by input features: weight [out_features, in_features / p]
/// holds rank r's columns; the partial products are summed over the group
/// (reduce_from_tensor_parallel_region), then the bias [out_features] (replicated) is added
/// once. Output replicated [*, out_features].
/// Errors (dltrain::Error): in_features not divisible by the group size, input features.
class RowParallelLinear : public TensorParallelModule {
 public:
  /// Built from the generator as nn::Linear(in, out, bias, opts) would be, then sliced.
  RowParallelLinear(int64_t in_features, int64_t out_features, ProcessGroup& group,
                    const RowParallelLinearOptions& options = {},
                    TensorOptions opts = TensorOptions());
  /// This rank's slice of `full` (a copy); bias as full has one.
  RowParallelLinear(const nn::Linear& full, ProcessGroup& group, bool input_is_parallel = false);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  int64_t in_features, out_features, in_features_per_rank;
  RowParallelLinearOptions options;
  Tensor weight, bias;
};

// --- blocks ------------------------------------------------------------------------------

struct TensorParallelMLPOptions {
  /// Output features; 0 = in_features.
  int64_t out_features = 0;
  /// "relu" or "gelu" (exact).
  std::string activation = "relu";
  bool bias = true;
  /// Dropout on the hidden activation (inside the parallel region: tensor_parallel_generator).
  double dropout = 0.0;
};

/// linear2(dropout(activation(linear1(x)))) with linear1 column-parallel (no gather) and
/// linear2 row-parallel (input_is_parallel): hidden_features split over the group, one
/// all-reduce forward, one backward. Children linear1, dropout, linear2, the feed-forward of
/// nn::TransformerEncoderLayer. Input and output replicated.
class TensorParallelMLP : public nn::Module {
 public:
  /// Built as nn::Linear(in, hidden) then nn::Linear(hidden, out) from the generator.
  TensorParallelMLP(int64_t in_features, int64_t hidden_features, ProcessGroup& group,
                    const TensorParallelMLPOptions& options = {},
                    TensorOptions opts = TensorOptions());
  /// Slices of two ordinary layers (linear1.out_features == linear2.in_features);
  /// options.out_features and options.bias are theirs.
  TensorParallelMLP(const nn::Linear& linear1, const nn::Linear& linear2, ProcessGroup& group,
                    const TensorParallelMLPOptions& options = {});
  Tensor forward(const Tensor& x) override;

  TensorParallelMLPOptions options;
  std::shared_ptr<ColumnParallelLinear> linear1;
  std::shared_ptr<nn::Dropout> dropout;
  std::shared_ptr<RowParallelLinear> linear2;

 private:
  void init_from(const nn::Linear& linear1, const nn::Linear& linear2, ProcessGroup& group);
};

/// nn::MultiheadAttention with its heads split over the group: rank r computes heads
/// [r * H/p, (r + 1) * H/p). in_proj_weight [3E/p, E] (q, k and v rows of those heads; or
/// q/k/v_proj_weight [E/p, E|kdim|vdim]) and in_proj_bias [3E/p] are column-parallel,
/// out_proj a RowParallelLinear (input_is_parallel). forward takes and returns what the
/// ordinary module does (replicated), masks included; the attention weights are gathered
/// (averaged over all heads, or all heads). Errors: num_heads not divisible by the group size,
/// and the ordinary module's.
class TensorParallelMultiheadAttention : public TensorParallelModule {
 public:
  /// Built from the generator as nn::MultiheadAttention(embed_dim, num_heads, options, opts).
  TensorParallelMultiheadAttention(int64_t embed_dim, int64_t num_heads, ProcessGroup& group,
                                   const nn::MultiheadAttentionOptions& options = {},
                                   TensorOptions opts = TensorOptions());
  /// This rank's heads of `full` (copies).
  TensorParallelMultiheadAttention(const nn::MultiheadAttention& full, ProcessGroup& group);

  using nn::Module::forward;
  /// As nn::MultiheadAttention::forward.
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

  int64_t embed_dim, num_heads, head_dim, kdim, vdim, heads_per_rank;
  nn::MultiheadAttentionOptions options;
  Tensor in_proj_weight;
  Tensor q_proj_weight, k_proj_weight, v_proj_weight;
  Tensor in_proj_bias;
  std::shared_ptr<RowParallelLinear> out_proj;
};

/// nn::TransformerEncoderLayer with self_attn a TensorParallelMultiheadAttention and the
/// feed-forward linear1 column-parallel, linear2 row-parallel; norms and dropouts as the
/// ordinary layer (replicated). Same children and names, so gather_state_dict gives the
/// ordinary layer's state dict. Two all-reduces forward (attention, feed-forward), two
/// backward. Errors: nhead or dim_feedforward not divisible by the group size, and the
/// ordinary layer's.
class TensorParallelTransformerEncoderLayer : public nn::Module {
 public:
  /// Built from the generator as nn::TransformerEncoderLayer(d_model, nhead, options, opts).
  TensorParallelTransformerEncoderLayer(int64_t d_model, int64_t nhead, ProcessGroup& group,
                                        const nn::TransformerEncoderLayerOptions& options = {},
                                        TensorOptions opts = TensorOptions());
  /// This rank's slices of `full` (copies; the norms copied whole).
  TensorParallelTransformerEncoderLayer(const nn::TransformerEncoderLayer& full,
                                        ProcessGroup& group);
  /// As nn::TransformerEncoderLayer::forward.
  Tensor forward(const Tensor& src, const Tensor& src_mask,
                 const Tensor& src_key_padding_mask = Tensor(), bool is_causal = false);
  Tensor forward(const Tensor& src) override { return forward(src, Tensor()); }
  Tensor operator()(const Tensor& src, const Tensor& src_mask = Tensor(),
                    const Tensor& src_key_padding_mask = Tensor(), bool is_causal = false) {
    return forward(src, src_mask, src_key_padding_mask, is_causal);
  }

  int64_t d_model, nhead;
  nn::TransformerEncoderLayerOptions options;
  std::shared_ptr<TensorParallelMultiheadAttention> self_attn;
  std::shared_ptr<ColumnParallelLinear> linear1;
  std::shared_ptr<RowParallelLinear> linear2;
  std::shared_ptr<nn::Dropout> dropout, dropout1, dropout2;
  std::shared_ptr<nn::LayerNorm> norm1, norm2;

 private:
  void init_from(const nn::TransformerEncoderLayer& full, ProcessGroup& group);
};

}  // namespace dltrain::distributed

namespace dltrain::nn {
/// The tensor-parallel layers under the names the nn layers have (they live in distributed/,
/// which depends on nn, not the other way round).
using distributed::ColumnParallelLinear;
using distributed::ColumnParallelLinearOptions;
using distributed::RowParallelLinear;
using distributed::RowParallelLinearOptions;
using distributed::TensorParallelMLP;
using distributed::TensorParallelMLPOptions;
using distributed::TensorParallelMultiheadAttention;
using distributed::TensorParallelTransformerEncoderLayer;
}  // namespace dltrain::nn
