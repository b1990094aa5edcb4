// Batch and layer normalisation with dedicated CPU kernels for forward and backward.
//
// batch_norm views its input as either "planar" [N, C, S] (contiguous NC...) or
// "interleaved" [M, C] (channels-last 4-d input, or any 2-d input), reduces
// per-channel statistics in double (two passes: mean, then centred squares),
// parallel over channels for planar and over fixed row blocks for interleaved
// (the block partition does not depend on the thread count, so results are
// deterministic). The output and the input gradient keep the input's memory
// format. layer_norm reduces each trailing row in double. Both save the input
// (detached), the per-channel / per-row mean and inverse std, and compute the
// backward pass in one kernel; 16-bit floats compute in float (acc_t).
//
// With oneDNN (src/backend/cpu/dnnl.hpp), training-mode batch_norm of f32/bf16 CPU input runs
// through it instead, forward and backward, in the input's own layout, with f32 scale, shift
// and statistics (mean and biased variance saved for the backward) whatever the input's dtype;
// evaluation mode and f64/f16 keep the kernels below.
//
// CUDA tensors: batch_norm runs on cuDNN (inputs that are not 4-d are viewed as 4-d, see
// as_4d), with f32 (f64) copies of the per-channel tensors where needed; running
// statistics held in another dtype or layout are updated through a copy written back
// afterwards. Its eval-mode backward and layer_norm are kernels of the dnn family.
#include "dltrain/ops/norm.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <vector>

#include "dltrain/autograd/node.hpp"
#include "dltrain/backend/cuda.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/reduction.hpp"
#include "src/backend/cpu/cast.hpp"
#include "src/backend/cpu/dnnl.hpp"
#include "src/backend/cuda/dnn.hpp"
#include "src/core/trace.hpp"
#include "src/ops/common.hpp"

namespace dltrain {

using backend::cpu::cast;

namespace {

// Element (i) of channel c lives at: planar  -> (n * C + c) * S + s
//                                     interleaved -> m * C + c
struct BnLayout {
  bool interleaved = false;
  int64_t N = 0, C = 0, S = 1;  // for interleaved, N holds M = rows and S = 1
  int64_t per_channel() const { return N * S; }
};

constexpr int64_t kRowBlocks = 64;

// Per-channel sums of K quantities f(i, c) -> std::array<double, K>, into out[k * C + c].
template <size_t K, class F>
std::vector<double> channel_reduce(const BnLayout& L, F f) {
  const int64_t C = L.C;
  std::vector<double> out(K * static_cast<size_t>(C), 0.0);
  if (!L.interleaved) {
    parallel_for(0, C, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        // kLanes independent accumulators break the add dependency chain (and vectorise).
        constexpr int64_t kLanes = 8;
        double acc[K][kLanes] = {};
        for (int64_t n = 0; n < L.N; ++n) {
          const int64_t base = (n * C + c) * L.S;
          int64_t s = 0;
          for (; s + kLanes <= L.S; s += kLanes)
            for (int64_t u = 0; u < kLanes; ++u) {
              const std::array<double, K> v = f(base + s + u, c);
              for (size_t k = 0; k < K; ++k) acc[k][u] += v[k];
            }
          for (; s < L.S; ++s) {
            const std::array<double, K> v = f(base + s, c);
            for (size_t k = 0; k < K; ++k) acc[k][0] += v[k];
          }
        }
        for (size_t k = 0; k < K; ++k) {
          double t = 0;
          for (int64_t u = 0; u < kLanes; ++u) t += acc[k][u];
          out[k * C + c] = t;
        }
      }
    });
    return out;
  }
  const int64_t M = L.N;
  const int64_t nb = std::max<int64_t>(1, std::min<int64_t>(kRowBlocks, M));
  const int64_t rows_per = (M + nb - 1) / nb;
  std::vector<double> part(static_cast<size_t>(nb) * K * C, 0.0);
  parallel_for(0, nb, 1, [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) {
      double* acc = part.data() + blk * static_cast<int64_t>(K) * C;
      for (int64_t m = blk * rows_per; m < std::min(M, (blk + 1) * rows_per); ++m) {
        for (int64_t c = 0; c < C; ++c) {
          const std::array<double, K> v = f(m * C + c, c);
          for (size_t k = 0; k < K; ++k) acc[k * C + c] += v[k];
        }
      }
    }
  });
  for (int64_t blk = 0; blk < nb; ++blk)
    for (size_t j = 0; j < K * C; ++j) out[j] += part[blk * K * C + j];
  return out;
}

