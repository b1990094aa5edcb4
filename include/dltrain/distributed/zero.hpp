// ZeroRedundancyOptimizer: ZeRO stage 1, the optimizer state sharded over the ranks of a
// data-parallel group (PyTorch's torch.distributed.optim.ZeroRedundancyOptimizer).
//
// It wraps any optimizer type (SGD, Adam/AdamW, LARS, LAMB) built by a factory. The parameters
// are partitioned over the ranks at construction, greedily by size as PyTorch does: group by
// group, each group's parameters sorted by decreasing numel (ties in flat-index order), each to
// the rank with the fewest elements so far (ties to the lowest rank). Every rank gets the same
// partition, a pure function of the parameters' sizes. Each rank's inner optimizer holds only
// its shard's parameters, in flat-index order, with the same groups and hyper-parameters; so
// the state (momentum buffers, Adam moments, LARS/LAMB buffers, the f32 state of 16-bit
// parameters) exists on one rank only: about 1/N of it per rank.
//
// step() (collective) copies the groups' hyper-parameters (what LR schedulers write) into the
// inner optimizer, steps the local shard, then broadcasts every parameter from its owner so all
// ranks hold the full updated model. The broadcasts go in buckets of one owner, dtype and device
// of at most bucket_cap_mb (a lone dense parameter is broadcast in place), in the same order on
// every rank: per step, each rank receives all parameters it does not own, (N-1)/N of the
// model's bytes, which is the cost of one all-gather of the parameters (ZeRO-1 trades the
// optimizer state's memory for that one all-gather; gradients are still all-reduced in full by
// DDP beforehand). Staging costs one bucket of memory per dtype and device.
//
// The gradients must be identical on every rank when step() runs (DDP's all-reduce makes them
// so), since each owner steps its shard alone. A rank whose local step throws leaves the others
// waiting in the broadcast: uncaught, its exception ends the whole job with its message
// (distributed::init's handler, as with DDP); a program that catches it must call
// distributed::abort, and the collective timeout ends the job otherwise.
//
// state_dict() is collective (every rank calls it, in the same order as its other collectives):
// each parameter's state is broadcast from its owner and every rank returns the full state, with
// the keys, flat indices and values a single-process optimizer of the wrapped type would save,
// so that optimizer loads it. consolidated_state_dict(rank) returns it on one rank only.
// load_state_dict(full) takes such a full state (saved by ZeRO on any number of ranks, or by a
// single-process optimizer) and keeps this rank's shard of it: resuming on another rank count
// re-shards. It needs no communication.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "dltrain/distributed/process_group.hpp"
#include "dltrain/optim/optimizer.hpp"

namespace dltrain::distributed {

/// Builds the wrapped optimizer over the given groups (called once per rank, with every
/// group's parameters; see ZeroRedundancyOptimizer). Example:
/// `[](std::vector<optim::ParamGroup> g) { return std::make_unique<optim::SGD>(g, opts); }`.
using OptimizerFactory =
    std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;

struct ZeroOptions {
  /// The data-parallel group to shard over; null = default_group().
  ProcessGroup* group = nullptr;
  /// Largest broadcast bucket after step(), in MiB (> 0).
  double bucket_cap_mb = 25.0;
};

/// ZeRO-1: an optimizer whose state is sharded over the ranks of a group. A
/// dltrain::optim::Optimizer: LR schedulers drive its param_groups(), GradScaler steps it, and
/// zero_grad() clears every parameter's gradient. Example:
/// `auto opt = ZeroRedundancyOptimizer::make<optim::SGD>(model->parameters(),
///     optim::SGDOptions{.lr = 0.1, .momentum = 0.9});`
class ZeroRedundancyOptimizer final : public optim::Optimizer {
 public:
  /// Builds the wrapped optimizer with `factory(groups)` (which validates the groups and fills
  /// their defaults; the adopted groups become param_groups()), partitions the parameters and
  /// keeps this rank's shard. Collective: checks that every rank passed the same parameters
  /// (number of groups and parameters, shapes, dtypes), and throws dltrain::Error on every rank
  /// naming the ranks that differ from rank 0, or the rank whose factory threw. Throws for an
  /// empty parameter list (the wrapped optimizer's message), a null factory or result, or a
  /// non-positive bucket_cap_mb.
  ZeroRedundancyOptimizer(std::vector<optim::ParamGroup> groups, const OptimizerFactory& factory,
                          const ZeroOptions& options = {});
  /// One group holding `params`.
  ZeroRedundancyOptimizer(std::vector<Tensor> params, const OptimizerFactory& factory,
                          const ZeroOptions& options = {});

