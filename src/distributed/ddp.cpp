// DistributedDataParallel's reducer and SyncBatchNorm (see include/dltrain/distributed/ddp.hpp).
//
// Invariants of the reducer: buckets are launched strictly in index order (next_bucket_), so
// every rank issues the same all-reduces in the same order whatever order its hooks fire in;
// a round (one synchronised backward) starts at the first hook and ends in the engine's
// end-of-backward callback, which always waits for every launched bucket before it returns
// or throws, so no collective outlives the round that launched it.
//
// Sharded buckets (shard_gradients, ZeRO-2): a bucket's buffer is allocated at its first
// gradient and released when its collective is reaped (reap), at most kShardedInFlight buckets
// in flight; a parameter's view into it exists only while it is allocated. A bucket whose
// segments balance (size() x the longest segment <= 2 x its elements) is reduce-scattered into
// a shard allocated at launch; the owned gradients become views into it and nothing else keeps
// it. A bucket that does not balance (one owner: a large parameter alone in its bucket) is
// all-reduced instead, which moves fewer bytes than a reduce-scatter of mostly padding, and its
// owner keeps its gradients out of the buffer (as views when it owns all of them, else copies).
//
// Timing (last_round_timing): CPU buckets read the host clock when they complete; CUDA
// buckets record a timing event on the current stream instead (the one the hook's gradient
// was produced and copied on), against events recorded at the round's first hook and at its
// end, read only when the timing is asked for. Two sets of events alternate between rounds, so
// the last finished round's set is intact while the next round records into the other.
#include "dltrain/distributed/ddp.hpp"

#include "dltrain/distributed/zero.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <optional>
#include <unordered_set>

#include "dltrain/autograd/node.hpp"
#include "dltrain/backend/cuda.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/reduction.hpp"
#include "dltrain/ops/shape.hpp"
#include "src/core/layout.hpp"
#include "src/distributed/internal.hpp"

namespace dltrain::distributed {

namespace {

// A view of `numel(like)` elements of `flat` at `offset`, laid out like `like` when `like`
// is dense (so copying a channels-last gradient into it is a straight copy).
Tensor bucket_view(const Tensor& flat, int64_t offset, const Tensor& like) {
  const bool cl = like.suggest_memory_format() == MemoryFormat::ChannelsLast;
  return ::dltrain::detail::make_view(
      flat, like.shape(),
      cl ? channels_last_strides(like.shape()) : contiguous_strides(like.shape()),
      flat.storage_offset() + offset);
}

// Rank 0's values of `ts` on every rank, one broadcast per dtype and device (a ResNet-50 has
// 161 buffers, mostly a few hundred bytes: one collective each would cost a round trip each,
// every training step).
void broadcast_coalesced(ProcessGroup& g, const std::vector<Tensor>& ts) {
  std::vector<std::pair<std::pair<DType, Device>, std::vector<Tensor>>> groups;
  for (const Tensor& t : ts) {
    const auto key = std::make_pair(t.dtype(), t.device());
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& e) { return e.first == key; });
    if (it == groups.end()) {
      groups.push_back({key, {}});
      it = groups.end() - 1;
    }
    it->second.push_back(t);
  }
  for (auto& [key, group] : groups) {
    std::vector<Tensor> flat;
    for (const Tensor& t : group) flat.push_back(t.reshape({-1}));
    Tensor packed = cat(flat);
    g.broadcast(packed, 0).wait();
    int64_t off = 0;
    for (Tensor& t : group) {
      t.copy_(packed.narrow(0, off, t.numel()).view(t.shape()));
      off += t.numel();
    }
  }
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find('\n', start);
    if (end == std::string::npos) end = s.size();
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// ZeRO-2: how many sharded buckets may wait for their reduce-scatter at once (each holds its
// full buffer until then). Two keep one collective running while the next bucket fills.
constexpr size_t kShardedInFlight = 2;

std::string signature(const nn::Module& m) {
  std::string sig;
  for (const auto& [name, t] : m.named_parameters())
    sig += "parameter '" + name + "' " + shape_str(t.shape()) + " " + dtype_name(t.dtype()) +
           (t.requires_grad() ? "" : " (frozen)") + "\n";
  for (const auto& [name, t] : m.named_buffers())
    sig += "buffer '" + name + "' " + shape_str(t.shape()) + " " + dtype_name(t.dtype()) + "\n";
  return sig;
}

}  // namespace

