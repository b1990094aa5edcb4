// FullyShardedDataParallel (include/dltrain/distributed/fsdp.hpp).
//
// How a unit's parameters are "freed": the module's parameter tensors are views, for the
// object's whole life, into one buffer per unit (its gathered flat parameters). On the CPU that
// buffer is an anonymous memory mapping: releasing the unit hands its pages back to the system
// (madvise MADV_DONTNEED) while the address, the Storage and its version counter stay; the next
// all-gather faults the pages back in and writes the values again. This is PyTorch's
// storage().resize_(0) in effect: every tensor over the buffer (the module's parameters, what
// autograd saved of them) sees it emptied and refilled, none keeps the memory alive, and the
// version counters that saved tensors check stay valid (the gather does not bump them: the
// values it writes are the ones they saw). Between a release and the next gather the buffer
// reads zeros. CUDA buffers cannot be emptied in place this way (that needs the virtual memory
// API, cuMemMap): a CUDA unit keeps its gathered buffer allocated, so on a GPU FSDP shards the
// gradients and the optimizer state but not the parameters' memory yet.
//
// Invariants: every rank issues the same collectives in the same order: gathers in forward in
// the order units are called (the same program on every rank), prefetches from the forward order
// recorded by the first forward, reduce-scatters strictly in reduce_order (reverse forward order),
// the end-of-backward callback waiting for every one before it returns or throws.
#include "dltrain/distributed/fsdp.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>

#include "dltrain/autograd/node.hpp"
#include "dltrain/nn/hooks.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/shape.hpp"
#include "src/core/layout.hpp"
#include "src/distributed/internal.hpp"

namespace dltrain::distributed {

namespace {

constexpr const char* kName = "FullyShardedDataParallel";

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

// A flat buffer of `numel` elements whose memory release() can hand back in place (CPU: an
// anonymous mapping; CUDA: an ordinary allocation that stays).
Tensor make_unit_buffer(int64_t numel, DType dt, Device dev) {
  auto impl = std::make_shared<TensorImpl>();
  const size_t bytes = static_cast<size_t>(numel) * dtype_size(dt);
  if (dev.is_cpu()) {
    const size_t len = std::max(page_size(), (bytes + page_size() - 1) / page_size() * page_size());
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    DLTRAIN_CHECK(p != MAP_FAILED, kName, ": cannot map ", len,
                  " bytes for a unit's gathered parameters (out of memory?)");
    impl->storage = Storage(p, bytes, dev, [len](void* q) { munmap(q, len); });
  } else {
    impl->storage = Storage(bytes, dev);
  }
  impl->shape = {numel};
  impl->strides = {1};
  impl->dtype = dt;
  return Tensor(std::move(impl));
}

// Hands the pages of a CPU unit buffer back to the system (the contents read as zeros after).
void empty_buffer(const Tensor& full) {
  if (!full.device().is_cpu()) return;
  const size_t bytes = full.numel() * full.element_size();
  const size_t len = (bytes + page_size() - 1) / page_size() * page_size();
  madvise(full.storage().data(), len, MADV_DONTNEED);
}

std::string join(const std::vector<std::string>& v, size_t max = 10) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max; ++i) s += (i ? ", '" : "'") + v[i] + "'";
  if (v.size() > max) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s;
}

}  // namespace

struct FullyShardedDataParallel::Impl : std::enable_shared_from_this<Impl> {
  struct Unit {
    std::string path;
    nn::Module* module = nullptr;
    std::vector<std::string> names;
    std::vector<Tensor> params;
    std::vector<int64_t> offsets;
    std::vector<int64_t> global_index;  // index in module.parameters()
    int64_t numel = 0, shard_numel = 0;
    DType dtype = DType::f32;
    Device device = Device::cpu();
    Tensor shard;  // this rank's slice: the optimizer's parameter
    Tensor full;   // the gathered buffer the module's parameters view
    Work gather;
    bool in_flight = false;  // a gather launched, not waited for
    bool resident = false;   // the buffer holds the gathered values
    // the round (one synchronised backward)
    std::vector<char> got;
    size_t pending = 0;
    bool ready = false, launched = false;
    Tensor grad_full, grad_shard;
    Work reduce;
    uint64_t hooks = 0;
  };

