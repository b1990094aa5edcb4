// interpolate (own kernels), pad, pixel_shuffle / pixel_unshuffle (compositions).
//
// interpolate is one pass forward and one backward: on the CPU the loops below, one (n, c)
// plane per work item (so backward's scatter never races) with per-call tap tables; on CUDA
// kernels/resample.cu, which computes the same taps per thread (no tables, no copies, no host
// synchronisation; atomic adds in backward). Taps and weights are PyTorch's formulas
// (src/ops/resample_index.hpp), so results match torch to the last bits in f64. Backward
// accumulates in f32 (f64 for f64) and rounds once. Outputs keep the input's memory format.
//
// Reflect / replicate pad of the last one or two dims is the same scheme with one tap
// (pad_index); padding three dims, or an integer tensor, gathers along one dim at a time
// (index_select with host-computed indices, a small host-to-device copy per dim on CUDA).
// Constant pad is cat with filled blocks (negative amounts are views), and pixel_shuffle a
// view + permute + copy, so they run on every device with cat's / copy's gradients.
#include "dltrain/ops/resample.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/indexing.hpp"
#include "dltrain/ops/shape.hpp"
#include "src/backend/cuda/resample.hpp"
#include "src/core/trace.hpp"
#include "src/ops/common.hpp"
#include "src/ops/resample_index.hpp"

