// FullyShardedDataParallel: ZeRO stage 3, the parameters themselves sharded over the ranks of
// a data-parallel group (PyTorch's FSDP with FULL_SHARD and use_orig_params=False).
//
// The user names the units: submodules (by their named_modules() path: "layer1", "blocks.0")
// whose parameters are gathered and freed together; units may nest, and the root module is
// always a unit that owns every trainable parameter no other unit owns. Each unit's trainable
// parameters, in registration order, are flattened into one vector padded to a multiple of the
// group size N, and each rank keeps its 1/N slice of it: the unit's shard, a leaf tensor that
// is what the optimizer steps (parameters()). Outside a unit's use, the module's own parameter
// tensors keep their shape, dtype and autograd identity but hold no memory.
//
// Forward: just before a unit runs (a forward hook, nn/hooks.hpp: units must be called through
// Module::operator(), as Sequential and ResNet call their children), its flat parameters are
// all-gathered into one buffer and the module's parameters are pointed at their slices; when
// its forward returns they are released. Once the first forward has shown the order in which
// units run, the next unit's all-gather is launched before this one's is waited for
// (prefetch), so on an asynchronous backend it runs while this unit computes.
// Backward: an identity node on the unit's output gathers the unit again when the gradient
// reaches it (and prefetches the unit backward reaches next), so code that reads the module's
// parameters in backward (activation checkpointing's recomputation) finds them. Each parameter's
// gradient hook (the same per-parameter hooks DDP's buckets use) copies its final gradient
// into the unit's flat gradient buffer and drops it; when the unit's last gradient is in, the
// buffer is reduce-scattered (average) asynchronously into the unit's gradient shard, the
// unit's gathered parameters are released, and backward goes on. At the end of backward every
// reduce-scatter is waited for and its result added to the shard's grad(). Reduce-scatters are
// launched in one fixed order (units in reverse order of their first forward, the root last),
// a unit that completes early waiting for the earlier ones, so every rank issues its
// collectives in the same order.
//
// The optimizer must be elementwise over the flat shards (SGD, Adam, AdamW: each element's
// update depends on that element only), since a shard cuts parameters anywhere; LARS and LAMB
// (per-parameter norms) would be wrong and are refused by full_optim_state_dict. One param
// group per FSDP object (per-parameter groups would need per-parameter shards).
//
// no_sync(): the hooks keep each parameter's gradient, accumulating in full (as PyTorch's
// FSDP.no_sync, memory of a full gradient per rank); the next synchronised backward scatters
// the accumulated sums.
//
// Memory: between steps a rank holds its shards, their gradients and the optimizer's state of
// them, ~1/N of the model's. During forward, dltrain has no way to empty a buffer that other
// tensors still point at (PyTorch resizes the storage to 0): the parameters an op saves for its
// backward (a linear layer's weight) keep that part of the unit's gathered buffer alive until
// that backward has run. Activation checkpointing inside a unit saves nothing, and then only
// the units in use are gathered.
//
// The module stays sharded for the FSDP object's life, and its parameters read zeros when the
// object is gone (their unit buffers emptied): take full_state_dict() before destroying it, and
// load that into a plain model for evaluation or export.
//
// Buffers (BatchNorm statistics) are not sharded: each rank keeps them, broadcast from rank 0
// at construction; use SyncBatchNorm for the global batch's statistics.
//
// Errors: a rank that throws while the others wait in a gather ends the job with its message
// (distributed::init's handler, as with DDP); the collective timeout ends it otherwise.
//
// CUDA/NCCL: the code path is the same (all_gather / reduce_scatter on the group's stream), and
// compiles, but has not been run on a GPU yet.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dltrain/core/state_dict.hpp"
#include "dltrain/distributed/process_group.hpp"
#include "dltrain/nn/module.hpp"
#include "dltrain/optim/optimizer.hpp"

namespace dltrain::distributed {

struct FSDPOptions {
  /// The group to shard over; null = default_group().
  ProcessGroup* group = nullptr;
  /// The units below the root, by named_modules() path; the root is always a unit.
  std::vector<std::string> units{};
  /// Launch the next unit's all-gather before waiting for this one (forward and backward).
  bool prefetch = true;
};

class FullyShardedDataParallel {
 public:
  /// Checks that every rank holds the same model, broadcasts rank 0's parameters and buffers,
  /// builds the units' shards and frees the module's parameters. Throws dltrain::Error for an
  /// unknown unit path, a unit whose parameters mix dtypes or devices, or ranks that differ.
  explicit FullyShardedDataParallel(std::shared_ptr<nn::Module> module, FSDPOptions options = {});
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  /// Runs the module (the root unit gathered around it).
  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  /// This rank's shards, one per unit (the root first, then the units in the order given):
  /// what the optimizer steps.
  std::vector<Tensor> parameters() const;
  nn::Module& module() { return *module_; }
  ProcessGroup& group() const { return *group_; }

  /// Disables the reduction while alive (gradient accumulation over micro-batches).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(FullyShardedDataParallel& f);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    FullyShardedDataParallel& f_;
    bool previous_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  struct UnitInfo {
    std::string path;                     // "" for the root
    int64_t numel = 0;                    // the unit's trainable elements
    int64_t shard_numel = 0;              // per rank (padded numel / N)
    std::vector<std::string> parameters;  // the model's names, in flat order
  };
  std::vector<UnitInfo> units() const;
  /// Bytes of the shards and of their gradients on this rank.
  int64_t local_parameter_bytes() const;
  int64_t local_gradient_bytes() const;
  /// Bytes of the units' gathered buffers holding values now (gathered or being gathered), and
  /// their peak since construction or reset_max_gathered_bytes(). On the CPU these buffers are
  /// mapped outside the tensor allocator, so memory_allocated() does not count them: add them.
  /// In a group of one the buffers are the shards and count as 0 here.
  int64_t gathered_bytes() const;
  int64_t max_gathered_bytes() const;
  void reset_max_gathered_bytes();

  /// The model's state dict, parameters gathered, under the model's own names (a single
  /// process's load_state_dict takes it). Collective; every rank returns it.
  StateDict full_state_dict();
  /// Loads a full state dict (from full_state_dict on any rank count, or a single process's
  /// model): each rank keeps its slice of each unit. No communication. Strict: a missing or
  /// unexpected entry, or a shape that differs, throws naming it.
  void load_full_state_dict(const StateDict& state);

  /// `opt` (built over parameters(), one group) state as a single-process optimizer of the
  /// same type over module().parameters() saves it: per-element state gathered and cut into
  /// the parameters' shapes, under their flat indices. Collective.
  StateDict full_optim_state_dict(const optim::Optimizer& opt);
  /// Loads such a state (saved on any rank count, or by a single process) into `opt` (built
  /// over parameters()), keeping this rank's slices. No communication.
  void load_full_optim_state_dict(optim::Optimizer& opt, const StateDict& state);

  /// This rank's shards ("shard.<unit>") and the group size ("world_size"); with
  /// sharded_optim_state_dict, what a checkpoint per rank holds. No communication.
  StateDict sharded_state_dict() const;
  /// Loads what sharded_state_dict saved on the same rank of a group of the same size (to
  /// resume on another size, save and load the full state dicts). Throws naming the mismatch.
  void load_sharded_state_dict(const StateDict& state);

  struct Impl;

 private:
  std::shared_ptr<nn::Module> module_;
  ProcessGroup* group_;
  std::shared_ptr<Impl> impl_;
};

}  // namespace dltrain::distributed