  ProcessGroup* group = nullptr;
  FSDPOptions opt;
  std::vector<Unit> units;  // [0] = the root
  std::vector<size_t> fwd_order;
  bool order_known = false;
  std::vector<size_t> reduce_order;
  size_t next_reduce = 0;
  bool sync = true;
  bool round_active = false;
  std::vector<char> called;  // units whose forward hook ran in the current forward
  // A group of one: the shard is the whole unit and its storage is the unit buffer's, always
  // resident (no gather, no release: a copy into it would bump the version counter that the
  // tensors autograd saved check).
  bool solo = false;
  int64_t resident_bytes = 0, max_resident_bytes = 0;  // gathered unit buffers (CPU pages in use)

  static int64_t buffer_bytes(const Unit& U) {
    return U.full.numel() * static_cast<int64_t>(U.full.element_size());
  }

  bool unit_empty(size_t u) const { return units[u].numel == 0; }

  void launch_gather(size_t u) {
    Unit& U = units[u];
    if (unit_empty(u) || solo || U.resident || U.in_flight) return;
    U.gather = group->all_gather(U.full, U.shard.detach());
    U.in_flight = true;
    resident_bytes += buffer_bytes(U);
    max_resident_bytes = std::max(max_resident_bytes, resident_bytes);
  }

  void gather(size_t u) {
    launch_gather(u);
    Unit& U = units[u];
    if (!U.in_flight) return;
    U.in_flight = false;
    U.gather.wait();
    U.resident = true;
  }

  void release(size_t u) {
    Unit& U = units[u];
    if (U.in_flight) {  // never empty a buffer a collective is writing into
      U.in_flight = false;
      U.gather.wait();
      U.resident = true;  // its pages are written: empty them (a prefetch never used)
    }
    if (!U.resident || solo) return;
    empty_buffer(U.full);
    U.resident = false;
    resident_bytes -= buffer_bytes(U);
  }

  // The unit after (forward) or before (backward) `u` in the recorded forward order.
  std::optional<size_t> neighbour(size_t u, int step) const {
    if (!order_known || !opt.prefetch) return std::nullopt;
    auto it = std::find(fwd_order.begin(), fwd_order.end(), u);
    if (it == fwd_order.end()) return std::nullopt;
    const auto k = static_cast<int64_t>(it - fwd_order.begin()) + step;
    if (k < 0 || k >= static_cast<int64_t>(fwd_order.size())) return std::nullopt;
    return fwd_order[static_cast<size_t>(k)];
  }

  void pre_forward(size_t u) {
    if (u < called.size()) called[u] = 1;
    if (!order_known && std::find(fwd_order.begin(), fwd_order.end(), u) == fwd_order.end())
      fwd_order.push_back(u);
    launch_gather(u);
    if (auto next = neighbour(u, +1)) launch_gather(*next);
    gather(u);
  }

  Tensor post_forward(size_t u, const Tensor& out) {
    release(u);
    if (!autograd::grad_mode_enabled() || !out.defined() || !out.requires_grad()) return out;
    // An identity whose backward gathers the unit before the gradient enters it.
    Tensor y = out.detach();
    std::weak_ptr<Impl> weak = weak_from_this();
    autograd::record("fsdp_pre_backward", {out}, {y}, [weak, u](const std::vector<Tensor>& g) {
      if (auto self = weak.lock()) self->pre_backward(u);
      return g;
    });
    return y;
  }

  void pre_backward(size_t u) {
    start_round();
    if (units[u].ready) return;
    launch_gather(u);
    if (auto prev = neighbour(u, -1); prev && !units[*prev].ready) launch_gather(*prev);
    gather(u);
  }

