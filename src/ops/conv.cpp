// conv2d (cross-correlation with stride, padding, dilation, groups) and its gradients.
//
// The output's memory format is PyTorch's: channels-last when the input or the weight is
// (detail::conv_memory_format), so a model moved to channels-last runs channels-last from its
// first convolution even on 1-channel images (dense in both formats). Gradients come back in
// their operand's own format.
//
// The CPU kernel works on contiguous NCHW data in float or double (f16/bf16
// are upcast and the result rounded once; channels-last operands are converted
// and the output converted to the convolution's format). Per group the forward is a GEMM y_g = W_g
// * im2col(x_g): large feature maps are cut into output-row chunks whose column buffer fits in L2,
// small ones put several images side by side so the GEMM stays wide, and 1x1
// stride-1 unpadded convolutions multiply x directly. Work is split over
// images (each thread owns its buffers) when there are enough images for the
// pool, otherwise inside each GEMM. Backward computes grad_input as
// col2im(W_g^T * gy_g), grad_weight as sum gy_g * im2col(x_g)^T in per-thread
// accumulators reduced at the end, and grad_bias as a plain sum. The backward
// kernels are not themselves recorded (no double backward).
//
// CUDA tensors go to cuDNN (backend::cuda::conv2d_*): x, weight and the output are
// brought to the convolution's memory format (f64 always computes in NCHW, then converts), and the
// CUDA node calls cuDNN's backward-data and backward-filter directly; the bias gradient is
// a per-channel sum.
#include "dltrain/ops/conv.hpp"

#include <algorithm>
#include <memory>
#include <mutex>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/reduction.hpp"
#include "src/backend/cpu/dnnl.hpp"
#include "src/backend/cpu/gemm.hpp"
#include "src/backend/cuda/dnn.hpp"
#include "src/core/trace.hpp"
#include "src/ops/common.hpp"
#include "src/ops/conv_impl.hpp"

