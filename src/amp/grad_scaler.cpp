// GradScaler: PyTorch's torch.amp.GradScaler (grad_scaler.py) step for step, with the two
// device ops it relies on: the fused unscale + non-finite check (CPU here, CUDA in
// kernels/amp.cu) and the scale update (_amp_update_scale_).
//
// CPU unscale: the dense gradients of one dtype are cut into fixed chunks and processed in one
// parallel_for (one pass over the memory, whatever the number of tensors); a chunk that meets
// an inf or NaN raises a shared flag, written to found_inf after the pass. Gradients that are
// not dense (hand-set strided views) take a strided loop each.
#include "dltrain/amp/grad_scaler.hpp"

#include <atomic>
#include <cmath>
#include <map>
#include <utility>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/optim/optimizer.hpp"
#include "src/backend/cpu/cast.hpp"
#include "src/backend/cpu/loops.hpp"
#include "src/backend/cuda/amp.hpp"
#include "src/core/layout.hpp"

namespace dltrain::amp {

namespace {

using backend::cpu::cast;

constexpr int64_t kChunk = int64_t{1} << 15;

using dltrain::detail::is_dense;

// g = g * inv (g when inv == 1) over n elements; true when one was inf or NaN before scaling.
template <class T>
bool unscale_run(T* g, int64_t n, float inv) {
  using A = acc_t<T>;
  const A a_inv = static_cast<A>(inv);
  bool bad = false;
  if (inv == 1.0f) {
    for (int64_t k = 0; k < n; ++k) bad |= !std::isfinite(cast<A>(g[k]));
    return bad;
  }
  for (int64_t k = 0; k < n; ++k) {
    const A v = cast<A>(g[k]);
    bad |= !std::isfinite(v);
    g[k] = cast<T>(v * a_inv);
  }
  return bad;
}

// The CPU twin of backend::cuda::amp_unscale for gradients of one dtype.
void cpu_unscale(const std::vector<Tensor>& grads, const Tensor& found_inf, float inv) {
  std::atomic<bool> bad{false};
  dispatch_floating(grads.front().dtype(), "GradScaler::unscale_", [&]<class T>() {
    struct Piece {
      T* ptr;
      int64_t n;
    };
    std::vector<Piece> pieces;
    for (const Tensor& g : grads) {
      if (is_dense(g)) {
        T* p = static_cast<T*>(g.data_ptr());
        for (int64_t s = 0; s < g.numel(); s += kChunk)
          pieces.push_back({p + s, std::min(kChunk, g.numel() - s)});
        continue;
      }
      backend::cpu::for_each_strided<1>(
          g.shape(), {static_cast<char*>(g.data_ptr())}, {g.strides()}, {sizeof(T)},
          [&](const std::array<char*, 1>& p, const std::array<int64_t, 1>& s, int64_t n) {
            bool b = false;
            const int64_t st = s[0] / static_cast<int64_t>(sizeof(T));
            T* q = reinterpret_cast<T*>(p[0]);
            for (int64_t i = 0; i < n; ++i) b |= unscale_run<T>(q + i * st, 1, inv);
            if (b) bad.store(true, std::memory_order_relaxed);
          });
    }
    parallel_for(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t b, int64_t e) {
      bool local = false;
      for (int64_t i = b; i < e; ++i) local |= unscale_run<T>(pieces[i].ptr, pieces[i].n, inv);
      if (local) bad.store(true, std::memory_order_relaxed);
    });
  });
  if (bad.load()) found_inf.data<float>()[0] = 1.0f;
}

void cpu_update_scale(const Tensor& scale, const Tensor& tracker, const Tensor& found_inf,
                      double growth, double backoff, int64_t interval) {
  float& s = scale.data<float>()[0];
  int32_t& t = tracker.data<int32_t>()[0];
  if (found_inf.data<float>()[0] > 0.0f) {
    s = static_cast<float>(s * backoff);
    t = 0;
    return;
  }
  const int64_t successful = t + 1;
  if (successful == interval) {
    const float grown = static_cast<float>(s * growth);
    if (std::isfinite(grown)) s = grown;
    t = 0;
  } else {
    t = static_cast<int32_t>(successful);
  }
}

void check_options(const GradScalerOptions& o) {
  DLTRAIN_CHECK(o.init_scale > 0.0 && std::isfinite(o.init_scale),
                "GradScaler: init_scale must be finite and > 0 but is ", o.init_scale);
  DLTRAIN_CHECK(o.growth_factor > 1.0 && std::isfinite(o.growth_factor),
                "GradScaler: growth_factor must be finite and > 1 but is ", o.growth_factor);
  DLTRAIN_CHECK(o.backoff_factor > 0.0 && o.backoff_factor < 1.0,
                "GradScaler: backoff_factor must be in (0, 1) but is ", o.backoff_factor);
  DLTRAIN_CHECK(o.growth_interval >= 1 && o.growth_interval <= INT32_MAX,
                "GradScaler: growth_interval must be in [1, 2^31) but is ", o.growth_interval);
}

}  // namespace