  void start_round() {
    if (round_active) return;
    round_active = true;
    for (Unit& U : units) {
      U.got.assign(U.params.size(), 0);
      U.pending = U.params.size();
      U.ready = U.launched = false;
    }
    next_reduce = 0;
    std::weak_ptr<Impl> weak = weak_from_this();
    autograd::queue_callback([weak] {
      if (auto self = weak.lock()) self->finish_round();
    });
  }

  void on_grad(size_t u, size_t i, const Tensor& grad) {
    if (!sync) return;
    start_round();
    Unit& U = units[u];
    DLTRAIN_CHECK(!U.launched, kName, ": parameter '", U.names[i],
                  "' got a gradient after its unit's reduce-scatter was launched (is it used "
                  "outside its unit, or twice in one backward?)");
    NoGradGuard ng;
    if (!U.grad_full.defined())
      U.grad_full =
          zeros({U.shard_numel * group->size()}, TensorOptions(U.dtype).with_device(U.device));
    const Tensor& p = U.params[i];
    U.grad_full.narrow(0, U.offsets[i], p.numel()).view(p.shape()).copy_(grad);
    p.set_grad(Tensor());  // the shard's gradient is what stays
    if (!U.got[i]) {
      U.got[i] = 1;
      if (--U.pending == 0) {
        U.ready = true;
        release(u);
        launch_reduces();
      }
    }
  }

  void launch_reduces() {
    while (next_reduce < reduce_order.size() && units[reduce_order[next_reduce]].ready) {
      Unit& U = units[reduce_order[next_reduce++]];
      if (U.numel == 0) continue;
      if (!U.grad_full.defined())
        U.grad_full =
            zeros({U.shard_numel * group->size()}, TensorOptions(U.dtype).with_device(U.device));
      U.grad_shard = empty({U.shard_numel}, TensorOptions(U.dtype).with_device(U.device));
      U.reduce = group->reduce_scatter(U.grad_shard, U.grad_full, ReduceOp::Avg);
      U.launched = true;
    }
  }

  void finish_round() {
    round_active = false;
    if (sync) {
      // Parameters that got no gradient are reduced as zeros (every rank reduces every unit).
      for (Unit& U : units) U.ready = true;
      launch_reduces();
      NoGradGuard ng;
      for (size_t u : reduce_order) {
        Unit& U = units[u];
        if (!U.launched) continue;
        U.reduce.wait();
        Tensor g = U.shard.grad();
        if (g.defined())
          add_(g, U.grad_shard);
        else
          U.shard.set_grad(U.grad_shard);
        U.grad_full = Tensor();
        U.grad_shard = Tensor();
        U.launched = false;
      }
    }
    for (size_t u = 0; u < units.size(); ++u) release(u);
  }

  void set_order_known() {
    if (order_known) return;
    order_known = true;
    for (size_t u = 0; u < units.size(); ++u)
      if (std::find(fwd_order.begin(), fwd_order.end(), u) == fwd_order.end())
        fwd_order.push_back(u);
    reduce_order.assign(fwd_order.rbegin(), fwd_order.rend());
    // The root last: its parameters (a stem and a head, typically) finish at both ends.
    reduce_order.erase(std::find(reduce_order.begin(), reduce_order.end(), size_t{0}));
    reduce_order.push_back(0);
  }
};