namespace dltrain {

using backend::cpu::ConvGeom;
using backend::cpu::Mat;

namespace {

struct ConvShape {
  int64_t N, Cin, H, W, Cout, kh, kw, Ho, Wo, groups;
  Int2 stride, pad, dil;
  int64_t cin_g() const { return Cin / groups; }
  int64_t cout_g() const { return Cout / groups; }
  int64_t K() const { return cin_g() * kh * kw; }
  int64_t L() const { return Ho * Wo; }
  bool pointwise() const { return kh == 1 && kw == 1 && stride == Int2(1) && pad == Int2(0); }
  ConvGeom geom() const {
    return {cin_g(), H, W, kh, kw, stride.h, stride.w, pad.h, pad.w, dil.h, dil.w, Ho, Wo};
  }
};

detail::ConvGeometry geometry(const ConvShape& s) {
  return {s.N, s.Cin, s.H, s.W, s.Cout, s.kh, s.kw, s.Ho, s.Wo, s.groups, s.stride, s.pad, s.dil};
}

bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }

template <class T>
std::unique_ptr<T[]> buffer(int64_t n) {
  return std::unique_ptr<T[]>(new T[static_cast<size_t>(std::max<int64_t>(n, 1))]);
}

// True when images should be spread over threads (each runs serial GEMMs).
bool split_images(int64_t N) {
  const int64_t t = get_num_threads();
  return t > 1 && !in_parallel_region() && N >= t && (N % t == 0 || N >= 4 * t);
}

// Calls fn(begin, end) over images, in parallel when split_images says so.
template <class F>
void over_images(int64_t N, F&& fn) {
  if (split_images(N)) {
    parallel_for(0, N, 1, [&](int64_t b, int64_t e) { fn(b, e); });
  } else {
    fn(0, N);
  }
}

// Images multiplied side by side in one GEMM, so that small feature maps still give the
// GEMM at least ~1024 columns.
int64_t images_per_gemm(int64_t L, int64_t images) {
  return std::clamp<int64_t>((1024 + L - 1) / L, 1, std::max<int64_t>(images, 1));
}

// Output rows per im2col chunk: the chunk's column buffer stays within ~512 KiB (L2) so the
// GEMM packs it from cache instead of from memory. Grouped images and direct 1x1 convs use
// whole images (one chunk).
template <class T>
int64_t rows_per_chunk(const ConvShape& s, bool whole) {
  if (whole) return s.Ho;
  const int64_t bytes_per_row = s.K() * s.Wo * static_cast<int64_t>(sizeof(T));
  return std::clamp<int64_t>((512 * 1024) / std::max<int64_t>(bytes_per_row, 1), 1, s.Ho);
}

template <class T>
void conv_forward(const T* x, const T* w, const T* bias, T* y, const ConvShape& s) {
  const ConvGeom g = s.geom();
  const int64_t Cg = s.cin_g(), Og = s.cout_g(), K = s.K(), L = s.L(), HW = s.H * s.W;
  over_images(s.N, [&](int64_t n0, int64_t n1) {
    const int64_t G = images_per_gemm(L, n1 - n0);
    const bool direct = s.pointwise() && G == 1;  // x itself is the GEMM operand
    const int64_t R = rows_per_chunk<T>(s, G > 1 || direct);
    auto col = buffer<T>(direct ? 0 : K * G * R * s.Wo);
    auto ybuf = buffer<T>(G > 1 ? Og * G * L : 0);
    for (int64_t n = n0; n < n1; n += G) {
      const int64_t gn = std::min(G, n1 - n);
      for (int64_t gr = 0; gr < s.groups; ++gr) {
        for (int64_t oh0 = 0; oh0 < s.Ho; oh0 += R) {
          const int64_t oh1 = std::min(s.Ho, oh0 + R), li = (oh1 - oh0) * s.Wo, cols = gn * li;
          const T* B = x + (n * s.Cin + gr * Cg) * HW;
          if (!direct) {
            for (int64_t j = 0; j < gn; ++j)
              backend::cpu::im2col(x + ((n + j) * s.Cin + gr * Cg) * HW, g, col.get() + j * li,
                                   cols, oh0, oh1);
            B = col.get();
          }
          T* C = gn == 1 ? y + (n * s.Cout + gr * Og) * L + oh0 * s.Wo : ybuf.get();
          const int64_t ldc = gn == 1 ? L : cols;
          if (bias)
            for (int64_t o = 0; o < Og; ++o)
              std::fill(C + o * ldc, C + o * ldc + cols, bias[gr * Og + o]);
          backend::cpu::gemm<T>({w + gr * Og * K, Og, K, K, 1}, {B, K, cols, cols, 1},
                                {C, Og, cols, ldc, 1}, bias ? T(1) : T(0));
          if (gn > 1)  // whole images: li == L
            for (int64_t j = 0; j < gn; ++j)
              for (int64_t o = 0; o < Og; ++o)
                std::copy(C + o * cols + j * L, C + o * cols + (j + 1) * L,
                          y + ((n + j) * s.Cout + gr * Og + o) * L);
        }
      }
    }
  });
}

// gx and gw (when non-null) must be zero-filled by the caller.
template <class T>
void conv_backward(const T* x, const T* w, const T* gy, T* gx, T* gw, T* gb, const ConvShape& s) {
  const ConvGeom g = s.geom();
  const int64_t Cg = s.cin_g(), Og = s.cout_g(), K = s.K(), L = s.L(), HW = s.H * s.W;
  const int64_t wnum = s.Cout * K;
  const bool split = split_images(s.N);
  std::mutex mu;
  if (gx || gw) {
    over_images(s.N, [&](int64_t n0, int64_t n1) {
      const int64_t G = images_per_gemm(L, n1 - n0);
      const bool direct = s.pointwise() && G == 1;
      const int64_t R = rows_per_chunk<T>(s, G > 1 || direct);
      auto col = buffer<T>(direct || !gw ? 0 : K * G * R * s.Wo);
      auto gcol = buffer<T>(direct || !gx ? 0 : K * G * R * s.Wo);
      auto gybuf = buffer<T>(G > 1 ? Og * G * L : 0);
      std::unique_ptr<T[]> local;
      T* gwa = gw;
      if (gw && split) {
        local = buffer<T>(wnum);
        std::fill(local.get(), local.get() + wnum, T(0));
        gwa = local.get();
      }
      for (int64_t n = n0; n < n1; n += G) {
        const int64_t gn = std::min(G, n1 - n);
        for (int64_t gr = 0; gr < s.groups; ++gr) {
          if (gn > 1)  // gather the group's gradients side by side
            for (int64_t j = 0; j < gn; ++j)
              for (int64_t o = 0; o < Og; ++o) {
                const T* src = gy + ((n + j) * s.Cout + gr * Og + o) * L;
                std::copy(src, src + L, gybuf.get() + o * gn * L + j * L);
              }
          // w is null when only the weight gradient is wanted (no offset on a null pointer).
          const Mat<const T> wg{w ? w + gr * Og * K : nullptr, Og, K, K, 1};
          for (int64_t oh0 = 0; oh0 < s.Ho; oh0 += R) {
            const int64_t oh1 = std::min(s.Ho, oh0 + R), li = (oh1 - oh0) * s.Wo, cols = gn * li;
            const Mat<const T> gyg =
                gn == 1 ? Mat<const T>{gy + (n * s.Cout + gr * Og) * L + oh0 * s.Wo, Og, cols, L, 1}
                        : Mat<const T>{gybuf.get(), Og, cols, cols, 1};
            if (gw) {
              const T* B = x + (n * s.Cin + gr * Cg) * HW;
              if (!direct) {
                for (int64_t j = 0; j < gn; ++j)
                  backend::cpu::im2col(x + ((n + j) * s.Cin + gr * Cg) * HW, g, col.get() + j * li,
                                       cols, oh0, oh1);
                B = col.get();
              }
              backend::cpu::gemm<T>(gyg, Mat<const T>{B, K, cols, cols, 1}.t(),
                                    {gwa + gr * Og * K, Og, K, K, 1}, T(1));
            }
            if (gx) {
              if (direct) {
                backend::cpu::gemm<T>(wg.t(), gyg, {gx + (n * s.Cin + gr * Cg) * HW, Cg, L, L, 1},
                                      T(0));
              } else {
                backend::cpu::gemm<T>(wg.t(), gyg, {gcol.get(), K, cols, cols, 1}, T(0));
                for (int64_t j = 0; j < gn; ++j)
                  backend::cpu::col2im(gcol.get() + j * li, g,
                                       gx + ((n + j) * s.Cin + gr * Cg) * HW, cols, oh0, oh1);
              }
            }
          }
        }
      }
      if (local) {
        std::lock_guard<std::mutex> lk(mu);
        for (int64_t i = 0; i < wnum; ++i) gw[i] += local[i];
      }
    });
  }
  if (gb) {
    parallel_for(0, s.Cout, 16, [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) {
        T acc = 0;
        for (int64_t n = 0; n < s.N; ++n) {
          const T* p = gy + (n * s.Cout + o) * L;
          for (int64_t l = 0; l < L; ++l) acc += p[l];
        }
        gb[o] = acc;
      }
    });
  }
}

