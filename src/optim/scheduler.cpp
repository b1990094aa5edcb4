// The learning-rate schedulers of dltrain/optim/scheduler.hpp: each a closed form of the
// step count (chained ones compose), with state_dict for exact resume.
#include "dltrain/optim/scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>

#include "common.hpp"
#include "dltrain/core/error.hpp"

namespace dltrain::optim {

namespace {

constexpr double kPi = std::numbers::pi;

Tensor vec_tensor(const std::vector<double>& v) { return from_vector(v); }

std::vector<double> read_vec(const StateDict& state, const std::string& key, const char* ctx,
                             size_t expected) {
  const Tensor& t = state.at(key, ctx);
  DLTRAIN_CHECK(t.dim() == 1 && t.numel() == static_cast<int64_t>(expected), ctx, ": entry '", key,
                "' should hold ", expected, " values (one per param group) but has shape ",
                shape_str(t.shape()), "; was it saved with another optimizer?");
  return t.to_vector<double>();
}

int64_t read_int(const StateDict& state, const std::string& key, const char* ctx) {
  const double v = state.scalar(key, ctx);
  DLTRAIN_CHECK(v == std::floor(v), ctx, ": entry '", key, "' should be an integer but is ", v);
  return static_cast<int64_t>(v);
}

void save_int(StateDict& out, const std::string& key, int64_t v) {
  out.insert_scalar(key, static_cast<double>(v), /*integer=*/true);
}

// --- rescale_remaining: step counts converted to another global batch ---

void check_factor(double factor, const char* who) {
  DLTRAIN_CHECK(std::isfinite(factor) && factor > 0, who, "::rescale_remaining: the factor ",
                "must be positive and finite, got ", factor);
}

// Steps to something due `ahead` (> 0) steps from now, converted: at least 1.
int64_t convert_ahead(int64_t ahead, double factor) {
  return std::max<int64_t>(1, std::llround(static_cast<double>(ahead) * factor));
}

// A cycle of `total` steps, `last` of them done (last < total), with its rest converted and
// the fraction done kept, so the chainable formulas continue from the current rate:
// {new last, new total}.
std::pair<int64_t, int64_t> stretch_cycle(int64_t last, int64_t total, double factor) {
  const double done = static_cast<double>(last) / static_cast<double>(total);
  const int64_t new_left = convert_ahead(total - last, factor);
  const int64_t new_total =
      std::max<int64_t>(new_left, std::llround(static_cast<double>(new_left) / (1.0 - done)));
  return {new_total - new_left, new_total};
}

std::string join(const std::vector<int64_t>& v) {
  std::ostringstream o;
  for (size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
  return o.str();
}

// Saves the children's states under schedulers.<k>. (SequentialLR, ChainedScheduler).
void save_children(const std::vector<std::shared_ptr<LRScheduler>>& children, StateDict& out) {
  for (size_t k = 0; k < children.size(); ++k) {
    out.merge(children[k]->state_dict(), "schedulers." + std::to_string(k) + ".");
  }
}

// Loads every child, or none: on a failure the children already loaded get their old state.
void load_children(const std::vector<std::shared_ptr<LRScheduler>>& children,
                   const StateDict& state, const char* ctx) {
  DLTRAIN_CHECK(!state.contains("schedulers." + std::to_string(children.size()) + ".type"), ctx,
                ": the state holds more than ", children.size(), " schedulers");
  std::vector<StateDict> backup;
  for (const auto& c : children) backup.push_back(c->state_dict());
  size_t k = 0;
  try {
    for (; k < children.size(); ++k) {
      const std::string pre = "schedulers." + std::to_string(k) + ".";
      DLTRAIN_CHECK(state.contains(pre + "type"), ctx, ": the state has no entry for scheduler ", k,
                    " (missing key '", pre, "type')");
      children[k]->load_state_dict(state.sub(pre));
    }
  } catch (...) {
    for (size_t j = 0; j < k; ++j) children[j]->load_state_dict(backup[j]);
    throw;
  }
}

}  // namespace

// --- LRScheduler -----------------------------------------------------------------------

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
  for (auto& g : optimizer_.param_groups()) {
    if (!g.initial_lr) g.initial_lr = g.lr.value();
    base_lrs_.push_back(*g.initial_lr);
  }
}

void LRScheduler::initial_step() {
  step_count_ = 0;
  step();
}

std::vector<double> LRScheduler::group_lrs() const {
  std::vector<double> out;
  for (const auto& g : optimizer_.param_groups()) out.push_back(g.lr.value());
  return out;
}

void LRScheduler::check_groups() const {
  DLTRAIN_CHECK(optimizer_.param_groups().size() == base_lrs_.size(), name(),
                ": the optimizer has ", optimizer_.param_groups().size(), " param groups but had ",
                base_lrs_.size(),
                " when the scheduler was made; create the scheduler after add_param_group");
}

void LRScheduler::apply(const std::vector<double>& lrs) {
  auto& groups = optimizer_.param_groups();
  DLTRAIN_CHECK(lrs.size() == groups.size(), name(), ": computed ", lrs.size(),
                " learning rates for ", groups.size(), " param groups");
  for (size_t g = 0; g < groups.size(); ++g) groups[g].lr = lrs[g];
  last_lr_ = lrs;
}

void LRScheduler::step() {
  check_groups();
  ++step_count_;
  ++last_epoch_;
  std::vector<double> lrs;
  try {
    lrs = get_lr();
  } catch (...) {
    --step_count_;
    --last_epoch_;
    throw;
  }
  apply(lrs);
}

void LRScheduler::step_to(int64_t epoch) {
  check_groups();
  const int64_t old_epoch = last_epoch_;
  ++step_count_;
  last_epoch_ = epoch;
  std::vector<double> lrs;
  try {
    auto closed = closed_form_lr();
    lrs = closed ? std::move(*closed) : get_lr();
  } catch (...) {
    --step_count_;
    last_epoch_ = old_epoch;
    throw;
  }
  apply(lrs);
}

std::optional<std::string> LRScheduler::rescale_remaining(double factor) {
  check_factor(factor, name());
  return std::nullopt;
}

StateDict LRScheduler::state_dict() const {
  StateDict out;
  out.insert("type", detail::type_tag(name()));
  save_int(out, "last_epoch", last_epoch_);
  save_int(out, "step_count", step_count_);
  out.insert("base_lrs", vec_tensor(base_lrs_));
  out.insert("last_lr", vec_tensor(last_lr_));
  save_extra(out);
  return out;
}

void LRScheduler::load_state_dict(const StateDict& state) {
  const std::string ctx_s = std::string(name()) + "::load_state_dict";
  const char* ctx = ctx_s.c_str();
  const std::string saved = detail::read_tag(state, "type", ctx);
  DLTRAIN_CHECK(saved == name(), ctx, ": the state was saved by a ", saved,
                " and cannot be loaded into a ", name());
  check_groups();
  const int64_t last_epoch = read_int(state, "last_epoch", ctx);
  const int64_t step_count = read_int(state, "step_count", ctx);
  auto base_lrs = read_vec(state, "base_lrs", ctx, base_lrs_.size());
  auto last_lr = read_vec(state, "last_lr", ctx, base_lrs_.size());
  load_extra(state);  // throws before changing anything
  last_epoch_ = last_epoch;
  step_count_ = step_count;
  base_lrs_ = std::move(base_lrs);
  last_lr_ = std::move(last_lr);
}

// --- LambdaLR --------------------------------------------------------------------------

LambdaLR::LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> lr_lambda)
    : LRScheduler(optimizer) {
  DLTRAIN_CHECK(static_cast<bool>(lr_lambda), "LambdaLR: lr_lambda is empty");
  lambdas_.assign(base_lrs_.size(), lr_lambda);
  initial_step();
}

