// Tensor parallelism: the region operators, the sharded-parameter bookkeeping and the
// column/row-parallel linear layers (include/dltrain/distributed/tensor_parallel.hpp).
//
// Each region operator runs its collective under NoGradGuard on a copy (or, for the identity,
// on a detached handle) and records one node whose backward is the conjugate operator, so a
// create_graph backward differentiates through the collectives as well (f and g, scatter and
// gather are each other's adjoint). Collectives block (Work::wait) before returning: the
// result is read at once by the next op.
//
// A sharded parameter's full tensor along its split dim is [chunks, p, m] (m elements per rank
// and chunk); rank r holds [chunks, m] = the r-th index of the middle axis. gather_shard
// all-gathers the blocks ([p, chunks, m] in rank order) and swaps the two leading axes;
// slice_shard takes index r. Both view the other dims as one leading and one trailing axis.
#include "dltrain/distributed/tensor_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/linalg.hpp"
#include "dltrain/ops/reduction.hpp"
#include "dltrain/optim/optimizer.hpp"
#include "src/optim/state_keys.hpp"

namespace dltrain::distributed {

namespace {

void check_input(const Tensor& x, const char* op) {
  DLTRAIN_CHECK(x.defined(), op, ": the input is undefined; pass a tensor");
}

std::string rank_str(const ProcessGroup& g) {
  return "rank " + std::to_string(g.rank()) + " of a tensor-parallel group of " +
         std::to_string(g.size());
}

// [A, ..., m] laid out rank-major as [p, A, m] by all_gather -> [A, p * m].
Tensor gather_last_dim(const Tensor& x, ProcessGroup& group) {
  const Tensor xc = x.contiguous();
  const int64_t p = group.size(), m = x.size(x.dim() - 1), a = x.numel() / std::max<int64_t>(m, 1);
  Tensor buf = empty({p * x.numel()}, xc.options());
  group.all_gather(buf, xc).wait();
  Shape out_shape = x.shape();
  out_shape.back() = p * m;
  return buf.reshape({p, a, m}).permute({1, 0, 2}).contiguous().reshape(out_shape);
}

}  // namespace

// --- region operators ------------------------------------------------------------------------

Tensor copy_to_tensor_parallel_region(const Tensor& x, ProcessGroup& group) {
  check_input(x, "copy_to_tensor_parallel_region");
  Tensor out = x.detach();
  ProcessGroup* g = &group;
  autograd::record(
      "copy_to_tensor_parallel_region", {x}, {out},
      [g](const std::vector<Tensor>& grads) {
        return std::vector<Tensor>{reduce_from_tensor_parallel_region(grads[0], *g)};
      },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor reduce_from_tensor_parallel_region(const Tensor& x, ProcessGroup& group) {
  check_input(x, "reduce_from_tensor_parallel_region");
  Tensor out;
  {
    NoGradGuard ng;
    out = x.contiguous().clone(MemoryFormat::Contiguous);
    group.all_reduce(out, ReduceOp::Sum).wait();
  }
  ProcessGroup* g = &group;
  autograd::record(
      "reduce_from_tensor_parallel_region", {x}, {out},
      [g](const std::vector<Tensor>& grads) {
        return std::vector<Tensor>{copy_to_tensor_parallel_region(grads[0], *g)};
      },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor scatter_to_tensor_parallel_region(const Tensor& x, ProcessGroup& group) {
  const char* op = "scatter_to_tensor_parallel_region";
  check_input(x, op);
  DLTRAIN_CHECK(x.dim() >= 1 && x.size(x.dim() - 1) % group.size() == 0, op, ": the last dim of ",
                shape_str(x.shape()), " must be divisible by the group size ", group.size(),
                " to split it over the ranks; pad the features or use a group whose size divides "
                "them");
  const int64_t m = x.size(x.dim() - 1) / group.size();
  Tensor out;
  {
    NoGradGuard ng;
    out = x.detach().narrow(x.dim() - 1, group.rank() * m, m).contiguous().clone();
  }
  ProcessGroup* g = &group;
  autograd::record(
      op, {x}, {out},
      [g](const std::vector<Tensor>& grads) {
        return std::vector<Tensor>{gather_from_tensor_parallel_region(grads[0], *g)};
      },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor gather_from_tensor_parallel_region(const Tensor& x, ProcessGroup& group) {
  const char* op = "gather_from_tensor_parallel_region";
  check_input(x, op);
  DLTRAIN_CHECK(x.dim() >= 1, op,
                ": the input must have at least one dim (gathered along the "
                "last) but is a scalar");
  Tensor out;
  {
    NoGradGuard ng;
    out = gather_last_dim(x, group);
  }
  ProcessGroup* g = &group;
  autograd::record(
      op, {x}, {out},
      [g](const std::vector<Tensor>& grads) {
        return std::vector<Tensor>{scatter_to_tensor_parallel_region(grads[0], *g)};
      },
      autograd::HigherOrder::Supported);
  return out;
}

// --- the in-region generator --------------------------------------------------------------

namespace {

struct RegionGenerator {
  std::mutex mutex;
  std::unique_ptr<Generator> gen;
};

RegionGenerator& region_generator() {
  static RegionGenerator r;
  return r;
}

// Apart from the default generator's stream whatever the seeds (Megatron's offset).
constexpr uint64_t kRegionSeedOffset = 2718;

}  // namespace

Generator& tensor_parallel_generator(const ProcessGroup& group) {
  RegionGenerator& r = region_generator();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.gen)
    r.gen = std::make_unique<Generator>(default_generator().seed() + kRegionSeedOffset +
                                        static_cast<uint64_t>(group.rank()));
  return *r.gen;
}

void manual_seed_tensor_parallel(uint64_t seed, const ProcessGroup& group) {
  RegionGenerator& r = region_generator();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.gen =
      std::make_unique<Generator>(seed + kRegionSeedOffset + static_cast<uint64_t>(group.rank()));
}

// --- TensorParallelModule ------------------------------------------------------------------

TensorParallelModule::TensorParallelModule(std::string type_name, ProcessGroup& group)
    : Module(std::move(type_name)), group_(&group) {}

Tensor TensorParallelModule::register_sharded_parameter(const std::string& name, Tensor local,
                                                        ShardSpec spec) {
  DLTRAIN_CHECK(spec.dim >= 0 && spec.dim < local.dim() && spec.chunks >= 1 &&
                    local.size(spec.dim) % spec.chunks == 0,
                type_name(), ": invalid split of parameter '", name, "' ", shape_str(local.shape()),
                " (dim ", spec.dim, ", chunks ", spec.chunks, ")");
  Tensor t = register_parameter(name, std::move(local));
  specs_.emplace_back(name, spec);
  return t;
}

int64_t TensorParallelModule::per_rank(int64_t n, const char* op, const char* what) const {
  const int64_t p = group_->size();
  DLTRAIN_CHECK(n % p == 0, op, ": ", what, " (", n,
                ") must be divisible by the tensor-parallel group size (", p, "); choose ", what,
                " as a multiple of ", p, " or a group whose size divides ", n);
  return n / p;
}

const ShardSpec* TensorParallelModule::shard_spec(const std::string& name) const {
  for (const auto& [n, s] : specs_)
    if (n == name) return &s;
  return nullptr;
}

namespace {

struct Split {
  Shape local, full;
  int64_t pre = 1, chunks = 1, m = 1, post = 1;
};

Split split_of(const TensorParallelModule& mod, const std::string& name, int64_t p) {
  const ShardSpec* spec = mod.shard_spec(name);
  DLTRAIN_CHECK(spec != nullptr, mod.type_name(), ": parameter '", name,
                "' is not split over the group");
  Tensor local;
  for (const auto& [n, t] : mod.named_parameters(false))
    if (n == name) local = t;
  Split s;
  s.local = local.shape();
  s.full = s.local;
  s.full[static_cast<size_t>(spec->dim)] *= p;
  for (int64_t d = 0; d < spec->dim; ++d) s.pre *= s.local[static_cast<size_t>(d)];
  for (int64_t d = spec->dim + 1; d < local.dim(); ++d) s.post *= s.local[static_cast<size_t>(d)];
  s.chunks = spec->chunks;
  s.m = s.local[static_cast<size_t>(spec->dim)] / spec->chunks;
  return s;
}

}  // namespace

Tensor TensorParallelModule::gather_shard(const std::string& name, const Tensor& local) const {
  const int64_t p = group_->size();
  const Split s = split_of(*this, name, p);
  DLTRAIN_CHECK(local.shape() == s.local, type_name(), ": gather_shard('", name, "') takes ",
                shape_str(s.local), " (this rank's block) but got ", shape_str(local.shape()));
  NoGradGuard ng;
  const Tensor lc = local.detach().contiguous();
  Tensor buf = empty({p * lc.numel()}, lc.options());
  group_->all_gather(buf, lc).wait();
  return buf.reshape({p, s.pre, s.chunks, s.m, s.post})
      .permute({1, 2, 0, 3, 4})
      .contiguous()
      .reshape(s.full);
}

Tensor TensorParallelModule::slice_shard(const std::string& name, const Tensor& full) const {
  const int64_t p = group_->size();
  const Split s = split_of(*this, name, p);
  DLTRAIN_CHECK(full.defined() && full.shape() == s.full, type_name(), ": parameter '", name,
                "' is ", shape_str(s.full), " in the ordinary layer (", shape_str(s.local),
                " on each of ", p, " ranks) but the full tensor given is ",
                full.defined() ? shape_str(full.shape()) : std::string("undefined"),
                "; load a state dict of the same model configuration");
  NoGradGuard ng;
  return full.detach()
      .contiguous()
      .reshape({s.pre, s.chunks, p, s.m, s.post})
      .narrow(2, group_->rank(), 1)
      .contiguous()
      .clone()
      .reshape(s.local);
}

// --- state dicts ---------------------------------------------------------------------------

namespace {

// Dotted name -> (module, own name) of every sharded parameter in `module`.
std::map<std::string, std::pair<const TensorParallelModule*, std::string>> sharded_params(
    const nn::Module& module) {
  std::map<std::string, std::pair<const TensorParallelModule*, std::string>> out;
  for (const auto& [prefix, m] : module.named_modules()) {
    const auto* tp = dynamic_cast<const TensorParallelModule*>(m.get());
    if (!tp) continue;
    for (const auto& [n, t] : tp->named_parameters(false))
      if (tp->shard_spec(n)) out[prefix.empty() ? n : prefix + "." + n] = {tp, n};
  }
  return out;
}

}  // namespace

StateDict gather_state_dict(const nn::Module& module) {
  const auto sharded = sharded_params(module);
  StateDict out;
  for (const auto& [name, t] : module.state_dict()) {
    auto it = sharded.find(name);
    out.insert(name,
               it == sharded.end() ? t : it->second.first->gather_shard(it->second.second, t));
  }
  return out;
}

nn::LoadResult load_full_state_dict(nn::Module& module, const StateDict& full, bool strict) {
  const auto sharded = sharded_params(module);
  StateDict local;
  for (const auto& [name, t] : full) {
    auto it = sharded.find(name);
    local.insert(name,
                 it == sharded.end() ? t : it->second.first->slice_shard(it->second.second, t));
  }
  return module.load_state_dict(local, strict);
}

namespace {

// The optimizer's flat indices of `module`'s sharded parameters, with their layer and own name
// and local shape; throws when the optimizer holds a parameter the module does not.
struct ShardedIndex {
  const TensorParallelModule* layer;
  std::string name;
  Shape local;
};
std::map<int64_t, ShardedIndex> sharded_indices(const nn::Module& module,
                                                const optim::Optimizer& optimizer,
                                                const char* ctx) {
  const auto sharded = sharded_params(module);
  std::map<const void*, std::pair<std::string, Shape>> name_of;
  for (const auto& [n, t] : module.named_parameters()) name_of[t.impl().get()] = {n, t.shape()};
  std::map<int64_t, ShardedIndex> out;
  int64_t i = 0;
  for (const auto& group : optimizer.param_groups())
    for (const Tensor& t : group.params) {
      const auto it = name_of.find(t.impl().get());
      DLTRAIN_CHECK(it != name_of.end(), ctx, ": the optimizer's parameter ", i,
                    " is not one of the module's; pass the module the optimizer steps");
      const auto s = sharded.find(it->second.first);
      if (s != sharded.end()) out[i] = {s->second.first, s->second.second, it->second.second};
      ++i;
    }
  return out;
}

}  // namespace

StateDict gather_optimizer_state_dict(const nn::Module& module, const optim::Optimizer& optimizer) {
  const auto sharded =
      sharded_indices(module, optimizer, "distributed::gather_optimizer_state_dict");
  StateDict out;
  for (const auto& [key, t] : optimizer.state_dict()) {  // in key order: the same on every rank
    int64_t i = 0;
    std::string rest;
    const auto it = optim::detail::parse_state_key(key, i, rest) ? sharded.find(i) : sharded.end();
    if (it != sharded.end() && t.shape() == it->second.local)
      out.insert(key, it->second.layer->gather_shard(it->second.name, t));
    else
      out.insert(key, t);
  }
  return out;
}

void load_full_optimizer_state_dict(const nn::Module& module, optim::Optimizer& optimizer,
                                    const StateDict& full) {
  const char* ctx = "distributed::load_full_optimizer_state_dict";
  const auto sharded = sharded_indices(module, optimizer, ctx);
  StateDict local;
  for (const auto& [key, t] : full) {
    int64_t i = 0;
    std::string rest;
    const auto it = optim::detail::parse_state_key(key, i, rest) ? sharded.find(i) : sharded.end();
    // A state with the parameter's shape (a moment) is sliced; a scalar (the step) is not.
    if (it != sharded.end() && t.dim() == static_cast<int64_t>(it->second.local.size()) &&
        t.dim() > 0)
      local.insert(key, it->second.layer->slice_shard(it->second.name, t));
    else
      local.insert(key, t);
  }
  optimizer.load_state_dict(local);
}

nn::NamedTensors gather_grads(const nn::Module& module) {
  const auto sharded = sharded_params(module);
  nn::NamedTensors out;
  for (const auto& [name, t] : module.named_parameters()) {
    auto it = sharded.find(name);
    if (it == sharded.end()) {
      out.emplace_back(name, t.grad());
      continue;
    }
    const Tensor g = t.grad().defined() ? t.grad() : zeros(t.shape(), t.options());
    out.emplace_back(name, it->second.first->gather_shard(it->second.second, g));
  }
  return out;
}

double clip_grad_norm_tensor_parallel_(const nn::Module& module, double max_norm) {
  DLTRAIN_CHECK(max_norm >= 0.0, "clip_grad_norm_tensor_parallel_: max_norm must be >= 0 but is ",
                max_norm);
  const auto sharded = sharded_params(module);
  NoGradGuard ng;
  // Squares of the sharded gradients, per group in order of first appearance (the same order
  // on every rank), summed over each group; the replicated ones as they are.
  std::vector<std::pair<ProcessGroup*, double>> per_group;
  double replicated = 0.0;
  std::vector<Tensor> grads;
  for (const auto& [name, t] : module.named_parameters()) {
    const Tensor g = t.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    const Tensor g64 = g.to(DType::f64);
    const double sq = sum(mul(g64, g64)).item<double>();
    auto it = sharded.find(name);
    if (it == sharded.end()) {
      replicated += sq;
      continue;
    }
    ProcessGroup* pg = &it->second.first->group();
    auto at = std::find_if(per_group.begin(), per_group.end(),
                           [pg](const auto& e) { return e.first == pg; });
    if (at == per_group.end())
      per_group.emplace_back(pg, sq);
    else
      at->second += sq;
  }
  double total = replicated;
  for (const auto& [pg, sq] : per_group) {
    Tensor v = full({1}, sq, TensorOptions(DType::f64).with_device(pg->tensor_device()));
    pg->all_reduce(v).wait();
    total += v.to(Device::cpu()).item<double>();
  }
  const double norm = std::sqrt(total);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0)
    for (Tensor g : grads) mul_(g, coef);
  return norm;
}

// --- ColumnParallelLinear --------------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, ProcessGroup& group,
                                           const ColumnParallelLinearOptions& o, TensorOptions opts)
    : ColumnParallelLinear(nn::Linear(in, out, o.bias, opts), group, o.gather_output) {}

ColumnParallelLinear::ColumnParallelLinear(const nn::Linear& full, ProcessGroup& group,
                                           bool gather_output)
    : TensorParallelModule("ColumnParallelLinear", group),
      in_features(full.in_features),
      out_features(full.out_features),
      out_features_per_rank(per_rank(full.out_features, "ColumnParallelLinear", "out_features")),
      options{.bias = full.bias.defined(), .gather_output = gather_output} {
  const int64_t m = out_features_per_rank, r = group.rank();
  NoGradGuard ng;
  weight = register_sharded_parameter("weight", full.weight.detach().narrow(0, r * m, m).clone(),
                                      {.dim = 0});
  if (options.bias)
    bias = register_sharded_parameter("bias", full.bias.detach().narrow(0, r * m, m).clone(),
                                      {.dim = 0});
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  DLTRAIN_CHECK(x.defined() && x.dim() >= 1 && x.size(x.dim() - 1) == in_features,
                "ColumnParallelLinear(in_features=", in_features, "): input of shape ",
                x.defined() ? shape_str(x.shape()) : std::string("undefined"), " must end in ",
                in_features, " features; flatten or reshape it first");
  const Tensor y = linear(copy_to_tensor_parallel_region(x, group()), weight, bias);
  return options.gather_output ? gather_from_tensor_parallel_region(y, group()) : y;
}

std::string ColumnParallelLinear::extra_repr() const {
  return "in_features=" + std::to_string(in_features) +
         ", out_features=" + std::to_string(out_features) + " (" +
         std::to_string(out_features_per_rank) + " on " + rank_str(group()) +
         "), bias=" + (bias.defined() ? "True" : "False") +
         ", gather_output=" + (options.gather_output ? "True" : "False");
}

// --- RowParallelLinear -----------------------------------------------------------------------

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, ProcessGroup& group,
                                     const RowParallelLinearOptions& o, TensorOptions opts)
    : RowParallelLinear(nn::Linear(in, out, o.bias, opts), group, o.input_is_parallel) {}

RowParallelLinear::RowParallelLinear(const nn::Linear& full, ProcessGroup& group,
                                     bool input_is_parallel)
    : TensorParallelModule("RowParallelLinear", group),
      in_features(full.in_features),
      out_features(full.out_features),
      in_features_per_rank(per_rank(full.in_features, "RowParallelLinear", "in_features")),
      options{.bias = full.bias.defined(), .input_is_parallel = input_is_parallel} {
  const int64_t m = in_features_per_rank, r = group.rank();
  NoGradGuard ng;
  weight = register_sharded_parameter("weight", full.weight.detach().narrow(1, r * m, m).clone(),
                                      {.dim = 1});
  if (options.bias) bias = register_parameter("bias", full.bias.detach().clone());
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  const int64_t want = options.input_is_parallel ? in_features_per_rank : in_features;
  DLTRAIN_CHECK(
      x.defined() && x.dim() >= 1 && x.size(x.dim() - 1) == want,
      "RowParallelLinear(in_features=", in_features, "): input of shape ",
      x.defined() ? shape_str(x.shape()) : std::string("undefined"), " must end in ", want,
      options.input_is_parallel ? " features (this rank's block: input_is_parallel is set)"
                                : " features (the full input: input_is_parallel is not set)",
      "; flatten or reshape it, or set input_is_parallel to match what the previous "
      "layer returns");
  const Tensor xl = options.input_is_parallel ? x : scatter_to_tensor_parallel_region(x, group());
  const Tensor y = reduce_from_tensor_parallel_region(linear(xl, weight), group());
  return bias.defined() ? add(y, bias) : y;
}

std::string RowParallelLinear::extra_repr() const {
  return "in_features=" + std::to_string(in_features) + " (" +
         std::to_string(in_features_per_rank) + " on " + rank_str(group()) +
         "), out_features=" + std::to_string(out_features) +
         ", bias=" + (bias.defined() ? "True" : "False") +
         ", input_is_parallel=" + (options.input_is_parallel ? "True" : "False");
}

}  // namespace dltrain::distributed