// Contiguous NCHW copy of t in dtype ct, cut from the graph.
Tensor prepared(const Tensor& t, DType ct) {
  return t.defined() ? t.detach().to(ct).contiguous() : Tensor();
}

template <class T>
const T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}
template <class T>
T* mptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

struct ConvGrads {
  Tensor gx, gw, gb;
};

// What backward needs to know besides the saved tensors.
struct ConvMeta {
  DType dtype;
  MemoryFormat x_fmt, w_fmt;
  bool need_x, need_w, need_b;
};

// x is defined when need_w, w when need_x.
ConvGrads conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& gy0, const ConvShape& s,
                          const ConvMeta& m) {
  const bool need_x = m.need_x, need_w = m.need_w, need_b = m.need_b;
  const DType dt = m.dtype, ct = is_half(dt) ? DType::f32 : dt;
  Tensor xc = need_w ? prepared(x, ct) : Tensor(), wc = need_x ? prepared(w, ct) : Tensor();
  Tensor gy = prepared(gy0, ct);
  ConvGrads r;
  if (need_x) r.gx = zeros({s.N, s.Cin, s.H, s.W}, TensorOptions(ct));
  if (need_w) r.gw = zeros({s.Cout, s.cin_g(), s.kh, s.kw}, TensorOptions(ct));
  if (need_b) r.gb = empty({s.Cout}, TensorOptions(ct));
  dispatch_floating(ct, "conv2d_backward", [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
      conv_backward<T>(ptr<T>(xc), ptr<T>(wc), ptr<T>(gy), mptr<T>(r.gx), mptr<T>(r.gw),
                       mptr<T>(r.gb), s);
  });
  if (ct != dt) {
    if (r.gx.defined()) r.gx = r.gx.to(dt);
    if (r.gw.defined()) r.gw = r.gw.to(dt);
    if (r.gb.defined()) r.gb = r.gb.to(dt);
  }
  if (r.gx.defined() && m.x_fmt == MemoryFormat::ChannelsLast)
    r.gx = r.gx.contiguous(MemoryFormat::ChannelsLast);
  if (r.gw.defined() && m.w_fmt == MemoryFormat::ChannelsLast)
    r.gw = r.gw.contiguous(MemoryFormat::ChannelsLast);
  return r;
}