namespace dltrain {

namespace cu = backend::cuda;

namespace {

Tensor index_tensor(const std::vector<int64_t>& idx, Device dev) {
  return from_vector(idx).to(dev);
}

// interpolate's kernels on the CPU (strided input, dense output / accumulator in either
// layout), one (n, c) plane per work item so that backward's scatter never races. Taps come
// from per-call row and column tables built with src/ops/resample_index.hpp, the functions the
// CUDA kernels call per thread.
struct Taps {
  std::vector<int64_t> i0, i1;
  std::vector<double> l1;
};

Taps taps(int64_t in, int64_t out, bool bilinear, bool align_corners, double scale) {
  Taps t;
  t.i0.resize(static_cast<size_t>(out));
  t.i1.resize(static_cast<size_t>(out));
  t.l1.assign(static_cast<size_t>(out), 0.0);
  const double ratio = resample::linear_ratio(in, out, align_corners, scale);
  for (int64_t o = 0; o < out; ++o) {
    const size_t k = static_cast<size_t>(o);
    if (bilinear) {
      resample::linear_taps(o, in, out, align_corners, ratio, t.i0[k], t.i1[k], t.l1[k]);
    } else {
      t.i0[k] = t.i1[k] = resample::nearest_index(o, in, out, scale);
    }
  }
  return t;
}

// Element offsets of a dense [N, C, H, W] tensor in layout cl: plane (n, c) start, row, column.
struct DenseGeo {
  int64_t plane_n, plane_c, row, col;
};
DenseGeo dense_geo(int64_t C, int64_t H, int64_t W, bool cl) {
  return cl ? DenseGeo{H * W * C, 1, W * C, C} : DenseGeo{C * H * W, H * W, W, 1};
}

template <class T>
void upsample_forward_cpu(const Tensor& x, const Tensor& y, const cu::Upsample2d& p, bool cl) {
  using A = acc_t<T>;
  const Taps th = taps(p.H, p.Ho, p.bilinear, p.align_corners, p.scale_h);
  const Taps tw = taps(p.W, p.Wo, p.bilinear, p.align_corners, p.scale_w);
  const T* xp = static_cast<const T*>(x.data_ptr());
  T* yp = static_cast<T*>(y.data_ptr());
  const int64_t sn = x.stride(0), sc = x.stride(1), sh = x.stride(2), sw = x.stride(3);
  if (cl) {  // one output row (n, oh) per work item, channels innermost: unit stride in NHWC
    parallel_for(0, p.N * p.Ho, 1, [&](int64_t b, int64_t e) {
      for (int64_t nh = b; nh < e; ++nh) {
        const int64_t n = nh / p.Ho, oh = nh % p.Ho;
        const size_t kh = static_cast<size_t>(oh);
        const T* r0 = xp + n * sn + th.i0[kh] * sh;
        const T* r1 = xp + n * sn + th.i1[kh] * sh;
        const A a1 = static_cast<A>(th.l1[kh]), a0 = A(1) - a1;
        T* dst = yp + nh * p.Wo * p.C;
        for (int64_t ow = 0; ow < p.Wo; ++ow) {
          const size_t kw = static_cast<size_t>(ow);
          const T* p00 = r0 + tw.i0[kw] * sw;
          const T* p01 = r0 + tw.i1[kw] * sw;
          const T* p10 = r1 + tw.i0[kw] * sw;
          const T* p11 = r1 + tw.i1[kw] * sw;
          const A b1 = static_cast<A>(tw.l1[kw]), b0 = A(1) - b1;
          T* out = dst + ow * p.C;
          if (!p.bilinear) {
            for (int64_t c = 0; c < p.C; ++c) out[c] = p00[c * sc];
            continue;
          }
          for (int64_t c = 0; c < p.C; ++c)
            out[c] = static_cast<T>(
                a0 * (b0 * static_cast<A>(p00[c * sc]) + b1 * static_cast<A>(p01[c * sc])) +
                a1 * (b0 * static_cast<A>(p10[c * sc]) + b1 * static_cast<A>(p11[c * sc])));
        }
      }
    });
    return;
  }
  const DenseGeo d = dense_geo(p.C, p.Ho, p.Wo, cl);
  parallel_for(0, p.N * p.C, 1, [&](int64_t b, int64_t e) {
    for (int64_t nc = b; nc < e; ++nc) {
      const int64_t n = nc / p.C, c = nc % p.C;
      const T* src = xp + n * sn + c * sc;
      T* dst = yp + n * d.plane_n + c * d.plane_c;
      for (int64_t oh = 0; oh < p.Ho; ++oh) {
        const size_t kh = static_cast<size_t>(oh);
        const T* r0 = src + th.i0[kh] * sh;
        const T* r1 = src + th.i1[kh] * sh;
        const A a1 = static_cast<A>(th.l1[kh]), a0 = A(1) - a1;
        for (int64_t ow = 0; ow < p.Wo; ++ow) {
          const size_t kw = static_cast<size_t>(ow);
          const int64_t w0 = tw.i0[kw] * sw, w1 = tw.i1[kw] * sw;
          T& out = dst[oh * d.row + ow * d.col];
          if (!p.bilinear) {
            out = r0[w0];
            continue;
          }
          const A b1 = static_cast<A>(tw.l1[kw]), b0 = A(1) - b1;
          out = static_cast<T>(a0 * (b0 * static_cast<A>(r0[w0]) + b1 * static_cast<A>(r0[w1])) +
                               a1 * (b0 * static_cast<A>(r1[w0]) + b1 * static_cast<A>(r1[w1])));
        }
      }
    }
  });
}

// acc (dense [N, C, H, W] in layout cl, of type A, zero-filled) += adjoint(gy).
template <class T, class A>
void upsample_backward_cpu(const Tensor& gy, const Tensor& acc, const cu::Upsample2d& p, bool cl) {
  const Taps th = taps(p.H, p.Ho, p.bilinear, p.align_corners, p.scale_h);
  const Taps tw = taps(p.W, p.Wo, p.bilinear, p.align_corners, p.scale_w);
  const T* gp = static_cast<const T*>(gy.data_ptr());
  A* ap = static_cast<A*>(acc.data_ptr());
  const int64_t sn = gy.stride(0), sc = gy.stride(1), sh = gy.stride(2), sw = gy.stride(3);
  if (cl) {  // one image per work item (its scatter never meets another's), channels innermost
    parallel_for(0, p.N, 1, [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n) {
        A* img = ap + n * p.H * p.W * p.C;
        for (int64_t oh = 0; oh < p.Ho; ++oh) {
          const size_t kh = static_cast<size_t>(oh);
          A* r0 = img + th.i0[kh] * p.W * p.C;
          A* r1 = img + th.i1[kh] * p.W * p.C;
          const A a1 = static_cast<A>(th.l1[kh]), a0 = A(1) - a1;
          for (int64_t ow = 0; ow < p.Wo; ++ow) {
            const size_t kw = static_cast<size_t>(ow);
            const T* g = gp + n * sn + oh * sh + ow * sw;
            A* q00 = r0 + tw.i0[kw] * p.C;
            A* q01 = r0 + tw.i1[kw] * p.C;
            A* q10 = r1 + tw.i0[kw] * p.C;
            A* q11 = r1 + tw.i1[kw] * p.C;
            if (!p.bilinear) {
              for (int64_t c = 0; c < p.C; ++c) q00[c] += static_cast<A>(g[c * sc]);
              continue;
            }
            const A b1 = static_cast<A>(tw.l1[kw]), b0 = A(1) - b1;
            const A w00 = a0 * b0, w01 = a0 * b1, w10 = a1 * b0, w11 = a1 * b1;
            for (int64_t c = 0; c < p.C; ++c) {
              const A v = static_cast<A>(g[c * sc]);
              q00[c] += w00 * v;
              q01[c] += w01 * v;
              q10[c] += w10 * v;
              q11[c] += w11 * v;
            }
          }
        }
      }
    });
    return;
  }
  const DenseGeo d = dense_geo(p.C, p.H, p.W, cl);
  parallel_for(0, p.N * p.C, 1, [&](int64_t b, int64_t e) {
    for (int64_t nc = b; nc < e; ++nc) {
      const int64_t n = nc / p.C, c = nc % p.C;
      const T* src = gp + n * sn + c * sc;
      A* dst = ap + n * d.plane_n + c * d.plane_c;
      for (int64_t oh = 0; oh < p.Ho; ++oh) {
        const size_t kh = static_cast<size_t>(oh);
        A* r0 = dst + th.i0[kh] * d.row;
        A* r1 = dst + th.i1[kh] * d.row;
        const A a1 = static_cast<A>(th.l1[kh]), a0 = A(1) - a1;
        for (int64_t ow = 0; ow < p.Wo; ++ow) {
          const size_t kw = static_cast<size_t>(ow);
          const A v = static_cast<A>(src[oh * sh + ow * sw]);
          const int64_t w0 = tw.i0[kw] * d.col, w1 = tw.i1[kw] * d.col;
          if (!p.bilinear) {
            r0[w0] += v;
            continue;
          }
          const A b1 = static_cast<A>(tw.l1[kw]), b0 = A(1) - b1;
          r0[w0] += a0 * b0 * v;
          r0[w1] += a0 * b1 * v;
          r1[w0] += a1 * b0 * v;
          r1[w1] += a1 * b1 * v;
        }
      }
    }
  });
}

// The gradient of interpolate: gy [N, C, Ho, Wo] -> [N, C, H, W] of dtype dt in layout fmt.
Tensor upsample_backward(const Tensor& gy0, const cu::Upsample2d& p, DType dt, MemoryFormat fmt) {
  const Tensor gy = gy0.dtype() == dt ? gy0 : gy0.to(dt);
  const DType at = dt == DType::f64 ? DType::f64 : DType::f32;
  const bool cl = fmt == MemoryFormat::ChannelsLast;
  Tensor acc = empty({p.N, p.C, p.H, p.W}, fmt, TensorOptions(at).with_device(gy.device()));
  acc.zero_();
  if (gy.device().is_cuda()) {
    cu::upsample2d_backward(acc, gy, p);
  } else {
    dispatch_floating(dt, "interpolate_backward", [&]<class T>() {
      using A = acc_t<T>;
      upsample_backward_cpu<T, A>(gy, acc, p, cl);
    });
  }
  return at == dt ? acc : acc.to(dt);
}

std::string pair_str(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << '{';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << '}';
  return os.str();
}

MemoryFormat format_of(const Tensor& x) {
  return x.dim() == 4 ? x.suggest_memory_format() : MemoryFormat::Contiguous;
}

// Reflect / replicate amounts (l, r) for dim d of x: non-negative, reflect below the size,
// replicate of a non-empty dim.
void check_gather_pad(const Tensor& x, int64_t d, int64_t l, int64_t r, PadMode mode) {
  const int64_t n = x.size(d);
  DLTRAIN_CHECK(l >= 0 && r >= 0, "pad: ", mode == PadMode::Reflect ? "reflect" : "replicate",
                " padding takes non-negative amounts but got (", l, ", ", r, ") for dim ", d,
                "; crop with narrow() or constant padding");
  if (mode == PadMode::Reflect)
    DLTRAIN_CHECK(l < n && r < n, "pad: reflect padding (", l, ", ", r,
                  ") must be smaller than dim ", d, " of input ", shape_str(x.shape()), " (size ",
                  n, "); use replicate or pad in steps");
  else
    DLTRAIN_CHECK(n > 0, "pad: replicate padding of dim ", d, " of input ", shape_str(x.shape()),
                  ", which is empty");
}

template <class T>
void pad_forward_cpu(const Tensor& x, const Tensor& y, const cu::Pad2d& p, bool cl) {
  std::vector<int64_t> ih(static_cast<size_t>(p.Ho)), iw(static_cast<size_t>(p.Wo));
  for (int64_t o = 0; o < p.Ho; ++o)
    ih[static_cast<size_t>(o)] = resample::pad_index(o, p.H, p.top, p.reflect);
  for (int64_t o = 0; o < p.Wo; ++o)
    iw[static_cast<size_t>(o)] = resample::pad_index(o, p.W, p.left, p.reflect);
  const T* xp = static_cast<const T*>(x.data_ptr());
  T* yp = static_cast<T*>(y.data_ptr());
  const int64_t sn = x.stride(0), sc = x.stride(1), sh = x.stride(2), sw = x.stride(3);
  const DenseGeo d = dense_geo(p.C, p.Ho, p.Wo, cl);
  parallel_for(0, p.N * p.C, 1, [&](int64_t b, int64_t e) {
    for (int64_t nc = b; nc < e; ++nc) {
      const T* src = xp + (nc / p.C) * sn + (nc % p.C) * sc;
      T* dst = yp + (nc / p.C) * d.plane_n + (nc % p.C) * d.plane_c;
      for (int64_t oh = 0; oh < p.Ho; ++oh) {
        const T* row = src + ih[static_cast<size_t>(oh)] * sh;
        for (int64_t ow = 0; ow < p.Wo; ++ow)
          dst[oh * d.row + ow * d.col] = row[iw[static_cast<size_t>(ow)] * sw];
      }
    }
  });
}

template <class T, class A>
void pad_backward_cpu(const Tensor& gy, const Tensor& acc, const cu::Pad2d& p, bool cl) {
  const T* gp = static_cast<const T*>(gy.data_ptr());
  A* ap = static_cast<A*>(acc.data_ptr());
  const int64_t sn = gy.stride(0), sc = gy.stride(1), sh = gy.stride(2), sw = gy.stride(3);
  const DenseGeo d = dense_geo(p.C, p.H, p.W, cl);
  parallel_for(0, p.N * p.C, 1, [&](int64_t b, int64_t e) {
    for (int64_t nc = b; nc < e; ++nc) {
      const T* src = gp + (nc / p.C) * sn + (nc % p.C) * sc;
      A* dst = ap + (nc / p.C) * d.plane_n + (nc % p.C) * d.plane_c;
      for (int64_t oh = 0; oh < p.Ho; ++oh) {
        A* row = dst + resample::pad_index(oh, p.H, p.top, p.reflect) * d.row;
        for (int64_t ow = 0; ow < p.Wo; ++ow)
          row[resample::pad_index(ow, p.W, p.left, p.reflect) * d.col] +=
              static_cast<A>(src[oh * sh + ow * sw]);
      }
    }
  });
}

// Reflect / replicate padding of the last one or two dims of x (amounts checked by the
// caller) as one kernel: x is seen as [N, C, H, W] (4-d, any strides) or [1, P, H, W]
// (other ranks, made contiguous), with its own autograd node.
Tensor pad_fused(const Tensor& x, const std::vector<int64_t>& amounts, bool reflect) {
  const int64_t nd = x.dim(), W = x.size(-1);
  const bool two = amounts.size() == 4;
  const int64_t H = two ? x.size(-2) : (nd == 4 ? x.size(2) : 1);
  const MemoryFormat fmt = format_of(x);
  Tensor x4 = x.detach();
  if (nd != 4) x4 = x4.reshape({1, W > 0 && H > 0 ? x.numel() / (H * W) : 0, H, W});
  const int64_t top = two ? amounts[2] : 0, bottom = two ? amounts[3] : 0;
  const cu::Pad2d p{x4.size(0), x4.size(1),       H,
                    W,          H + top + bottom, W + amounts[0] + amounts[1],
                    top,        amounts[0],       reflect};
  Tensor y = empty({p.N, p.C, p.Ho, p.Wo}, fmt, x.options());
  if (x.device().is_cuda()) {
    cu::pad2d_forward(y, x4, p);
  } else {
    dispatch_floating(x.dtype(), "pad", [&]<class T>() {
      pad_forward_cpu<T>(x4, y, p, fmt == MemoryFormat::ChannelsLast);
    });
  }
  Shape out_shape = x.shape();
  out_shape[static_cast<size_t>(nd - 1)] = p.Wo;
  if (two) out_shape[static_cast<size_t>(nd - 2)] = p.Ho;
  if (nd != 4) y = y.view(out_shape);
  autograd::record(
      "pad", {x}, {y}, [p, dt = x.dtype(), fmt, shape = x.shape()](const std::vector<Tensor>& g) {
        const Tensor gy0 = g[0].dtype() == dt ? g[0] : g[0].to(dt);
        const Tensor gy = gy0.dim() == 4 ? gy0 : gy0.reshape({p.N, p.C, p.Ho, p.Wo});
        const DType at = dt == DType::f64 ? DType::f64 : DType::f32;
        Tensor acc = empty({p.N, p.C, p.H, p.W}, fmt, TensorOptions(at).with_device(gy.device()));
        acc.zero_();
        if (gy.device().is_cuda()) {
          cu::pad2d_backward(acc, gy, p);
        } else {
          dispatch_floating(dt, "pad_backward", [&]<class T>() {
            pad_backward_cpu<T, acc_t<T>>(gy, acc, p, fmt == MemoryFormat::ChannelsLast);
          });
        }
        Tensor gx = at == dt ? acc : acc.to(dt);
        return std::vector<Tensor>{shape.size() == 4 ? gx : gx.view(shape)};
      });
  autograd::set_adjoint(y, [amounts, reflect](const std::vector<Tensor>& gg) {
    return std::vector<Tensor>{pad_fused(gg[0], amounts, reflect)};
  });
  return y;
}

}  // namespace

