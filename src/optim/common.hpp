// Helpers shared by the optim sources (not installed): memory-layout checks for the fused
// passes, the u8 type tag that marks whose state a StateDict holds, and the batch through
// which CUDA parameters are updated by multi-tensor kernels.
//
// CUDA batching: Optimizer::update is per parameter, but a CUDA update should be one launch
// for a whole group. So while Optimizer::step runs, a CudaBatchScope installs a thread-local
// CudaBatch; update() of a CUDA parameter prepares its state and appends its tensors there,
// and step() flushes the batch after each group (one multi-tensor launch per device, dtype
// and table of tensors).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "dltrain/core/error.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/core/state_dict.hpp"
#include "dltrain/core/tensor.hpp"
#include "dltrain/optim/optimizer.hpp"
#include "src/backend/cuda/optim.hpp"
#include "src/core/layout.hpp"

namespace dltrain::optim::detail {

/// Elements per parallel_for chunk of the fused passes: big enough to amortise the pool
/// hand-off, small enough to split a 2.4M-element ResNet-50 conv weight over 16 threads.
constexpr int64_t kGrain = int64_t{1} << 15;

using dltrain::detail::is_dense;

/// Calls `f(std::true_type{})` or `f(std::false_type{})`: a run-time flag made a compile-time
/// one, so the fused loops carry no per-element branch on it.
template <class F>
void with_flag(bool b, F&& f) {
  if (b) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

/// True when a and b have one shape and equal strides on every dim of size > 1, so the
/// same memory offset addresses the same logical element in both.
inline bool same_layout(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  }
  return true;
}

/// Runs f(lo, hi) -> std::array<double, 2> on the fixed chunks [c * kGrain, (c + 1) * kGrain)
/// of [0, n), in parallel, and returns the chunks' results summed in chunk order: the same
/// bits whatever the thread count (the norms of LARS and LAMB).
template <class F>
std::array<double, 2> chunked_sums(int64_t n, F&& f) {
  const int64_t chunks = (n + kGrain - 1) / kGrain;
  if (chunks <= 1) return f(int64_t{0}, n);
  std::vector<std::array<double, 2>> part(static_cast<size_t>(chunks));
  parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) part[c] = f(c * kGrain, std::min(n, (c + 1) * kGrain));
  });
  std::array<double, 2> s{0.0, 0.0};
  for (const auto& p : part) {
    s[0] += p[0];
    s[1] += p[1];
  }
  return s;
}

/// The dtype of a parameter's optimizer state and of its update arithmetic: f32 for f16/bf16
/// parameters (pure low-precision training keeps f32 moments, and each element is rounded to
/// the parameter's dtype once per step), the parameter's own dtype otherwise.
inline DType state_dtype(DType param) {
  return param == DType::f16 || param == DType::bf16 ? DType::f32 : param;
}

/// Uninitialised state buffer for `param`: its shape, strides and device, state_dtype.
inline Tensor empty_state(const Tensor& param) {
  return empty_strided(param.shape(), param.strides(),
                       param.options().with_dtype(state_dtype(param.dtype())));
}

/// Keeps an optimizer buffer of `param` in param's current state dtype, device and layout: the
/// fused passes address both with one flat offset, and Module::to(dtype|device|format) converts
/// a parameter in place (same TensorImpl) after its buffers may have been made. A buffer that
/// no longer matches is replaced by a converted copy (logical values kept).
inline void match_param(Tensor& state, const Tensor& param) {
  if (!state.defined() || (state.dtype() == state_dtype(param.dtype()) &&
                           state.device() == param.device() && same_layout(param, state)))
    return;
  Tensor t = empty_state(param);
  t.copy_(state);
  state = t;
}

/// The CUDA updates of the param group being stepped (see the file comment). Within one
/// flush the hyper-parameters are the group's.
struct CudaBatch {
  backend::cuda::SgdHyper sgd_hyper;
  std::vector<backend::cuda::SgdTensors> sgd;
  backend::cuda::AdamHyper adam_hyper;
  std::vector<backend::cuda::AdamTensors> adam;
  backend::cuda::LarsHyper lars_hyper;
  std::vector<backend::cuda::LarsTensors> lars;
  backend::cuda::LambHyper lamb_hyper;
  std::vector<backend::cuda::LambTensors> lamb;
  /// Launches the queued updates, one call per (device, dtype), and empties the batch.
  void flush();
};

/// The batch of the Optimizer::step running on this thread; throws outside of one.
CudaBatch& cuda_batch();

/// Installs an empty CudaBatch for the calling thread for its lifetime (restoring the
/// previous one after); queued updates that were not flushed are dropped.
class CudaBatchScope {
 public:
  CudaBatchScope();
  ~CudaBatchScope();
  CudaBatchScope(const CudaBatchScope&) = delete;
  CudaBatchScope& operator=(const CudaBatchScope&) = delete;
  void flush() { batch_.flush(); }