// conv2d of f32/bf16 CPU tensors through oneDNN in their own layout, with its node.
Tensor conv2d_dnnl(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvShape& s) {
  const backend::cpu::DnnlConvShape d{s.N,     s.Cin,   s.H,     s.W,      s.Cout,     s.kh,
                                      s.kw,    s.Ho,    s.Wo,    s.groups, s.stride.h, s.stride.w,
                                      s.pad.h, s.pad.w, s.dil.h, s.dil.w};
  const MemoryFormat fmt = detail::conv_memory_format(x, weight);
  Tensor y = backend::cpu::dnnl_conv2d_forward(x.detach(), weight.detach(),
                                               bias.defined() ? bias.detach() : Tensor(), d, fmt);
  const bool rx = x.requires_grad(), rw = weight.requires_grad(),
             rb = bias.defined() && bias.requires_grad();
  autograd::record(
      "conv2d", {x, weight, bias}, {y},
      [xh = rw ? autograd::SavedInput(x, x) : autograd::SavedInput(),
       wh = autograd::SavedInput(weight, weight), s, xs = x.detach(), ws = weight.detach(), d, fmt,
       rx, rw, rb](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())
          return detail::conv2d_higher(xh.get(), wh.get(), g[0], geometry(s), rx, rw, rb);

        Tensor gx, gw, gb;
        backend::cpu::dnnl_conv2d_backward(xs, ws, g[0], d, fmt, rx ? &gx : nullptr,
                                           rw ? &gw : nullptr, rb ? &gb : nullptr);
        return std::vector<Tensor>{gx, gw, gb};
      },
      autograd::HigherOrder::Supported);
  return y;
}