Tensor interpolate(const Tensor& x, const InterpolateOptions& o) {
  DLTRAIN_OP_SCOPE("interpolate", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record(
          {x},
          {{"mode", o.mode == InterpolateMode::Nearest ? "nearest" : "bilinear"},
           {"align_corners", o.align_corners},
           {"scale_h", o.scale_factor ? o.scale_factor->h : 0.0},
           {"scale_w", o.scale_factor ? o.scale_factor->w : 0.0}},
          [&] { return interpolate(x, o); });
    });
  const char* op = "interpolate";
  detail::check_defined(op, x, "input");
  DLTRAIN_CHECK(x.dim() == 4, "interpolate: expected a 4-d input [N, C, H, W] but got shape ",
                shape_str(x.shape()), "; add a batch dim with unsqueeze(0)");
  DLTRAIN_CHECK(is_floating(x.dtype()), "interpolate: input must be floating point but is ",
                x.dtype(), "; convert it with .to(DType::f32)");
  DLTRAIN_CHECK(o.size.has_value() != o.scale_factor.has_value(),
                "interpolate: give exactly one of size and scale_factor (got ",
                o.size ? "both" : "neither", ")");
  DLTRAIN_CHECK(!(o.mode == InterpolateMode::Nearest && o.align_corners),
                "interpolate: align_corners only applies to bilinear mode; leave it false for "
                "nearest");
  const int64_t H = x.size(2), W = x.size(3);
  DLTRAIN_CHECK(H > 0 && W > 0, "interpolate: input ", shape_str(x.shape()),
                " has an empty spatial dim");
  int64_t Ho, Wo;
  std::optional<double> sh, sw;
  if (o.size) {
    Ho = o.size->h;
    Wo = o.size->w;
    DLTRAIN_CHECK(Ho > 0 && Wo > 0, "interpolate: size (", Ho, ", ", Wo, ") must be positive");
  } else {
    sh = o.scale_factor->h;
    sw = o.scale_factor->w;
    DLTRAIN_CHECK(*sh > 0 && *sw > 0 && std::isfinite(*sh) && std::isfinite(*sw),
                  "interpolate: scale_factor (", *sh, ", ", *sw, ") must be positive");
    Ho = static_cast<int64_t>(std::floor(static_cast<double>(H) * *sh));
    Wo = static_cast<int64_t>(std::floor(static_cast<double>(W) * *sw));
    DLTRAIN_CHECK(Ho > 0 && Wo > 0, "interpolate: input ", shape_str(x.shape()), " scaled by (",
                  *sh, ", ", *sw, ") is empty (", Ho, " x ", Wo, "); use a larger scale_factor");
  }
  const MemoryFormat fmt = x.suggest_memory_format();
  const cu::Upsample2d p{x.size(0),
                         x.size(1),
                         H,
                         W,
                         Ho,
                         Wo,
                         o.mode == InterpolateMode::Bilinear,
                         o.align_corners,
                         sh ? 1.0 / *sh : 0.0,
                         sw ? 1.0 / *sw : 0.0};
  Tensor y = empty({p.N, p.C, Ho, Wo}, fmt, x.options());
  const Tensor xd = x.detach();
  if (x.device().is_cuda()) {
    cu::upsample2d_forward(y, xd, p);
  } else {
    dispatch_floating(x.dtype(), "interpolate", [&]<class T>() {
      upsample_forward_cpu<T>(xd, y, p, fmt == MemoryFormat::ChannelsLast);
    });
  }
  autograd::record("interpolate", {x}, {y}, [p, dt = x.dtype(), fmt](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{upsample_backward(g[0], p, dt, fmt)};
  });
  // The backward is linear in g; its adjoint is this interpolation (create_graph).
  autograd::set_adjoint(
      y, [o](const std::vector<Tensor>& gg) { return std::vector<Tensor>{interpolate(gg[0], o)}; });
  return y;
}