LambdaLR::LambdaLR(Optimizer& optimizer, std::vector<std::function<double(int64_t)>> lr_lambdas)
    : LRScheduler(optimizer), lambdas_(std::move(lr_lambdas)) {
  DLTRAIN_CHECK(lambdas_.size() == base_lrs_.size(), "LambdaLR: expected ", base_lrs_.size(),
                " lr_lambdas (one per param group), got ", lambdas_.size());
  for (const auto& f : lambdas_) DLTRAIN_CHECK(static_cast<bool>(f), "LambdaLR: empty lr_lambda");
  initial_step();
}

std::vector<double> LambdaLR::get_lr() {
  std::vector<double> out;
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    out.push_back(base_lrs_[g] * lambdas_[g](last_epoch_));
  }
  return out;
}

// --- StepLR ----------------------------------------------------------------------------

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  DLTRAIN_CHECK(step_size > 0, "StepLR: step_size must be > 0, got ", step_size);
  initial_step();
}

std::vector<double> StepLR::get_lr() {
  auto lrs = group_lrs();
  if (last_epoch_ == 0 || last_epoch_ % step_size_ != 0) return lrs;
  for (auto& lr : lrs) lr = lr * gamma_;
  return lrs;
}

std::optional<std::vector<double>> StepLR::closed_form_lr() const {
  std::vector<double> out;
  const double e = static_cast<double>(last_epoch_ / step_size_);
  for (double b : base_lrs_) out.push_back(b * std::pow(gamma_, e));
  return out;
}