// --- FullyShardedDataParallel ----------------------------------------------------------------

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<nn::Module> module,
                                                   FSDPOptions options)
    : module_(std::move(module)) {
  DLTRAIN_CHECK(module_ != nullptr, kName, ": the module is null");
  group_ = options.group ? options.group : &default_group();
  ProcessGroup& g = *group_;
  const int n = g.size(), r = g.rank();

  // 1. The same model everywhere: names, shapes, dtypes, and the same units.
  std::string mine;
  for (const auto& [name, t] : module_->named_parameters())
    mine += "parameter '" + name + "' " + shape_str(t.shape()) + " " + dtype_name(t.dtype()) +
            (t.requires_grad() ? "" : " (frozen)") + "\n";
  for (const auto& [name, t] : module_->named_buffers())
    mine += "buffer '" + name + "' " + shape_str(t.shape()) + " " + dtype_name(t.dtype()) + "\n";
  for (const auto& u : options.units) mine += "unit '" + u + "'\n";
  const std::string theirs = detail::broadcast_string(g, mine);
  Tensor flag = full({1}, mine == theirs ? 0.0 : 1.0,
                     TensorOptions(DType::i32).with_device(g.tensor_device()));
  g.all_reduce(flag, ReduceOp::Max).wait();
  DLTRAIN_CHECK(flag.to(Device::cpu()).item<int32_t>() == 0, kName,
                ": the model or the units differ between ranks",
                mine == theirs
                    ? std::string(" (not on this rank: see the others' message)")
                    : std::string(" (this rank, ") + std::to_string(r) + ", differs from rank 0)",
                ". Build the same model and name the same units on every rank");

  // 2. Rank 0's values everywhere.
  {
    NoGradGuard ng;
    std::vector<Work> works;
    for (const auto& t : module_->parameters()) {
      t.bump_version("FSDP broadcast");
      works.push_back(g.broadcast(t, 0));
    }
    for (const auto& t : module_->buffers()) {
      t.bump_version("FSDP broadcast");
      works.push_back(g.broadcast(t, 0));
    }
    for (auto& w : works) w.wait();
  }

  // 3. The units and the parameters each owns (its own, not those of a unit inside it).
  impl_ = std::make_shared<Impl>();
  Impl& im = *impl_;
  im.group = group_;
  im.opt = options;
  im.solo = n == 1;
  std::map<std::string, nn::Module*> by_path;
  for (const auto& [path, m] : module_->named_modules()) by_path[path] = m.get();
  im.units.push_back({});
  im.units[0].module = module_.get();
  std::set<std::string> seen;
  for (const std::string& path : options.units) {
    DLTRAIN_CHECK(!path.empty(), kName, ": a unit path is empty; the root module is always a unit");
    DLTRAIN_CHECK(seen.insert(path).second, kName, ": unit '", path, "' is named twice");
    auto it = by_path.find(path);
    if (it == by_path.end()) {
      std::vector<std::string> names;
      for (const auto& [p, m] : by_path)
        if (!p.empty()) names.push_back(p);
      DLTRAIN_FAIL(kName, ": no submodule '", path, "' in the ", module_->type_name(),
                   "; its submodules are ", join(names, 20));
    }
    Impl::Unit u;
    u.path = path;
    u.module = it->second;
    im.units.push_back(std::move(u));
  }
  int64_t gi = 0;
  for (const auto& [name, t] : module_->named_parameters()) {
    const int64_t index = gi++;
    if (!t.requires_grad()) continue;
    size_t best = 0, best_len = 0;
    for (size_t u = 1; u < im.units.size(); ++u) {
      const std::string& p = im.units[u].path;
      if (name.size() > p.size() && name.compare(0, p.size(), p) == 0 && name[p.size()] == '.' &&
          p.size() + 1 > best_len) {
        best = u;
        best_len = p.size() + 1;
      }
    }
    Impl::Unit& U = im.units[best];
    if (!U.params.empty()) {
      DLTRAIN_CHECK(t.dtype() == U.dtype && t.device() == U.device, kName, ": unit '", U.path,
                    "' mixes parameters of dtype/device ", dtype_name(U.dtype), "/", U.device.str(),
                    " ('", U.names[0], "') and ", dtype_name(t.dtype()), "/", t.device().str(),
                    " ('", name,
                    "'); a unit's parameters are flattened into one buffer: make them alike or "
                    "split the unit");
    }
    U.dtype = t.dtype();
    U.device = t.device();
    U.names.push_back(name);
    U.params.push_back(t);
    U.offsets.push_back(U.numel);
    U.global_index.push_back(index);
    U.numel += t.numel();
  }
  for (size_t u = 1; u < im.units.size(); ++u)
    DLTRAIN_CHECK(im.units[u].numel > 0, kName, ": unit '", im.units[u].path,
                  "' has no trainable parameters of its own (an inner unit holds them all, or it "
                  "has none); drop it from FSDPOptions::units");

  // 4. The shards, and the module's parameters made views of the unit buffers (emptied).
  NoGradGuard ng;
  for (Impl::Unit& U : im.units) {
    if (U.numel == 0) continue;
    U.shard_numel = (U.numel + n - 1) / n;
    const int64_t padded = U.shard_numel * n;
    U.full = make_unit_buffer(padded, U.dtype, U.device);
    U.shard = n == 1 ? U.full.detach()
                     : zeros({U.shard_numel}, TensorOptions(U.dtype).with_device(U.device));
    const int64_t lo = static_cast<int64_t>(r) * U.shard_numel, hi = lo + U.shard_numel;
    for (size_t i = 0; i < U.params.size(); ++i) {
      Tensor& p = U.params[i];
      const int64_t a = std::max(lo, U.offsets[i]), b = std::min(hi, U.offsets[i] + p.numel());
      if (a < b)
        U.shard.narrow(0, a - lo, b - a)
            .copy_(p.detach().reshape({-1}).narrow(0, a - U.offsets[i], b - a));
      // The parameter keeps its handle (layers hold it, autograd knows it) and becomes a view.
      auto& pi = *p.impl();
      pi.storage = U.full.storage();
      pi.offset = U.offsets[i];
      pi.strides = contiguous_strides(pi.shape);
    }
    U.shard.requires_grad_(true);
    if (n == 1)
      U.resident = true;
    else
      empty_buffer(U.full);
  }

  // 5. Hooks: forward around each unit below the root, gradients of each parameter.
  std::weak_ptr<Impl> weak = impl_;
  for (size_t u = 1; u < im.units.size(); ++u) {
    im.units[u].hooks = nn::register_forward_hooks(
        *im.units[u].module, {.pre =
                                  [weak, u](nn::Module&) {
                                    if (auto self = weak.lock()) self->pre_forward(u);
                                  },
                              .post =
                                  [weak, u](nn::Module&, const Tensor& out) {
                                    auto self = weak.lock();
                                    return self ? self->post_forward(u, out) : out;
                                  }});
  }
  for (size_t u = 0; u < im.units.size(); ++u)
    for (size_t i = 0; i < im.units[u].params.size(); ++i)
      im.units[u].params[i].register_hook([weak, u, i](const Tensor& grad) {
        if (auto self = weak.lock()) self->on_grad(u, i, grad);
      });
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  if (!impl_) return;
  for (auto& U : impl_->units)
    if (U.hooks) nn::remove_forward_hooks(U.hooks);
  for (size_t u = 0; u < impl_->units.size(); ++u) {
    auto& U = impl_->units[u];
    if (U.in_flight) U.gather.wait();
    if (U.launched) U.reduce.wait();
  }
}

