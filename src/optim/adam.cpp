// optim::Adam and AdamW (dltrain/optim/adam.hpp): the moments in f32 for 16-bit parameters,
// one fused pass per parameter on the CPU, the multi-tensor kernels on CUDA.
#include "dltrain/optim/adam.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "common.hpp"
#include "dltrain/core/parallel.hpp"
#include "src/backend/cpu/cast.hpp"

namespace dltrain::optim {

namespace {

ParamGroup adam_defaults(const AdamOptions& o) {
  ParamGroup g;
  g.lr = o.lr;
  g.weight_decay = o.weight_decay;
  g.betas = o.betas;
  g.eps = o.eps;
  g.amsgrad = o.amsgrad;
  g.maximize = o.maximize;
  return g;
}

AdamOptions from_adamw(const AdamWOptions& o) {
  return AdamOptions{.lr = o.lr,
                     .betas = o.betas,
                     .eps = o.eps,
                     .weight_decay = o.weight_decay,
                     .amsgrad = o.amsgrad,
                     .maximize = o.maximize};
}

struct AdamCoeffs {
  double decay_factor;  // AdamW: 1 - lr * wd
  double wd;            // Adam: L2 coefficient
  double beta1, beta2, step_size, bc2_sqrt, eps, sign;
};

// The fused update, written with PyTorch's operation order (see adam.hpp); flags are
// template parameters so each variant's loops are branch-free. std::sqrt keeps errno
// semantics (the build does not pass -fno-math-errno), which makes GCC guard it with a call
// that blocks vectorisation of any loop containing it. So each chunk is processed in
// L1-resident tiles of three passes: moments (vectorised), sqrt (scalar), parameter update
// with its two divisions (vectorised): 2x faster than one scalar loop. P is the parameter and
// gradient type, T the moment and arithmetic type (float for f16/bf16 parameters, whose
// decayed value is kept in a float tile so the parameter is rounded once).
template <class P, class T, bool kDecoupled, bool kDecay, bool kAmsgrad>
void adam_kernel(P* p, const P* g, T* m, T* v, T* vmax, int64_t n, const AdamCoeffs& c) {
  using backend::cpu::cast;
  constexpr bool kSame = std::is_same_v<P, T>;
  const T decay_factor = static_cast<T>(c.decay_factor), wd = static_cast<T>(c.wd),
          b1 = static_cast<T>(c.beta1), b2 = static_cast<T>(c.beta2),
          one_minus_b1 = static_cast<T>(1.0 - c.beta1),
          one_minus_b2 = static_cast<T>(1.0 - c.beta2),
          neg_step_size = static_cast<T>(-c.step_size), bc2_sqrt = static_cast<T>(c.bc2_sqrt),
          eps = static_cast<T>(c.eps), sign = static_cast<T>(c.sign);
  parallel_for(0, n, detail::kGrain, [=](int64_t lo, int64_t hi) {
    constexpr int64_t kTile = 512;
    T root[kTile];
    T pv[kSame ? 1 : kTile];  // the f16/bf16 parameter tile in float
    for (int64_t t0 = lo; t0 < hi; t0 += kTile) {
      const int64_t len = std::min(kTile, hi - t0);
      P* __restrict pt = p + t0;
      const P* __restrict gt = g + t0;
      T* __restrict mt = m + t0;
      T* __restrict vt = v + t0;
      T* __restrict pw;  // the parameter as updated in T
      if constexpr (kSame) {
        pw = pt;
      } else {
        pw = pv;
        for (int64_t k = 0; k < len; ++k) pv[k] = cast<T>(pt[k]);
      }
      for (int64_t k = 0; k < len; ++k) {
        T d = sign * cast<T>(gt[k]);
        if constexpr (kDecoupled) {
          pw[k] = pw[k] * decay_factor;
        } else if constexpr (kDecay) {
          d = d + wd * pw[k];
        }
        mt[k] = mt[k] * b1 + one_minus_b1 * d;
        const T vk = vt[k] * b2 + one_minus_b2 * d * d;
        vt[k] = vk;
        if constexpr (kAmsgrad) {
          const T old = vmax[t0 + k];
          const T mx = (vk != vk || vk > old) ? vk : old;  // NaN propagates, as torch.maximum
          vmax[t0 + k] = mx;
          root[k] = mx;
        } else {
          root[k] = vk;
        }
      }
      for (int64_t k = 0; k < len; ++k) root[k] = std::sqrt(root[k]);
      for (int64_t k = 0; k < len; ++k) {
        const T denom = root[k] / bc2_sqrt + eps;
        pw[k] = pw[k] + neg_step_size * (mt[k] / denom);
      }
      if constexpr (!kSame)
        for (int64_t k = 0; k < len; ++k) pt[k] = cast<P>(pv[k]);
    }
  });
}

}  // namespace

Adam::Adam(std::vector<Tensor> params, const AdamOptions& options)
    : Optimizer(adam_defaults(options)), decoupled_(false) {
  ParamGroup g;
  g.params = std::move(params);
  init({std::move(g)});
}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& options)
    : Adam(std::move(groups), options, false) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& options, bool decoupled)
    : Optimizer(adam_defaults(options)), decoupled_(decoupled) {
  init(std::move(groups));
}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : AdamW(std::vector<ParamGroup>{ParamGroup{.params = std::move(params)}}, options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options)
    : Adam(std::move(groups), from_adamw(options), true) {}