GradScaler::GradScaler(const GradScalerOptions& options) : options_(options) {
  check_options(options_);
}

void GradScaler::check_started(const char* method) const {
  DLTRAIN_CHECK(scale_.defined(), "GradScaler::", method,
                ": no loss has been scaled yet; call scaler.scale(loss).backward() earlier in the "
                "iteration");
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!options_.enabled) return loss;
  DLTRAIN_CHECK(loss.defined(), "GradScaler::scale: the loss is an undefined tensor");
  DLTRAIN_CHECK(is_floating(loss.dtype()), "GradScaler::scale: the loss must be floating-point ",
                "but has dtype ", loss.dtype());
  if (!scale_.defined()) {
    TensorOptions o = TensorOptions(DType::f32).with_device(loss.device());
    scale_ = full({}, options_.init_scale, o);
    growth_tracker_ = full({}, static_cast<double>(init_growth_tracker_), o.with_dtype(DType::i32));
  }
  return mul(loss, scale_.device() == loss.device() ? scale_ : scale_.to(loss.device(), true));
}

std::vector<Tensor> GradScaler::scale(const std::vector<Tensor>& losses) {
  std::vector<Tensor> out;
  out.reserve(losses.size());
  for (const Tensor& l : losses) out.push_back(scale(l));
  return out;
}

void GradScaler::unscale_(optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  check_started("unscale_");
  OptimizerState& st = per_optimizer_[&optimizer];
  DLTRAIN_CHECK(st.stage != Stage::Unscaled,
                "GradScaler::unscale_: unscale_() has already been called on this optimizer "
                "since the last update(); call it at most once per step");
  DLTRAIN_CHECK(st.stage != Stage::Stepped,
                "GradScaler::unscale_: unscale_() is being called after step(); call it before "
                "step(), or call update() first to start the next iteration");
  NoGradGuard ng;
  // Gradients grouped by (device, dtype); every parameter is checked before any is touched.
  std::map<std::pair<std::pair<int, int>, DType>, std::vector<Tensor>> groups;
  int64_t i = 0;
  for (const Tensor& p : optimizer.parameters()) {
    const int64_t idx = i++;
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    DLTRAIN_CHECK(g.dtype() != DType::f16, "GradScaler::unscale_: parameter ", idx,
                  " has a float16 gradient; GradScaler unscales f32 (or bf16/f64) gradients. "
                  "Keep the parameters in f32 and let amp::autocast cast them to f16");
    const Device d = g.device();
    groups[{{static_cast<int>(d.type), d.index}, g.dtype()}].push_back(g);
  }
  // inv_scale = 1 / scale in double, rounded to f32, computed on the scale's device (no host
  // sync) and copied to each gradient device.
  const Tensor inv = (1.0 / scale_.to(DType::f64)).to(DType::f32);
  std::map<std::pair<int, int>, std::pair<Tensor, Tensor>> per_device;  // found_inf, inv_scale
  std::vector<Tensor> found;
  for (const auto& [key, grads] : groups) {
    const Device dev = grads.front().device();
    auto it = per_device.find(key.first);
    if (it == per_device.end()) {
      Tensor f = zeros({}, TensorOptions(DType::f32).with_device(dev));
      it = per_device.emplace(key.first, std::make_pair(f, inv.to(dev))).first;
      found.push_back(f);
    }
    const auto& [found_inf, inv_scale] = it->second;
    if (dev.is_cuda())
      backend::cuda::amp_unscale(grads, found_inf, inv_scale);
    else
      cpu_unscale(grads, found_inf, inv_scale.item<float>());
  }
  st.found_inf = optimizer.combine_found_inf(std::move(found));
  st.stage = Stage::Unscaled;
}