// --- the reducer ---------------------------------------------------------------------------

struct DistributedDataParallel::Reducer
    : std::enable_shared_from_this<DistributedDataParallel::Reducer> {
  struct Param {
    std::string name;
    Tensor tensor;
    size_t bucket = 0;
    Tensor view;
    int owner = 0;       // shard_gradients: the rank that keeps this parameter's gradient
    int64_t offset = 0;  // shard_gradients: its offset in the bucket's (padded) buffer
  };
  struct Bucket {
    Tensor buffer;
    Tensor wire;  // the 16-bit copy that is reduced (gradient_compression), else undefined
    std::vector<size_t> params;
    size_t pending = 0;
    Work work;
    bool launched = false;
    int64_t numel = 0;  // elements reduced (sharded: size() * shard.numel())
    DType dtype = DType::f32;
    Device device = Device::cpu();
    Tensor shard;             // sharded: this rank's segment of the result, during a round
    int64_t shard_numel = 0;  // sharded: each segment's length; 0 for an all-reduced bucket
    bool reaped = true;       // sharded: its collective waited for, its buffer released
  };

  ProcessGroup* group = nullptr;
  DDPOptions opt;
  bool sharded = false;           // shard_gradients (ZeRO-2)
  std::vector<size_t> in_flight;  // sharded buckets launched and not reaped, in launch order
  std::vector<Param> params;
  std::vector<Bucket> buckets;
  bool sync = true;
  bool round_active = false;
  std::vector<char> ready;
  size_t next_bucket = 0;
  std::vector<size_t> unused_next;  // found by forward's graph walk (find_unused_parameters)
  double last_wait = 0;
  // Timing of the round (last_round_timing): host times, CUDA buckets' events, and the last
  // finished round's (whose CUDA entries are filled in from its events when first asked for).
  std::chrono::steady_clock::time_point round_start;
  RoundTiming timing, finished_timing;
  double since_start() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - round_start).count();
  }
  struct GpuRound {
    uint64_t layout = 0;                            // the layout generation the events belong to
    std::vector<int> devices;                       // the CUDA devices holding a bucket
    std::vector<cuda::Event> start, end;            // per device
    std::vector<std::optional<cuda::Event>> ready;  // per bucket (CUDA buckets only)
    std::vector<size_t> ready_device;               // per bucket: its index in `devices`
  };
  std::array<GpuRound, 2> gpu;
  int gpu_cur = 0;                // the set this (or the last) round records into
  std::optional<int> gpu_unread;  // the finished round's set, until last_round_timing reads it
  uint64_t layout_gen = 1;        // bumped by lay_out
  bool any_cuda_bucket = false;

  // The event set for a new round, (re)built for the current layout.
  GpuRound& next_gpu_round() {
    gpu_cur ^= 1;
    GpuRound& g = gpu[static_cast<size_t>(gpu_cur)];
    if (gpu_unread == gpu_cur) gpu_unread.reset();  // unread for two rounds: overwritten
    if (g.layout == layout_gen) return g;
    g = GpuRound();
    g.layout = layout_gen;
    for (const Bucket& b : buckets) {
      if (!b.device.is_cuda()) {
        g.ready.emplace_back();
        g.ready_device.push_back(0);
        continue;
      }
      const int dev = b.device.index;
      cuda::DeviceGuard guard(dev);
      g.ready.emplace_back(cuda::Event(/*timing=*/true));
      auto at = std::find(g.devices.begin(), g.devices.end(), dev);
      if (at == g.devices.end()) {
        g.devices.push_back(dev);
        g.start.emplace_back(true);
        g.end.emplace_back(true);
        at = g.devices.end() - 1;
      }
      g.ready_device.push_back(static_cast<size_t>(at - g.devices.begin()));
    }
    return g;
  }
  GpuRound& gpu_round() { return gpu[static_cast<size_t>(gpu_cur)]; }

  // Records bucket b's completion: the host clock, or an event on its device's current stream.
  void stamp_ready(size_t b, double host_seconds) {
    timing.bucket_ready_seconds[b] = host_seconds;
    if (!any_cuda_bucket) return;
    if (auto& e = gpu_round().ready[b]) e->record(cuda::current_stream(buckets[b].device.index));
  }
  // The order the gradients became ready in this round, until the buckets are rebuilt (true
  // from the start when no rebuild is wanted: rebuild_buckets off, or find_unused_parameters).
  std::vector<size_t> ready_order;
  bool rebuilt = false;

  // In a group of one the average is the gradient itself: no bucket copies, no collective, no
  // copy back (a single-process run wrapped in DDP pays only the readiness bookkeeping),
  // unless reduce_world_of_one asks for the full path.
  bool solo() const { return group->size() == 1 && !opt.reduce_world_of_one; }

  void on_grad(size_t i, const Tensor& grad) {
    if (!sync) return;
    if (!round_active) start_round();
    Param& p = params[i];
    Bucket& b = buckets[p.bucket];
    DLTRAIN_CHECK(!b.launched, "DistributedDataParallel: parameter '", p.name,
                  "' got a gradient after its bucket was reduced (was it marked unused by "
                  "find_unused_parameters, or used twice in one backward?)");
    if (sharded && !solo()) {
      ensure_buffer(p.bucket);
      p.view.copy_(grad);
      // Whatever this rank owns comes back averaged into its shard; the local gradient is
      // not needed any more (this is where ZeRO-2 saves the gradients' memory).
      p.tensor.set_grad(Tensor());
    } else if (!solo() && grad.data_ptr() != p.view.data_ptr()) {
      p.view.copy_(grad);
    }
    if (!ready[i]) mark_ready(i);
  }

  // Sharded: allocates bucket b's buffer and its parameters' views into it, once per round.
  void ensure_buffer(size_t b) {
    Bucket& bk = buckets[b];
    if (bk.buffer.defined()) return;
    bk.buffer = zeros({bk.numel}, TensorOptions(bk.dtype).with_device(bk.device));
    for (size_t pi : bk.params)
      params[pi].view = bucket_view(bk.buffer, params[pi].offset, params[pi].tensor);
  }

  // Sharded: waits for bucket b's reduce-scatter, hands the owned parameters their averaged
  // gradients (views into the shard) and releases the full buffer.
  void reap(size_t b) {
    Bucket& bk = buckets[b];
    if (bk.reaped) return;
    bk.reaped = true;
    bk.work.wait();
    const int me = group->rank();
    const int64_t base = static_cast<int64_t>(me) * bk.shard_numel;
    const bool owns_all = std::all_of(bk.params.begin(), bk.params.end(),
                                      [&](size_t pi) { return params[pi].owner == me; });
    for (size_t pi : bk.params) {
      Param& p = params[pi];
      if (p.owner == me) {
        if (bk.shard_numel > 0)
          p.tensor.set_grad(bucket_view(bk.shard, p.offset - base, p.tensor));
        else
          p.tensor.set_grad(owns_all ? p.view : p.view.clone());
      }
      p.view = Tensor();
    }
    bk.buffer = Tensor();
    bk.shard = Tensor();
  }

  void start_round() {
    round_active = true;
    round_start = std::chrono::steady_clock::now();
    timing.bucket_ready_seconds.assign(buckets.size(), 0.0);
    if (any_cuda_bucket) {
      GpuRound& g = next_gpu_round();
      for (size_t d = 0; d < g.devices.size(); ++d)
        g.start[d].record(cuda::current_stream(g.devices[d]));
    }
    std::fill(ready.begin(), ready.end(), 0);
    ready_order.clear();
    for (auto& b : buckets) {
      b.pending = b.params.size();
      b.launched = false;
      b.work = Work();
    }
    next_bucket = 0;
    autograd::queue_callback([self = weak_from_this()] {
      if (auto r = self.lock()) r->finish_round();
    });
    for (size_t i : unused_next) {
      if (sharded && !solo()) ensure_buffer(params[i].bucket);
      params[i].view.zero_();
      mark_ready(i);
    }
    unused_next.clear();
  }

  void mark_ready(size_t i) {
    ready[i] = 1;
    if (!rebuilt) ready_order.push_back(i);
    Bucket& b = buckets[params[i].bucket];
    if (--b.pending == 0) {
      stamp_ready(params[i].bucket, since_start());
      if (opt.overlap) launch_in_order();
    }
  }

  void launch_in_order() {
    while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0) {
      const size_t index = next_bucket++;
      Bucket& b = buckets[index];
      if (solo()) {
      } else if (sharded) {
        ensure_buffer(index);  // a bucket whose parameters were all unused
        if (b.shard_numel > 0) {
          b.shard = empty({b.shard_numel}, TensorOptions(b.dtype).with_device(b.device));
          b.work = group->reduce_scatter(b.shard, b.buffer, ReduceOp::Avg);
        } else {
          b.work = group->all_reduce(b.buffer, ReduceOp::Avg);
        }
        b.reaped = false;
        in_flight.push_back(index);
        while (in_flight.size() > kShardedInFlight) {
          reap(in_flight.front());
          in_flight.erase(in_flight.begin());
        }
      } else if (b.wire.defined()) {
        // Divide before the cast (fp16_compress_hook's order: the sum of the ranks' shares
        // stays in the inputs' range, no f16 overflow from the sum alone), in the same pass
        // as the cast; the bucket is overwritten by the result.
        copy_scaled_(b.wire, b.buffer, 1.0 / group->size());
        b.work = group->all_reduce(b.wire, ReduceOp::Sum);
      } else {
        // The collective overwrites the bucket (the gradients' views) behind the version
        // counter's back: it is told here.
        b.buffer.bump_version("DDP all_reduce");
        b.work = group->all_reduce(b.buffer, ReduceOp::Avg);
      }
      b.launched = true;
    }
  }

  void wait_launched() {
    if (sharded) {
      for (size_t b : in_flight) reap(b);
      in_flight.clear();
      return;
    }
    for (auto& b : buckets)
      if (b.launched) b.work.wait();
  }

  void finish_round() {
    round_active = false;
    timing.backward_seconds = since_start();
    if (any_cuda_bucket) {
      GpuRound& g = gpu_round();
      for (size_t d = 0; d < g.devices.size(); ++d)
        g.end[d].record(cuda::current_stream(g.devices[d]));
    }
    std::vector<std::string> missing;
    for (size_t i = 0; i < params.size(); ++i)
      if (!ready[i]) missing.push_back(params[i].name);
    if (!missing.empty() && !opt.find_unused_parameters) {
      wait_launched();
      std::string names;
      for (size_t k = 0; k < missing.size() && k < 10; ++k)
        names += (k ? ", " : "") + std::string("'") + missing[k] + "'";
      if (missing.size() > 10) names += ", ... (" + std::to_string(missing.size()) + " in all)";
      DLTRAIN_FAIL("DistributedDataParallel: ", missing.size(),
                   " parameter(s) got no gradient in this backward: ", names,
                   ". Every rank must reduce every bucket; if the model does not use them in "
                   "every step, construct DDP with find_unused_parameters = true, or mark them "
                   "requires_grad_(false)");
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (ready[i]) continue;
      if (sharded && !solo()) ensure_buffer(params[i].bucket);
      params[i].view.zero_();
      ready[i] = 1;
      if (--buckets[params[i].bucket].pending == 0)
        stamp_ready(params[i].bucket, timing.backward_seconds);
    }
    finished_timing = timing;
    if (any_cuda_bucket) gpu_unread = gpu_cur;
    launch_in_order();
    const auto t0 = std::chrono::steady_clock::now();
    wait_launched();
    last_wait = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!solo())
      for (Bucket& b : buckets)
        if (b.wire.defined()) b.buffer.copy_(b.wire);
    if (sharded && !solo()) {  // reap has set the owned gradients
      if (!rebuilt) rebuild();
      return;
    }
    for (size_t i = 0; i < params.size(); ++i) {
      Param& p = params[i];
      Tensor g = p.tensor.grad();
      if (solo()) {  // the gradient is final; an unused parameter gets zeros, as when reduced
        if (!g.defined()) p.tensor.set_grad(zeros_like(p.tensor));
        continue;
      }
      if (opt.gradient_as_bucket_view) {
        if (!g.defined() || g.data_ptr() != p.view.data_ptr()) p.tensor.set_grad(p.view);
      } else if (g.defined()) {
        g.copy_(p.view);
      } else {
        p.tensor.set_grad(p.view.clone());
      }
    }
    if (!rebuilt) rebuild();
  }

  // Lays the buckets out over `params` in the order `order` lists them: a bucket per dtype
  // and device open at a time, the first one capped at first_bucket_cap_mb, the others at
  // bucket_cap_mb, a parameter larger than the cap alone in its bucket.
  void lay_out(const std::vector<size_t>& order) {
    std::vector<int64_t> bucket_bytes, bucket_cap;
    std::vector<std::pair<DType, Device>> bucket_key;
    std::vector<std::vector<std::pair<size_t, int64_t>>> members;  // (param, offset)
    for (size_t pi : order) {
      const Tensor& t = params[pi].tensor;
      const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
      // The open bucket of this dtype and device is the last one created with that key.
      std::optional<size_t> open;
      for (size_t b = bucket_key.size(); b-- > 0;)
        if (bucket_key[b] == std::make_pair(t.dtype(), t.device())) {
          open = b;
          break;
        }
      if (!open || (bucket_bytes[*open] > 0 && bucket_bytes[*open] + bytes > bucket_cap[*open])) {
        const double cap_mb = bucket_key.empty() ? opt.first_bucket_cap_mb : opt.bucket_cap_mb;
        bucket_key.emplace_back(t.dtype(), t.device());
        bucket_bytes.push_back(0);
        bucket_cap.push_back(static_cast<int64_t>(cap_mb * 1024 * 1024));
        members.emplace_back();
        open = bucket_key.size() - 1;
      }
      members[*open].emplace_back(pi, bucket_bytes[*open] / static_cast<int64_t>(t.element_size()));
      bucket_bytes[*open] += bytes;
    }
    buckets.clear();
    in_flight.clear();
    for (size_t b = 0; b < members.size(); ++b) {
      Bucket bucket;
      const auto [dt, dev] = bucket_key[b];
      bucket.dtype = dt;
      bucket.device = dev;
      int64_t numel = bucket_bytes[b] / static_cast<int64_t>(dtype_size(dt));
      if (sharded && !solo()) {
        // One segment per rank, each holding its owner's parameters in bucket order, padded
        // to the longest: reduce_scatter hands segment r to rank r.
        const int n = group->size();
        std::vector<int64_t> seg(static_cast<size_t>(n), 0);
        for (auto [pi, offset] : members[b])
          seg[static_cast<size_t>(params[pi].owner)] += params[pi].tensor.numel();
        const int64_t len = *std::max_element(seg.begin(), seg.end());
        // Padding costs wire bytes: past 2x, an all-reduce of the bucket moves fewer.
        const bool scatter = n * len <= 2 * numel;
        std::fill(seg.begin(), seg.end(), 0);
        for (auto [pi, offset] : members[b]) {
          Param& p = params[pi];
          p.bucket = b;
          p.offset = scatter
                         ? static_cast<int64_t>(p.owner) * len + seg[static_cast<size_t>(p.owner)]
                         : offset;
          seg[static_cast<size_t>(p.owner)] += p.tensor.numel();
          p.view = Tensor();
          bucket.params.push_back(pi);
        }
        bucket.numel = scatter ? len * n : numel;
        bucket.shard_numel = scatter ? len : 0;
        buckets.push_back(std::move(bucket));
        continue;
      }
      bucket.numel = numel;
      bucket.buffer = zeros({numel}, TensorOptions(dt).with_device(dev));
      for (auto [pi, offset] : members[b]) {
        params[pi].bucket = b;
        params[pi].view = bucket_view(bucket.buffer, offset, params[pi].tensor);
        bucket.params.push_back(pi);
      }
      if (opt.gradient_compression && !solo() && (dt == DType::f32 || dt == DType::f64))
        bucket.wire = zeros({numel}, TensorOptions(*opt.gradient_compression).with_device(dev));
      buckets.push_back(std::move(bucket));
    }
    ++layout_gen;  // the next round builds its timing events for these buckets
    any_cuda_bucket = std::any_of(buckets.begin(), buckets.end(),
                                  [](const Bucket& b) { return b.device.is_cuda(); });
  }

  // The last finished round's timing, its CUDA buckets read from their events (waiting for
  // the round's end event on each device the first time).
  RoundTiming read_timing() {
    if (!gpu_unread) return finished_timing;
    GpuRound& g = gpu[static_cast<size_t>(*gpu_unread)];
    gpu_unread.reset();
    double end_s = 0;
    for (size_t d = 0; d < g.devices.size(); ++d) {
      g.end[d].synchronize();
      end_s = std::max(end_s, g.start[d].elapsed_ms(g.end[d]) / 1e3);
    }
    for (size_t b = 0; b < g.ready.size() && b < finished_timing.bucket_ready_seconds.size(); ++b) {
      if (!g.ready[b]) continue;
      g.ready[b]->synchronize();
      finished_timing.bucket_ready_seconds[b] =
          g.start[g.ready_device[b]].elapsed_ms(*g.ready[b]) / 1e3;
    }
    finished_timing.backward_seconds = end_s;
    return finished_timing;
  }

  // Once, at the end of the first synchronised backward: the buckets in rank 0's ready order
  // (every rank must launch the same buckets in the same order).
  void rebuild() {
    rebuilt = true;
    if (ready_order.size() != params.size() || solo()) return;
    Tensor order_t = from_vector(std::vector<int64_t>(ready_order.begin(), ready_order.end()),
                                 {static_cast<int64_t>(ready_order.size())})
                         .to(group->tensor_device());
    group->broadcast(order_t, 0).wait();
    std::vector<size_t> order;
    for (int64_t i : order_t.to_vector<int64_t>()) order.push_back(static_cast<size_t>(i));
    std::vector<size_t> current;
    for (const Bucket& b : buckets) current.insert(current.end(), b.params.begin(), b.params.end());
    ready_order.clear();
    ready_order.shrink_to_fit();
    if (order == current) return;  // already in that order: same layout
    // Gradients that live in the old buckets (gradient_as_bucket_view) move to the new ones.
    std::vector<Tensor> old_views;
    for (const Param& p : params) old_views.push_back(p.view);
    lay_out(order);
    if (opt.gradient_as_bucket_view) {
      NoGradGuard ng;
      for (size_t i = 0; i < params.size(); ++i) {
        Tensor g = params[i].tensor.grad();
        if (g.defined() && g.data_ptr() == old_views[i].data_ptr()) {
          params[i].view.copy_(g);
          params[i].tensor.set_grad(params[i].view);
        }
      }
    }
  }

  // Gradients as bucket views before backward: zeroed where they were cleared.
  void attach_views() {
    for (Bucket& b : buckets) {
      bool all_cleared = true;
      for (size_t i : b.params) all_cleared = all_cleared && !params[i].tensor.grad().defined();
      if (all_cleared) b.buffer.zero_();
      for (size_t i : b.params) {
        Param& p = params[i];
        Tensor g = p.tensor.grad();
        if (g.defined() && g.data_ptr() == p.view.data_ptr()) continue;
        if (g.defined())
          p.view.copy_(g);
        else if (!all_cleared)
          p.view.zero_();
        p.tensor.set_grad(p.view);
      }
    }
  }

  // Parameters the graph of `out` does not reach.
  void find_unused(const std::vector<Tensor>& outs) {
    std::unordered_set<const TensorImpl*> reached;
    std::unordered_set<const autograd::Node*> seen;
    std::vector<std::shared_ptr<autograd::Node>> stack;
    for (const Tensor& out : outs) {
      if (out.defined() && out.grad_fn()) stack.push_back(out.grad_fn());
      // An output that is a parameter itself (a leaf) is reached too.
      if (out.defined() && out.is_leaf()) reached.insert(out.impl().get());
    }
    while (!stack.empty()) {
      auto n = stack.back();
      stack.pop_back();
      if (!seen.insert(n.get()).second) continue;
      if (auto* acc = dynamic_cast<autograd::AccumulateGrad*>(n.get()))
        reached.insert(acc->leaf().get());
      for (const auto& e : n->next_edges())
        if (e.node) stack.push_back(e.node);
    }
    unused_next.clear();
    for (size_t i = 0; i < params.size(); ++i)
      if (!reached.count(params[i].tensor.impl().get())) unused_next.push_back(i);
  }
};