std::optional<std::string> StepLR::rescale_remaining(double factor) {
  check_factor(factor, "StepLR");
  // The next decay, at k * step_size, comes after convert_ahead(k * step_size - L) steps at
  // k * new_step ((k - 1) decays so far, as before: ahead <= new_step since both round).
  const int64_t k = std::max<int64_t>(last_epoch_, 0) / step_size_ + 1;
  const int64_t new_step = convert_ahead(step_size_, factor);
  const int64_t ahead = std::min(new_step, convert_ahead(k * step_size_ - last_epoch_, factor));
  std::ostringstream o;
  o << "step_size " << step_size_ << " -> " << new_step << ", next decay in "
    << k * step_size_ - last_epoch_ << " steps -> " << ahead;
  step_size_ = new_step;
  last_epoch_ = k * new_step - ahead;
  return o.str();
}
void StepLR::save_extra(StateDict& out) const {
  save_int(out, "step_size", step_size_);
  out.insert_scalar("gamma", gamma_);
}

void StepLR::load_extra(const StateDict& state) {
  const int64_t step_size = read_int(state, "step_size", "StepLR::load_state_dict");
  const double gamma = state.scalar("gamma", "StepLR::load_state_dict");
  DLTRAIN_CHECK(step_size > 0, "StepLR::load_state_dict: saved step_size ", step_size,
                " is not > 0");
  step_size_ = step_size;
  gamma_ = gamma;
}

// --- MultiStepLR -----------------------------------------------------------------------

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer), milestones_(std::move(milestones)), gamma_(gamma) {
  for (int64_t m : milestones_) {
    DLTRAIN_CHECK(m >= 0, "MultiStepLR: milestones must be >= 0, got ", m);
  }
  std::sort(milestones_.begin(), milestones_.end());
  initial_step();
}

std::vector<double> MultiStepLR::get_lr() {
  auto lrs = group_lrs();
  const auto [lo, hi] = std::equal_range(milestones_.begin(), milestones_.end(), last_epoch_);
  const auto count = hi - lo;
  if (count == 0) return lrs;
  for (auto& lr : lrs) lr = lr * std::pow(gamma_, static_cast<double>(count));
  return lrs;
}

std::optional<std::vector<double>> MultiStepLR::closed_form_lr() const {
  const auto passed =
      std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin();
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(b * std::pow(gamma_, static_cast<double>(passed)));
  return out;
}

std::optional<std::string> MultiStepLR::rescale_remaining(double factor) {
  check_factor(factor, "MultiStepLR");
  std::vector<int64_t> before, after;
  for (int64_t& m : milestones_) {
    if (m <= last_epoch_) continue;
    before.push_back(m);
    m = last_epoch_ + convert_ahead(m - last_epoch_, factor);
    after.push_back(m);
  }
  std::sort(milestones_.begin(), milestones_.end());
  if (before.empty()) return std::string();
  return "milestones " + join(before) + " -> " + join(after);
}
void MultiStepLR::save_extra(StateDict& out) const {
  out.insert("milestones", from_vector(milestones_));
  out.insert_scalar("gamma", gamma_);
}

void MultiStepLR::load_extra(const StateDict& state) {
  const char* ctx = "MultiStepLR::load_state_dict";
  const Tensor& m = state.at("milestones", ctx);
  DLTRAIN_CHECK(m.dim() == 1, ctx, ": entry 'milestones' should be 1-d");
  const double gamma = state.scalar("gamma", ctx);
  auto milestones = m.to_vector<int64_t>();
  std::sort(milestones.begin(), milestones.end());
  milestones_ = std::move(milestones);
  gamma_ = gamma;
}

// --- ConstantLR ------------------------------------------------------------------------

ConstantLR::ConstantLR(Optimizer& optimizer, double factor, int64_t total_iters)
    : LRScheduler(optimizer), factor_(factor), total_iters_(total_iters) {
  DLTRAIN_CHECK(factor > 0.0 && factor <= 1.0, "ConstantLR: factor must be in (0, 1], got ",
                factor);
  DLTRAIN_CHECK(total_iters >= 0, "ConstantLR: total_iters must be >= 0, got ", total_iters);
  initial_step();
}

std::vector<double> ConstantLR::get_lr() {
  auto lrs = group_lrs();
  if (last_epoch_ == 0) {
    for (auto& lr : lrs) lr = lr * factor_;
  } else if (last_epoch_ == total_iters_) {
    for (auto& lr : lrs) lr = lr * (1.0 / factor_);
  }
  return lrs;
}

std::optional<std::vector<double>> ConstantLR::closed_form_lr() const {
  std::vector<double> out;
  const double after = last_epoch_ >= total_iters_ ? 1.0 - factor_ : 0.0;
  for (double b : base_lrs_) out.push_back(b * (factor_ + after));
  return out;
}

