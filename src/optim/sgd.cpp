// optim::SGD (dltrain/optim/sgd.hpp): momentum, dampening, Nesterov and weight decay, f32
// momentum for 16-bit parameters, fused per parameter on the CPU and multi-tensor on CUDA.
#include "dltrain/optim/sgd.hpp"

#include <cmath>

#include "common.hpp"
#include "dltrain/core/parallel.hpp"
#include "src/backend/cpu/cast.hpp"

namespace dltrain::optim {

namespace {

ParamGroup sgd_defaults(const SGDOptions& o) {
  ParamGroup g;
  g.lr = o.lr;
  g.weight_decay = o.weight_decay;
  g.momentum = o.momentum;
  g.dampening = o.dampening;
  g.nesterov = o.nesterov;
  g.maximize = o.maximize;
  return g;
}

// The fused update. The flags are template parameters so each variant's loop has no
// branches and vectorises; `sign` is +-1 (exact) for maximize. P is the parameter and
// gradient type, T the buffer and arithmetic type (the same except for f16/bf16 parameters).
template <class P, class T, bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
void sgd_kernel(P* p, const P* g, T* buf, int64_t n, T lr, T wd, T momentum, T one_minus_damp,
                T sign) {
  using backend::cpu::cast;
  parallel_for(0, n, detail::kGrain, [=](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      const T pk = cast<T>(p[k]);
      T d = sign * cast<T>(g[k]);
      if constexpr (kDecay) d = d + wd * pk;
      if constexpr (kMomentum) {
        T b;
        if constexpr (kFirst) {
          b = d;
        } else {
          b = momentum * buf[k] + one_minus_damp * d;
        }
        buf[k] = b;
        if constexpr (kNesterov) {
          d = d + momentum * b;
        } else {
          d = b;
        }
      }
      p[k] = cast<P>(pk - lr * d);
    }
  });
}

}  // namespace

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options) : Optimizer(sgd_defaults(options)) {
  ParamGroup g;
  g.params = std::move(params);
  init({std::move(g)});
}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& options)
    : Optimizer(sgd_defaults(options)) {
  init(std::move(groups));
}

void SGD::validate_group(const ParamGroup& group, int64_t g) const {
  const double lr = *group.lr, momentum = *group.momentum, dampening = *group.dampening,
               wd = *group.weight_decay;
  DLTRAIN_CHECK(!std::isnan(lr), "SGD: param group ", g, " has no learning rate; SGD has no ",
                "default lr (as in PyTorch): set SGDOptions::lr");
  DLTRAIN_CHECK(lr >= 0.0 && std::isfinite(lr), "SGD: invalid learning rate ", lr,
                " in param group ", g, " (must be finite and >= 0)");
  DLTRAIN_CHECK(momentum >= 0.0 && std::isfinite(momentum), "SGD: invalid momentum ", momentum,
                " in param group ", g, " (must be >= 0)");
  DLTRAIN_CHECK(wd >= 0.0 && std::isfinite(wd), "SGD: invalid weight_decay ", wd,
                " in param group ", g, " (must be >= 0)");
  DLTRAIN_CHECK(std::isfinite(dampening), "SGD: invalid dampening ", dampening, " in param group ",
                g);
  DLTRAIN_CHECK(!*group.nesterov || (momentum > 0.0 && dampening == 0.0), "SGD: Nesterov ",
                "momentum requires momentum > 0 and dampening == 0, but param group ", g,
                " has momentum ", momentum, " and dampening ", dampening);
}

void SGD::update(const ParamGroup& group, int64_t i, Tensor& param, const Tensor& grad) {
  if (static_cast<int64_t>(momentum_buffer_.size()) <= i) momentum_buffer_.resize(i + 1);
  const double momentum = *group.momentum;
  Tensor& buf = momentum_buffer_[i];
  detail::match_param(buf, param);
  bool first = false;
  if (momentum != 0.0 && !buf.defined()) {
    buf = detail::empty_state(param);
    first = true;
  }
  if (param.device().is_cuda()) {
    detail::CudaBatch& batch = detail::cuda_batch();
    batch.sgd_hyper = backend::cuda::SgdHyper{.lr = *group.lr,
                                              .weight_decay = *group.weight_decay,
                                              .momentum = momentum,
                                              .dampening = *group.dampening,
                                              .nesterov = *group.nesterov,
                                              .maximize = *group.maximize};
    batch.sgd.push_back(backend::cuda::SgdTensors{
        .param = param, .grad = grad, .momentum_buffer = buf, .first = first});
    return;
  }
  const int64_t n = param.numel();
  dispatch_floating(param.dtype(), "SGD::step", [&]<class P>() {
    using T = acc_t<P>;
    P* p = param.data<P>();
    const P* g = grad.data<P>();
    T* b = momentum != 0.0 ? buf.data<T>() : nullptr;
    const T lr = static_cast<T>(*group.lr), wd = static_cast<T>(*group.weight_decay),
            mom = static_cast<T>(momentum), one_minus_damp = static_cast<T>(1.0 - *group.dampening),
            sign = *group.maximize ? T(-1) : T(1);
    detail::with_flag(*group.weight_decay != 0.0, [&](auto decay) {
      detail::with_flag(momentum != 0.0, [&](auto use_mom) {
        detail::with_flag(first, [&](auto is_first) {
          detail::with_flag(*group.nesterov, [&](auto nesterov) {
            sgd_kernel<P, T, decltype(decay)::value, decltype(use_mom)::value,
                       decltype(is_first)::value, decltype(nesterov)::value>(
                p, g, b, n, lr, wd, mom, one_minus_damp, sign);
          });
        });
      });
    });
  });
}

std::vector<std::string> SGD::state_names() const { return {"momentum_buffer"}; }

void SGD::save_state(int64_t i, const std::string& prefix, StateDict& out) const {
  detail::save_momentum(momentum_buffer_, i, prefix, out);
}

void SGD::load_state(const StateDict& state, const std::vector<ParamGroup>& groups) {
  momentum_buffer_ = detail::load_momentum(
      state, groups,
      [&](const std::string& key, const Tensor& p) { return load_buffer(state, key, p); });
}

}  // namespace dltrain::optim