Tensor FullyShardedDataParallel::forward(const Tensor& x) {
  Impl& im = *impl_;
  im.called.assign(im.units.size(), 0);
  im.pre_forward(0);
  Tensor out;
  try {
    out = (*module_)(x);
  } catch (...) {
    for (size_t u = 0; u < im.units.size(); ++u) im.release(u);
    throw;
  }
  // A unit whose hooks did not run computed with emptied parameters (zeros): refuse the result.
  std::vector<std::string> skipped;
  for (size_t u = 1; u < im.units.size(); ++u)
    if (!im.called[u]) skipped.push_back(im.units[u].path);
  if (!skipped.empty()) {
    for (size_t u = 0; u < im.units.size(); ++u) im.release(u);
    DLTRAIN_FAIL(kName, ": unit(s) ", join(skipped),
                 " did not run through Module::operator() in this forward, so their parameters "
                 "were never gathered (a parent that calls child->forward(x) or a multi-argument "
                 "overload bypasses the hooks, and an unused unit is never gathered). Name as "
                 "units the modules called as (*child)(x) on every forward");
  }
  out = im.post_forward(0, out);
  im.set_order_known();
  return out;
}

std::vector<Tensor> FullyShardedDataParallel::parameters() const {
  std::vector<Tensor> out;
  for (const auto& U : impl_->units)
    if (U.numel > 0) out.push_back(U.shard);
  return out;
}

