// optim::LAMB (dltrain/optim/lamb.hpp): Adam moments with a per-parameter trust ratio
// (You et al. 2019).
#include "dltrain/optim/lamb.hpp"

#include <algorithm>
#include <cmath>

#include "common.hpp"
#include "dltrain/core/parallel.hpp"
#include "src/backend/cpu/cast.hpp"

namespace dltrain::optim {

namespace {

ParamGroup lamb_defaults(const LAMBOptions& o) {
  ParamGroup g;
  g.lr = o.lr;
  g.weight_decay = o.weight_decay;
  g.betas = o.betas;
  g.eps = o.eps;
  g.max_trust_ratio = o.max_trust_ratio;
  g.trust_ratio = o.trust_ratio;
  return g;
}

// The per-element coefficients of one step, in the arithmetic type T.
template <class T>
struct LambCoeffs {
  T b1, b2, one_minus_b1, one_minus_b2, bc1, bc2, eps, wd;
};

// r of lamb.hpp from the updated moments and the parameter; both passes call this.
template <class T>
inline T lamb_r(T m, T v, T w, const LambCoeffs<T>& c) {
  return (m / c.bc1) / (std::sqrt(v / c.bc2) + c.eps) + c.wd * w;
}

// Pass 1: updates the moments; returns ||w||^2 and ||r||^2 (f64).
template <class P, class T>
std::array<double, 2> lamb_moments(const P* p, const P* g, T* m, T* v, int64_t n,
                                   const LambCoeffs<T>& c) {
  using backend::cpu::cast;
  return detail::chunked_sums(n, [=, &c](int64_t lo, int64_t hi) {
    double sw = 0.0, sr = 0.0;
    for (int64_t k = lo; k < hi; ++k) {
      const T d = cast<T>(g[k]), w = cast<T>(p[k]);
      const T mk = c.b1 * m[k] + c.one_minus_b1 * d;
      const T vk = c.b2 * v[k] + c.one_minus_b2 * d * d;
      m[k] = mk;
      v[k] = vk;
      const double r = static_cast<double>(lamb_r(mk, vk, w, c)), wd = static_cast<double>(w);
      sw += wd * wd;
      sr += r * r;
    }
    return std::array<double, 2>{sw, sr};
  });
}

// Pass 2: w -= step * r.
template <class P, class T>
void lamb_apply(P* p, const T* m, const T* v, int64_t n, const LambCoeffs<T>& c, T step) {
  using backend::cpu::cast;
  parallel_for(0, n, detail::kGrain, [=, &c](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      const T w = cast<T>(p[k]);
      p[k] = cast<P>(w - step * lamb_r(m[k], v[k], w, c));
    }
  });
}

}  // namespace

LAMB::LAMB(std::vector<Tensor> params, const LAMBOptions& options)
    : Optimizer(lamb_defaults(options)) {
  ParamGroup g;
  g.params = std::move(params);
  init({std::move(g)});
}

LAMB::LAMB(std::vector<ParamGroup> groups, const LAMBOptions& options)
    : Optimizer(lamb_defaults(options)) {
  init(std::move(groups));
}

void LAMB::validate_group(const ParamGroup& group, int64_t g) const {
  const double lr = *group.lr, eps = *group.eps, wd = *group.weight_decay,
               clip = *group.max_trust_ratio;
  const auto [b1, b2] = *group.betas;
  DLTRAIN_CHECK(lr >= 0.0 && std::isfinite(lr), "LAMB: invalid learning rate ", lr,
                " in param group ", g, " (must be finite and >= 0)");
  DLTRAIN_CHECK(eps >= 0.0 && std::isfinite(eps), "LAMB: invalid eps ", eps, " in param group ", g,
                " (must be finite and >= 0)");
  DLTRAIN_CHECK(b1 >= 0.0 && b1 < 1.0, "LAMB: invalid beta1 ", b1, " in param group ", g,
                " (must be in [0, 1))");
  DLTRAIN_CHECK(b2 >= 0.0 && b2 < 1.0, "LAMB: invalid beta2 ", b2, " in param group ", g,
                " (must be in [0, 1))");
  DLTRAIN_CHECK(wd >= 0.0 && std::isfinite(wd), "LAMB: invalid weight_decay ", wd,
                " in param group ", g, " (must be finite and >= 0)");
  DLTRAIN_CHECK(clip > 0.0, "LAMB: invalid max_trust_ratio ", clip, " in param group ", g,
                " (must be > 0; +infinity does not clip)");
}

