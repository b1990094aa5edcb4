// DistributedDataParallel: data-parallel training with gradient reduction overlapped with
// backward, and SyncBatchNorm.
//
// DDP wraps a model. At construction it checks that every rank holds the same parameters
// (names, shapes, dtypes; a mismatch names the first differing parameter and the ranks) and
// broadcasts parameters and buffers from rank 0. Trainable parameters are packed, in reverse
// registration order (roughly the order backward produces their gradients), into buckets of
// one dtype and device: the first of first_bucket_cap_mb, the others of bucket_cap_mb. A
// gradient hook on each parameter copies its final gradient into its bucket; when a bucket
// is full its all-reduce (average) is launched at once, asynchronously, in bucket order on
// every rank, so communication runs while backward computes the remaining gradients. When
// backward ends, a callback waits for the buckets and writes the averaged gradients back
// (with gradient_as_bucket_view the gradients are views into the buckets and nothing is
// copied). Buckets are launched strictly in order on every rank, so ranks never issue
// collectives in different orders.
//
// The averaged gradient equals the gradient of the mean loss over the global batch when
// each rank's loss is a mean over its own batch of equal size (what DistributedSampler
// gives). no_sync() skips the reduction for gradient accumulation: gradients accumulate
// locally, and the next synchronised backward reduces the accumulated sums.
//
// ZeRO-2 (DDPOptions::shard_gradients, with a ZeroRedundancyOptimizer over the same
// parameters): each bucket is laid out as one segment per rank, holding the gradients of the
// parameters that rank owns in the optimizer's partition (segments padded to the longest), and
// is reduce-scattered (average) instead of all-reduced, launched from the same hooks in the same
// order, overlapped with backward. A bucket whose segments do not balance (padding past 2x its
// elements: typically one large parameter alone in its bucket, so one owner) is all-reduced
// instead, which moves fewer bytes, and only its owner keeps the result. Each rank then keeps
// the averaged gradients of its own parameters only; every other parameter's gradient is
// dropped as soon as it is copied into its bucket, and a bucket's full buffer exists only from
// its first gradient until its collective has completed (at most two buckets wait for their
// collective at once; the oldest is waited for when a new one is launched). So a rank holds
// its share of the gradients after backward (its parameters in the optimizer's partition,
// plus segment padding), and the buckets in flight during it.
// Under no_sync() the hooks do nothing: gradients accumulate in full on every rank (as with
// PyTorch FSDP's no_sync), and the next synchronised backward scatters the accumulated sums.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dltrain/distributed/process_group.hpp"
#include "dltrain/nn/containers.hpp"
#include "dltrain/nn/layers.hpp"
#include "dltrain/nn/module.hpp"