std::optional<std::string> ConstantLR::rescale_remaining(double factor) {
  check_factor(factor, "ConstantLR");
  if (total_iters_ <= last_epoch_) return std::string();
  const int64_t before = total_iters_;
  total_iters_ = last_epoch_ + convert_ahead(total_iters_ - last_epoch_, factor);
  return "total_iters " + std::to_string(before) + " -> " + std::to_string(total_iters_);
}
void ConstantLR::save_extra(StateDict& out) const {
  out.insert_scalar("factor", factor_);
  save_int(out, "total_iters", total_iters_);
}

void ConstantLR::load_extra(const StateDict& state) {
  const char* ctx = "ConstantLR::load_state_dict";
  const double factor = state.scalar("factor", ctx);
  const int64_t total_iters = read_int(state, "total_iters", ctx);
  DLTRAIN_CHECK(factor > 0.0 && factor <= 1.0, ctx, ": saved factor ", factor, " is not in (0, 1]");
  factor_ = factor;
  total_iters_ = total_iters;
}

// --- LinearLR --------------------------------------------------------------------------

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor,
                   int64_t total_iters)
    : LRScheduler(optimizer),
      start_factor_(start_factor),
      end_factor_(end_factor),
      total_iters_(total_iters) {
  DLTRAIN_CHECK(start_factor > 0.0 && start_factor <= 1.0,
                "LinearLR: start_factor must be in (0, 1], got ", start_factor);
  DLTRAIN_CHECK(end_factor >= 0.0 && end_factor <= 1.0,
                "LinearLR: end_factor must be in [0, 1], got ", end_factor);
  DLTRAIN_CHECK(total_iters > 0, "LinearLR: total_iters must be > 0, got ", total_iters);
  initial_step();
}

std::vector<double> LinearLR::get_lr() {
  auto lrs = group_lrs();
  if (last_epoch_ == 0) {
    for (auto& lr : lrs) lr = lr * start_factor_;
    return lrs;
  }
  if (last_epoch_ > total_iters_) return lrs;
  const double delta = end_factor_ - start_factor_;
  const double f = 1.0 + delta / (static_cast<double>(total_iters_) * start_factor_ +
                                  static_cast<double>(last_epoch_ - 1) * delta);
  for (auto& lr : lrs) lr = lr * f;
  return lrs;
}

std::optional<std::vector<double>> LinearLR::closed_form_lr() const {
  std::vector<double> out;
  const double t = static_cast<double>(std::min(total_iters_, last_epoch_));
  for (double b : base_lrs_) {
    out.push_back(b * (start_factor_ +
                       (end_factor_ - start_factor_) * t / static_cast<double>(total_iters_)));
  }
  return out;
}

std::optional<std::string> LinearLR::rescale_remaining(double factor) {
  check_factor(factor, "LinearLR");
  if (total_iters_ <= last_epoch_ || last_epoch_ < 0) return std::string();
  const int64_t left = total_iters_ - last_epoch_;
  std::tie(last_epoch_, total_iters_) = stretch_cycle(last_epoch_, total_iters_, factor);
  return "remaining " + std::to_string(left) + " warmup steps -> " +
         std::to_string(total_iters_ - last_epoch_);
}
void LinearLR::save_extra(StateDict& out) const {
  out.insert_scalar("start_factor", start_factor_);
  out.insert_scalar("end_factor", end_factor_);
  save_int(out, "total_iters", total_iters_);
}

void LinearLR::load_extra(const StateDict& state) {
  const char* ctx = "LinearLR::load_state_dict";
  const double start = state.scalar("start_factor", ctx), end = state.scalar("end_factor", ctx);
  const int64_t total = read_int(state, "total_iters", ctx);
  DLTRAIN_CHECK(start > 0.0 && total > 0, ctx, ": saved start_factor ", start, " / total_iters ",
                total, " are invalid");
  start_factor_ = start;
  end_factor_ = end;
  total_iters_ = total;
}

// --- ExponentialLR ---------------------------------------------------------------------

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma)
    : LRScheduler(optimizer), gamma_(gamma) {
  initial_step();
}

std::vector<double> ExponentialLR::get_lr() {
  auto lrs = group_lrs();
  if (last_epoch_ == 0) return lrs;
  for (auto& lr : lrs) lr = lr * gamma_;
  return lrs;
}

std::optional<std::vector<double>> ExponentialLR::closed_form_lr() const {
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(b * std::pow(gamma_, static_cast<double>(last_epoch_)));
  return out;
}

void ExponentialLR::save_extra(StateDict& out) const { out.insert_scalar("gamma", gamma_); }

void ExponentialLR::load_extra(const StateDict& state) {
  gamma_ = state.scalar("gamma", "ExponentialLR::load_state_dict");
}