Tensor pad(const Tensor& x, const std::vector<int64_t>& p, PadMode mode, double value) {
  DLTRAIN_OP_SCOPE("pad", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x},
                                  {{"pad", p},
                                   {"mode", mode == PadMode::Constant  ? "constant"
                                            : mode == PadMode::Reflect ? "reflect"
                                                                       : "edge"},
                                   {"value", value}},
                                  [&] { return pad(x, p, mode, value); });
    });
  const char* op = "pad";
  detail::check_defined(op, x, "input");
  DLTRAIN_CHECK(p.size() % 2 == 0 && static_cast<int64_t>(p.size() / 2) <= x.dim(),
                "pad: the amounts ", pair_str(p),
                " must come in (before, after) pairs, one pair per padded dim starting from the "
                "last, at most ",
                x.dim(), " pairs for input ", shape_str(x.shape()));
  const MemoryFormat fmt = format_of(x);
  if (mode != PadMode::Constant && p.size() <= 4 && is_floating(x.dtype())) {
    for (size_t k = 0; k < p.size() / 2; ++k) {
      const int64_t d = x.dim() - 1 - static_cast<int64_t>(k);
      check_gather_pad(x, d, p[2 * k], p[2 * k + 1], mode);
    }
    return pad_fused(x, p, mode == PadMode::Reflect);
  }
  Tensor y = x;
  for (size_t k = 0; k < p.size() / 2; ++k) {
    const int64_t d = x.dim() - 1 - static_cast<int64_t>(k);
    const int64_t l = p[2 * k], r = p[2 * k + 1], n = y.size(d);
    if (l == 0 && r == 0) continue;
    if (mode == PadMode::Constant) {
      const int64_t cut_l = std::max<int64_t>(-l, 0), cut_r = std::max<int64_t>(-r, 0);
      DLTRAIN_CHECK(n - cut_l - cut_r >= 0 && n + l + r >= 0, "pad: negative amounts (", l, ", ", r,
                    ") crop more than dim ", d, " of input ", shape_str(x.shape()), " holds");
      if (cut_l || cut_r) y = y.narrow(d, cut_l, n - cut_l - cut_r);
      std::vector<Tensor> parts;
      Shape fs = y.shape();
      if (l > 0) {
        fs[static_cast<size_t>(d)] = l;
        parts.push_back(full(fs, value, y.options()));
      }
      parts.push_back(y);
      if (r > 0) {
        fs[static_cast<size_t>(d)] = r;
        parts.push_back(full(fs, value, y.options()));
      }
      if (parts.size() > 1) y = cat(parts, d);
      continue;
    }
    check_gather_pad(y, d, l, r, mode);
    std::vector<int64_t> idx;
    idx.reserve(static_cast<size_t>(l + n + r));
    for (int64_t j = -l; j < n + r; ++j) {
      if (mode == PadMode::Reflect)
        idx.push_back(j < 0 ? -j : (j >= n ? 2 * (n - 1) - j : j));
      else
        idx.push_back(std::clamp<int64_t>(j, 0, n - 1));
    }
    y = index_select(y, d, index_tensor(idx, x.device()));
  }
  if (y.impl() == x.impl()) return x.clone(fmt);
  return y.suggest_memory_format() == fmt ? y : y.contiguous(fmt);
}

