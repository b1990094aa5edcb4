// ZeroRedundancyOptimizer (include/dltrain/distributed/zero.hpp). Invariants: owner_,
// local_index_ and buckets_ are the same pure function of the parameters' sizes on every rank
// (checked at construction), so every rank issues the same broadcasts in the same order; the
// inner optimizer's group g holds exactly the parameters of group g owned here, in flat order,
// so its flat index k is local_params_[k] here.
#include "dltrain/distributed/zero.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <numeric>
#include <sstream>
#include <string>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "src/core/trace.hpp"
#include "src/distributed/internal.hpp"
#include "src/optim/clip_grad_internal.hpp"

namespace dltrain::distributed {

namespace {

constexpr const char* kName = "ZeroRedundancyOptimizer";

// Rank `root`'s string on every rank (two blocking broadcasts: length, then bytes).
std::string broadcast_bytes(ProcessGroup& g, const std::string& s, int root) {
  const TensorOptions i64 = TensorOptions(DType::i64).with_device(g.tensor_device());
  Tensor len = full({1}, static_cast<double>(s.size()), i64);
  g.broadcast(len, root).wait();
  const int64_t n = len.item<int64_t>();
  if (n == 0) return {};
  std::vector<uint8_t> bytes(s.begin(), s.end());
  bytes.resize(static_cast<size_t>(n));
  Tensor t = from_vector(bytes, {n}).to(g.tensor_device());
  g.broadcast(t, root).wait();
  auto v = t.to_vector<uint8_t>();
  return std::string(v.begin(), v.end());
}

// FNV-1a over the values, a cheap fingerprint of the parameters' shapes and dtypes.
uint64_t fnv1a(uint64_t h, int64_t v) {
  for (int b = 0; b < 8; ++b) {
    h ^= static_cast<uint64_t>(v >> (8 * b)) & 0xffu;
    h *= 1099511628211ull;
  }
  return h;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params,
                                                 const OptimizerFactory& factory,
                                                 const ZeroOptions& options)
    : ZeroRedundancyOptimizer(std::vector<optim::ParamGroup>{{.params = std::move(params)}},
                              factory, options) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<optim::ParamGroup> groups,
                                                 const OptimizerFactory& factory,
                                                 const ZeroOptions& options)
    : Optimizer(optim::ParamGroup{}), options_(options) {
  DLTRAIN_CHECK(options.bucket_cap_mb > 0, kName, ": bucket_cap_mb must be > 0, got ",
                options.bucket_cap_mb);
  DLTRAIN_CHECK(static_cast<bool>(factory), kName,
                ": the optimizer factory is empty; pass a function that builds the optimizer "
                "to wrap from its param groups");
  group_ = options.group ? options.group : &default_group();
  // The wrapped type validates the groups and fills their defaults. A rank whose factory
  // throws still joins the parameter check, so the others fail with it instead of waiting.
  std::exception_ptr failure;
  try {
    local_ = factory(std::move(groups));
    DLTRAIN_CHECK(local_ != nullptr, kName, ": the optimizer factory returned null");
  } catch (...) {
    failure = std::current_exception();
  }
  check_same_parameters(failure != nullptr);
  if (failure) std::rethrow_exception(failure);
  groups_ = local_->param_groups();
  defaults_ = local_->defaults_;
  partition();
  // The inner optimizer keeps only this rank's parameters. Changing its groups' params is safe
  // here: state is indexed by flat index and created at the first step, so none exists yet.
  for (size_t g = 0, i = 0; g < groups_.size(); ++g) {
    std::vector<Tensor> mine;
    for (const Tensor& p : groups_[g].params) {
      if (owner_[i++] == group_->rank()) mine.push_back(p);
    }
    local_->param_groups()[g].params = std::move(mine);
  }
  DLTRAIN_CHECK(local_->num_params() == static_cast<int64_t>(local_params_.size()), kName,
                ": the optimizer factory must build a fresh optimizer over the groups it is given");
  plan_buckets();
}

void ZeroRedundancyOptimizer::check_same_parameters(bool factory_failed) {
  ProcessGroup& g = *group_;
  // [factory failed, groups, parameters, elements, fingerprint of shapes and dtypes]
  std::vector<int64_t> mine(5, 0);
  mine[0] = factory_failed ? 1 : 0;
  if (!factory_failed) {
    uint64_t h = 14695981039346656037ull;
    const auto& gs = local_->param_groups();
    mine[1] = static_cast<int64_t>(gs.size());
    for (const auto& grp : gs) {
      h = fnv1a(h, static_cast<int64_t>(grp.params.size()));
      for (const Tensor& p : grp.params) {
        ++mine[2];
        mine[3] += p.numel();
        h = fnv1a(h, static_cast<int64_t>(p.dtype()));
        h = fnv1a(h, p.dim());
        for (int64_t d : p.shape()) h = fnv1a(h, d);
      }
    }
    mine[4] = static_cast<int64_t>(h);
  }
  if (g.size() == 1) return;
  const TensorOptions i64 = TensorOptions(DType::i64).with_device(g.tensor_device());
  Tensor all = zeros({5 * static_cast<int64_t>(g.size())}, i64);
  g.all_gather(all, from_vector(mine).to(g.tensor_device())).wait();
  const auto v = all.to_vector<int64_t>();
  auto at = [&](int r, int k) { return v[static_cast<size_t>(5 * r + k)]; };
  std::string failed, differ;
  for (int r = 0; r < g.size(); ++r) {
    if (at(r, 0)) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!failed.empty()) {
    if (factory_failed) return;  // this rank rethrows its own error
    DLTRAIN_FAIL(kName, ": building the wrapped optimizer failed on rank(s) ", failed,
                 "; see their message");
  }
  std::ostringstream what;
  for (int r = 1; r < g.size(); ++r) {
    bool same = true;
    for (int k = 1; k < 5; ++k) same = same && at(r, k) == at(0, k);
    if (same) continue;
    differ += (differ.empty() ? "" : ", ") + std::to_string(r);
    if (what.tellp() == 0) {
      what << ": rank " << r << " has " << at(r, 2) << " parameters (" << at(r, 3)
           << " elements) in " << at(r, 1) << " group(s), rank 0 has " << at(0, 2) << " ("
           << at(0, 3) << " elements) in " << at(0, 1) << " group(s)";
      if (at(r, 1) == at(0, 1) && at(r, 2) == at(0, 2) && at(r, 3) == at(0, 3))
        what << ", with other shapes, dtypes or grouping";
    }
  }
  DLTRAIN_CHECK(differ.empty(), kName, ": the parameters differ between ranks (rank(s) ", differ,
                " differ from rank 0)", what.str(),
                ". Pass the same model's parameters, in the same order, on every rank");
}

void ZeroRedundancyOptimizer::partition() {
  const int n = group_->size();
  std::vector<int64_t> load(static_cast<size_t>(n), 0);
  const int64_t total = num_params();
  owner_.assign(static_cast<size_t>(total), 0);
  local_index_.assign(static_cast<size_t>(total), -1);
  int64_t first = 0;
  for (const auto& grp : groups_) {
    std::vector<int64_t> order(grp.params.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return grp.params[static_cast<size_t>(a)].numel() >
             grp.params[static_cast<size_t>(b)].numel();
    });
    for (int64_t k : order) {
      const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      owner_[static_cast<size_t>(first + k)] = static_cast<int>(r);
      load[r] += grp.params[static_cast<size_t>(k)].numel();
    }
    first += static_cast<int64_t>(grp.params.size());
  }
  local_params_.clear();
  for (int64_t i = 0; i < total; ++i) {
    if (owner_[static_cast<size_t>(i)] != group_->rank()) continue;
    local_index_[static_cast<size_t>(i)] = static_cast<int64_t>(local_params_.size());
    local_params_.push_back(i);
  }
}