// --- CosineAnnealingLR -----------------------------------------------------------------

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min)
    : LRScheduler(optimizer), T_max_(T_max), eta_min_(eta_min) {
  DLTRAIN_CHECK(T_max > 0, "CosineAnnealingLR: T_max must be > 0, got ", T_max);
  initial_step();
}

std::vector<double> CosineAnnealingLR::get_lr() {
  auto lrs = group_lrs();
  const double e = static_cast<double>(last_epoch_), T = static_cast<double>(T_max_);
  if (last_epoch_ == 0) return lrs;
  if (step_count_ == 1 && last_epoch_ > 0) {
    for (size_t g = 0; g < lrs.size(); ++g) {
      lrs[g] = eta_min_ + (base_lrs_[g] - eta_min_) * (1 + std::cos(e * kPi / T)) / 2;
    }
  } else if ((last_epoch_ - 1 - T_max_) % (2 * T_max_) == 0) {
    for (size_t g = 0; g < lrs.size(); ++g) {
      lrs[g] = lrs[g] + (base_lrs_[g] - eta_min_) * (1 - std::cos(kPi / T)) / 2;
    }
  } else {
    const double ratio = (1 + std::cos(kPi * e / T)) / (1 + std::cos(kPi * (e - 1) / T));
    for (auto& lr : lrs) lr = ratio * (lr - eta_min_) + eta_min_;
  }
  return lrs;
}

std::optional<std::vector<double>> CosineAnnealingLR::closed_form_lr() const {
  std::vector<double> out;
  const double e = static_cast<double>(last_epoch_), T = static_cast<double>(T_max_);
  for (double b : base_lrs_) {
    out.push_back(eta_min_ + (b - eta_min_) * (1 + std::cos(kPi * e / T)) / 2);
  }
  return out;
}

std::optional<std::string> CosineAnnealingLR::rescale_remaining(double factor) {
  check_factor(factor, "CosineAnnealingLR");
  if (T_max_ <= last_epoch_ || last_epoch_ < 0) return std::string();
  const int64_t left = T_max_ - last_epoch_;
  std::tie(last_epoch_, T_max_) = stretch_cycle(last_epoch_, T_max_, factor);
  return "remaining " + std::to_string(left) + " steps -> " + std::to_string(T_max_ - last_epoch_);
}
void CosineAnnealingLR::save_extra(StateDict& out) const {
  save_int(out, "T_max", T_max_);
  out.insert_scalar("eta_min", eta_min_);
}

void CosineAnnealingLR::load_extra(const StateDict& state) {
  const char* ctx = "CosineAnnealingLR::load_state_dict";
  const int64_t T_max = read_int(state, "T_max", ctx);
  const double eta_min = state.scalar("eta_min", ctx);
  DLTRAIN_CHECK(T_max > 0, ctx, ": saved T_max ", T_max, " is not > 0");
  T_max_ = T_max;
  eta_min_ = eta_min;
}

// --- PolynomialLR ----------------------------------------------------------------------

namespace {
void check_poly(int64_t total_iters, double power, double end_lr, const char* who) {
  DLTRAIN_CHECK(total_iters > 0, who, ": total_iters must be > 0, got ", total_iters);
  DLTRAIN_CHECK(power >= 0.0 && std::isfinite(power), who, ": power must be finite and >= 0, got ",
                power);
  DLTRAIN_CHECK(end_lr >= 0.0 && std::isfinite(end_lr), who,
                ": end_lr must be finite and >= 0, got ", end_lr);
}
}  // namespace

PolynomialLR::PolynomialLR(Optimizer& optimizer, int64_t total_iters, double power, double end_lr)
    : LRScheduler(optimizer), total_iters_(total_iters), power_(power), end_lr_(end_lr) {
  check_poly(total_iters, power, end_lr, "PolynomialLR");
  initial_step();
}

std::vector<double> PolynomialLR::get_lr() {
  auto lrs = group_lrs();
  if (last_epoch_ == 0 || last_epoch_ > total_iters_) return lrs;
  // PyTorch's expression, applied to the distance above end_lr.
  const double T = static_cast<double>(total_iters_), e = static_cast<double>(last_epoch_);
  const double f = std::pow((1.0 - e / T) / (1.0 - (e - 1.0) / T), power_);
  for (auto& lr : lrs) lr = (lr - end_lr_) * f + end_lr_;
  return lrs;
}

std::optional<std::vector<double>> PolynomialLR::closed_form_lr() const {
  std::vector<double> out;
  const double T = static_cast<double>(total_iters_);
  const double t = static_cast<double>(std::min(total_iters_, last_epoch_));
  for (double b : base_lrs_) out.push_back((b - end_lr_) * std::pow(1.0 - t / T, power_) + end_lr_);
  return out;
}