// conv2d of CUDA tensors through cuDNN, with its node (see the file comment).
Tensor conv2d_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvShape& s) {
  DLTRAIN_CHECK(s.Cin > 0, "conv2d: input ", shape_str(x.shape()), " and weight ",
                shape_str(weight.shape()),
                " have no input channels, which cuDNN cannot convolve; run it on the CPU");
  const DType dt = x.dtype();
  const MemoryFormat out_fmt = detail::conv_memory_format(x, weight);
  const MemoryFormat fmt = dt != DType::f64 ? out_fmt : MemoryFormat::Contiguous;
  const backend::cuda::ConvParams p{s.stride, s.pad, s.dil, s.groups};
  Tensor y = empty({s.N, s.Cout, s.Ho, s.Wo}, fmt, x.options());
  backend::cuda::conv2d_forward(y, x.detach().contiguous(fmt), weight.detach().contiguous(fmt),
                                bias.defined() ? bias.detach() : Tensor(), p);
  if (fmt != out_fmt) y = y.contiguous(out_fmt);

  const bool rx = x.requires_grad(), rw = weight.requires_grad(),
             rb = bias.defined() && bias.requires_grad();
  const ConvMeta meta{dt, x.suggest_memory_format(), weight.suggest_memory_format(), rx, rw, rb};
  autograd::record(
      "conv2d", {x, weight, bias}, {y},
      [xh = rw ? autograd::SavedInput(x, x) : autograd::SavedInput(),
       wh = autograd::SavedInput(weight, weight), rx, rw, rb, xs = rw ? x.detach() : Tensor(),
       ws = rx ? weight.detach() : Tensor(), s, p, fmt, meta](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())
          return detail::conv2d_higher(xh.get(), wh.get(), g[0], geometry(s), rx, rw, rb);

        const TensorOptions opts = TensorOptions(meta.dtype).with_device(g[0].device());
        const Tensor gy = (g[0].dtype() == meta.dtype ? g[0] : g[0].to(meta.dtype)).contiguous(fmt);
        ConvGrads r;
        if (meta.need_x) {
          if (s.Cout == 0) {  // no output channels (cuDNN rejects them): a zero gradient
            r.gx = zeros({s.N, s.Cin, s.H, s.W}, opts);
          } else {
            r.gx = empty({s.N, s.Cin, s.H, s.W}, fmt, opts);
            backend::cuda::conv2d_backward_data(r.gx, gy, ws.contiguous(fmt), p);
          }
          if (meta.x_fmt != r.gx.suggest_memory_format()) r.gx = r.gx.contiguous(meta.x_fmt);
        }
        if (meta.need_w) {
          if (s.N == 0) {
            r.gw = zeros({s.Cout, s.cin_g(), s.kh, s.kw}, opts);
          } else {
            r.gw = empty({s.Cout, s.cin_g(), s.kh, s.kw}, fmt, opts);
            backend::cuda::conv2d_backward_filter(r.gw, gy, xs.contiguous(fmt), p);
          }
          if (meta.w_fmt != r.gw.suggest_memory_format()) r.gw = r.gw.contiguous(meta.w_fmt);
        }
        if (meta.need_b) {
          r.gb = empty({s.Cout}, opts);
          backend::cuda::channel_sum(r.gb, gy);
        }
        return std::vector<Tensor>{r.gx, r.gw, r.gb};
      },
      autograd::HigherOrder::Supported);
  return y;
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

ConvShape conv_shape(const detail::ConvGeometry& g) {
  return {g.N, g.Cin, g.H, g.W, g.Cout, g.kh, g.kw, g.Ho, g.Wo, g.groups, g.stride, g.pad, g.dil};
}

backend::cpu::DnnlConvShape dnnl_shape(const ConvShape& s) {
  return {s.N,  s.Cin,    s.H,        s.W,        s.Cout,  s.kh,    s.kw,    s.Ho,
          s.Wo, s.groups, s.stride.h, s.stride.w, s.pad.h, s.pad.w, s.dil.h, s.dil.w};
}

}  // namespace