Tensor pixel_shuffle(const Tensor& x, int64_t r) {
  DLTRAIN_OP_SCOPE("pixel_shuffle", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"factor", r}}, [&] { return pixel_shuffle(x, r); });
    });
  detail::check_defined("pixel_shuffle", x, "input");
  DLTRAIN_CHECK(x.dim() >= 3, "pixel_shuffle: expected at least 3 dims [*, C, H, W] but got ",
                shape_str(x.shape()));
  DLTRAIN_CHECK(r > 0, "pixel_shuffle: upscale_factor must be positive but got ", r);
  const int64_t nd = x.dim(), C = x.size(-3), H = x.size(-2), W = x.size(-1);
  DLTRAIN_CHECK(C % (r * r) == 0, "pixel_shuffle: ", C, " channels of input ", shape_str(x.shape()),
                " are not divisible by upscale_factor^2 = ", r * r);
  Shape lead(x.shape().begin(), x.shape().end() - 3);
  Shape s6 = lead, perm, out = lead;
  s6.insert(s6.end(), {C / (r * r), r, r, H, W});
  for (int64_t i = 0; i < nd - 3; ++i) perm.push_back(i);
  const int64_t b = nd - 3;
  perm.insert(perm.end(), {b, b + 3, b + 1, b + 4, b + 2});
  out.insert(out.end(), {C / (r * r), H * r, W * r});
  Tensor y = x.reshape(s6).permute(perm).reshape(out);
  return nd == 4 ? y.contiguous(format_of(x)) : y;
}