bool GradScaler::step(optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  check_started("step");
  DLTRAIN_CHECK(per_optimizer_[&optimizer].stage != Stage::Stepped,
                "GradScaler::step: step() has already been called since the last update(); call "
                "update() once per iteration, after step()");
  if (per_optimizer_[&optimizer].stage == Stage::Ready) unscale_(optimizer);
  OptimizerState& st = per_optimizer_[&optimizer];
  DLTRAIN_CHECK(!st.found_inf.empty(),
                "GradScaler::step: no inf checks were recorded for this optimizer (none of its "
                "parameters has a gradient); call backward() on scaler.scale(loss) first");
  double found = 0.0;
  for (const Tensor& f : st.found_inf) found += f.item<double>();  // syncs, as PyTorch's .item()
  const bool stepped = found == 0.0;
  if (stepped) optimizer.step();
  st.stage = Stage::Stepped;
  return stepped;
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!options_.enabled) return;
  check_started("update");
  NoGradGuard ng;
  if (new_scale) {
    DLTRAIN_CHECK(*new_scale > 0.0 && std::isfinite(*new_scale),
                  "GradScaler::update: new_scale must be finite and > 0 but is ", *new_scale);
    scale_.fill_(*new_scale);
  } else {
    Tensor found;
    for (const auto& [opt, st] : per_optimizer_) {
      for (const Tensor& f : st.found_inf) {
        const Tensor here = f.to(scale_.device(), true);
        found = found.defined() ? add(found, here) : here;
      }
    }
    DLTRAIN_CHECK(found.defined(),
                  "GradScaler::update: no inf checks were recorded prior to update(); call "
                  "unscale_() or step() in this iteration, or pass new_scale");
    if (scale_.device().is_cuda()) {
      backend::cuda::amp_update_scale(scale_, growth_tracker_, found, options_.growth_factor,
                                      options_.backoff_factor, options_.growth_interval);
    } else {
      cpu_update_scale(scale_, growth_tracker_, found, options_.growth_factor,
                       options_.backoff_factor, options_.growth_interval);
    }
  }
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  return scale_.defined() ? scale_.item<double>() : options_.init_scale;
}

int64_t GradScaler::get_growth_tracker() const {
  if (!options_.enabled) return 0;
  return growth_tracker_.defined() ? growth_tracker_.item<int64_t>() : init_growth_tracker_;
}

void GradScaler::set_growth_factor(double factor) {
  GradScalerOptions o = options_;
  o.growth_factor = factor;
  check_options(o);
  options_ = o;
}

void GradScaler::set_backoff_factor(double factor) {
  GradScalerOptions o = options_;
  o.backoff_factor = factor;
  check_options(o);
  options_ = o;
}

void GradScaler::set_growth_interval(int64_t interval) {
  GradScalerOptions o = options_;
  o.growth_interval = interval;
  check_options(o);
  options_ = o;
}

StateDict GradScaler::state_dict() const {
  StateDict out;
  if (!options_.enabled) return out;
  out.insert_scalar("scale", get_scale());
  out.insert_scalar("growth_factor", options_.growth_factor);
  out.insert_scalar("backoff_factor", options_.backoff_factor);
  out.insert_scalar("growth_interval", static_cast<double>(options_.growth_interval), true);
  out.insert_scalar("_growth_tracker", static_cast<double>(get_growth_tracker()), true);
  return out;
}

void GradScaler::load_state_dict(const StateDict& state) {
  if (!options_.enabled) return;
  const char* ctx = "GradScaler::load_state_dict";
  DLTRAIN_CHECK(!state.empty(), ctx,
                ": the state dict is empty, possibly because it was saved from a disabled "
                "GradScaler; construct this scaler with {.enabled = false} too, or do not load it");
  for (const auto& item : state) {
    const std::string& k = item.first;
    DLTRAIN_CHECK(k == "scale" || k == "growth_factor" || k == "backoff_factor" ||
                      k == "growth_interval" || k == "_growth_tracker",
                  ctx, ": unexpected entry '", k, "'; was the state saved by another object?");
  }
  GradScalerOptions o = options_;
  o.init_scale = state.scalar("scale", ctx);
  o.growth_factor = state.scalar("growth_factor", ctx);
  o.backoff_factor = state.scalar("backoff_factor", ctx);
  const double interval = state.scalar("growth_interval", ctx);
  const double tracker = state.scalar("_growth_tracker", ctx);
  DLTRAIN_CHECK(interval == std::floor(interval) && tracker == std::floor(tracker) &&
                    tracker >= 0 && tracker <= INT32_MAX,
                ctx, ": growth_interval (", interval, ") and _growth_tracker (", tracker,
                ") must be non-negative integers");
  o.growth_interval = static_cast<int64_t>(interval);
  check_options(o);
  options_ = o;
  init_growth_tracker_ = static_cast<int64_t>(tracker);
  if (scale_.defined()) {
    scale_.fill_(o.init_scale);
    growth_tracker_.fill_(tracker);
  }
}

}  // namespace dltrain::amp
