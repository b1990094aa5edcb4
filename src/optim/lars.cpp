// optim::LARS (dltrain/optim/lars.hpp): SGD with momentum and a per-parameter trust ratio,
// as MLPerf's ResNet-50 reference applies it (You et al. 2017).
#include "dltrain/optim/lars.hpp"

#include <cmath>
#include <type_traits>

#include "common.hpp"
#include "dltrain/core/parallel.hpp"
#include "src/backend/cpu/cast.hpp"

namespace dltrain::optim {

namespace {

ParamGroup lars_defaults(const LARSOptions& o) {
  ParamGroup g;
  g.lr = o.lr;
  g.weight_decay = o.weight_decay;
  g.momentum = o.momentum;
  g.eps = o.eps;
  g.trust_coefficient = o.trust_coefficient;
  g.trust_ratio = o.trust_ratio;
  return g;
}

// ||w||^2 and ||g||^2 in f64 (see lars.hpp).
template <class P, class T>
std::array<double, 2> lars_sq_norms(const P* p, const P* g, int64_t n) {
  using backend::cpu::cast;
  return detail::chunked_sums(n, [=](int64_t lo, int64_t hi) {
    double sw = 0.0, sg = 0.0;
    for (int64_t k = lo; k < hi; ++k) {
      const double w = static_cast<double>(cast<T>(p[k])), d = static_cast<double>(cast<T>(g[k]));
      sw += w * w;
      sg += d * d;
    }
    return std::array<double, 2>{sw, sg};
  });
}

// The fused update; P the parameter and gradient type, T the velocity and arithmetic type.
template <class P, class T, bool kDecay, bool kMomentum>
void lars_kernel(P* p, const P* g, T* buf, int64_t n, T local_lr, T wd, T momentum) {
  using backend::cpu::cast;
  parallel_for(0, n, detail::kGrain, [=](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      const T pk = cast<T>(p[k]);
      T d = cast<T>(g[k]);
      if constexpr (kDecay) d = d + wd * pk;
      if constexpr (kMomentum) {
        const T b = momentum * buf[k] + local_lr * d;
        buf[k] = b;
        p[k] = cast<P>(pk - b);
      } else {
        p[k] = cast<P>(pk - local_lr * d);
      }
    }
  });
}

}  // namespace

LARS::LARS(std::vector<Tensor> params, const LARSOptions& options)
    : Optimizer(lars_defaults(options)) {
  ParamGroup g;
  g.params = std::move(params);
  init({std::move(g)});
}

LARS::LARS(std::vector<ParamGroup> groups, const LARSOptions& options)
    : Optimizer(lars_defaults(options)) {
  init(std::move(groups));
}

void LARS::validate_group(const ParamGroup& group, int64_t g) const {
  const double lr = *group.lr, momentum = *group.momentum, wd = *group.weight_decay,
               eta = *group.trust_coefficient, eps = *group.eps;
  DLTRAIN_CHECK(!std::isnan(lr), "LARS: param group ", g, " has no learning rate; LARS has no ",
                "default lr: set LARSOptions::lr");
  DLTRAIN_CHECK(lr >= 0.0 && std::isfinite(lr), "LARS: invalid learning rate ", lr,
                " in param group ", g, " (must be finite and >= 0)");
  DLTRAIN_CHECK(momentum >= 0.0 && momentum < 1.0, "LARS: invalid momentum ", momentum,
                " in param group ", g, " (must be in [0, 1))");
  DLTRAIN_CHECK(wd >= 0.0 && std::isfinite(wd), "LARS: invalid weight_decay ", wd,
                " in param group ", g, " (must be finite and >= 0)");
  DLTRAIN_CHECK(eta > 0.0 && std::isfinite(eta), "LARS: invalid trust_coefficient ", eta,
                " in param group ", g, " (must be finite and > 0)");
  DLTRAIN_CHECK(eps >= 0.0 && std::isfinite(eps), "LARS: invalid eps ", eps, " in param group ", g,
                " (must be finite and >= 0)");
}

void LARS::update(const ParamGroup& group, int64_t i, Tensor& param, const Tensor& grad) {
  if (static_cast<int64_t>(momentum_buffer_.size()) <= i) momentum_buffer_.resize(i + 1);
  const double momentum = *group.momentum, wd = *group.weight_decay;
  Tensor& buf = momentum_buffer_[i];
  detail::match_param(buf, param);
  if (momentum != 0.0 && !buf.defined()) {
    buf = detail::empty_state(param);
    buf.zero_();
  }
  if (param.device().is_cuda()) {
    detail::CudaBatch& batch = detail::cuda_batch();
    batch.lars_hyper = backend::cuda::LarsHyper{.lr = *group.lr,
                                                .weight_decay = wd,
                                                .momentum = momentum,
                                                .trust_coefficient = *group.trust_coefficient,
                                                .eps = *group.eps,
                                                .trust_ratio = *group.trust_ratio};
    batch.lars.push_back(backend::cuda::LarsTensors{
        .param = param, .grad = grad, .momentum_buffer = momentum != 0.0 ? buf : Tensor()});
    return;
  }
  const int64_t n = param.numel();
  dispatch_floating(param.dtype(), "LARS::step", [&]<class P>() {
    using T = acc_t<P>;
    P* p = param.data<P>();
    const P* g = grad.data<P>();
    double ratio = 1.0;
    if (*group.trust_ratio) {
      const auto sq = lars_sq_norms<P, T>(p, g, n);
      const double wn = std::sqrt(sq[0]), gn = std::sqrt(sq[1]);
      if (wn > 0.0 && gn > 0.0) ratio = *group.trust_coefficient * wn / (gn + wd * wn + *group.eps);
    }
    T* b = momentum != 0.0 ? buf.data<T>() : nullptr;
    const T local_lr = static_cast<T>(*group.lr * ratio), wdt = static_cast<T>(wd),
            mom = static_cast<T>(momentum);
    detail::with_flag(wd != 0.0, [&](auto decay) {
      detail::with_flag(momentum != 0.0, [&](auto use_mom) {
        lars_kernel<P, T, decltype(decay)::value, decltype(use_mom)::value>(p, g, b, n, local_lr,
                                                                            wdt, mom);
      });
    });
  });
}

std::vector<std::string> LARS::state_names() const { return {"momentum_buffer"}; }

void LARS::save_state(int64_t i, const std::string& prefix, StateDict& out) const {
  detail::save_momentum(momentum_buffer_, i, prefix, out);
}

void LARS::load_state(const StateDict& state, const std::vector<ParamGroup>& groups) {
  momentum_buffer_ = detail::load_momentum(
      state, groups,
      [&](const std::string& key, const Tensor& p) { return load_buffer(state, key, p); });
}

}  // namespace dltrain::optim