FullyShardedDataParallel::NoSyncGuard::NoSyncGuard(FullyShardedDataParallel& f)
    : f_(f), previous_(f.impl_->sync) {
  f_.impl_->sync = false;
}
FullyShardedDataParallel::NoSyncGuard::~NoSyncGuard() { f_.impl_->sync = previous_; }

std::vector<FullyShardedDataParallel::UnitInfo> FullyShardedDataParallel::units() const {
  std::vector<UnitInfo> out;
  for (const auto& U : impl_->units) out.push_back({U.path, U.numel, U.shard_numel, U.names});
  return out;
}

int64_t FullyShardedDataParallel::local_parameter_bytes() const {
  int64_t b = 0;
  for (const auto& U : impl_->units)
    if (U.numel > 0) b += U.shard.numel() * static_cast<int64_t>(U.shard.element_size());
  return b;
}

int64_t FullyShardedDataParallel::local_gradient_bytes() const {
  int64_t b = 0;
  for (const auto& U : impl_->units) {
    if (U.numel == 0) continue;
    if (Tensor g = U.shard.grad(); g.defined())
      b += g.numel() * static_cast<int64_t>(g.element_size());
    for (const Tensor& p : U.params)
      if (Tensor g = p.grad(); g.defined()) b += g.numel() * static_cast<int64_t>(g.element_size());
  }
  return b;
}

int64_t FullyShardedDataParallel::gathered_bytes() const { return impl_->resident_bytes; }
int64_t FullyShardedDataParallel::max_gathered_bytes() const { return impl_->max_resident_bytes; }
void FullyShardedDataParallel::reset_max_gathered_bytes() {
  impl_->max_resident_bytes = impl_->resident_bytes;
}

StateDict FullyShardedDataParallel::full_state_dict() {
  Impl& im = *impl_;
  std::map<std::string, Tensor> values;
  for (size_t u = 0; u < im.units.size(); ++u) {
    if (im.unit_empty(u)) continue;
    im.gather(u);
    auto& U = im.units[u];
    for (size_t i = 0; i < U.params.size(); ++i) values[U.names[i]] = U.params[i].detach().clone();
    im.release(u);
  }
  StateDict out;
  for (const auto& [key, t] : module_->state_dict()) {
    auto it = values.find(key);
    out.insert(key, it != values.end() ? it->second : t.clone());
  }
  return out;
}

void FullyShardedDataParallel::load_full_state_dict(const StateDict& state) {
  Impl& im = *impl_;
  const StateDict own = module_->state_dict();
  std::vector<std::string> missing, unexpected;
  for (const auto& [key, t] : own)
    if (!state.contains(key)) missing.push_back(key);
  for (const auto& [key, t] : state)
    if (!own.contains(key)) unexpected.push_back(key);
  DLTRAIN_CHECK(missing.empty() && unexpected.empty(), kName,
                "::load_full_state_dict: the state does not match the model: missing ",
                missing.empty() ? std::string("nothing") : join(missing), ", unexpected ",
                unexpected.empty() ? std::string("nothing") : join(unexpected),
                ". Load a state saved from the same model (full_state_dict or a single "
                "process's state_dict)");
  for (const auto& [key, t] : own) {
    const Tensor& v = state.at(key);
    DLTRAIN_CHECK(v.shape() == t.shape(), kName, "::load_full_state_dict: entry '", key,
                  "' has shape ", shape_str(v.shape()), " but the model's is ",
                  shape_str(t.shape()));
  }
  NoGradGuard ng;
  std::set<std::string> sharded;
  const int64_t r = group_->rank();
  for (auto& U : im.units) {
    if (U.numel == 0) continue;
    const int64_t lo = r * U.shard_numel, hi = lo + U.shard_numel;
    for (size_t i = 0; i < U.params.size(); ++i) {
      sharded.insert(U.names[i]);
      const int64_t m = U.params[i].numel();
      const int64_t a = std::max(lo, U.offsets[i]), b = std::min(hi, U.offsets[i] + m);
      if (a >= b) continue;
      Tensor v = state.at(U.names[i]).to(U.device).to(U.dtype).contiguous().reshape({-1});
      U.shard.narrow(0, a - lo, b - a).copy_(v.narrow(0, a - U.offsets[i], b - a));
    }
  }
  // Buffers and frozen parameters are held whole.
  for (const auto& [key, t] : own) {
    if (sharded.count(key)) continue;
    Tensor dst = t;
    dst.copy_(state.at(key));
  }
}