// --- DistributedDataParallel ------------------------------------------------------------------

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 DDPOptions options)
    : module_(std::move(module)), options_(options) {
  DLTRAIN_CHECK(module_ != nullptr, "DistributedDataParallel: the module is null");
  DLTRAIN_CHECK(options_.bucket_cap_mb > 0 && options_.first_bucket_cap_mb > 0,
                "DistributedDataParallel: bucket caps must be positive, got ",
                options_.first_bucket_cap_mb, " and ", options_.bucket_cap_mb, " MiB");
  DLTRAIN_CHECK(!options_.gradient_compression || *options_.gradient_compression == DType::bf16 ||
                    *options_.gradient_compression == DType::f16,
                "DistributedDataParallel: gradient_compression must be DType::bf16 or DType::f16 "
                "(or nullopt for full precision), got ",
                options_.gradient_compression.value_or(DType::f32));
  group_ = options_.group ? options_.group : &default_group();
  ProcessGroup& g = *group_;
  if (const ZeroRedundancyOptimizer* z = options_.shard_gradients) {
    DLTRAIN_CHECK(!options_.gradient_as_bucket_view && !options_.gradient_compression,
                  "DistributedDataParallel: shard_gradients (ZeRO-2) works neither with "
                  "gradient_as_bucket_view nor with gradient_compression; turn them off");
    DLTRAIN_CHECK(&z->process_group() == group_,
                  "DistributedDataParallel: shard_gradients' ZeroRedundancyOptimizer shards over "
                  "another process group than DDP's; build both on the same group");
  }

  // 1. Every rank must hold the same model: compare with rank 0's description.
  const std::string mine = signature(*module_);
  const std::string theirs = detail::broadcast_string(g, mine);
  std::string difference;
  if (mine != theirs) {
    auto a = lines(mine), b = lines(theirs);
    for (size_t i = 0; i < std::max(a.size(), b.size()) && difference.empty(); ++i) {
      const std::string x = i < a.size() ? a[i] : "(nothing)";
      const std::string y = i < b.size() ? b[i] : "(nothing)";
      if (x != y)
        difference = "entry " + std::to_string(i) + " is " + x + " on rank " +
                     std::to_string(g.rank()) + " but " + y + " on rank 0";
    }
  }
  Tensor flags = zeros({g.size()}, TensorOptions(DType::i32).with_device(g.tensor_device()));
  Tensor flag = full({1}, difference.empty() ? 0.0 : 1.0,
                     TensorOptions(DType::i32).with_device(g.tensor_device()));
  g.all_gather(flags, flag).wait();
  std::string bad;
  for (int r = 0; auto v : flags.to_vector<int32_t>()) {
    if (v) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
    ++r;
  }
  DLTRAIN_CHECK(
      bad.empty(), "DistributedDataParallel: the model differs between ranks (rank(s) ", bad,
      " differ from rank 0)",
      difference.empty() ? std::string("; see their message") : std::string(": ") + difference,
      ". Build the same model on every rank before wrapping it");

  // 2. Rank 0's values everywhere.
  {
    NoGradGuard ng;
    std::vector<Work> works;
    for (const auto& t : module_->parameters()) {
      t.bump_version("DDP broadcast");
      works.push_back(g.broadcast(t, 0));
    }
    for (const auto& t : module_->buffers()) {
      t.bump_version("DDP broadcast");
      works.push_back(g.broadcast(t, 0));
    }
    for (auto& w : works) w.wait();
  }

  // 3. Buckets over the trainable parameters, in reverse registration order.
  reducer_ = std::make_shared<Reducer>();
  Reducer& r = *reducer_;
  r.group = group_;
  r.opt = options_;
  r.sharded = options_.shard_gradients != nullptr;
  r.rebuilt = !options_.rebuild_buckets || options_.find_unused_parameters;
  auto named = module_->named_parameters();
  for (auto it = named.rbegin(); it != named.rend(); ++it) {
    if (!it->second.requires_grad()) continue;
    r.params.push_back({it->first, it->second, 0, Tensor()});
    if (r.sharded) {
      const int owner = options_.shard_gradients->owner_of(it->second);
      DLTRAIN_CHECK(owner >= 0, "DistributedDataParallel: shard_gradients: parameter '", it->first,
                    "' is not one of the ZeroRedundancyOptimizer's parameters; build the "
                    "optimizer over every trainable parameter of the model (or freeze it)");
      r.params.back().owner = owner;
    }
  }
  std::vector<size_t> order(r.params.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  r.lay_out(order);
  r.ready.assign(r.params.size(), 0);
  std::weak_ptr<Reducer> weak = reducer_;
  for (size_t i = 0; i < r.params.size(); ++i)
    r.params[i].tensor.register_hook([weak, i](const Tensor& grad) {
      if (auto red = weak.lock()) red->on_grad(i, grad);
    });
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::before_forward() {
  if (module_->is_training() && options_.broadcast_buffers && group_->size() > 1) {
    NoGradGuard ng;
    broadcast_coalesced(*group_, module_->buffers());
  }
  if (options_.gradient_as_bucket_view && autograd::grad_mode_enabled()) reducer_->attach_views();
}

bool DistributedDataParallel::find_unused_wanted() const {
  return options_.find_unused_parameters && reducer_->sync && autograd::grad_mode_enabled();
}

void DistributedDataParallel::after_forward(const std::vector<Tensor>& outputs) {
  reducer_->find_unused(outputs);
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  before_forward();
  Tensor out = module_->forward(x);
  if (find_unused_wanted()) after_forward({out});
  return out;
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.reducer_->sync) {
  ddp_.reducer_->sync = false;
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() { ddp_.reducer_->sync = previous_; }

std::vector<DistributedDataParallel::BucketInfo> DistributedDataParallel::buckets() const {
  std::vector<BucketInfo> out;
  for (const auto& b : reducer_->buckets) {
    BucketInfo info{b.dtype, b.device,     b.numel, b.wire.defined() ? b.wire.dtype() : b.dtype,
                    {},      b.shard_numel};
    for (size_t i : b.params) info.parameters.push_back(reducer_->params[i].name);
    out.push_back(std::move(info));
  }
  return out;
}

double DistributedDataParallel::last_wait_seconds() const { return reducer_->last_wait; }

DistributedDataParallel::RoundTiming DistributedDataParallel::last_round_timing() const {
  return reducer_->read_timing();
}

// --- SyncBatchNorm ---------------------------------------------------------------------------

Tensor all_reduce_with_grad(const Tensor& x, ProcessGroup& group) {
  Tensor out;
  {
    NoGradGuard ng;
    out = x.contiguous().clone();
    group.all_reduce(out, ReduceOp::Sum).wait();
  }
  ProcessGroup* g = &group;
  autograd::record("all_reduce", {x}, {out}, [g](const std::vector<Tensor>& grads) {
    Tensor gsum = grads[0].contiguous().clone();
    g->all_reduce(gsum, ReduceOp::Sum).wait();
    return std::vector<Tensor>{gsum};
  });
  return out;
}

SyncBatchNorm::SyncBatchNorm(int64_t num_features, const nn::BatchNormOptions& options,
                             ProcessGroup* group, TensorOptions opts)
    : nn::BatchNorm("SyncBatchNorm", {2, 3, 4, 5}, num_features, options, opts) {
  make_sync_batchnorm(*this, group);
}

void make_sync_batchnorm(nn::BatchNorm& bn, ProcessGroup* group) {
  bn.sync_stats = [group](const Tensor& stats) {
    ProcessGroup* g = group;
    if (!g) {
      DLTRAIN_CHECK(is_initialized(),
                    "SyncBatchNorm: no process group; call "
                    "distributed::init() first (or pass a group)");
      g = &default_group();
    }
    return all_reduce_with_grad(stats, *g);
  };
}

std::shared_ptr<nn::Module> convert_sync_batchnorm(std::shared_ptr<nn::Module> module,
                                                   ProcessGroup* group) {
  DLTRAIN_CHECK(module != nullptr, "convert_sync_batchnorm: the module is null");
  module->apply([group](nn::Module& m) {
    if (auto* bn = dynamic_cast<nn::BatchNorm*>(&m)) make_sync_batchnorm(*bn, group);
  });
  return module;
}

}  // namespace dltrain::distributed