  /// Wraps an `Opt` built as `Opt(groups, options)`: `make<optim::AdamW>(params,
  /// optim::AdamOptions{.lr = 1e-3, .weight_decay = 0.05})`. `params` is a std::vector of
  /// Tensor or of optim::ParamGroup.
  template <class Opt, class Params, class Options>
  static ZeroRedundancyOptimizer make(Params params, const Options& options,
                                      const ZeroOptions& zero = {}) {
    return ZeroRedundancyOptimizer(
        std::move(params),
        [options](std::vector<optim::ParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
          return std::make_unique<Opt>(std::move(groups), options);
        },
        zero);
  }

  /// Steps this rank's shard, then broadcasts every parameter from its owner. Collective.
  void step() override;
  /// Not supported yet (the partition is fixed at construction): throws dltrain::Error.
  void add_param_group(optim::ParamGroup group) override;
  /// The wrapped optimizer's name ("SGD", "AdamW", ...): also the state dict's type tag.
  const char* name() const override { return local_->name(); }
  /// GradScaler's inf check over the group: one flag, the maximum of every rank's (under
  /// ZeRO-2 each rank sees only its own parameters' gradients). Collective.
  std::vector<Tensor> combine_found_inf(std::vector<Tensor> found) const override;

  /// The full state on `rank` only (an empty StateDict elsewhere). Collective.
  StateDict consolidated_state_dict(int rank) const;
  /// This rank's inner optimizer state: its shard only, with the inner optimizer's (local) flat
  /// indices. No communication.
  StateDict local_state_dict() const { return local_->state_dict(); }
  /// Bytes of the per-parameter state tensors this rank holds.
  int64_t local_state_bytes() const;

  /// The rank that owns flat parameter `i` (its state, its update).
  int owner(int64_t i) const { return owner_.at(static_cast<size_t>(i)); }
  /// The rank that owns parameter `p` (compared by identity), or -1 when `p` is not one of this
  /// optimizer's parameters. What DDPOptions::shard_gradients (ZeRO-2) scatters by.
  int owner_of(const Tensor& p) const;
  /// The flat indices of the parameters this rank owns, increasing.
  const std::vector<int64_t>& local_parameters() const { return local_params_; }
  /// The inner optimizer over this rank's shard (its groups mirror param_groups(); its
  /// hyper-parameters are overwritten from them at every step()).
  optim::Optimizer& local_optimizer() { return *local_; }
  ProcessGroup& process_group() const { return *group_; }

 private:
  struct Bucket {
    int root;
    std::vector<Tensor> params;
    int64_t numel;
    int64_t stage;  // index into stages_, or -1: a lone dense parameter broadcast in place
  };

  void check_same_parameters(bool factory_failed);
  void partition();
  void plan_buckets();
  void sync_hyper_parameters();

  void validate_group(const optim::ParamGroup& group, int64_t g) const override;
  void update(const optim::ParamGroup& group, int64_t i, Tensor& param,
              const Tensor& grad) override;
  std::vector<std::string> state_names() const override;
  void save_state(int64_t i, const std::string& prefix, StateDict& out) const override;
  void load_state(const StateDict& state, const std::vector<optim::ParamGroup>& groups) override;

  ZeroOptions options_;
  ProcessGroup* group_ = nullptr;
  std::unique_ptr<optim::Optimizer> local_;
  std::vector<int> owner_;             // by flat index
  std::vector<int64_t> local_index_;   // by flat index: index in local_, or -1
  std::vector<int64_t> local_params_;  // flat indices owned here
  std::vector<Bucket> buckets_;
  std::vector<Tensor> stages_;       // one staging buffer per dtype and device
  mutable int consolidate_to_ = -1;  // save_state keeps the state only on this rank (-1: all)
};

/// clip_grad_norm_ for a ZeRO optimizer's parameters, whose gradients may be sharded (ZeRO-2:
/// each rank holds its own parameters' gradients only): the norm of all the model's gradients,
/// each counted once (on its owner) and reduced over the optimizer's group, the same total on
/// every rank; each rank scales the gradients it holds. Equals optim::clip_grad_norm_ of one
/// process over the same gradients (up to the order of the partial sums). Collective. Returns
/// the total norm (a 0-d f64 CPU tensor).
Tensor clip_grad_norm_(const ZeroRedundancyOptimizer& optimizer, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false);

}  // namespace dltrain::distributed