void ZeroRedundancyOptimizer::plan_buckets() {
  buckets_.clear();
  stages_.clear();
  if (group_->size() == 1) return;
  const std::vector<Tensor> all = parameters();
  const double cap_bytes = options_.bucket_cap_mb * 1024.0 * 1024.0;
  std::vector<std::pair<DType, Device>> stage_keys;
  std::vector<int64_t> stage_numel;
  for (int r = 0; r < group_->size(); ++r) {
    // Open buckets of owner r, one per dtype and device, in the order they were opened.
    std::vector<size_t> open;
    auto close = [&](size_t b) {
      Bucket& bk = buckets_[b];
      const Tensor& p0 = bk.params[0];
      if (bk.params.size() == 1 && p0.is_contiguous()) return;  // broadcast in place
      const auto key = std::make_pair(p0.dtype(), p0.device());
      auto it = std::find(stage_keys.begin(), stage_keys.end(), key);
      if (it == stage_keys.end()) {
        stage_keys.push_back(key);
        stage_numel.push_back(0);
        it = stage_keys.end() - 1;
      }
      const auto s = static_cast<size_t>(it - stage_keys.begin());
      bk.stage = static_cast<int64_t>(s);
      stage_numel[s] = std::max(stage_numel[s], bk.numel);
    };
    for (size_t i = 0; i < all.size(); ++i) {
      if (owner_[i] != r) continue;
      const Tensor& p = all[i];
      auto it = std::find_if(open.begin(), open.end(), [&](size_t b) {
        const Tensor& q = buckets_[b].params[0];
        return q.dtype() == p.dtype() && q.device() == p.device();
      });
      if (it != open.end()) {
        Bucket& bk = buckets_[*it];
        const double bytes =
            static_cast<double>(bk.numel + p.numel()) * static_cast<double>(p.element_size());
        if (bytes <= cap_bytes) {
          bk.params.push_back(p);
          bk.numel += p.numel();
          continue;
        }
        close(*it);
        open.erase(it);
      }
      buckets_.push_back(Bucket{r, {p}, p.numel(), -1});
      open.push_back(buckets_.size() - 1);
    }
    for (size_t b : open) close(b);
  }
  for (size_t s = 0; s < stage_keys.size(); ++s) {
    stages_.push_back(empty({stage_numel[s]},
                            TensorOptions(stage_keys[s].first).with_device(stage_keys[s].second)));
  }
}