// Calls f(i, c) for every element, in parallel.
template <class F>
void channel_apply(const BnLayout& L, F f) {
  const int64_t C = L.C;
  if (!L.interleaved) {
    parallel_for(0, L.N * C, std::max<int64_t>(1, 8192 / std::max<int64_t>(L.S, 1)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t p = b; p < e; ++p) {
                     const int64_t c = p % C;
                     for (int64_t s = 0; s < L.S; ++s) f(p * L.S + s, c);
                   }
                 });
    return;
  }
  parallel_for(0, L.N, std::max<int64_t>(1, 8192 / std::max<int64_t>(C, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t m = b; m < e; ++m)
                   for (int64_t c = 0; c < C; ++c) f(m * C + c, c);
               });
}

// Values of a small tensor (parameters, statistics) as doubles.
std::vector<double> values(const Tensor& t) { return t.detach().to_vector<double>(); }

Tensor vector_tensor(const std::vector<double>& v, DType dt) {
  return from_vector<double>(v, {static_cast<int64_t>(v.size())}).to(dt);
}

void check_param(const char* op, const Tensor& p, const char* name, const Shape& shape) {
  if (!p.defined()) return;
  DLTRAIN_CHECK(is_floating(p.dtype()), op, ": '", name,
                "' must be a floating-point tensor but has dtype ", p.dtype(),
                "; convert it with .to(DType::f32)");
  DLTRAIN_CHECK(p.shape() == shape, op, ": '", name, "' has shape ", shape_str(p.shape()), " but ",
                shape_str(shape),
                " was expected for the input; pass a tensor of that shape or leave it undefined");
}

// The dtype of cuDNN's per-channel tensors (and of the layer-norm statistics) for x's dtype.
DType param_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }

// `t` as a contiguous tensor of dtype pt: t itself (sharing storage) when it already is one.
Tensor as_param(const Tensor& t, DType pt) { return t.detach().to(pt).contiguous(); }

// How batch_norm presents an input to cuDNN as 4-d: 4-d as it is; [N, C] as the channels-last
// [1, C, N, 1] (the same bytes; no limit on N that way); other shapes as [N, C, S, 1].
Tensor as_4d(const Tensor& t) {
  if (t.dim() == 4) return t;
  if (t.dim() == 2) return t.t().unsqueeze(0).unsqueeze(3);
  int64_t S = 1;
  for (int64_t d = 2; d < t.dim(); ++d) S *= t.size(d);
  return t.view({t.size(0), t.size(1), S, 1});
}

// --- create_graph backward: the norms written with differentiable ops ---------------------

// Per-channel [C] values shaped to broadcast against x [N, C, ...].
Tensor per_channel(const Tensor& v, const Tensor& x) {
  Shape cs(static_cast<size_t>(x.dim()), 1);
  cs[1] = x.size(1);
  return v.reshape(cs);
}

// batch_norm: batch statistics when training, else the given per-channel mean and 1/std.
Tensor batch_norm_reference(const Tensor& x, const Tensor& w, const Tensor& b, bool training,
                            const Tensor& eval_mean, const Tensor& eval_invstd, double eps) {
  Tensor xn;
  if (training) {
    Shape dims;
    for (int64_t d = 0; d < x.dim(); ++d)
      if (d != 1) dims.push_back(d);
    const Tensor c = sub(x, mean(x, dims, true));
    xn = mul(c, rsqrt(add(mean(mul(c, c), dims, true), eps)));
  } else {
    const TensorOptions o = TensorOptions(x.dtype()).with_device(x.device());
    xn = mul(sub(x, per_channel(eval_mean.to(o.dtype).to(o.device), x)),
             per_channel(eval_invstd.to(o.dtype).to(o.device), x));
  }
  if (w.defined()) xn = mul(xn, per_channel(w, x));
  if (b.defined()) xn = add(xn, per_channel(b, x));
  return xn;
}

std::vector<Tensor> batch_norm_higher(const autograd::SavedInput& xs, const Tensor& w,
                                      const Tensor& b, bool training, const Tensor& eval_mean,
                                      const Tensor& eval_invstd, double eps, const Tensor& g) {
  return autograd::grad_by_recompute(
      [=](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{
            batch_norm_reference(in[0], in[1], in[2], training, eval_mean, eval_invstd, eps)};
      },
      {xs.get(), w, b}, {g});
}