namespace detail {

MemoryFormat conv_memory_format(const Tensor& x, const Tensor& w) {
  return x.suggest_memory_format() == MemoryFormat::ChannelsLast ||
                 w.suggest_memory_format() == MemoryFormat::ChannelsLast
             ? MemoryFormat::ChannelsLast
             : MemoryFormat::Contiguous;
}

Tensor conv2d_input_grad(const Tensor& gy0, const Tensor& w0, const ConvGeometry& geo,
                         MemoryFormat fmt) {
  const ConvShape s = conv_shape(geo);
  const Tensor gy = gy0.detach(), w = w0.detach();
  const DType dt = w.dtype();
  const TensorOptions opts = TensorOptions(dt).with_device(w.device());
  if (s.N == 0 || s.Cout == 0 || s.Cin == 0) return zeros({s.N, s.Cin, s.H, s.W}, opts);
  if (w.device().is_cuda()) {
    const bool cl = fmt == MemoryFormat::ChannelsLast ||
                    w.suggest_memory_format() == MemoryFormat::ChannelsLast;
    const MemoryFormat cf =
        cl && dt != DType::f64 ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
    Tensor gx = empty({s.N, s.Cin, s.H, s.W}, cf, opts);
    backend::cuda::conv2d_backward_data(gx, gy.to(dt).contiguous(cf), w.contiguous(cf),
                                        {s.stride, s.pad, s.dil, s.groups});
    return cf == fmt ? gx : gx.contiguous(fmt);
  }
  if (backend::cpu::dnnl_available() && backend::cpu::dnnl_conv_supported(dt)) {
    // oneDNN reads only the format and dtype of x for an input gradient.
    const Tensor x_like = empty({s.N, s.Cin, s.H, s.W}, fmt, opts);
    Tensor gx;
    backend::cpu::dnnl_conv2d_backward(x_like, w, gy, dnnl_shape(s), conv_memory_format(x_like, w),
                                       &gx, nullptr, nullptr);
    return gx;
  }
  const ConvMeta meta{dt, fmt, w.suggest_memory_format(), true, false, false};
  return conv2d_backward(Tensor(), w, gy, s, meta).gx;
}

Tensor conv2d_weight_grad(const Tensor& x0, const Tensor& gy0, const ConvGeometry& geo,
                          MemoryFormat fmt) {
  const ConvShape s = conv_shape(geo);
  const Tensor x = x0.detach(), gy = gy0.detach();
  const DType dt = x.dtype();
  const TensorOptions opts = TensorOptions(dt).with_device(x.device());
  const Shape ws{s.Cout, s.cin_g(), s.kh, s.kw};
  if (s.N == 0 || s.Cout == 0 || s.Cin == 0) return zeros(ws, opts);
  if (x.device().is_cuda()) {
    const bool cl = fmt == MemoryFormat::ChannelsLast ||
                    x.suggest_memory_format() == MemoryFormat::ChannelsLast;
    const MemoryFormat cf =
        cl && dt != DType::f64 ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
    Tensor gw = empty(ws, cf, opts);
    backend::cuda::conv2d_backward_filter(gw, gy.to(dt).contiguous(cf), x.contiguous(cf),
                                          {s.stride, s.pad, s.dil, s.groups});
    return cf == fmt ? gw : gw.contiguous(fmt);
  }
  if (backend::cpu::dnnl_available() && backend::cpu::dnnl_conv_supported(dt)) {
    // oneDNN reads only the shape, format and dtype of w for a weight gradient.
    const Tensor w_like = empty(ws, fmt, opts);
    Tensor gw;
    backend::cpu::dnnl_conv2d_backward(x, w_like, gy, dnnl_shape(s), conv_memory_format(x, w_like),
                                       nullptr, &gw, nullptr);
    return gw;
  }
  const ConvMeta meta{dt, x.suggest_memory_format(), fmt, false, true, false};
  return conv2d_backward(x, Tensor(), gy, s, meta).gw;
}

Tensor conv2d_weight_grad_op(const Tensor& x, const Tensor& gy, const ConvGeometry& geo,
                             MemoryFormat fmt) {
  Tensor gw;
  {
    NoGradGuard ng;
    gw = conv2d_weight_grad(x, gy.to(x.dtype()), geo, fmt);
  }
  // gw is bilinear in (x, gy): <gg, gw> = <gy, conv2d(x, gg)> = <x, conv_transpose2d(gy, gg)>.
  autograd::record(
      "conv2d_weight_grad", {x, gy}, {gw},
      [x, gy, geo](const std::vector<Tensor>& g) {
        const Tensor gg = g[0].to(x.dtype());
        return std::vector<Tensor>{
            x.requires_grad()
                ? conv_transpose2d(gy.to(x.dtype()), gg, Tensor(), geo.stride, geo.pad,
                                   conv2d_output_padding(geo), geo.groups, geo.dil)
                : Tensor(),
            gy.requires_grad()
                ? conv2d(x, gg, Tensor(), geo.stride, geo.pad, geo.dil, geo.groups).to(gy.dtype())
                : Tensor()};
      },
      autograd::HigherOrder::Supported);
  return gw;
}

Int2 conv2d_output_padding(const ConvGeometry& g) {
  return Int2(g.H - ((g.Ho - 1) * g.stride.h - 2 * g.pad.h + g.dil.h * (g.kh - 1) + 1),
              g.W - ((g.Wo - 1) * g.stride.w - 2 * g.pad.w + g.dil.w * (g.kw - 1) + 1));
}

std::vector<Tensor> conv2d_higher(const Tensor& x, const Tensor& w, const Tensor& g0,
                                  const ConvGeometry& geo, bool rx, bool rw, bool rb) {
  const Tensor g = g0.to(rx ? w.dtype() : x.dtype());
  Tensor gx, gw, gb;
  if (rx)
    gx = conv_transpose2d(g, w, Tensor(), geo.stride, geo.pad, conv2d_output_padding(geo),
                          geo.groups, geo.dil);
  if (rw)
    gw = conv2d_weight_grad_op(x, g, geo,
                               w.defined() ? w.suggest_memory_format() : MemoryFormat::Contiguous);
  if (rb) gb = sum(g, {0, 2, 3});
  return {gx, gw, gb};
}

}  // namespace detail

