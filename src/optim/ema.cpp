// optim::ModelEMA (dltrain/optim/ema.hpp): an exponential moving average of a model's
// parameters and buffers, with decay warm-up and checkpointable state.
#include "dltrain/optim/ema.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "common.hpp"
#include "dltrain/autograd/node.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/ops/elementwise.hpp"

namespace dltrain::optim {

namespace {

void check_options(const ModelEMAOptions& o, const char* who) {
  DLTRAIN_CHECK(o.decay >= 0.0 && o.decay <= 1.0, who, ": decay must be in [0, 1], got ", o.decay);
  DLTRAIN_CHECK(o.update_every >= 1, who, ": update_every must be >= 1, got ", o.update_every);
}

constexpr const char* kShadow = "shadow.";

}  // namespace

ModelEMA::ModelEMA(const nn::Module& model, const ModelEMAOptions& options) : options_(options) {
  check_options(options, "ModelEMA");
  std::set<std::string> params;
  for (const auto& [name, p] : model.named_parameters()) params.insert(name);
  autograd::NoGradGuard no_grad;
  for (const auto& [name, t] : model.state_dict()) {
    Tensor s;
    if (is_floating(t.dtype())) {
      s = empty_strided(t.shape(), t.strides(),
                        t.options().with_dtype(detail::state_dtype(t.dtype())));
      s.copy_(t);
    } else {
      s = t.clone();
    }
    shadow_.insert(name, s);
    is_param_.push_back(params.count(name) != 0);
  }
}

double ModelEMA::next_decay() const {
  if (!options_.warmup) return options_.decay;
  const double t = static_cast<double>(num_updates_);
  return std::min(options_.decay, (1.0 + t) / (10.0 + t));
}

StateDict ModelEMA::checked_model_state(const nn::Module& model, const char* who) const {
  StateDict sd = model.state_dict();
  const auto& want = shadow_.items();
  const auto& got = sd.items();
  for (size_t k = 0; k < std::max(want.size(), got.size()); ++k) {
    DLTRAIN_CHECK(k < want.size() && k < got.size() && want[k].first == got[k].first, who,
                  ": the model's state has entry '", k < got.size() ? got[k].first : "(none)",
                  "' where the EMA has '", k < want.size() ? want[k].first : "(none)",
                  "'; was the EMA made from another model?");
    const Tensor &s = want[k].second, &m = got[k].second;
    DLTRAIN_CHECK(s.shape() == m.shape() && s.device() == m.device(), who, ": entry '",
                  got[k].first, "' is ", shape_str(m.shape()), " on ", m.device(),
                  " in the model but ", shape_str(s.shape()), " on ", s.device(),
                  " in the EMA (move the model before making the EMA)");
  }
  return sd;
}

void ModelEMA::update(const nn::Module& model) {
  const StateDict sd = checked_model_state(model, "ModelEMA::update");
  ++step_count_;
  if (step_count_ % options_.update_every != 0) return;
  const double d = next_decay();
  autograd::NoGradGuard no_grad;
  const auto& items = sd.items();
  for (size_t k = 0; k < items.size(); ++k) {
    Tensor s = shadow_.items()[k].second;
    const Tensor& m = items[k].second;
    const bool blend =
        is_floating(m.dtype()) && (is_param_[k] || options_.average_buffers) && d != 0.0;
    if (!blend) {
      s.copy_(m);
      continue;
    }
    dltrain::mul_(s, d);
    dltrain::add_(s, m.dtype() == s.dtype() ? m : m.to(s.dtype()), 1.0 - d);
  }
  ++num_updates_;
}

void ModelEMA::copy_to(nn::Module& model) const {
  checked_model_state(model, "ModelEMA::copy_to");
  model.load_state_dict(shadow_);
}

StateDict ModelEMA::state_dict() const {
  StateDict out;
  out.insert("type", detail::type_tag("ModelEMA"));
  out.insert_scalar("decay", options_.decay);
  out.insert_scalar("warmup", options_.warmup ? 1.0 : 0.0, /*integer=*/true);
  out.insert_scalar("update_every", static_cast<double>(options_.update_every), true);
  out.insert_scalar("average_buffers", options_.average_buffers ? 1.0 : 0.0, true);
  out.insert_scalar("step_count", static_cast<double>(step_count_), true);
  out.insert_scalar("num_updates", static_cast<double>(num_updates_), true);
  for (const auto& [name, t] : shadow_) out.insert(kShadow + name, t.clone());
  return out;
}

void ModelEMA::load_state_dict(const StateDict& state) {
  const char* ctx = "ModelEMA::load_state_dict";
  const std::string type = detail::read_tag(state, "type", ctx);
  DLTRAIN_CHECK(type == "ModelEMA", ctx, ": the state was saved by a ", type,
                " and cannot be loaded into a ModelEMA");
  auto read_count = [&](const char* key) {
    const double v = state.scalar(key, ctx);
    DLTRAIN_CHECK(v >= 0.0 && v == std::floor(v), ctx, ": entry '", key,
                  "' should be a non-negative integer but is ", v);
    return static_cast<int64_t>(v);
  };
  ModelEMAOptions o;
  o.decay = state.scalar("decay", ctx);
  o.warmup = state.scalar("warmup", ctx) != 0.0;
  o.update_every = read_count("update_every");
  o.average_buffers = state.scalar("average_buffers", ctx) != 0.0;
  check_options(o, ctx);
  const int64_t steps = read_count("step_count"), updates = read_count("num_updates");
  std::set<std::string> known = {
      "type", "decay", "warmup", "update_every", "average_buffers", "step_count", "num_updates"};
  std::vector<Tensor> loaded;
  for (const auto& [name, s] : shadow_) {
    const std::string key = kShadow + name;
    const Tensor& t = state.at(key, ctx);
    DLTRAIN_CHECK(t.shape() == s.shape(), ctx, ": entry '", key, "' has shape ",
                  shape_str(t.shape()), " but the EMA's is ", shape_str(s.shape()),
                  "; was it saved for another model?");
    Tensor c = empty_strided(s.shape(), s.strides(), s.options());
    c.copy_(t);
    loaded.push_back(c);
    known.insert(key);
  }
  for (const auto& [key, t] : state) {
    DLTRAIN_CHECK(known.count(key) != 0, ctx, ": unexpected entry '", key,
                  "'; was it saved for another model?");
  }
  StateDict shadow;
  size_t k = 0;
  for (const auto& [name, s] : shadow_) shadow.insert(name, loaded[k++]);
  shadow_ = std::move(shadow);
  options_ = o;
  step_count_ = steps;
  num_updates_ = updates;
}

EMAScope::EMAScope(const ModelEMA& ema, nn::Module& model) : model_(model) {
  const StateDict own = ema.checked_model_state(model, "EMAScope");
  for (const auto& [name, t] : own) saved_.insert(name, t.clone());
  model.load_state_dict(ema.shadow_);
}

EMAScope::~EMAScope() { model_.load_state_dict(saved_); }

}  // namespace dltrain::optim