void Adam::validate_group(const ParamGroup& group, int64_t g) const {
  const double lr = *group.lr, eps = *group.eps, wd = *group.weight_decay;
  const auto [b1, b2] = *group.betas;
  DLTRAIN_CHECK(lr >= 0.0 && std::isfinite(lr), name(), ": invalid learning rate ", lr,
                " in param group ", g, " (must be finite and >= 0)");
  DLTRAIN_CHECK(eps >= 0.0 && std::isfinite(eps), name(), ": invalid eps ", eps, " in param group ",
                g, " (must be >= 0)");
  DLTRAIN_CHECK(b1 >= 0.0 && b1 < 1.0, name(), ": invalid beta1 ", b1, " in param group ", g,
                " (must be in [0, 1))");
  DLTRAIN_CHECK(b2 >= 0.0 && b2 < 1.0, name(), ": invalid beta2 ", b2, " in param group ", g,
                " (must be in [0, 1))");
  DLTRAIN_CHECK(wd >= 0.0 && std::isfinite(wd), name(), ": invalid weight_decay ", wd,
                " in param group ", g, " (must be >= 0)");
}

void Adam::update(const ParamGroup& group, int64_t i, Tensor& param, const Tensor& grad) {
  if (static_cast<int64_t>(state_.size()) <= i) state_.resize(i + 1);
  State& s = state_[i];
  const bool amsgrad = *group.amsgrad;
  if (s.step == 0) {
    s.exp_avg = detail::empty_state(param).zero_();
    s.exp_avg_sq = detail::empty_state(param).zero_();
  } else {
    detail::match_param(s.exp_avg, param);
    detail::match_param(s.exp_avg_sq, param);
  }
  detail::match_param(s.max_exp_avg_sq, param);
  if (amsgrad && !s.max_exp_avg_sq.defined()) s.max_exp_avg_sq = detail::empty_state(param).zero_();
  s.step += 1;
  if (param.device().is_cuda()) {
    const auto [b1, b2] = *group.betas;
    detail::CudaBatch& batch = detail::cuda_batch();
    batch.adam_hyper = backend::cuda::AdamHyper{.lr = *group.lr,
                                                .weight_decay = *group.weight_decay,
                                                .beta1 = b1,
                                                .beta2 = b2,
                                                .eps = *group.eps,
                                                .decoupled = decoupled_,
                                                .amsgrad = amsgrad,
                                                .maximize = *group.maximize};
    batch.adam.push_back(
        backend::cuda::AdamTensors{.param = param,
                                   .grad = grad,
                                   .exp_avg = s.exp_avg,
                                   .exp_avg_sq = s.exp_avg_sq,
                                   .max_exp_avg_sq = amsgrad ? s.max_exp_avg_sq : Tensor(),
                                   .step = s.step});
    return;
  }

  const double lr = *group.lr, wd = *group.weight_decay;
  const auto [beta1, beta2] = *group.betas;
  const double step = static_cast<double>(s.step);
  const double bc1 = 1.0 - std::pow(beta1, step), bc2 = 1.0 - std::pow(beta2, step);
  const AdamCoeffs c{.decay_factor = 1.0 - lr * wd,
                     .wd = wd,
                     .beta1 = beta1,
                     .beta2 = beta2,
                     .step_size = lr / bc1,
                     .bc2_sqrt = std::sqrt(bc2),
                     .eps = *group.eps,
                     .sign = *group.maximize ? -1.0 : 1.0};
  const int64_t n = param.numel();
  dispatch_floating(param.dtype(), "Adam::step", [&]<class P>() {
    using T = acc_t<P>;
    T* vmax = amsgrad ? s.max_exp_avg_sq.data<T>() : nullptr;
    detail::with_flag(decoupled_, [&](auto decoupled) {
      detail::with_flag(wd != 0.0, [&](auto decay) {
        detail::with_flag(amsgrad, [&](auto ams) {
          adam_kernel<P, T, decltype(decoupled)::value, decltype(decay)::value,
                      decltype(ams)::value>(param.data<P>(), grad.data<P>(), s.exp_avg.data<T>(),
                                            s.exp_avg_sq.data<T>(), vmax, n, c);
        });
      });
    });
  });
}

std::vector<std::string> Adam::state_names() const {
  return {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
}

void Adam::save_state(int64_t i, const std::string& prefix, StateDict& out) const {
  if (i >= static_cast<int64_t>(state_.size())) return;
  const State& s = state_[i];
  detail::save_moments({s.step, s.exp_avg, s.exp_avg_sq, s.max_exp_avg_sq}, prefix, out);
}

void Adam::load_state(const StateDict& state, const std::vector<ParamGroup>& groups) {
  const std::string ctx = std::string(name()) + "::load_state_dict";
  std::vector<State> loaded;
  for (detail::Moments& m : detail::load_moments(
           state, groups, ctx.c_str(), [](const ParamGroup&g) { return *g.amsgrad; },
           [&](const std::string&key, const Tensor&p) { return load_buffer(state, key, p); }))
    loaded.push_back(
        {m.step, std::move(m.exp_avg), std::move(m.exp_avg_sq), std::move(m.max_exp_avg_sq)});
  state_ = std::move(loaded);
}

}  // namespace dltrain::optim