int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation,
                         bool ceil_mode) {
  DLTRAIN_CHECK(stride > 0 && kernel > 0 && dilation > 0 && pad >= 0, "conv_output_size: kernel (",
                kernel, "), stride (", stride, ") and dilation (", dilation,
                ") must be positive and padding (", pad, ") non-negative");
  const int64_t num = in + 2 * pad - dilation * (kernel - 1) - 1;
  int64_t out = floor_div(num + (ceil_mode ? stride - 1 : 0), stride) + 1;
  // With ceil_mode the last window must start inside the input or its left padding.
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Int2 stride, Int2 padding,
              Int2 dilation, int64_t groups) {
  DLTRAIN_OP_SCOPE("conv2d", x, weight, bias);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record(
          {x, weight, bias},
          {{"stride", detail::graph_pair(stride)},
           {"padding", detail::graph_pair(padding)},
           {"dilation", detail::graph_pair(dilation)},
           {"groups", groups}},
          [&] { return conv2d(x, weight, bias, stride, padding, dilation, groups); });
    });
  if (auto ac = amp::detail::autocast_args(amp::Op::conv2d, {&x, &weight, &bias}))
    return conv2d((*ac)[0], (*ac)[1], (*ac)[2], stride, padding, dilation, groups);
  detail::check_defined("conv2d", x, "input");
  detail::check_defined("conv2d", weight, "weight");
  detail::check_same_device("conv2d", {&x, &weight, &bias});
  DLTRAIN_CHECK(x.dim() == 4, "conv2d: expected a 4-d input [N, C, H, W] but got shape ",
                shape_str(x.shape()),
                x.dim() == 3 ? "; for N one-channel images [N, H, W] add the channel dim with "
                               "unsqueeze(1), for one image [C, H, W] the batch dim with "
                               "unsqueeze(0)"
                             : "");
  DLTRAIN_CHECK(weight.dim() == 4,
                "conv2d: expected a 4-d weight [C_out, C_in/groups, kH, kW] but got ",
                shape_str(weight.shape()));
  DLTRAIN_CHECK(is_floating(x.dtype()) && x.dtype() == weight.dtype() &&
                    (!bias.defined() || bias.dtype() == x.dtype()),
                "conv2d: input, weight and bias must share one floating dtype but got ", x.dtype(),
                ", ", weight.dtype(), bias.defined() ? ", " : "",
                bias.defined() ? dtype_name(bias.dtype()) : "", "; convert them with .to(dtype)");
  DLTRAIN_CHECK(groups >= 1, "conv2d: groups must be >= 1 but got ", groups);
  DLTRAIN_CHECK(stride.h > 0 && stride.w > 0 && dilation.h > 0 && dilation.w > 0 &&
                    padding.h >= 0 && padding.w >= 0,
                "conv2d: stride (", stride.h, ", ", stride.w, ") and dilation (", dilation.h, ", ",
                dilation.w, ") must be positive and padding (", padding.h, ", ", padding.w,
                ") non-negative");
  const int64_t N = x.size(0), Cin = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t Cout = weight.size(0), kh = weight.size(2), kw = weight.size(3);
  DLTRAIN_CHECK(Cin % groups == 0 && Cout % groups == 0 && weight.size(1) * groups == Cin,
                "conv2d: the input has ", Cin, " channels (shape ", shape_str(x.shape()),
                ") but the weight ", shape_str(weight.shape()), " with groups=", groups,
                " expects ", weight.size(1) * groups,
                " (C_in/groups = weight.size(1), and C_out = ", Cout,
                " divisible by groups); fix the input, the weight's shape or the groups argument");
  DLTRAIN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == Cout),
                "conv2d: bias must be [", Cout, "] (one per output channel of weight ",
                shape_str(weight.shape()), ") but got ",
                bias.defined() ? shape_str(bias.shape()) : std::string());
  DLTRAIN_CHECK(kh > 0 && kw > 0, "conv2d: weight ", shape_str(weight.shape()),
                " has an empty kernel");
  const int64_t Ho = conv_output_size(H, kh, stride.h, padding.h, dilation.h);
  const int64_t Wo = conv_output_size(W, kw, stride.w, padding.w, dilation.w);
  DLTRAIN_CHECK(Ho > 0 && Wo > 0, "conv2d: input ", shape_str(x.shape()), " padded by (", padding.h,
                ", ", padding.w, ") is smaller than the dilated kernel of weight ",
                shape_str(weight.shape()), " (dilation ", dilation.h, ", ", dilation.w,
                "); pad more or use a smaller kernel");
  const ConvShape s{N, Cin, H, W, Cout, kh, kw, Ho, Wo, groups, stride, padding, dilation};
  if (x.device().is_cuda()) return conv2d_cuda(x, weight, bias, s);
  if (backend::cpu::dnnl_available() && backend::cpu::dnnl_conv_supported(x.dtype()))
    return conv2d_dnnl(x, weight, bias, s);

  const DType dt = x.dtype(), ct = is_half(dt) ? DType::f32 : dt;
  Tensor xc = prepared(x, ct), wc = prepared(weight, ct), bc = prepared(bias, ct);
  Tensor y = empty({N, Cout, Ho, Wo}, TensorOptions(ct));
  dispatch_floating(ct, "conv2d", [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
      conv_forward<T>(ptr<T>(xc), ptr<T>(wc), ptr<T>(bc), mptr<T>(y), s);
  });
  if (ct != dt) y = y.to(dt);
  if (detail::conv_memory_format(x, weight) == MemoryFormat::ChannelsLast)
    y = y.contiguous(MemoryFormat::ChannelsLast);

  const bool rx = x.requires_grad(), rw = weight.requires_grad(),
             rb = bias.defined() && bias.requires_grad();
  const ConvMeta meta{dt, x.suggest_memory_format(), weight.suggest_memory_format(), rx, rw, rb};
  autograd::record(
      "conv2d", {x, weight, bias}, {y},
      [xh = rw ? autograd::SavedInput(x, x) : autograd::SavedInput(),
       wh = autograd::SavedInput(weight, weight), rx, rw, rb, xs = rw ? x.detach() : Tensor(),
       ws = rx ? weight.detach() : Tensor(), s, meta](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())
          return detail::conv2d_higher(xh.get(), wh.get(), g[0], geometry(s), rx, rw, rb);

        ConvGrads r = conv2d_backward(xs, ws, g[0], s, meta);
        return std::vector<Tensor>{r.gx, r.gw, r.gb};
      },
      autograd::HigherOrder::Supported);
  return y;
}

}  // namespace dltrain