std::optional<std::string> PolynomialLR::rescale_remaining(double factor) {
  check_factor(factor, "PolynomialLR");
  if (total_iters_ <= last_epoch_ || last_epoch_ < 0) return std::string();
  const int64_t left = total_iters_ - last_epoch_;
  std::tie(last_epoch_, total_iters_) = stretch_cycle(last_epoch_, total_iters_, factor);
  return "remaining " + std::to_string(left) + " steps -> " +
         std::to_string(total_iters_ - last_epoch_);
}

void PolynomialLR::save_extra(StateDict& out) const {
  save_int(out, "total_iters", total_iters_);
  out.insert_scalar("power", power_);
  out.insert_scalar("end_lr", end_lr_);
}

void PolynomialLR::load_extra(const StateDict& state) {
  const char* ctx = "PolynomialLR::load_state_dict";
  const int64_t total = read_int(state, "total_iters", ctx);
  const double power = state.scalar("power", ctx), end_lr = state.scalar("end_lr", ctx);
  check_poly(total, power, end_lr, ctx);
  total_iters_ = total;
  power_ = power;
  end_lr_ = end_lr;
}

// --- OneCycleLR ------------------------------------------------------------------------

OneCycleLR::OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps,
                       const OneCycleOptions& options)
    : OneCycleLR(optimizer, std::vector<double>(optimizer.param_groups().size(), max_lr),
                 total_steps, options) {}

OneCycleLR::OneCycleLR(Optimizer& optimizer, std::vector<double> max_lrs, int64_t total_steps,
                       const OneCycleOptions& options)
    : LRScheduler(optimizer), total_steps_(total_steps), opt_(options) {
  auto& groups = optimizer_.param_groups();
  DLTRAIN_CHECK(total_steps > 0, "OneCycleLR: total_steps must be > 0, got ", total_steps);
  DLTRAIN_CHECK(max_lrs.size() == groups.size(), "OneCycleLR: expected ", groups.size(),
                " max_lr values (one per param group), got ", max_lrs.size());
  DLTRAIN_CHECK(options.pct_start >= 0.0 && options.pct_start <= 1.0,
                "OneCycleLR: pct_start must be in [0, 1], got ", options.pct_start);
  DLTRAIN_CHECK(options.div_factor > 0.0 && options.final_div_factor > 0.0,
                "OneCycleLR: div_factor (", options.div_factor, ") and final_div_factor (",
                options.final_div_factor, ") must be > 0");
  for (double m : max_lrs) {
    DLTRAIN_CHECK(m >= 0.0 && std::isfinite(m), "OneCycleLR: invalid max_lr ", m);
  }
  if (options.cycle_momentum) {
    const ParamGroup& g0 = groups.front();
    DLTRAIN_CHECK(g0.betas.has_value() || g0.momentum.has_value(),
                  "OneCycleLR: ", optimizer_.name(), " has neither momentum nor betas; pass ",
                  "cycle_momentum = false");
    use_beta1_ = g0.betas.has_value();
  }
  build_phases();
  for (size_t g = 0; g < groups.size(); ++g) {
    const double initial = max_lrs[g] / options.div_factor;
    groups[g].initial_lr = initial;
    base_lrs_[g] = initial;
    max_lrs_.push_back(max_lrs[g]);
    min_lrs_.push_back(initial / options.final_div_factor);
    if (options.cycle_momentum) {
      if (use_beta1_) {
        (*groups[g].betas)[0] = options.max_momentum;
      } else {
        groups[g].momentum = options.max_momentum;
      }
    }
  }
  initial_step();
}

void OneCycleLR::build_phases() {
  const double total = static_cast<double>(total_steps_), pct = opt_.pct_start;
  if (opt_.three_phase) {
    phases_ = {
        {pct * total - 1, 0, 1, 0, 1}, {2 * pct * total - 2, 1, 0, 1, 0}, {total - 1, 0, 2, 0, 0}};
  } else {
    phases_ = {{pct * total - 1, 0, 1, 0, 1}, {total - 1, 1, 2, 1, 0}};
  }
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (opt_.anneal_strategy == AnnealStrategy::Cos) {
    const double cos_out = std::cos(kPi * pct) + 1;
    return end + (start - end) / 2.0 * cos_out;
  }
  return (end - start) * pct + start;
}

