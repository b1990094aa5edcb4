// optim::Optimizer (dltrain/optim/optimizer.hpp): parameter groups and their defaults,
// zero_grad, and the state_dict / load_state_dict format shared by every optimizer.
#include "dltrain/optim/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "common.hpp"
#include "dltrain/autograd/node.hpp"
#include "dltrain/core/error.hpp"
#include "src/core/trace.hpp"

namespace dltrain::optim {

namespace {

// Calls f(name, a.field, b.field) for every hyper-parameter of ParamGroup except initial_lr
// (which schedulers own), so filling, saving and loading cannot forget a field.
template <class A, class B, class F>
void for_each_field(A& a, B& b, F&& f) {
  f("lr", a.lr, b.lr);
  f("weight_decay", a.weight_decay, b.weight_decay);
  f("momentum", a.momentum, b.momentum);
  f("dampening", a.dampening, b.dampening);
  f("nesterov", a.nesterov, b.nesterov);
  f("betas", a.betas, b.betas);
  f("eps", a.eps, b.eps);
  f("amsgrad", a.amsgrad, b.amsgrad);
  f("maximize", a.maximize, b.maximize);
  f("trust_coefficient", a.trust_coefficient, b.trust_coefficient);
  f("max_trust_ratio", a.max_trust_ratio, b.max_trust_ratio);
  f("trust_ratio", a.trust_ratio, b.trust_ratio);
}

void write_field(StateDict& out, const std::string& key, const std::optional<double>& v) {
  out.insert_scalar(key, *v);
}
void write_field(StateDict& out, const std::string& key, const std::optional<bool>& v) {
  out.insert_scalar(key, *v ? 1.0 : 0.0, /*integer=*/true);
}
void write_field(StateDict& out, const std::string& key,
                 const std::optional<std::array<double, 2>>& v) {
  out.insert(key, from_vector(std::vector<double>{(*v)[0], (*v)[1]}));
}

void read_field(const StateDict& in, const std::string& key, const char* ctx,
                std::optional<double>& v) {
  v = in.scalar(key, ctx);
}
void read_field(const StateDict& in, const std::string& key, const char* ctx,
                std::optional<bool>& v) {
  v = in.scalar(key, ctx) != 0.0;
}
void read_field(const StateDict& in, const std::string& key, const char* ctx,
                std::optional<std::array<double, 2>>& v) {
  const Tensor& t = in.at(key, ctx);
  DLTRAIN_CHECK(t.numel() == 2, ctx, ": entry '", key, "' should hold 2 values (beta1, beta2) ",
                "but has shape ", shape_str(t.shape()));
  const auto b = t.to_vector<double>();
  v = std::array<double, 2>{b[0], b[1]};
}

std::string group_prefix(size_t g) { return "param_groups." + std::to_string(g) + "."; }

thread_local detail::CudaBatch* current_batch = nullptr;

}  // namespace

namespace detail {

CudaBatch& cuda_batch() {
  DLTRAIN_CHECK(current_batch != nullptr,
                "optimizer: a CUDA parameter update was requested outside Optimizer::step");
  return *current_batch;
}

CudaBatchScope::CudaBatchScope() : previous_(current_batch) { current_batch = &batch_; }
CudaBatchScope::~CudaBatchScope() { current_batch = previous_; }

void CudaBatch::flush() {
  // Taken out first, so that a failing launch leaves an empty batch behind.
  std::vector<backend::cuda::SgdTensors> s = std::move(sgd);
  std::vector<backend::cuda::AdamTensors> a = std::move(adam);
  std::vector<backend::cuda::LarsTensors> l = std::move(lars);
  std::vector<backend::cuda::LambTensors> b = std::move(lamb);
  sgd.clear();
  adam.clear();
  lars.clear();
  lamb.clear();
  using Key = std::pair<int, DType>;
  std::map<Key, std::vector<backend::cuda::SgdTensors>> sgd_parts;
  for (auto& t : s) sgd_parts[{t.param.device().index, t.param.dtype()}].push_back(std::move(t));
  for (const auto& [key, ts] : sgd_parts) backend::cuda::sgd_step(sgd_hyper, ts);
  std::map<Key, std::vector<backend::cuda::AdamTensors>> adam_parts;
  for (auto& t : a) adam_parts[{t.param.device().index, t.param.dtype()}].push_back(std::move(t));
  for (const auto& [key, ts] : adam_parts) backend::cuda::adam_step(adam_hyper, ts);
  std::map<Key, std::vector<backend::cuda::LarsTensors>> lars_parts;
  for (auto& t : l) lars_parts[{t.param.device().index, t.param.dtype()}].push_back(std::move(t));
  for (const auto& [key, ts] : lars_parts) backend::cuda::lars_step(lars_hyper, ts);
  std::map<Key, std::vector<backend::cuda::LambTensors>> lamb_parts;
  for (auto& t : b) lamb_parts[{t.param.device().index, t.param.dtype()}].push_back(std::move(t));
  for (const auto& [key, ts] : lamb_parts) backend::cuda::lamb_step(lamb_hyper, ts);
}

}  // namespace detail

std::vector<Tensor> Optimizer::parameters() const {
  std::vector<Tensor> out;
  for (const auto& g : groups_) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

int64_t Optimizer::num_params() const {
  int64_t n = 0;
  for (const auto& g : groups_) n += static_cast<int64_t>(g.params.size());
  return n;
}

void Optimizer::init(std::vector<ParamGroup> groups) {
  int64_t total = 0;
  for (const auto& g : groups) total += static_cast<int64_t>(g.params.size());
  DLTRAIN_CHECK(total > 0, name(), ": got an empty parameter list; pass the model's ",
                "parameters (e.g. module.parameters())");
  for (auto& g : groups) add_param_group(std::move(g));
}

void Optimizer::add_param_group(ParamGroup group) {
  const int64_t gi = static_cast<int64_t>(groups_.size());
  std::set<const TensorImpl*> seen;
  for (const auto& g : groups_) {
    for (const auto& p : g.params) seen.insert(p.impl().get());
  }
  for (size_t k = 0; k < group.params.size(); ++k) {
    const Tensor& p = group.params[k];
    DLTRAIN_CHECK(p.defined(), name(), ": parameter ", k, " of param group ", gi,
                  " is an undefined tensor");
    DLTRAIN_CHECK(is_floating(p.dtype()), name(), ": parameter ", k, " of param group ", gi,
                  " has dtype ", p.dtype(), "; only floating-point tensors can be optimized");
    DLTRAIN_CHECK(p.is_leaf(), name(), ": parameter ", k, " of param group ", gi,
                  " is not a leaf (it was computed by an op); optimize the leaf it came from");
    DLTRAIN_CHECK(seen.insert(p.impl().get()).second, name(), ": parameter ", k, " of param group ",
                  gi, " (shape ", shape_str(p.shape()),
                  ") appears in more than one param group (or twice in one)");
  }
  for_each_field(group, defaults_, [&](const char* field, auto& mine, const auto& dflt) {
    if (!dflt.has_value()) {
      DLTRAIN_CHECK(!mine.has_value(), name(), ": param group ", gi, " sets '", field, "', which ",
                    name(), " does not use");
    } else if (!mine.has_value()) {
      mine = dflt;
    }
  });
  validate_group(group, gi);
  groups_.push_back(std::move(group));
}

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& g : groups_) {
    for (auto& p : g.params) {
      if (set_to_none) {
        p.set_grad(Tensor());
      } else if (Tensor gr = p.grad(); gr.defined()) {
        // Cut a graph-carrying gradient (backward(create_graph=true)) before zeroing it.
        if (gr.requires_grad()) {
          gr = gr.detach();
          p.set_grad(gr);
        }
        gr.zero_();
      }
    }
  }
}