namespace {
bool elementwise_state(const std::string& name) { return name != "step"; }

// The per-parameter entry names ("momentum_buffer", "exp_avg", ...) in an optimizer state.
std::vector<std::string> state_entry_names(const StateDict& state) {
  std::set<std::string> names;
  for (const auto& [key, t] : state) {
    if (key.rfind("state.", 0) != 0) continue;
    const auto dot = key.find('.', 6);
    if (dot != std::string::npos) names.insert(key.substr(dot + 1));
  }
  return {names.begin(), names.end()};
}
}  // namespace

StateDict FullyShardedDataParallel::full_optim_state_dict(const optim::Optimizer& opt) {
  Impl& im = *impl_;
  const std::string type = opt.name();
  DLTRAIN_CHECK(type == "SGD" || type == "Adam" || type == "AdamW", kName,
                "::full_optim_state_dict: a ", type,
                " optimizer is not elementwise (or not known to be): its update of a flat shard "
                "would differ from the per-parameter update; use SGD, Adam or AdamW with FSDP");
  const auto shards = parameters();
  DLTRAIN_CHECK(
      opt.param_groups().size() == 1 && opt.param_groups()[0].params.size() == shards.size(), kName,
      "::full_optim_state_dict: build the optimizer over parameters() in one "
      "param group");
  for (size_t k = 0; k < shards.size(); ++k)
    DLTRAIN_CHECK(opt.param_groups()[0].params[k].impl() == shards[k].impl(), kName,
                  "::full_optim_state_dict: the optimizer's parameter ", k,
                  " is not this FSDP's shard ", k, "; build the optimizer over parameters()");
  const StateDict local = opt.state_dict();
  StateDict out;
  out.insert("type", local.at("type"));
  const auto names = state_entry_names(local);
  std::vector<std::pair<int64_t, std::pair<std::string, Tensor>>> entries;
  size_t k = 0;
  for (auto& U : im.units) {
    if (U.numel == 0) continue;
    const std::string pre = "state." + std::to_string(k++) + ".";
    for (const std::string& name : names) {
      if (!local.contains(pre + name)) continue;
      const Tensor& t = local.at(pre + name);
      if (!elementwise_state(name)) {
        for (size_t i = 0; i < U.params.size(); ++i)
          entries.push_back({U.global_index[i], {name, t.clone()}});
        continue;
      }
      Tensor whole =
          empty({U.shard_numel * group_->size()}, TensorOptions(t.dtype()).with_device(t.device()));
      group_->all_gather(whole, t.contiguous()).wait();
      for (size_t i = 0; i < U.params.size(); ++i)
        entries.push_back({U.global_index[i],
                           {name, whole.narrow(0, U.offsets[i], U.params[i].numel())
                                      .view(U.params[i].shape())
                                      .clone()}});
    }
  }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [i, e] : entries) out.insert("state." + std::to_string(i) + "." + e.first, e.second);
  const int64_t total = static_cast<int64_t>(module_->parameters().size());
  std::vector<int64_t> idx(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) idx[static_cast<size_t>(i)] = i;
  out.insert("param_groups.0.params", from_vector(idx));
  for (const auto& [key, t] : local)
    if (key.rfind("param_groups.0.", 0) == 0 && key != "param_groups.0.params") out.insert(key, t);
  return out;
}