void ZeroRedundancyOptimizer::sync_hyper_parameters() {
  auto& inner = local_->param_groups();
  for (size_t g = 0; g < groups_.size(); ++g) {
    // Copy every field but params, without copying either parameter list.
    std::vector<Tensor> full = std::move(groups_[g].params);
    std::vector<Tensor> mine = std::move(inner[g].params);
    inner[g] = groups_[g];
    inner[g].params = std::move(mine);
    groups_[g].params = std::move(full);
  }
}

void ZeroRedundancyOptimizer::step() {
  ::dltrain::detail::OpScope scope(::dltrain::detail::TraceKind::Optimizer, kName, ".step");
  sync_hyper_parameters();
  local_->step();
  if (buckets_.empty()) return;
  NoGradGuard no_grad;
  ProcessGroup& g = *group_;
  std::vector<Work> in_place;
  for (Bucket& b : buckets_) {
    if (b.stage < 0) {
      Tensor& p = b.params[0];
      if (g.rank() != b.root) p.bump_version("ZeroRedundancyOptimizer broadcast");
      in_place.push_back(g.broadcast(p, b.root));
      continue;
    }
    Tensor flat = stages_[static_cast<size_t>(b.stage)].narrow(0, 0, b.numel);
    if (g.rank() == b.root) {
      int64_t off = 0;
      for (const Tensor& p : b.params) {
        flat.narrow(0, off, p.numel()).view(p.shape()).copy_(p);
        off += p.numel();
      }
    }
    // The staging buffer is reused by the next bucket of its dtype: wait before unpacking.
    g.broadcast(flat, b.root).wait();
    if (g.rank() != b.root) {
      int64_t off = 0;
      for (Tensor& p : b.params) {
        p.copy_(flat.narrow(0, off, p.numel()).view(p.shape()));
        off += p.numel();
      }
    }
  }
  for (Work& w : in_place) w.wait();
}

void ZeroRedundancyOptimizer::add_param_group(optim::ParamGroup) {
  DLTRAIN_FAIL(kName, ": add_param_group is not supported (the parameters are partitioned over ",
               "the ranks at construction); pass every group to the constructor");
}

StateDict ZeroRedundancyOptimizer::consolidated_state_dict(int rank) const {
  DLTRAIN_CHECK(rank >= 0 && rank < group_->size(), kName, "::consolidated_state_dict: rank ", rank,
                " is not in the group of ", group_->size());
  consolidate_to_ = rank;
  StateDict out;
  try {
    out = state_dict();
  } catch (...) {
    consolidate_to_ = -1;
    throw;
  }
  consolidate_to_ = -1;
  return group_->rank() == rank ? out : StateDict{};
}

int ZeroRedundancyOptimizer::owner_of(const Tensor& p) const {
  size_t i = 0;
  for (const auto& grp : groups_) {
    for (const Tensor& q : grp.params) {
      if (q.impl() == p.impl()) return owner_[i];
      ++i;
    }
  }
  return -1;
}

int64_t ZeroRedundancyOptimizer::local_state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [key, t] : local_->state_dict()) {
    if (starts_with(key, "state.")) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  }
  return bytes;
}

void ZeroRedundancyOptimizer::validate_group(const optim::ParamGroup& group, int64_t g) const {
  local_->validate_group(group, g);
}

void ZeroRedundancyOptimizer::update(const optim::ParamGroup&, int64_t, Tensor&, const Tensor&) {
  DLTRAIN_FAIL(kName, ": internal error: update() is never called (step() steps the shard)");
}

std::vector<std::string> ZeroRedundancyOptimizer::state_names() const {
  return local_->state_names();
}