std::vector<double> OneCycleLR::get_lr() {
  const int64_t step_num = last_epoch_;
  DLTRAIN_CHECK(step_num <= total_steps_, "OneCycleLR: tried to step ", step_num + 1,
                " times; the specified number of total steps is ", total_steps_,
                " (make total_steps cover every scheduler.step() call)");
  auto& groups = optimizer_.param_groups();
  // Find the phase once: it does not depend on the group.
  double start_step = 0.0, pct = 0.0;
  const Phase* phase = nullptr;
  for (size_t i = 0; i < phases_.size(); ++i) {
    const double end_step = phases_[i].end_step;
    if (static_cast<double>(step_num) <= end_step || i + 1 == phases_.size()) {
      DLTRAIN_CHECK(end_step != start_step, "OneCycleLR: phase ", i, " has zero length (",
                    "pct_start ", opt_.pct_start, " with total_steps ", total_steps_,
                    "); pick a pct_start giving each phase at least one step");
      pct = (static_cast<double>(step_num) - start_step) / (end_step - start_step);
      phase = &phases_[i];
      break;
    }
    start_step = end_step;
  }
  std::vector<double> lrs;
  for (size_t g = 0; g < groups.size(); ++g) {
    const double lr_at[3] = {groups[g].initial_lr.value(), max_lrs_[g], min_lrs_[g]};
    const double mom_at[2] = {opt_.max_momentum, opt_.base_momentum};
    lrs.push_back(anneal(lr_at[phase->start_lr], lr_at[phase->end_lr], pct));
    if (opt_.cycle_momentum) {
      const double m = anneal(mom_at[phase->start_momentum], mom_at[phase->end_momentum], pct);
      if (use_beta1_) {
        (*groups[g].betas)[0] = m;
      } else {
        groups[g].momentum = m;
      }
    }
  }
  return lrs;
}

std::optional<std::string> OneCycleLR::rescale_remaining(double factor) {
  check_factor(factor, "OneCycleLR");
  const int64_t left = total_steps_ - last_epoch_;
  if (left <= 0) return std::string();
  std::tie(last_epoch_, total_steps_) = stretch_cycle(last_epoch_, total_steps_, factor);
  build_phases();
  return "remaining " + std::to_string(left) + " steps -> " +
         std::to_string(total_steps_ - last_epoch_);
}

void OneCycleLR::save_extra(StateDict& out) const {
  save_int(out, "total_steps", total_steps_);
  out.insert_scalar("pct_start", opt_.pct_start);
  save_int(out, "anneal_strategy", opt_.anneal_strategy == AnnealStrategy::Cos ? 0 : 1);
  save_int(out, "cycle_momentum", opt_.cycle_momentum ? 1 : 0);
  save_int(out, "use_beta1", use_beta1_ ? 1 : 0);
  out.insert_scalar("base_momentum", opt_.base_momentum);
  out.insert_scalar("max_momentum", opt_.max_momentum);
  out.insert_scalar("div_factor", opt_.div_factor);
  out.insert_scalar("final_div_factor", opt_.final_div_factor);
  save_int(out, "three_phase", opt_.three_phase ? 1 : 0);
  out.insert("max_lrs", vec_tensor(max_lrs_));
  out.insert("min_lrs", vec_tensor(min_lrs_));
}

void OneCycleLR::load_extra(const StateDict& state) {
  const char* ctx = "OneCycleLR::load_state_dict";
  OneCycleOptions o;
  const int64_t total = read_int(state, "total_steps", ctx);
  o.pct_start = state.scalar("pct_start", ctx);
  o.anneal_strategy =
      read_int(state, "anneal_strategy", ctx) == 0 ? AnnealStrategy::Cos : AnnealStrategy::Linear;
  o.cycle_momentum = read_int(state, "cycle_momentum", ctx) != 0;
  const bool use_beta1 = read_int(state, "use_beta1", ctx) != 0;
  o.base_momentum = state.scalar("base_momentum", ctx);
  o.max_momentum = state.scalar("max_momentum", ctx);
  o.div_factor = state.scalar("div_factor", ctx);
  o.final_div_factor = state.scalar("final_div_factor", ctx);
  o.three_phase = read_int(state, "three_phase", ctx) != 0;
  auto max_lrs = read_vec(state, "max_lrs", ctx, base_lrs_.size());
  auto min_lrs = read_vec(state, "min_lrs", ctx, base_lrs_.size());
  DLTRAIN_CHECK(total > 0, ctx, ": saved total_steps ", total, " is not > 0");
  if (o.cycle_momentum) {
    const ParamGroup& g0 = optimizer_.param_groups().front();
    DLTRAIN_CHECK(use_beta1 ? g0.betas.has_value() : g0.momentum.has_value(), ctx,
                  ": the state cycles ", use_beta1 ? "beta1" : "momentum", " but ",
                  optimizer_.name(), " has no such hyper-parameter");
  }
  total_steps_ = total;
  opt_ = o;
  use_beta1_ = use_beta1;
  max_lrs_ = std::move(max_lrs);
  min_lrs_ = std::move(min_lrs);
  build_phases();
}