 private:
  CudaBatch batch_;
  CudaBatch* previous_;
};

/// A 1-d u8 tensor holding the bytes of `name`.
inline Tensor type_tag(const std::string& name) {
  return from_vector(std::vector<uint8_t>(name.begin(), name.end()));
}

/// The string stored by type_tag under `key`; throws naming `context` when it is absent or
/// not a 1-d u8 tensor.
inline std::string read_tag(const StateDict& state, const std::string& key, const char* context) {
  const Tensor& t = state.at(key, context);
  DLTRAIN_CHECK(t.dtype() == DType::u8 && t.dim() == 1, context, ": entry '", key,
                "' should be a 1-d u8 type name but has dtype ", t.dtype(), " and shape ",
                shape_str(t.shape()));
  const auto bytes = t.to_vector<uint8_t>();
  return std::string(bytes.begin(), bytes.end());
}

// --- per-parameter state in state dicts, shared by the optimizers with the same state ----

/// SGD's and LARS's state: `<prefix>momentum_buffer` for parameter i when it has one.
inline void save_momentum(const std::vector<Tensor>& buffers, int64_t i, const std::string& prefix,
                          StateDict& out) {
  if (i < static_cast<int64_t>(buffers.size()) && buffers[i].defined())
    out.insert(prefix + "momentum_buffer", buffers[i].clone(MemoryFormat::Contiguous));
}

/// The momentum buffers of every parameter of `groups` (undefined where the state has none);
/// `load(key, param)` is the optimizer's Optimizer::load_buffer.
template <class Load>
std::vector<Tensor> load_momentum(const StateDict& state, const std::vector<ParamGroup>& groups,
                                  Load load) {
  std::vector<Tensor> bufs;
  for (const auto& g : groups)
    for (const auto& p : g.params) {
      const std::string key = "state." + std::to_string(bufs.size()) + ".momentum_buffer";
      bufs.push_back(state.contains(key) ? load(key, p) : Tensor());
    }
  return bufs;
}

/// Adam's (and AdamW's, LAMB's) state of one parameter: its step count and moments.
struct Moments {
  int64_t step = 0;                            // 0: never stepped (no state saved)
  Tensor exp_avg, exp_avg_sq, max_exp_avg_sq;  // max_exp_avg_sq: AMSGrad only
};

/// `<prefix>step`, `exp_avg`, `exp_avg_sq` (and `max_exp_avg_sq` when kept), PyTorch's keys.
inline void save_moments(const Moments& s, const std::string& prefix, StateDict& out) {
  if (s.step == 0) return;
  out.insert_scalar(prefix + "step", static_cast<double>(s.step), /*integer=*/true);
  out.insert(prefix + "exp_avg", s.exp_avg.clone(MemoryFormat::Contiguous));
  out.insert(prefix + "exp_avg_sq", s.exp_avg_sq.clone(MemoryFormat::Contiguous));
  if (s.max_exp_avg_sq.defined())
    out.insert(prefix + "max_exp_avg_sq", s.max_exp_avg_sq.clone(MemoryFormat::Contiguous));
}

/// The moments of every parameter of `groups`; `with_max(group)` says whether a parameter of
/// that group keeps max_exp_avg_sq even when the state lacks it (AMSGrad), `load(key, param)`
/// is Optimizer::load_buffer. Throws naming `ctx` for a step that is not a positive integer.
template <class WithMax, class Load>
std::vector<Moments> load_moments(const StateDict& state, const std::vector<ParamGroup>& groups,
                                  const char* ctx, WithMax with_max, Load load) {
  std::vector<Moments> loaded;
  for (const auto& g : groups)
    for (const auto& p : g.params) {
      const std::string pre = "state." + std::to_string(loaded.size()) + ".";
      Moments s;
      if (state.contains(pre + "step") || state.contains(pre + "exp_avg") ||
          state.contains(pre + "exp_avg_sq") || state.contains(pre + "max_exp_avg_sq")) {
        const double step = state.scalar(pre + "step", ctx);
        DLTRAIN_CHECK(step >= 1.0 && step == std::floor(step), ctx, ": entry '", pre,
                      "step' should be a positive integer but is ", step);
        s.step = static_cast<int64_t>(step);
        s.exp_avg = load(pre + "exp_avg", p);
        s.exp_avg_sq = load(pre + "exp_avg_sq", p);
        if (with_max(g) || state.contains(pre + "max_exp_avg_sq"))
          s.max_exp_avg_sq = load(pre + "max_exp_avg_sq", p);
      }
      loaded.push_back(std::move(s));
    }
  return loaded;
}

}  // namespace dltrain::optim::detail