void ZeroRedundancyOptimizer::save_state(int64_t i, const std::string& prefix,
                                         StateDict& out) const {
  // Called by Optimizer::state_dict() for every flat index in order on every rank, so the
  // broadcasts below line up: the owner describes its entries (name, dtype, CPU or not, shape),
  // then sends each tensor.
  ProcessGroup& g = *group_;
  const int root = owner_[static_cast<size_t>(i)];
  const bool keep = consolidate_to_ < 0 || consolidate_to_ == g.rank();
  const Device wire = g.tensor_device();
  if (g.size() == 1) {
    local_->save_state(local_index_[static_cast<size_t>(i)], prefix, out);
    return;
  }
  struct Entry {
    std::string key;
    Tensor t;
    bool cpu;
  };
  std::vector<Entry> entries;
  std::string meta;
  if (g.rank() == root) {
    StateDict mine;
    local_->save_state(local_index_[static_cast<size_t>(i)], prefix, mine);
    std::ostringstream os;
    for (const auto& [key, t] : mine) {
      os << key << '\n'
         << static_cast<int>(t.dtype()) << ' ' << (t.device().is_cpu() ? 1 : 0) << ' ' << t.dim();
      for (int64_t d : t.shape()) os << ' ' << d;
      os << '\n';
      entries.push_back({key, t.contiguous().to(wire), t.device().is_cpu()});
    }
    meta = os.str();
  }
  meta = broadcast_bytes(g, meta, root);
  if (g.rank() != root) {
    std::istringstream is(meta);
    std::string key, line;
    while (std::getline(is, key) && std::getline(is, line)) {
      std::istringstream ls(line);
      int dt = 0, cpu = 0;
      int64_t dim = 0;
      ls >> dt >> cpu >> dim;
      Shape shape(static_cast<size_t>(dim));
      for (auto& d : shape) ls >> d;
      entries.push_back(
          {key, empty(shape, TensorOptions(static_cast<DType>(dt)).with_device(wire)), cpu != 0});
    }
  }
  std::vector<Work> works;
  for (Entry& e : entries) works.push_back(g.broadcast(e.t, root));
  for (Work& w : works) w.wait();
  if (!keep) return;
  const Tensor& param = parameters()[static_cast<size_t>(i)];
  for (Entry& e : entries) {
    out.insert(e.key, e.cpu ? e.t.to(Device::cpu()) : e.t.to(param.device()));
  }
}

void ZeroRedundancyOptimizer::load_state(const StateDict& state,
                                         const std::vector<optim::ParamGroup>& groups) {
  // Optimizer::load_state_dict has checked the type, the groups and the keys against the full
  // parameter list; the inner optimizer gets this rank's shard with its own flat indices.
  StateDict mine;
  mine.insert("type", state.at("type"));
  int64_t first = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<int64_t> idx;
    for (size_t k = 0; k < groups[g].params.size(); ++k) {
      const int64_t li = local_index_[static_cast<size_t>(first) + k];
      if (li >= 0) idx.push_back(li);
    }
    first += static_cast<int64_t>(groups[g].params.size());
    mine.insert("param_groups." + std::to_string(g) + ".params",
                from_vector(idx, {static_cast<int64_t>(idx.size())}));
  }
  for (const auto& [key, t] : state) {
    if (starts_with(key, "param_groups.")) {
      if (key.size() < 7 || key.compare(key.size() - 7, 7, ".params") != 0) mine.insert(key, t);
    } else if (starts_with(key, "state.")) {
      const auto dot = key.find('.', 6);
      const int64_t i = std::stoll(key.substr(6, dot - 6));
      const int64_t li = local_index_[static_cast<size_t>(i)];
      if (li >= 0) mine.insert("state." + std::to_string(li) + key.substr(dot), t);
    }
  }
  local_->load_state_dict(mine);
}

}  // namespace dltrain::distributed

namespace dltrain::distributed {

std::vector<Tensor> ZeroRedundancyOptimizer::combine_found_inf(std::vector<Tensor> found) const {
  autograd::NoGradGuard ng;
  const Device d = group_->tensor_device();
  Tensor flag = zeros({}, TensorOptions(DType::f32).with_device(d));
  for (const Tensor& f : found) flag = maximum(flag, f.to(d));
  group_->all_reduce(flag, ReduceOp::Max).wait();
  return {flag};
}

Tensor clip_grad_norm_(const ZeroRedundancyOptimizer& optimizer, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  const std::vector<Tensor> all = optimizer.parameters();
  std::vector<Tensor> owned;
  for (int64_t i : optimizer.local_parameters()) owned.push_back(all[static_cast<size_t>(i)]);
  const double mine =
      optim::detail::grad_norm_partial(owned, norm_type, "distributed::clip_grad_norm_");
  ProcessGroup& g = optimizer.process_group();
  Tensor partial = full({}, mine, TensorOptions(DType::f64).with_device(g.tensor_device()));
  g.all_reduce(partial, std::isinf(norm_type) ? ReduceOp::Max : ReduceOp::Sum).wait();
  const double total = optim::detail::clip_from_partial(all, max_norm, norm_type,
                                                        partial.item<double>(), error_if_nonfinite);
  return scalar_tensor(total, DType::f64);
}

}  // namespace dltrain::distributed