namespace dltrain::distributed {

class ZeroRedundancyOptimizer;

struct DDPOptions {
  /// The group to reduce over; null = default_group().
  ProcessGroup* group = nullptr;
  /// Bucket sizes in MiB (PyTorch's defaults).
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  /// Broadcast rank 0's buffers (BatchNorm running statistics) at every training forward.
  bool broadcast_buffers = true;
  /// Allow parameters that get no gradient in a step (found by walking the graph from the
  /// forward's output; they are reduced as zeros). Without it such a parameter is an error.
  bool find_unused_parameters = false;
  /// Make each parameter's .grad() a view into its bucket (no copies; zero_grad keeps it).
  bool gradient_as_bucket_view = false;
  /// Launch each bucket as soon as it is full (the point of DDP). False launches them all
  /// after backward, which only benchmarks want (to measure what overlap hides).
  bool overlap = true;
  /// Reduce f32/f64 gradients in 16 bits (PyTorch's bf16_compress_hook / fp16_compress_hook):
  /// each bucket is divided by the group size, cast to this dtype (DType::bf16 or DType::f16),
  /// summed across ranks in it, and cast back into the gradients. Half the bytes on the wire
  /// for a gradient rounded to 8 (bf16) or 11 (f16) significant bits, each partial sum of the
  /// reduction rounded again. bf16 keeps f32's range; f16 can overflow past 65504 (the
  /// pre-division keeps the sum in the inputs' range). Buckets already in 16 bits are reduced
  /// as they are; a group of one reduces nothing (no rounding) unless reduce_world_of_one.
  /// nullopt: full precision.
  std::optional<DType> gradient_compression = std::nullopt;
  /// After the first synchronised backward, rebuild the buckets once in the order the
  /// gradients actually became ready there (rank 0's order, broadcast), as PyTorch's DDP does.
  /// Buckets are launched in index order, so with the initial reverse-registration layout a
  /// model that registers its layers in another order than it uses them (a head declared
  /// before the body, an encoder after its decoder) holds every bucket back until its late
  /// first bucket is complete: no overlap at all. Not done with find_unused_parameters (the
  /// order can change from step to step). Values are unchanged: only which gradients share a
  /// bucket and when each is launched.
  bool rebuild_buckets = true;
  /// In a group of one the average is the gradient itself, so DDP skips the bucket copies and
  /// the collectives (and gradient_compression's rounding). True runs the full path anyway:
  /// gradients copied into the buckets, every bucket all-reduced (compressed when asked), the
  /// results copied back, the buckets rebuilt with a broadcast. For tests and measurements
  /// that must drive the real reduction (NCCL on one GPU, MPI on one rank); it costs the
  /// copies and the collectives' latency.
  bool reduce_world_of_one = false;
  /// ZeRO-2: reduce-scatter the gradients to the ranks that own them in this
  /// ZeroRedundancyOptimizer's partition instead of all-reducing them (file comment): after
  /// backward each rank holds only its own parameters' averaged gradients (the others' are
  /// undefined), which is all that optimizer's step() reads. Build the optimizer over the
  /// model's parameters first, on the same group, and keep it alive as long as the DDP object.
  /// Every trainable parameter must be one of the optimizer's. Not with gradient_as_bucket_view
  /// nor gradient_compression. GradScaler's inf check is reduced over the group by the
  /// optimizer (combine_found_inf); clip with distributed::clip_grad_norm_(optimizer, ...), not
  /// optim::clip_grad_norm_, which would see only this rank's shard.
  const ZeroRedundancyOptimizer* shard_gradients = nullptr;
};

class DistributedDataParallel {
 public:
  /// Wraps `module` (see the file comment). Throws dltrain::Error on every rank when the
  /// ranks' parameters differ.
  explicit DistributedDataParallel(std::shared_ptr<nn::Module> module, DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  /// Broadcasts buffers when asked, prepares the reduction of the coming backward and runs
  /// the module.
  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  /// A typed call of the wrapped module, for models with several inputs or outputs
  /// (docs/design.md, "Modules and batches with several inputs and outputs"):
  /// `auto [recon, mu, logvar] = ddp.call<Vae>(x);` `ddp.call<Gnn>(x, edge_index, edge_attr)`.
  /// Does what forward does around the call (buffers broadcast, bucket views, and with
  /// find_unused_parameters the graph walk from every tensor of the result: a Tensor, a
  /// pair, tuple or vector of them). The module is called as M (its dynamic type or a base)
  /// through operator() when that takes the arguments, else through forward, as nn::Chain.
  template <class M, class... Args>
  decltype(auto) call(Args&&... args) {
    M* m = dynamic_cast<M*>(module_.get());
    DLTRAIN_CHECK(m != nullptr, "DistributedDataParallel::call<M>: the wrapped module is a ",
                  module_->type_name(), ", not the class named in call<M>; name its own class");
    before_forward();
    decltype(auto) out = nn::detail::call_module(*m, std::forward<Args>(args)...);
    if (find_unused_wanted()) {
      std::vector<Tensor> outs;
      collect_outputs(out, outs);
      after_forward(outs);
    }
    return out;
  }

  /// The wrapped model (its state_dict has the model's own names, without a "module." prefix).
  nn::Module& module() { return *module_; }
  const std::shared_ptr<nn::Module>& module_ptr() const { return module_; }
  ProcessGroup& group() const { return *group_; }

  /// Disables gradient reduction while alive (gradient accumulation over micro-batches).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  /// One bucket: its dtype, element count and parameter names, in launch order.
  struct BucketInfo {
    DType dtype;
    Device device;
    /// Elements reduced (with shard_gradients: size() segments of shard_numel, padding included).
    int64_t numel = 0;
    /// The dtype the all-reduce runs in (gradient_compression's for compressed buckets).
    DType wire_dtype = DType::f32;
    std::vector<std::string> parameters;
    /// With shard_gradients: the length of each rank's segment when the bucket is
    /// reduce-scattered; 0 when it is all-reduced (without shard_gradients, or unbalanced).
    int64_t shard_numel = 0;
  };
  std::vector<BucketInfo> buckets() const;

  /// Seconds the last backward spent, after its last node, waiting for communication
  /// (communication that overlap did not hide).
  double last_wait_seconds() const;

  /// When the last synchronised backward completed each bucket (its last gradient ready),
  /// in seconds after that backward's first gradient hook, in bucket order (buckets()), and
  /// when its last node ended (the end-of-backward callback). The per-bucket backward times
  /// a scaling model needs (docs/scaling.md; `benchmarks/ddp_overlap` prints them). A bucket
  /// completed only at the end (unused parameters) reads backward_seconds.
  /// CPU buckets are timed on the host clock. CUDA buckets are timed on their GPU: a timing
  /// event is recorded on the current stream (the one that produced the gradient) at the first
  /// hook, when each bucket is complete and at the end of backward, so the times are when the
  /// GPU finished that work, not when the host enqueued it; backward_seconds is then the GPU's
  /// too. Those events are read here, on demand, which waits for the last one (the training
  /// step itself never waits for them).
  struct RoundTiming {
    std::vector<double> bucket_ready_seconds;
    double backward_seconds = 0;
  };
  RoundTiming last_round_timing() const;

  struct Reducer;

 private:
  void before_forward();
  bool find_unused_wanted() const;
  void after_forward(const std::vector<Tensor>& outputs);
  static void collect_outputs(const Tensor& t, std::vector<Tensor>& out) { out.push_back(t); }
  static void collect_outputs(const std::vector<Tensor>& ts, std::vector<Tensor>& out) {
    out.insert(out.end(), ts.begin(), ts.end());
  }
  template <class A, class B>
  static void collect_outputs(const std::pair<A, B>& p, std::vector<Tensor>& out) {
    collect_outputs(p.first, out);
    collect_outputs(p.second, out);
  }
  template <class... T>
  static void collect_outputs(const std::tuple<T...>& t, std::vector<Tensor>& out) {
    std::apply([&](const auto&... e) { (collect_outputs(e, out), ...); }, t);
  }
  template <class T>
  static void collect_outputs(const T&, std::vector<Tensor>&) {
    DLTRAIN_CHECK(false,
                  "DistributedDataParallel::call with find_unused_parameters: the module returned "
                  "a type DDP cannot read; return a Tensor, or a pair, tuple or vector of them, so "
                  "that DDP can walk the outputs' graph");
  }

  std::shared_ptr<nn::Module> module_;
  DDPOptions options_;
  ProcessGroup* group_;
  std::shared_ptr<Reducer> reducer_;
};

/// A differentiable all-reduce (sum): forward sums `x` over the group's ranks, backward sums
/// the incoming gradients over the ranks (the gradient of every rank's loss with respect to
/// its input). Blocks until the result is ready.
Tensor all_reduce_with_grad(const Tensor& x, ProcessGroup& group);

/// BatchNorm whose training statistics are those of the global batch: per-channel sums over
/// the group's ranks (one all-reduce of 2C + 1 values per forward, one per backward), inputs
/// [N, C], [N, C, L], [N, C, H, W] or [N, C, D, H, W]. In eval mode it is plain BatchNorm.
/// Running statistics are updated identically on every rank.
class SyncBatchNorm : public nn::BatchNorm {
 public:
  /// `group` null = default_group() at forward time.
  explicit SyncBatchNorm(int64_t num_features, const nn::BatchNormOptions& options = {},
                         ProcessGroup* group = nullptr, TensorOptions opts = TensorOptions());
};

/// Makes a BatchNorm synchronised over `group` (null = default_group() at forward time) by
/// setting its sync_stats (nn::BatchNorm).
void make_sync_batchnorm(nn::BatchNorm& bn, ProcessGroup* group = nullptr);

/// Synchronises every BatchNorm in `module` (recursively) over `group`, in place: the modules,
/// parameters and buffers stay the same objects, so optimizers built before keep working and
/// models that hold their layers in typed fields (ResNet's bn1) are converted too. Returns
/// `module`. Call it before wrapping the model in DistributedDataParallel.
std::shared_ptr<nn::Module> convert_sync_batchnorm(std::shared_ptr<nn::Module> module,
                                                   ProcessGroup* group = nullptr);

}  // namespace dltrain::distributed