std::vector<Tensor> layer_norm_higher(const autograd::SavedInput& xs, const Tensor& w,
                                      const Tensor& b, int64_t k, double eps, const Tensor& g) {
  return autograd::grad_by_recompute(
      [=](const std::vector<Tensor>& in) {
        const Tensor& x = in[0];
        Shape dims;
        for (int64_t d = x.dim() - k; d < x.dim(); ++d) dims.push_back(d);
        const Tensor c = sub(x, mean(x, dims, true));
        Tensor y = mul(c, rsqrt(add(mean(mul(c, c), dims, true), eps)));
        if (in[1].defined()) y = mul(y, in[1]);
        if (in[2].defined()) y = add(y, in[2]);
        return std::vector<Tensor>{y};
      },
      {xs.get(), w, b}, {g});
}

Tensor vector_of(const std::shared_ptr<std::vector<double>>& v) {
  return from_vector<double>(*v, {static_cast<int64_t>(v->size())});
}

// batch_norm of a CUDA tensor (arguments checked by batch_norm; fmt is x's memory format).
// cuDNN computes f64 in NCHW, and bf16 through f32 copies of x, y and the gradients unless
// cuda::cudnn_bf16_batch_norm() (DLTRAIN_CUDNN_BF16_BN=1) hands it bf16 data directly with f32
// statistics, scale and bias, as f16 always is (docs/design.md, "bf16 batch norm": the copies
// stay the default until a GPU run of the "[bf16_bn]" test has checked cuDNN's bf16 path).
// The output and input gradient come back in x's dtype and format.
Tensor batch_norm_cuda(const Tensor& x, MemoryFormat fmt, const Tensor& weight, const Tensor& bias,
                       const Tensor& running_mean, const Tensor& running_var, bool training,
                       double momentum, double eps) {
  const int64_t C = x.size(1);
  const DType dt = x.dtype();
  const DType cdt = dt == DType::bf16 && !cuda::cudnn_bf16_batch_norm() ? DType::f32 : dt;
  const MemoryFormat cfmt = dt == DType::f64 ? MemoryFormat::Contiguous : fmt;
  const DType pt = param_dtype(cdt);
  const TensorOptions popts = TensorOptions(pt).with_device(x.device());
  const Tensor xc = x.detach().to(cdt).contiguous(cfmt);
  const Tensor x4 = as_4d(xc);
  Tensor y = empty(x.shape(), cfmt, xc.options());
  const Tensor w = weight.defined() ? as_param(weight, pt) : full({C}, 1.0, popts);
  const Tensor b = bias.defined() ? as_param(bias, pt) : full({C}, 0.0, popts);
  const bool stats = running_mean.defined() && running_var.defined();
  Tensor rm = stats ? as_param(running_mean, pt) : Tensor();
  Tensor rv = stats ? as_param(running_var, pt) : Tensor();
  Tensor save_mean, save_invstd;
  if (training) {
    save_mean = empty({C}, popts);
    save_invstd = empty({C}, popts);
    backend::cuda::batch_norm_forward_training(as_4d(y), x4, w, b, rm, rv, momentum, eps, save_mean,
                                               save_invstd);
    NoGradGuard ng;
    Tensor rmt = running_mean, rvt = running_var;  // copies of other dtypes/layouts go back
    if (stats && rm.data_ptr() != running_mean.data_ptr()) rmt.copy_(rm);
    if (stats && rv.data_ptr() != running_var.data_ptr()) rvt.copy_(rv);
  } else {
    backend::cuda::batch_norm_forward_inference(as_4d(y), x4, w, b, rm, rv, eps);
  }
  if (y.dtype() != dt) y = y.to(dt);
  if (cfmt != fmt) y = y.contiguous(fmt);

  const bool rx = x.requires_grad(), rw = weight.defined() && weight.requires_grad(),
             rb = bias.defined() && bias.requires_grad();
  if (!autograd::any_requires_grad({&x, &weight, &bias})) return y;
  if (!training) {  // the backward must see the statistics this forward used
    if (rm.data_ptr() == running_mean.data_ptr()) rm = rm.clone();
    if (rv.data_ptr() == running_var.data_ptr()) rv = rv.clone();
  }
  autograd::record(
      "batch_norm", {x, weight, bias}, {y},
      [xs = autograd::SavedInput(x, xc), wi = weight, bi = bias, xc, w, save_mean, save_invstd, rm,
       rv, training, eps, fmt, cfmt, dt, wdt = weight.defined() ? weight.dtype() : dt,
       bdt = bias.defined() ? bias.dtype() : dt, rx, rw, rb](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())
          return batch_norm_higher(xs, wi, bi, training, rm,
                                   rv.defined() ? rsqrt(add(rv, eps)) : Tensor(), eps, g[0]);

        const Tensor gy = g[0].to(xc.dtype()).contiguous(cfmt);
        const TensorOptions popts = w.options();
        Tensor gx, gw, gb;
        if (training) {  // cuDNN computes all three
          gx = empty(xc.shape(), cfmt, xc.options());
          gw = empty(w.shape(), popts);
          gb = empty(w.shape(), popts);
          backend::cuda::batch_norm_backward(as_4d(gx), gw, gb, as_4d(gy), as_4d(xc), w, save_mean,
                                             save_invstd, eps);
        } else {
          if (rx) gx = empty(xc.shape(), cfmt, xc.options());
          if (rw) gw = empty(w.shape(), popts);
          if (rb) gb = empty(w.shape(), popts);
          backend::cuda::batch_norm_backward_eval(rx ? as_4d(gx) : Tensor(), gw, gb, as_4d(gy),
                                                  as_4d(xc), w, rm, rv, eps);
        }
        if (rx) gx = gx.to(dt).contiguous(fmt);
        return std::vector<Tensor>{rx ? gx : Tensor(), rw ? gw.to(wdt) : Tensor(),
                                   rb ? gb.to(bdt) : Tensor()};
      },
      autograd::HigherOrder::Supported);
  return y;
}