Tensor pixel_unshuffle(const Tensor& x, int64_t r) {
  DLTRAIN_OP_SCOPE("pixel_unshuffle", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"factor", r}}, [&] { return pixel_unshuffle(x, r); });
    });
  detail::check_defined("pixel_unshuffle", x, "input");
  DLTRAIN_CHECK(x.dim() >= 3, "pixel_unshuffle: expected at least 3 dims [*, C, H, W] but got ",
                shape_str(x.shape()));
  DLTRAIN_CHECK(r > 0, "pixel_unshuffle: downscale_factor must be positive but got ", r);
  const int64_t nd = x.dim(), C = x.size(-3), H = x.size(-2), W = x.size(-1);
  DLTRAIN_CHECK(H % r == 0 && W % r == 0, "pixel_unshuffle: spatial size ", H, " x ", W,
                " of input ", shape_str(x.shape()), " is not divisible by downscale_factor ", r);
  Shape lead(x.shape().begin(), x.shape().end() - 3);
  Shape s6 = lead, perm, out = lead;
  s6.insert(s6.end(), {C, H / r, r, W / r, r});
  for (int64_t i = 0; i < nd - 3; ++i) perm.push_back(i);
  const int64_t b = nd - 3;
  perm.insert(perm.end(), {b, b + 2, b + 4, b + 1, b + 3});
  out.insert(out.end(), {C * r * r, H / r, W / r});
  Tensor y = x.reshape(s6).permute(perm).reshape(out);
  return nd == 4 ? y.contiguous(format_of(x)) : y;
}

}  // namespace dltrain