void FullyShardedDataParallel::load_full_optim_state_dict(optim::Optimizer& opt,
                                                          const StateDict& state) {
  Impl& im = *impl_;
  DLTRAIN_CHECK(!state.contains("param_groups.1.params"), kName,
                "::load_full_optim_state_dict: the state has several param groups; FSDP's "
                "optimizer has one");
  StateDict local;
  local.insert("type", state.at("type"));
  const auto names = state_entry_names(state);
  const int64_t r = group_->rank();
  size_t k = 0;
  for (auto& U : im.units) {
    if (U.numel == 0) continue;
    const std::string pre = "state." + std::to_string(k++) + ".";
    for (const std::string& name : names) {
      auto key_of = [&](size_t i) {
        return "state." + std::to_string(U.global_index[i]) + "." + name;
      };
      if (!state.contains(key_of(0))) continue;
      if (!elementwise_state(name)) {
        local.insert(pre + name, state.at(key_of(0)).clone());
        continue;
      }
      const Tensor& t0 = state.at(key_of(0));
      Tensor shard = zeros({U.shard_numel}, TensorOptions(t0.dtype()).with_device(U.device));
      const int64_t lo = r * U.shard_numel, hi = lo + U.shard_numel;
      for (size_t i = 0; i < U.params.size(); ++i) {
        const Tensor& v = state.at(key_of(i));
        DLTRAIN_CHECK(v.shape() == U.params[i].shape(), kName,
                      "::load_full_optim_state_dict: entry '", key_of(i), "' has shape ",
                      shape_str(v.shape()), " but parameter '", U.names[i], "' has ",
                      shape_str(U.params[i].shape()));
        const int64_t a = std::max(lo, U.offsets[i]), b = std::min(hi, U.offsets[i] + v.numel());
        if (a < b)
          shard.narrow(0, a - lo, b - a)
              .copy_(v.to(U.device).contiguous().reshape({-1}).narrow(0, a - U.offsets[i], b - a));
      }
      local.insert(pre + name, shard);
    }
  }
  std::vector<int64_t> idx(k);
  for (size_t i = 0; i < k; ++i) idx[i] = static_cast<int64_t>(i);
  local.insert("param_groups.0.params", from_vector(idx));
  for (const auto& [key, t] : state)
    if (key.rfind("param_groups.0.", 0) == 0 && key != "param_groups.0.params")
      local.insert(key, t);
  opt.load_state_dict(local);
}

StateDict FullyShardedDataParallel::sharded_state_dict() const {
  StateDict out;
  out.insert_scalar("world_size", group_->size());
  out.insert_scalar("rank", group_->rank());
  size_t k = 0;
  for (const auto& U : impl_->units)
    if (U.numel > 0) out.insert("shard." + std::to_string(k++), U.shard.detach().clone());
  for (const auto& [key, t] : module_->named_buffers()) out.insert("buffer." + key, t.clone());
  return out;
}

void FullyShardedDataParallel::load_sharded_state_dict(const StateDict& state) {
  const char* ctx = "FullyShardedDataParallel::load_sharded_state_dict";
  const auto n = static_cast<int64_t>(state.scalar("world_size", ctx));
  const auto r = static_cast<int64_t>(state.scalar("rank", ctx));
  DLTRAIN_CHECK(n == group_->size() && r == group_->rank(), ctx, ": the shards were saved by rank ",
                r, " of ", n, ", this is rank ", group_->rank(), " of ", group_->size(),
                "; a sharded state resumes on the same rank count only (save full_state_dict() "
                "and full_optim_state_dict() to resume on another)");
  NoGradGuard ng;
  size_t k = 0;
  for (auto& U : impl_->units) {
    if (U.numel == 0) continue;
    const std::string key = "shard." + std::to_string(k++);
    const Tensor& t = state.at(key, ctx);
    DLTRAIN_CHECK(t.shape() == U.shard.shape(), ctx, ": entry '", key, "' has shape ",
                  shape_str(t.shape()), " but this unit's shard has ", shape_str(U.shard.shape()),
                  "; was it saved for another model or other units?");
    U.shard.copy_(t);
  }
  for (auto& [key, t] : module_->named_buffers()) {
    Tensor dst = t;
    dst.copy_(state.at("buffer." + key, ctx));
  }
}

}  // namespace dltrain::distributed