// Training-mode batch_norm of a CPU tensor through oneDNN (xc: x dense in format fmt, count:
// values per channel); an undefined tensor when oneDNN does not take it.
Tensor batch_norm_dnnl(const Tensor& x, const Tensor& xc, MemoryFormat fmt, const Tensor& weight,
                       const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                       double momentum, double eps, int64_t count) {
  const int64_t C = x.size(1);
  const TensorOptions f32(DType::f32);
  const Tensor scale = weight.defined() ? as_param(weight, DType::f32) : full({C}, 1.0, f32);
  const Tensor shift = bias.defined() ? as_param(bias, DType::f32) : full({C}, 0.0, f32);
  Tensor y, mean, var;
  if (!backend::cpu::dnnl_batch_norm_forward_training(xc, scale, shift, eps, y, mean, var))
    return Tensor();
  if (running_mean.defined() && running_var.defined()) {
    const std::vector<double> m = values(mean), v = values(var);
    std::vector<double> rm = values(running_mean), rv = values(running_var);
    const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
    for (int64_t c = 0; c < C; ++c) {
      rm[c] = (1.0 - momentum) * rm[c] + momentum * m[c];
      rv[c] = (1.0 - momentum) * rv[c] + momentum * v[c] * unbias;
    }
    NoGradGuard ng;
    Tensor rmt = running_mean, rvt = running_var;
    rmt.copy_(vector_tensor(rm, DType::f64));
    rvt.copy_(vector_tensor(rv, DType::f64));
  }
  autograd::record(
      "batch_norm", {x, weight, bias}, {y},
      [xs = autograd::SavedInput(x, xc), wi = weight, bi = bias, xc, fmt, scale, mean, var, eps,
       rx = x.requires_grad(), wdt = weight.defined() ? weight.dtype() : DType::f32,
       bdt = bias.defined() ? bias.dtype() : DType::f32](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())
          return batch_norm_higher(xs, wi, bi, true, Tensor(), Tensor(), eps, g[0]);

        Tensor gy = g[0].to(xc.dtype()).contiguous(fmt);
        if (gy.strides() != xc.strides()) {  // size-1 dims may carry other strides
          Tensor t = empty_strided(xc.shape(), xc.strides(), xc.options());
          t.copy_(gy);
          gy = t;
        }
        Tensor gx, gscale, gshift;
        DLTRAIN_CHECK(backend::cpu::dnnl_batch_norm_backward(xc, gy, scale, mean, var, eps, gx,
                                                             gscale, gshift),
                      "batch_norm backward: oneDNN took the forward of input ",
                      shape_str(xc.shape()),
                      " but has no backward for it; DLTRAIN_DNNL=0 uses the built-in path");
        return std::vector<Tensor>{rx ? gx : Tensor(), gscale.to(wdt), gshift.to(bdt)};
      },
      autograd::HigherOrder::Supported);
  return y;
}