void Optimizer::step() {
  dltrain::detail::OpScope scope(dltrain::detail::TraceKind::Optimizer, name(), ".step");
  autograd::NoGradGuard no_grad;
  // Every parameter is checked before any is updated, so a bad one changes nothing.
  struct Work {
    int64_t idx;
    Tensor* param;
    Tensor grad;
  };
  std::vector<std::vector<Work>> work(groups_.size());
  int64_t i = 0;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (auto& p : groups_[gi].params) {
      const int64_t idx = i++;
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      DLTRAIN_CHECK(
          grad.dtype() == p.dtype() && grad.device() == p.device() && grad.shape() == p.shape(),
          name(), ": the gradient of parameter ", idx, " is ", grad.dtype(), " ",
          shape_str(grad.shape()), " on ", grad.device(), " but the parameter is ", p.dtype(), " ",
          shape_str(p.shape()), " on ", p.device());
      DLTRAIN_CHECK(detail::is_dense(p), name(), ": parameter ", idx, " (shape ",
                    shape_str(p.shape()), ", strides ", shape_str(p.strides()),
                    ") is a non-dense view; optimizers update dense tensors, so make the ",
                    "parameter .contiguous() before handing it to the optimizer");
      if (p.numel() == 0) continue;
      if (!detail::is_dense(grad) || !detail::same_layout(p, grad)) {
        // Rare (a hand-set gradient in another memory format): one copy into p's layout.
        Tensor g2 = empty_state_like(p);
        g2.copy_(grad);
        grad = g2;
      }
      work[gi].push_back(Work{idx, &p, grad});
    }
  }
  // CPU parameters update in update(); CUDA ones are queued there and launched per group.
  detail::CudaBatchScope batch;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (Work& w : work[gi]) {
      // update() writes the parameter (and its state) through raw pointers or fused CUDA
      // kernels: the version counter learns of it here.
      w.param->bump_version("Optimizer::step");
      update(groups_[gi], w.idx, *w.param, w.grad);
    }
    batch.flush();
  }
}