// --- SequentialLR ----------------------------------------------------------------------

SequentialLR::SequentialLR(Optimizer& optimizer,
                           std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer), schedulers_(std::move(schedulers)), milestones_(milestones) {
  DLTRAIN_CHECK(!schedulers_.empty(), "SequentialLR: needs at least one scheduler");
  for (size_t k = 0; k < schedulers_.size(); ++k) {
    DLTRAIN_CHECK(schedulers_[k] != nullptr, "SequentialLR: scheduler ", k, " is null");
    DLTRAIN_CHECK(&schedulers_[k]->optimizer() == &optimizer, "SequentialLR: scheduler ", k, " (",
                  schedulers_[k]->name(), ") drives another optimizer than the one passed");
    DLTRAIN_CHECK(k == 0 || dynamic_cast<SequentialLR*>(schedulers_[k].get()) == nullptr,
                  "SequentialLR: scheduler ", k, " is a SequentialLR, which cannot restart at a ",
                  "milestone; flatten the sequence instead");
  }
  DLTRAIN_CHECK(milestones_.size() + 1 == schedulers_.size(), "SequentialLR: expects one ",
                "milestone fewer than schedulers, got ", schedulers_.size(), " schedulers and ",
                milestones_.size(), " milestones");
  for (size_t k = 1; k < milestones_.size(); ++k) {
    DLTRAIN_CHECK(milestones_[k] > milestones_[k - 1],
                  "SequentialLR: milestones must increase strictly, got ", milestones_[k - 1],
                  " then ", milestones_[k]);
  }
  last_epoch_ = 0;
  // As PyTorch: reset lr to initial_lr, undo the children's initial steps, then redo the
  // first child's.
  for (auto& g : optimizer_.param_groups()) g.lr = g.initial_lr.value();
  for (auto& s : schedulers_) s->last_epoch_ -= 1;
  schedulers_.front()->initial_step();
  last_lr_ = schedulers_.front()->get_last_lr();
}

void SequentialLR::step() {
  check_groups();
  const int64_t epoch = last_epoch_ + 1;
  const auto idx = static_cast<size_t>(
      std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin());
  LRScheduler& s = *schedulers_[idx];
  if (idx > 0 && milestones_[idx - 1] == epoch) {
    s.step_to(0);
  } else {
    s.step();
  }
  last_epoch_ = epoch;
  ++step_count_;
  last_lr_ = s.get_last_lr();
}

void SequentialLR::save_extra(StateDict& out) const {
  out.insert("milestones", from_vector(milestones_));
  save_children(schedulers_, out);
}

void SequentialLR::load_extra(const StateDict& state) {
  const char* ctx = "SequentialLR::load_state_dict";
  const Tensor& m = state.at("milestones", ctx);
  DLTRAIN_CHECK(m.dim() == 1 && m.numel() == static_cast<int64_t>(milestones_.size()), ctx,
                ": the state has ", m.numel(), " milestones but this SequentialLR has ",
                milestones_.size());
  auto milestones = m.to_vector<int64_t>();
  load_children(schedulers_, state, ctx);
  milestones_ = std::move(milestones);
}

// --- ChainedScheduler ------------------------------------------------------------------

namespace {
Optimizer& first_optimizer(const std::vector<std::shared_ptr<LRScheduler>>& s) {
  DLTRAIN_CHECK(!s.empty() && s.front() != nullptr,
                "ChainedScheduler: needs at least one (non-null) scheduler");
  return s.front()->optimizer();
}
}  // namespace

ChainedScheduler::ChainedScheduler(std::vector<std::shared_ptr<LRScheduler>> schedulers)
    : LRScheduler(first_optimizer(schedulers)), schedulers_(std::move(schedulers)) {
  for (size_t k = 0; k < schedulers_.size(); ++k) {
    DLTRAIN_CHECK(schedulers_[k] != nullptr, "ChainedScheduler: scheduler ", k, " is null");
    DLTRAIN_CHECK(&schedulers_[k]->optimizer() == &optimizer_, "ChainedScheduler: scheduler ", k,
                  " (", schedulers_[k]->name(), ") drives another optimizer than scheduler 0");
  }
  last_epoch_ = 0;
  last_lr_ = group_lrs();
}

void ChainedScheduler::step() {
  check_groups();
  for (auto& s : schedulers_) s->step();
  ++last_epoch_;
  ++step_count_;
  last_lr_ = group_lrs();
}

void ChainedScheduler::save_extra(StateDict& out) const { save_children(schedulers_, out); }

void ChainedScheduler::load_extra(const StateDict& state) {
  load_children(schedulers_, state, "ChainedScheduler::load_state_dict");
}

}  // namespace dltrain::optim