// layer_norm of a CUDA tensor (arguments checked by layer_norm).
Tensor layer_norm_cuda(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                       const Tensor& bias, double eps, int64_t D, int64_t R) {
  const DType pt = param_dtype(x.dtype());
  const TensorOptions popts = TensorOptions(pt).with_device(x.device());
  const Tensor xc = x.detach().contiguous();
  Tensor y = empty(x.shape(), x.options());
  const Tensor w = weight.defined() ? as_param(weight, pt) : Tensor();
  const Tensor b = bias.defined() ? as_param(bias, pt) : Tensor();
  const Tensor mean = empty({R}, popts), rstd = empty({R}, popts);
  if (R > 0 && D > 0) backend::cuda::layer_norm_forward(y, mean, rstd, xc, w, b, D, eps);
  const bool rx = x.requires_grad(), rw = weight.defined() && weight.requires_grad(),
             rb = bias.defined() && bias.requires_grad();
  autograd::record(
      "layer_norm", {x, weight, bias}, {y},
      [xs = autograd::SavedInput(x, xc), wi = weight, bi = bias, eps, xc, w, mean, rstd, D, R,
       ns = normalized_shape, dt = x.dtype(), wdt = weight.defined() ? weight.dtype() : x.dtype(),
       bdt = bias.defined() ? bias.dtype() : x.dtype(), rx, rw, rb](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())
          return layer_norm_higher(xs, wi, bi, static_cast<int64_t>(ns.size()), eps, g[0]);

        const Tensor gy = (g[0].dtype() == dt ? g[0] : g[0].to(dt)).contiguous();
        const TensorOptions popts = mean.options();
        Tensor gx = rx ? empty(xc.shape(), xc.options()) : Tensor();
        Tensor gw = rw ? zeros({D}, popts) : Tensor();
        Tensor gb = rb ? zeros({D}, popts) : Tensor();
        if (R > 0 && D > 0)
          backend::cuda::layer_norm_backward(gx, gw, gb, gy, xc, w, mean, rstd, D);
        return std::vector<Tensor>{gx, rw ? gw.to(wdt).reshape(ns) : Tensor(),
                                   rb ? gb.to(bdt).reshape(ns) : Tensor()};
      },
      autograd::HigherOrder::Supported);
  return y;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum, double eps) {
  DLTRAIN_OP_SCOPE("batch_norm", x, weight, bias, running_mean, running_var);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x, weight, bias, running_mean, running_var},
                                  {{"training", training}, {"eps", eps}}, [&] {
                                    return batch_norm(x, weight, bias, running_mean, running_var,
                                                      training, momentum, eps);
                                  });
    });
  const char* op = "batch_norm";
  detail::check_defined(op, x, "input");
  detail::check_same_device(op, {&x, &weight, &bias, &running_mean, &running_var});
  DLTRAIN_CHECK(x.dim() >= 2, op,
                ": expected an input [N, C, ...] with at least 2 dimensions but got shape ",
                shape_str(x.shape()));
  const int64_t C = x.size(1);
  check_param(op, weight, "weight", {C});
  check_param(op, bias, "bias", {C});
  check_param(op, running_mean, "running_mean", {C});
  check_param(op, running_var, "running_var", {C});
  DLTRAIN_CHECK(
      training || (running_mean.defined() && running_var.defined()), op,
      ": evaluation mode (training=false) needs running_mean and running_var; pass them or use "
      "training=true to normalise with batch statistics");
  DLTRAIN_CHECK(eps >= 0, op, ": eps must be non-negative but is ", eps);

  BnLayout L;
  L.C = C;
  const bool channels_last =
      x.dim() == 4 && x.suggest_memory_format() == MemoryFormat::ChannelsLast;
  const MemoryFormat fmt = channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  int64_t count = x.size(0);  // values per channel
  for (int64_t d = 2; d < x.dim(); ++d) count *= x.size(d);
  DLTRAIN_CHECK(!training || count > 1, op,
                ": expected more than 1 value per channel when training but got input shape ",
                shape_str(x.shape()), "; use a batch of at least 2 or training=false");
  if (x.device().is_cuda())
    return batch_norm_cuda(x, fmt, weight, bias, running_mean, running_var, training, momentum,
                           eps);
  Tensor xc = x.detach().contiguous(fmt);
  if (training && backend::cpu::dnnl_available())
    if (Tensor y = batch_norm_dnnl(x, xc, fmt, weight, bias, running_mean, running_var, momentum,
                                   eps, count);
        y.defined())
      return y;
  if (channels_last) {
    L.interleaved = true;
    L.N = x.size(0) * x.size(2) * x.size(3);
  } else {
    L.N = x.size(0);
    for (int64_t d = 2; d < x.dim(); ++d) L.S *= x.size(d);
    if (L.S == 1) L.interleaved = true;  // [N, C]: rows of C
  }
  auto mean = std::make_shared<std::vector<double>>(static_cast<size_t>(C));
  auto invstd = std::make_shared<std::vector<double>>(static_cast<size_t>(C));
  Tensor y = empty(x.shape(), fmt, x.options());
  const std::vector<double> w = weight.defined() ? values(weight) : std::vector<double>(C, 1.0);
  const std::vector<double> bvals = bias.defined() ? values(bias) : std::vector<double>(C, 0.0);

  dispatch_floating(x.dtype(), op, [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = xc.data<T>();
    T* yp = y.data<T>();
    std::vector<double> var(static_cast<size_t>(C));
    if (training) {
      const std::vector<double> s = channel_reduce<1>(
          L, [&](int64_t i, int64_t) { return std::array<double, 1>{double(cast<A>(xp[i]))}; });
      for (int64_t c = 0; c < C; ++c) (*mean)[c] = s[c] / static_cast<double>(count);
      const std::vector<double> q = channel_reduce<1>(L, [&](int64_t i, int64_t c) {
        const double d = double(cast<A>(xp[i])) - (*mean)[c];
        return std::array<double, 1>{d * d};
      });
      for (int64_t c = 0; c < C; ++c) var[c] = q[c] / static_cast<double>(count);
    } else {
      *mean = values(running_mean);
      var = values(running_var);
    }
    std::vector<A> scale(static_cast<size_t>(C)), shift(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      (*invstd)[c] = 1.0 / std::sqrt(var[c] + eps);
      scale[c] = static_cast<A>(w[c] * (*invstd)[c]);
      shift[c] = static_cast<A>(bvals[c] - (*mean)[c] * w[c] * (*invstd)[c]);
    }
    channel_apply(
        L, [&](int64_t i, int64_t c) { yp[i] = cast<T>(cast<A>(xp[i]) * scale[c] + shift[c]); });

    if (training && running_mean.defined() && running_var.defined()) {
      std::vector<double> rm = values(running_mean), rv = values(running_var);
      const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
      for (int64_t c = 0; c < C; ++c) {
        rm[c] = (1.0 - momentum) * rm[c] + momentum * (*mean)[c];
        rv[c] = (1.0 - momentum) * rv[c] + momentum * var[c] * unbias;
      }
      NoGradGuard ng;
      Tensor rmt = running_mean, rvt = running_var;
      rmt.copy_(vector_tensor(rm, DType::f64));
      rvt.copy_(vector_tensor(rv, DType::f64));
    }
  });

  autograd::record(
      op, {x, weight, bias}, {y},
      [xs = autograd::SavedInput(x, xc), wi = weight, bi = bias, eps, xc, L, fmt, mean, invstd,
       training, wt = weight.defined() ? weight.detach() : Tensor(),
       bdt = bias.defined() ? bias.dtype() : x.dtype(), rx = x.requires_grad(),
       rw = weight.defined() && weight.requires_grad(),
       rb = bias.defined() && bias.requires_grad()](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())
          return batch_norm_higher(xs, wi, bi, training, training ? Tensor() : vector_of(mean),
                                   training ? Tensor() : vector_of(invstd), eps, g[0]);

        const int64_t C = L.C;
        const double M = static_cast<double>(L.per_channel());
        Tensor gc = g[0].dtype() == xc.dtype() ? g[0] : g[0].to(xc.dtype());
        gc = gc.contiguous(fmt);
        const std::vector<double> w = wt.defined() ? values(wt) : std::vector<double>(C, 1.0);
        Tensor dx, dw, db;
        dispatch_floating(xc.dtype(), "batch_norm_backward", [&]<class T>() {
          using A = acc_t<T>;
          const T* xp = xc.data<T>();
          const T* gp = gc.data<T>();
          const std::vector<double> r = channel_reduce<2>(L, [&](int64_t i, int64_t c) {
            const double gv = double(cast<A>(gp[i]));
            return std::array<double, 2>{gv,
                                         gv * (double(cast<A>(xp[i])) - (*mean)[c]) * (*invstd)[c]};
          });
          if (rw) dw = vector_tensor(std::vector<double>(r.begin() + C, r.end()), wt.dtype());
          if (rb) db = vector_tensor(std::vector<double>(r.begin(), r.begin() + C), bdt);
          if (!rx) return;
          // dx = a * g + b * x + k per channel.
          std::vector<A> a(static_cast<size_t>(C)), bx(static_cast<size_t>(C)),
              k(static_cast<size_t>(C));
          for (int64_t c = 0; c < C; ++c) {
            const double is = (*invstd)[c], sc = w[c] * is;
            if (training) {
              const double sg = r[c] / M, sgx = r[C + c] / M;
              a[c] = static_cast<A>(sc);
              bx[c] = static_cast<A>(-sc * is * sgx);
              k[c] = static_cast<A>(sc * (is * sgx * (*mean)[c] - sg));
            } else {
              a[c] = static_cast<A>(sc);
              bx[c] = A(0);
              k[c] = A(0);
            }
          }
          dx = empty(xc.shape(), fmt, xc.options());
          T* dp = dx.data<T>();
          channel_apply(L, [&](int64_t i, int64_t c) {
            dp[i] = cast<T>(a[c] * cast<A>(gp[i]) + bx[c] * cast<A>(xp[i]) + k[c]);
          });
        });
        return std::vector<Tensor>{dx, dw, db};
      },
      autograd::HigherOrder::Supported);
  return y;
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  DLTRAIN_OP_SCOPE("layer_norm", x, weight, bias);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record(
          {x, weight, bias}, {{"normalized_shape", normalized_shape}, {"eps", eps}},
          [&] { return layer_norm(x, normalized_shape, weight, bias, eps); });
    });
  if (auto ac = amp::detail::autocast_args(amp::Op::layer_norm, {&x, &weight, &bias}))
    return layer_norm((*ac)[0], normalized_shape, (*ac)[1], (*ac)[2], eps);
  const char* op = "layer_norm";
  detail::check_defined(op, x, "input");
  detail::check_same_device(op, {&x, &weight, &bias});
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  DLTRAIN_CHECK(k >= 1, op, ": normalized_shape must name at least one trailing dimension; got []");
  bool match = x.dim() >= k;
  for (int64_t i = 0; match && i < k; ++i) match = x.size(x.dim() - k + i) == normalized_shape[i];
  DLTRAIN_CHECK(match, op, ": normalized_shape ", shape_str(normalized_shape),
                " does not match the trailing dimensions of the input of shape ",
                shape_str(x.shape()), "; pass the input's last ", k, " sizes");
  check_param(op, weight, "weight", normalized_shape);
  check_param(op, bias, "bias", normalized_shape);
  DLTRAIN_CHECK(eps >= 0, op, ": eps must be non-negative but is ", eps);

  const int64_t D = shape_numel(normalized_shape);
  const int64_t R = D == 0 ? 0 : x.numel() / D;
  if (x.device().is_cuda()) return layer_norm_cuda(x, normalized_shape, weight, bias, eps, D, R);
  Tensor xc = x.detach().contiguous();
  Tensor y = empty(x.shape(), x.options());
  auto mean = std::make_shared<std::vector<double>>(static_cast<size_t>(R));
  auto rstd = std::make_shared<std::vector<double>>(static_cast<size_t>(R));
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(D, 1));

  dispatch_floating(x.dtype(), op, [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = xc.data<T>();
    T* yp = y.data<T>();
    std::vector<A> w(static_cast<size_t>(D), A(1)), b(static_cast<size_t>(D), A(0));
    if (weight.defined()) {
      const std::vector<double> v = values(weight);
      for (int64_t j = 0; j < D; ++j) w[j] = static_cast<A>(v[j]);
    }
    if (bias.defined()) {
      const std::vector<double> v = values(bias);
      for (int64_t j = 0; j < D; ++j) b[j] = static_cast<A>(v[j]);
    }
    parallel_for(0, R, grain, [&](int64_t rb, int64_t re) {
      for (int64_t r = rb; r < re; ++r) {
        const T* row = xp + r * D;
        double s = 0;
        for (int64_t j = 0; j < D; ++j) s += double(cast<A>(row[j]));
        const double mu = s / static_cast<double>(D);
        double q = 0;
        for (int64_t j = 0; j < D; ++j) {
          const double d = double(cast<A>(row[j])) - mu;
          q += d * d;
        }
        const double is = 1.0 / std::sqrt(q / static_cast<double>(D) + eps);
        (*mean)[r] = mu;
        (*rstd)[r] = is;
        const A m = static_cast<A>(mu), ia = static_cast<A>(is);
        T* out = yp + r * D;
        for (int64_t j = 0; j < D; ++j) out[j] = cast<T>((cast<A>(row[j]) - m) * ia * w[j] + b[j]);
      }
    });
  });

  autograd::record(
      op, {x, weight, bias}, {y},
      [xs = autograd::SavedInput(x, xc), wi = weight, bi = bias, eps, xc, D, R, grain, mean, rstd,
       ns = normalized_shape, wt = weight.defined() ? weight.detach() : Tensor(),
       bdt = bias.defined() ? bias.dtype() : x.dtype(), rx = x.requires_grad(),
       rw = weight.defined() && weight.requires_grad(),
       rb = bias.defined() && bias.requires_grad()](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())
          return layer_norm_higher(xs, wi, bi, static_cast<int64_t>(ns.size()), eps, g[0]);

        Tensor gc = (g[0].dtype() == xc.dtype() ? g[0] : g[0].to(xc.dtype())).contiguous();
        Tensor dx, dw, db;
        dispatch_floating(xc.dtype(), "layer_norm_backward", [&]<class T>() {
          using A = acc_t<T>;
          const T* xp = xc.data<T>();
          const T* gp = gc.data<T>();
          std::vector<double> w(static_cast<size_t>(D), 1.0);
          if (wt.defined()) w = values(wt);
          if (rx) {
            dx = empty(xc.shape(), xc.options());
            T* dp = dx.data<T>();
            parallel_for(0, R, grain, [&](int64_t b, int64_t e) {
              for (int64_t r = b; r < e; ++r) {
                const T* xr = xp + r * D;
                const T* gr = gp + r * D;
                const double mu = (*mean)[r], is = (*rstd)[r];
                double s1 = 0, s2 = 0;  // sum(g*w), sum(g*w*xhat)
                for (int64_t j = 0; j < D; ++j) {
                  const double gw = double(cast<A>(gr[j])) * w[j];
                  s1 += gw;
                  s2 += gw * (double(cast<A>(xr[j])) - mu) * is;
                }
                const double m1 = s1 / static_cast<double>(D), m2 = s2 / static_cast<double>(D);
                T* dr = dp + r * D;
                for (int64_t j = 0; j < D; ++j) {
                  const double xhat = (double(cast<A>(xr[j])) - mu) * is;
                  dr[j] = cast<T>(
                      static_cast<A>(is * (double(cast<A>(gr[j])) * w[j] - m1 - xhat * m2)));
                }
              }
            });
          }
          if (rw || rb) {
            const int64_t nb = std::max<int64_t>(1, std::min<int64_t>(kRowBlocks, R));
            const int64_t per = (R + nb - 1) / nb;
            std::vector<double> pw(static_cast<size_t>(nb * D), 0.0),
                pb(static_cast<size_t>(nb * D), 0.0);
            parallel_for(0, nb, 1, [&](int64_t b, int64_t e) {
              for (int64_t blk = b; blk < e; ++blk) {
                double* aw = pw.data() + blk * D;
                double* ab = pb.data() + blk * D;
                for (int64_t r = blk * per; r < std::min(R, (blk + 1) * per); ++r) {
                  const double mu = (*mean)[r], is = (*rstd)[r];
                  for (int64_t j = 0; j < D; ++j) {
                    const double gv = double(cast<A>(gp[r * D + j]));
                    aw[j] += gv * (double(cast<A>(xp[r * D + j])) - mu) * is;
                    ab[j] += gv;
                  }
                }
              }
            });
            std::vector<double> sw(static_cast<size_t>(D), 0.0), sb(static_cast<size_t>(D), 0.0);
            for (int64_t blk = 0; blk < nb; ++blk)
              for (int64_t j = 0; j < D; ++j) {
                sw[j] += pw[blk * D + j];
                sb[j] += pb[blk * D + j];
              }
            if (rw) dw = vector_tensor(sw, wt.dtype()).reshape(ns);
            if (rb) db = vector_tensor(sb, bdt).reshape(ns);
          }
        });
        return std::vector<Tensor>{dx, dw, db};
      },
      autograd::HigherOrder::Supported);
  return y;
}

}  // namespace dltrain