StateDict Optimizer::state_dict() const {
  StateDict out;
  out.insert("type", detail::type_tag(name()));
  const int64_t n = num_params();
  for (int64_t i = 0; i < n; ++i) save_state(i, "state." + std::to_string(i) + ".", out);
  int64_t first = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    const std::string pre = group_prefix(g);
    std::vector<int64_t> idx(group.params.size());
    for (size_t k = 0; k < idx.size(); ++k) idx[k] = first + static_cast<int64_t>(k);
    first += static_cast<int64_t>(idx.size());
    out.insert(pre + "params", from_vector(idx));
    for_each_field(group, group, [&](const char* field, const auto& v, const auto&) {
      if (v.has_value()) write_field(out, pre + field, v);
    });
    if (group.initial_lr) out.insert_scalar(pre + "initial_lr", *group.initial_lr);
  }
  return out;
}

void Optimizer::load_state_dict(const StateDict& state) {
  const std::string ctx_s = std::string(name()) + "::load_state_dict";
  const char* ctx = ctx_s.c_str();
  const std::string saved_type = detail::read_tag(state, "type", ctx);
  DLTRAIN_CHECK(saved_type == name(), ctx, ": the state was saved by a ", saved_type,
                " optimizer and cannot be loaded into ", name(), "; build a ", saved_type,
                " to resume from it");

  size_t saved_groups = 0;
  while (state.contains(group_prefix(saved_groups) + "params")) ++saved_groups;
  DLTRAIN_CHECK(saved_groups == groups_.size(), ctx, ": the state has ", saved_groups,
                " param groups but this optimizer has ", groups_.size());

  std::set<std::string> known = {"type"};
  std::vector<ParamGroup> groups = groups_;
  for (size_t g = 0; g < groups.size(); ++g) {
    ParamGroup& group = groups[g];
    const std::string pre = group_prefix(g);
    const Tensor& idx = state.at(pre + "params", ctx);
    DLTRAIN_CHECK(idx.dim() == 1 && idx.numel() == static_cast<int64_t>(group.params.size()), ctx,
                  ": param group ", g, " has ", group.params.size(),
                  " parameters but the saved group has ", idx.numel(),
                  "; was the state saved for another model?");
    known.insert(pre + "params");
    for_each_field(group, group, [&](const char* field, auto& v, const auto&) {
      if (!v.has_value()) return;  // a field this optimizer does not use
      read_field(state, pre + field, ctx, v);
      known.insert(pre + field);
    });
    if (state.contains(pre + "initial_lr")) {
      group.initial_lr = state.scalar(pre + "initial_lr", ctx);
      known.insert(pre + "initial_lr");
    }
    validate_group(group, static_cast<int64_t>(g));
  }

  const int64_t n = num_params();
  const auto names = state_names();
  for (const auto& item : state) {
    const std::string& key = item.first;
    if (known.count(key)) continue;
    bool ok = false;
    if (key.rfind("state.", 0) == 0) {
      const auto dot = key.find('.', 6);
      const std::string num = key.substr(6, dot == std::string::npos ? 0 : dot - 6);
      if (dot != std::string::npos && !num.empty() &&
          std::all_of(num.begin(), num.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        const int64_t i = std::stoll(num);
        DLTRAIN_CHECK(i < n, ctx, ": entry '", key, "' is for parameter ", i,
                      " but this optimizer has only ", n, " parameters");
        ok = std::find(names.begin(), names.end(), key.substr(dot + 1)) != names.end();
      }
    }
    DLTRAIN_CHECK(ok, ctx, ": unexpected entry '", key, "' for a ", name(),
                  " state; was it saved by another optimizer or model?");
  }

  load_state(state, groups);  // throws before changing anything
  groups_ = std::move(groups);
}

Tensor Optimizer::load_buffer(const StateDict& state, const std::string& key, const Tensor& param) {
  const Tensor& t = state.at(key, "Optimizer::load_state_dict");
  DLTRAIN_CHECK(t.shape() == param.shape(), "Optimizer::load_state_dict: entry '", key,
                "' has shape ", shape_str(t.shape()), " but its parameter has shape ",
                shape_str(param.shape()), "; was the state saved for another model?");
  Tensor out = detail::empty_state(param);
  out.copy_(t);
  return out;
}

Tensor Optimizer::empty_state_like(const Tensor& param) {
  return empty_strided(param.shape(), param.strides(), param.options());
}

}  // namespace dltrain::optim