void LAMB::update(const ParamGroup& group, int64_t i, Tensor& param, const Tensor& grad) {
  if (static_cast<int64_t>(state_.size()) <= i) state_.resize(i + 1);
  State& s = state_[i];
  if (s.step == 0) {
    s.exp_avg = detail::empty_state(param).zero_();
    s.exp_avg_sq = detail::empty_state(param).zero_();
  } else {
    detail::match_param(s.exp_avg, param);
    detail::match_param(s.exp_avg_sq, param);
  }
  s.step += 1;
  // Plain variables, not a structured binding: the kernels' lambdas capture them (clang before
  // 16 cannot capture a structured binding).
  const double beta1 = (*group.betas)[0], beta2 = (*group.betas)[1];
  if (param.device().is_cuda()) {
    detail::CudaBatch& batch = detail::cuda_batch();
    batch.lamb_hyper = backend::cuda::LambHyper{.lr = *group.lr,
                                                .weight_decay = *group.weight_decay,
                                                .beta1 = beta1,
                                                .beta2 = beta2,
                                                .eps = *group.eps,
                                                .max_trust_ratio = *group.max_trust_ratio,
                                                .trust_ratio = *group.trust_ratio};
    batch.lamb.push_back(backend::cuda::LambTensors{.param = param,
                                                    .grad = grad,
                                                    .exp_avg = s.exp_avg,
                                                    .exp_avg_sq = s.exp_avg_sq,
                                                    .step = s.step});
    return;
  }
  const double step = static_cast<double>(s.step);
  const double bc1 = 1.0 - std::pow(beta1, step), bc2 = 1.0 - std::pow(beta2, step);
  const int64_t n = param.numel();
  dispatch_floating(param.dtype(), "LAMB::step", [&]<class P>() {
    using T = acc_t<P>;
    const LambCoeffs<T> c{static_cast<T>(beta1),       static_cast<T>(beta2),
                          static_cast<T>(1.0 - beta1), static_cast<T>(1.0 - beta2),
                          static_cast<T>(bc1),         static_cast<T>(bc2),
                          static_cast<T>(*group.eps),  static_cast<T>(*group.weight_decay)};
    P* p = param.data<P>();
    T* m = s.exp_avg.data<T>();
    T* v = s.exp_avg_sq.data<T>();
    const auto sq = lamb_moments<P, T>(p, grad.data<P>(), m, v, n, c);
    double ratio = 1.0;
    if (*group.trust_ratio) {
      const double wn = std::sqrt(sq[0]), rn = std::sqrt(sq[1]);
      if (wn > 0.0 && rn > 0.0) ratio = std::min(wn / rn, *group.max_trust_ratio);
    }
    lamb_apply<P, T>(p, m, v, n, c, static_cast<T>(*group.lr * ratio));
  });
}

std::vector<std::string> LAMB::state_names() const { return {"step", "exp_avg", "exp_avg_sq"}; }

void LAMB::save_state(int64_t i, const std::string& prefix, StateDict& out) const {
  if (i >= static_cast<int64_t>(state_.size())) return;
  const State& s = state_[i];
  detail::save_moments({s.step, s.exp_avg, s.exp_avg_sq, Tensor()}, prefix, out);
}

void LAMB::load_state(const StateDict& state, const std::vector<ParamGroup>& groups) {
  std::vector<State> loaded;
  for (detail::Moments& m : detail::load_moments(
           state, groups, "LAMB::load_state_dict", [](const ParamGroup&) { return false; },
           [&](const std::string&key, const Tensor&p) { return load_buffer(state, key, p); }))
    loaded.push_back({m.step, std::move(m.exp_avg), std::move(m.exp_avg_sq)});
  state_ = std::move(loaded);
}

}  // namespace dltrain::optim
