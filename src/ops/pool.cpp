// max_pool2d, avg_pool2d and adaptive_avg_pool2d with their gradients.
//
// Kernels run on a contiguous NCHW copy in float or double (f16/bf16 upcast,
// result rounded once), parallel over the N*C planes; channels-last inputs
// get channels-last outputs (and gradients). Window rules follow PyTorch:
// max pooling pads with -inf and picks NaN if present; average pooling
// clips windows to input + padding and divides by the clipped window
// (count_include_pad) or by the in-bounds part; adaptive pooling uses
// [floor(o*In/Out), ceil((o+1)*In/Out)). Max pooling indices are flat
// h*W + w positions inside each plane. 3-d [C, H, W] inputs are accepted and
// treated as one image. The backward kernels are not themselves recorded.
//
// With oneDNN (src/backend/cpu/dnnl.hpp), f32/bf16 max_pool2d (without indices, no dilation),
// avg_pool2d and the adaptive average pools that are plain average pools (sizes divisible) run
// through it in the input's own layout: no channels-last round trip and no upcast copy.
// oneDNN's max does not propagate NaN, so an input holding one takes the own kernels; oneDNN's
// include-pad divisor is the whole kernel, so average pools whose windows reach past the
// padding (ceil mode) take them too. bf16 pools with overlapping windows run oneDNN's f32
// primitives on f32 copies (its AVX-512 bf16 backward rounds partial sums to bf16). Ties pick
// the first maximum in window order, as here.
//
// CUDA tensors run the kernels of the dnn family (backend::cuda::*_pool2d_*) on x as laid
// out, with the output in x's memory format and the same window rules; max_pool2d keeps a
// one-byte in-window index per output for its backward (max_pool2d_with_indices returns the
// int64 flat indices, as on the CPU).
#include "dltrain/ops/pool.hpp"

#include <atomic>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/ops/indexing.hpp"
#include "src/backend/cpu/dnnl.hpp"
#include "src/backend/cuda/dnn.hpp"
#include "src/core/trace.hpp"
#include "src/ops/common.hpp"

namespace dltrain {

namespace {

struct PoolShape {
  int64_t N, C, H, W, Ho, Wo;
  Int2 k, s, p, d;
  int64_t planes() const { return N * C; }
};

bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }
DType compute_type(DType t) { return is_half(t) ? DType::f32 : t; }

void check_input(const char* op, const Tensor& x) {
  detail::check_defined(op, x, "input");
  DLTRAIN_CHECK(x.dim() == 4, op,
                ": expected a 4-d input [N, C, H, W] (or 3-d [C, H, W]) but got shape ",
                shape_str(x.shape()));
  DLTRAIN_CHECK(is_floating(x.dtype()), op, ": expected a floating-point input but got ", x.dtype(),
                "; convert it with .to(DType::f32)");
}

PoolShape window_shape(const char* op, const Tensor& x, Int2 k, std::optional<Int2> stride, Int2 p,
                       Int2 d, bool ceil_mode) {
  check_input(op, x);
  const Int2 s = stride.value_or(k);
  DLTRAIN_CHECK(k.h > 0 && k.w > 0 && s.h > 0 && s.w > 0 && d.h > 0 && d.w > 0, op, ": kernel (",
                k.h, ", ", k.w, "), stride (", s.h, ", ", s.w, ") and dilation (", d.h, ", ", d.w,
                ") must be positive");
  DLTRAIN_CHECK(p.h >= 0 && p.w >= 0 && p.h <= k.h / 2 && p.w <= k.w / 2, op, ": padding (", p.h,
                ", ", p.w, ") must be non-negative and at most half the kernel (", k.h, ", ", k.w,
                ")");
  PoolShape r{x.size(0), x.size(1), x.size(2), x.size(3), 0, 0, k, s, p, d};
  r.Ho = conv_output_size(r.H, k.h, s.h, p.h, d.h, ceil_mode);
  r.Wo = conv_output_size(r.W, k.w, s.w, p.w, d.w, ceil_mode);
  DLTRAIN_CHECK(r.Ho > 0 && r.Wo > 0, op, ": input ", shape_str(x.shape()), " with padding (", p.h,
                ", ", p.w, ") is smaller than the kernel (", k.h, ", ", k.w, ") with dilation (",
                d.h, ", ", d.w, "); the output would be empty");
  return r;
}

Tensor prepared(const Tensor& t, DType ct) { return t.detach().to(ct).contiguous(); }

// Converts an NCHW compute-type result to dtype dt and memory format fmt.
Tensor finish(Tensor y, DType dt, MemoryFormat fmt) {
  if (y.dtype() != dt) y = y.to(dt);
  return fmt == MemoryFormat::ChannelsLast ? y.contiguous(MemoryFormat::ChannelsLast) : y;
}

int64_t plane_grain(int64_t work_per_plane) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(work_per_plane, 1));
}

// Runs fn.template operator()<T>() for the float/double compute type ct.
template <class F>
void dispatch_compute(DType ct, const char* op, F&& f) {
  dispatch_floating(ct, op, [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) f.template operator()<T>();
  });
}

// --- max ---------------------------------------------------------------------------

// The 2x2, stride 2, unpadded pool of most CNNs has its own straight-line kernels.
bool is_k2s2(const PoolShape& s) {
  return s.k == Int2(2) && s.s == Int2(2) && s.p == Int2(0) && s.d == Int2(1);
}

// One output row of the 2x2/2 max pool: input rows r0 and r1, output y and flat indices
// (base = flat index of r0[0]). Written with restrict pointers and plain selects so the
// compiler vectorises it; NaNs (which must win, as in PyTorch) are rare and fixed up after.
template <class T>
void pool2x2_row_forward(const T* __restrict r0, const T* __restrict r1, T* __restrict y,
                         int64_t* __restrict idx, int64_t Wo, int64_t base, int64_t W) {
  for (int64_t ow = 0; ow < Wo; ++ow) {
    const T a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], e = r1[2 * ow + 1];
    T m = a;
    int64_t off = 0;
    off = b > m ? 1 : off;
    m = b > m ? b : m;
    off = c > m ? W : off;
    m = c > m ? c : m;
    off = e > m ? W + 1 : off;
    m = e > m ? e : m;
    y[ow] = m;
    idx[ow] = base + 2 * ow + off;
  }
  bool nan = false;
  for (int64_t i = 0; i < 2 * Wo; ++i) nan |= (r0[i] != r0[i]) | (r1[i] != r1[i]);
  if (!nan) return;
  for (int64_t ow = 0; ow < Wo; ++ow) {
    const int64_t offs[4] = {0, 1, W, W + 1};
    for (int64_t q = 0; q < 4; ++q) {
      const T v = (q < 2 ? r0 : r1)[2 * ow + (q & 1)];
      if (v != v) {  // the last NaN of the window wins
        y[ow] = v;
        idx[ow] = base + 2 * ow + offs[q];
      }
    }
  }
}

// The 2x2/2 pool without indices (what max_pool2d needs): the forward computes only the
// maxima, one vectorisable pass; the backward finds each window's maximum again in the saved
// input (the first element equal to it, or the last NaN, as PyTorch's index would be) and
// writes every input gradient. No int64 index tensor is written or read.
template <class T>
void pool2x2_values(const T* x, T* y, int64_t planes, int64_t H, int64_t W, int64_t Ho,
                    int64_t Wo) {
  parallel_for(0, planes * Ho, std::max<int64_t>(1, 16384 / std::max<int64_t>(Wo, 1)),
               [&](int64_t r0_, int64_t r1_) {
                 for (int64_t r = r0_; r < r1_; ++r) {
                   const int64_t pl = r / Ho, oh = r % Ho;
                   const T* __restrict a0 = x + pl * H * W + 2 * oh * W;
                   const T* __restrict a1 = a0 + W;
                   T* __restrict yr = y + r * Wo;
                   bool nan = false;
                   for (int64_t ow = 0; ow < Wo; ++ow) {
                     const T a = a0[2 * ow], b = a0[2 * ow + 1], c = a1[2 * ow], e = a1[2 * ow + 1];
                     const T ab = b > a ? b : a, ce = e > c ? e : c;
                     yr[ow] = ce > ab ? ce : ab;
                     nan |= (a != a) | (b != b) | (c != c) | (e != e);
                   }
                   if (!nan) continue;
                   for (int64_t ow = 0; ow < Wo; ++ow) {
                     const T v[4] = {a0[2 * ow], a0[2 * ow + 1], a1[2 * ow], a1[2 * ow + 1]};
                     for (const T q : v)
                       if (q != q) yr[ow] = q;
                   }
                 }
               });
}

template <class T>
void pool2x2_values_backward(const T* x, const T* y, const T* gy, T* gx, int64_t planes, int64_t H,
                             int64_t W, int64_t Ho, int64_t Wo) {
  parallel_for(0, planes * Ho, std::max<int64_t>(1, 16384 / std::max<int64_t>(Wo, 1)),
               [&](int64_t r0_, int64_t r1_) {
                 for (int64_t r = r0_; r < r1_; ++r) {
                   const int64_t pl = r / Ho, oh = r % Ho;
                   const T* __restrict a0 = x + pl * H * W + 2 * oh * W;
                   const T* __restrict a1 = a0 + W;
                   T* __restrict g0 = gx + pl * H * W + 2 * oh * W;
                   T* __restrict g1 = g0 + W;
                   const T* __restrict yr = y + r * Wo;
                   const T* __restrict gr = gy + r * Wo;
                   for (int64_t ow = 0; ow < Wo; ++ow) {
                     const T m = yr[ow], v = gr[ow];
                     // Bitwise, not short-circuit, so the loop stays branch-free.
                     const bool ea = a0[2 * ow] == m, eb = a0[2 * ow + 1] == m,
                                ec = a1[2 * ow] == m;
                     const bool ta = ea, tb = eb & !ea, tc = ec & !(ea | eb);
                     const bool te = !(ea | eb | ec);  // NaN windows are fixed below
                     g0[2 * ow] = ta ? v : T(0);
                     g0[2 * ow + 1] = tb ? v : T(0);
                     g1[2 * ow] = tc ? v : T(0);
                     g1[2 * ow + 1] = te ? v : T(0);
                   }
                   for (int64_t ow = 0; ow < Wo; ++ow) {
                     if (yr[ow] == yr[ow]) continue;
                     T* slots[4] = {g0 + 2 * ow, g0 + 2 * ow + 1, g1 + 2 * ow, g1 + 2 * ow + 1};
                     const T vals[4] = {a0[2 * ow], a0[2 * ow + 1], a1[2 * ow], a1[2 * ow + 1]};
                     int last = 3;
                     for (int q = 0; q < 4; ++q) {
                       *slots[q] = T(0);
                       if (vals[q] != vals[q]) last = q;
                     }
                     *slots[last] = gr[ow];
                   }
                   for (int64_t w = 2 * Wo; w < W; ++w) g0[w] = g1[w] = T(0);  // odd width
                   if (oh == Ho - 1)
                     for (int64_t h = 2 * Ho; h < H; ++h)
                       std::fill(gx + pl * H * W + h * W, gx + pl * H * W + (h + 1) * W, T(0));
                 }
               });
}

// The matching backward row: every input element of the covered 2 x (2 Wo) block is written
// (the gradient or 0), so gx needs no zero-fill.
template <class T>
void pool2x2_row_backward(const T* __restrict gy, const int64_t* __restrict idx, T* __restrict g0,
                          T* __restrict g1, int64_t Wo, int64_t base, int64_t W) {
  for (int64_t ow = 0; ow < Wo; ++ow) {
    const int64_t at = idx[ow] - base - 2 * ow;  // 0, 1, W or W + 1
    const T v = gy[ow];
    g0[2 * ow] = at == 0 ? v : T(0);
    g0[2 * ow + 1] = at == 1 ? v : T(0);
    g1[2 * ow] = at == W ? v : T(0);
    g1[2 * ow + 1] = at == W + 1 ? v : T(0);
  }
}

template <class T>
void max_forward(const T* x, T* y, int64_t* idx, const PoolShape& s) {
  const int64_t HW = s.H * s.W, L = s.Ho * s.Wo;
  // The part of each window inside the input, by output row / column, computed once, so the
  // inner loop has no bounds tests and a branch-free (cmov) running max.
  auto clip = [](int64_t start, int64_t k, int64_t d, int64_t n) {
    int64_t lo = 0, hi = k;
    while (lo < hi && start + lo * d < 0) ++lo;
    while (hi > lo && start + (hi - 1) * d >= n) --hi;
    return std::pair<int64_t, int64_t>(lo, hi);
  };
  std::vector<std::pair<int64_t, int64_t>> rows(static_cast<size_t>(s.Ho)),
      cols(static_cast<size_t>(s.Wo));
  for (int64_t oh = 0; oh < s.Ho; ++oh) rows[oh] = clip(oh * s.s.h - s.p.h, s.k.h, s.d.h, s.H);
  for (int64_t ow = 0; ow < s.Wo; ++ow) cols[ow] = clip(ow * s.s.w - s.p.w, s.k.w, s.d.w, s.W);
  const bool k2s2 = is_k2s2(s);
  parallel_for(0, s.planes(), plane_grain(L * s.k.h * s.k.w), [&](int64_t p0, int64_t p1) {
    for (int64_t pl = p0; pl < p1; ++pl) {
      const T* xp = x + pl * HW;
      T* yp = y + pl * L;
      int64_t* ip = idx + pl * L;
      if (k2s2) {  // the common 2x2/2 pool: branch-free row kernels
        for (int64_t oh = 0; oh < s.Ho; ++oh) {
          pool2x2_row_forward(xp + 2 * oh * s.W, xp + (2 * oh + 1) * s.W, yp + oh * s.Wo,
                              ip + oh * s.Wo, s.Wo, 2 * oh * s.W, s.W);
        }
        continue;
      }
      for (int64_t oh = 0; oh < s.Ho; ++oh) {
        const int64_t hs = oh * s.s.h - s.p.h;
        const auto [i0, i1] = rows[oh];
        for (int64_t ow = 0; ow < s.Wo; ++ow) {
          const int64_t ws = ow * s.s.w - s.p.w;
          const auto [j0, j1] = cols[ow];
          T best = -std::numeric_limits<T>::infinity();
          int64_t bi = -1;
          if (i0 < i1 && j0 < j1) {
            bi = (hs + i0 * s.d.h) * s.W + ws + j0 * s.d.w;
            best = xp[bi];
          }
          for (int64_t i = i0; i < i1; ++i) {
            const int64_t row = (hs + i * s.d.h) * s.W;
            for (int64_t j = j0; j < j1; ++j) {
              const int64_t at = row + ws + j * s.d.w;
              const T v = xp[at];
              const bool take = v > best || v != v;  // NaN propagates, as PyTorch
              best = take ? v : best;
              bi = take ? at : bi;
            }
          }
          yp[oh * s.Wo + ow] = best;
          ip[oh * s.Wo + ow] = bi;
        }
      }
    }
  });
}

// gx must be zero-filled by the caller, except for the 2x2/2 pool (disjoint windows), whose
// backward writes every element of gx itself.
template <class T>
void max_backward(const T* gy, const int64_t* idx, T* gx, const PoolShape& s) {
  const int64_t HW = s.H * s.W, L = s.Ho * s.Wo;
  if (is_k2s2(s)) {
    const int64_t W = s.W, H = s.H, Ho = s.Ho, Wo = s.Wo;
    parallel_for(0, s.planes(), plane_grain(4 * L), [&](int64_t p0, int64_t p1) {
      for (int64_t pl = p0; pl < p1; ++pl) {
        T* g = gx + pl * HW;
        const T* gp = gy + pl * L;
        const int64_t* ip = idx + pl * L;
        for (int64_t oh = 0; oh < Ho; ++oh) {
          T* r0 = g + 2 * oh * W;
          T* r1 = r0 + W;
          pool2x2_row_backward(gp + oh * Wo, ip + oh * Wo, r0, r1, Wo, 2 * oh * W, W);
          for (int64_t w = 2 * Wo; w < W; ++w) r0[w] = r1[w] = T(0);  // odd width
        }
        for (int64_t h = 2 * Ho; h < H; ++h) std::fill(g + h * W, g + (h + 1) * W, T(0));
      }
    });
    return;
  }
  parallel_for(0, s.planes(), plane_grain(L), [&](int64_t p0, int64_t p1) {
    for (int64_t pl = p0; pl < p1; ++pl)
      for (int64_t o = 0; o < L; ++o)
        if (idx[pl * L + o] >= 0) gx[pl * HW + idx[pl * L + o]] += gy[pl * L + o];
  });
}

// --- average -----------------------------------------------------------------------

// The window of output (oh, ow) clipped to the input, and its divisor.
struct AvgWindow {
  int64_t hs, he, ws, we;
  double div;
};

AvgWindow avg_window(const PoolShape& s, int64_t oh, int64_t ow, bool count_include_pad) {
  int64_t hs = oh * s.s.h - s.p.h, ws = ow * s.s.w - s.p.w;
  int64_t he = std::min(hs + s.k.h, s.H + s.p.h), we = std::min(ws + s.k.w, s.W + s.p.w);
  const int64_t pool = (he - hs) * (we - ws);
  hs = std::max<int64_t>(hs, 0);
  ws = std::max<int64_t>(ws, 0);
  he = std::min(he, s.H);
  we = std::min(we, s.W);
  const int64_t inside = std::max<int64_t>(he - hs, 0) * std::max<int64_t>(we - ws, 0);
  return {hs, he, ws, we, static_cast<double>(count_include_pad ? pool : inside)};
}

template <class T>
void avg_forward(const T* x, T* y, const PoolShape& s, bool cip) {
  const int64_t HW = s.H * s.W, L = s.Ho * s.Wo;
  parallel_for(0, s.planes(), plane_grain(L * s.k.h * s.k.w), [&](int64_t p0, int64_t p1) {
    for (int64_t pl = p0; pl < p1; ++pl) {
      const T* xp = x + pl * HW;
      for (int64_t oh = 0; oh < s.Ho; ++oh)
        for (int64_t ow = 0; ow < s.Wo; ++ow) {
          const AvgWindow w = avg_window(s, oh, ow, cip);
          T acc = 0;
          for (int64_t ih = w.hs; ih < w.he; ++ih)
            for (int64_t iw = w.ws; iw < w.we; ++iw) acc += xp[ih * s.W + iw];
          y[pl * L + oh * s.Wo + ow] = w.div > 0 ? acc / static_cast<T>(w.div) : T(0);
        }
    }
  });
}

template <class T>
void avg_backward(const T* gy, T* gx, const PoolShape& s, bool cip) {
  const int64_t HW = s.H * s.W, L = s.Ho * s.Wo;
  parallel_for(0, s.planes(), plane_grain(L * s.k.h * s.k.w), [&](int64_t p0, int64_t p1) {
    for (int64_t pl = p0; pl < p1; ++pl) {
      T* gp = gx + pl * HW;
      for (int64_t oh = 0; oh < s.Ho; ++oh)
        for (int64_t ow = 0; ow < s.Wo; ++ow) {
          const AvgWindow w = avg_window(s, oh, ow, cip);
          if (w.div <= 0) continue;
          const T g = gy[pl * L + oh * s.Wo + ow] / static_cast<T>(w.div);
          for (int64_t ih = w.hs; ih < w.he; ++ih)
            for (int64_t iw = w.ws; iw < w.we; ++iw) gp[ih * s.W + iw] += g;
        }
    }
  });
}

// --- adaptive average --------------------------------------------------------------

int64_t start_index(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
int64_t end_index(int64_t o, int64_t in, int64_t out) { return ((o + 1) * in + out - 1) / out; }

template <class T, bool Backward>
void adaptive_kernel(const T* src, T* dst, const PoolShape& s) {
  const int64_t HW = s.H * s.W, L = s.Ho * s.Wo;
  parallel_for(0, s.planes(), plane_grain(HW), [&](int64_t p0, int64_t p1) {
    for (int64_t pl = p0; pl < p1; ++pl)
      for (int64_t oh = 0; oh < s.Ho; ++oh) {
        const int64_t hs = start_index(oh, s.H, s.Ho), he = end_index(oh, s.H, s.Ho);
        for (int64_t ow = 0; ow < s.Wo; ++ow) {
          const int64_t ws = start_index(ow, s.W, s.Wo), we = end_index(ow, s.W, s.Wo);
          const T count = static_cast<T>((he - hs) * (we - ws));
          if constexpr (Backward) {
            const T g = src[pl * L + oh * s.Wo + ow] / count;
            for (int64_t ih = hs; ih < he; ++ih)
              for (int64_t iw = ws; iw < we; ++iw) dst[pl * HW + ih * s.W + iw] += g;
          } else {
            T acc = 0;
            for (int64_t ih = hs; ih < he; ++ih)
              for (int64_t iw = ws; iw < we; ++iw) acc += src[pl * HW + ih * s.W + iw];
            dst[pl * L + oh * s.Wo + ow] = acc / count;
          }
        }
      }
  });
}

// --- CUDA ----------------------------------------------------------------------------

backend::cuda::PoolParams cuda_params(const PoolShape& s) { return {s.k, s.s, s.p, s.d}; }

Tensor cuda_input_grad(const Tensor& g, const PoolShape& s, DType dt, MemoryFormat fmt,
                       Tensor& gy) {
  gy = g.dtype() == dt ? g : g.to(dt);
  return empty({s.N, s.C, s.H, s.W}, fmt, TensorOptions(dt).with_device(g.device()));
}

// Max pooling of a CUDA tensor: output and indices in x's format; `flat` indices are the
// int64 h * W + w of max_pool2d_with_indices, otherwise one byte per output inside its window
// (when the window has fewer than 255 elements).
std::pair<Tensor, Tensor> max_pool_cuda(const Tensor& x, const PoolShape& s, bool flat) {
  const DType dt = x.dtype();
  const MemoryFormat fmt = x.suggest_memory_format();
  const backend::cuda::PoolParams p = cuda_params(s);
  const bool local = !flat && s.k.h * s.k.w < 255;
  Tensor y = empty({s.N, s.C, s.Ho, s.Wo}, fmt, x.options());
  Tensor idx = empty({s.N, s.C, s.Ho, s.Wo}, fmt,
                     TensorOptions(local ? DType::u8 : DType::i64).with_device(x.device()));
  backend::cuda::max_pool2d_forward(y, idx, x.detach(), p);
  autograd::record("max_pool2d", {x}, flat ? std::vector<Tensor>{y, idx} : std::vector<Tensor>{y},
                   [idx, s, p, dt, fmt](const std::vector<Tensor>& g) {
                     Tensor gy;
                     Tensor gx = cuda_input_grad(g[0], s, dt, fmt, gy);
                     backend::cuda::max_pool2d_backward(gx, gy, idx, p);
                     return std::vector<Tensor>{gx};
                   });
  return {y, flat ? idx : Tensor()};
}

Tensor avg_pool_cuda(const Tensor& x, const PoolShape& s, bool cip) {
  const DType dt = x.dtype();
  const MemoryFormat fmt = x.suggest_memory_format();
  const backend::cuda::PoolParams p = cuda_params(s);
  Tensor y = empty({s.N, s.C, s.Ho, s.Wo}, fmt, x.options());
  backend::cuda::avg_pool2d_forward(y, x.detach(), p, cip);
  autograd::record("avg_pool2d", {x}, {y}, [s, p, dt, fmt, cip](const std::vector<Tensor>& g) {
    Tensor gy;
    Tensor gx = cuda_input_grad(g[0], s, dt, fmt, gy);
    backend::cuda::avg_pool2d_backward(gx, gy, p, cip);
    return std::vector<Tensor>{gx};
  });
  return y;
}

Tensor adaptive_avg_pool_cuda(const Tensor& x, const PoolShape& s) {
  const DType dt = x.dtype();
  const MemoryFormat fmt = x.suggest_memory_format();
  Tensor y = empty({s.N, s.C, s.Ho, s.Wo}, fmt, x.options());
  backend::cuda::adaptive_avg_pool2d_forward(y, x.detach());
  autograd::record("adaptive_avg_pool2d", {x}, {y}, [s, dt, fmt](const std::vector<Tensor>& g) {
    Tensor gy;
    Tensor gx = cuda_input_grad(g[0], s, dt, fmt, gy);
    backend::cuda::adaptive_avg_pool2d_backward(gx, gy);
    return std::vector<Tensor>{gx};
  });
  return y;
}

enum class Kind { Avg, Adaptive };

// Shared backward of the average pools: gy -> gx in the input's dtype and format.
Tensor avg_like_backward(Kind kind, const Tensor& gy0, const PoolShape& s, bool cip, DType dt,
                         MemoryFormat fmt) {
  const DType ct = compute_type(dt);
  Tensor gy = prepared(gy0, ct);
  Tensor gx = zeros({s.N, s.C, s.H, s.W}, TensorOptions(ct));
  dispatch_compute(ct, "avg_pool2d_backward", [&]<class T>() {
    const T* g = static_cast<const T*>(gy.data_ptr());
    T* o = static_cast<T*>(gx.data_ptr());
    if (kind == Kind::Avg)
      avg_backward<T>(g, o, s, cip);
    else
      adaptive_kernel<T, true>(g, o, s);
  });
  return finish(gx, dt, fmt);
}

// --- oneDNN --------------------------------------------------------------------------

// True when the dense f32/bf16 tensor holds a NaN (a read-only pass, split over the pool).
bool has_nan(const Tensor& t) {
  std::atomic<bool> found{false};
  const int64_t n = t.numel();
  auto scan = [&]<class U>(const U* p, auto is_nan) {
    parallel_for(0, n, 1 << 16, [&](int64_t b, int64_t e) {
      bool any = false;
      for (int64_t i = b; i < e; ++i) any |= is_nan(p[i]);
      if (any) found = true;
    });
  };
  if (t.dtype() == DType::f32)
    scan(static_cast<const float*>(t.data_ptr()), [](float v) { return v != v; });
  else
    scan(static_cast<const uint16_t*>(t.data_ptr()),
         [](uint16_t v) { return (v & 0x7fff) > 0x7f80; });
  return found;
}

backend::cpu::DnnlPoolShape dnnl_shape(const PoolShape& s, MemoryFormat fmt) {
  return {s.N,
          s.C,
          s.H,
          s.W,
          s.Ho,
          s.Wo,
          s.k.h,
          s.k.w,
          s.s.h,
          s.s.w,
          s.p.h,
          s.p.w,
          fmt == MemoryFormat::ChannelsLast};
}

// Pooling through oneDNN, or an undefined tensor when it does not take this case.
Tensor pool_dnnl(const char* op, const Tensor& x, const PoolShape& s, backend::cpu::DnnlPool kind) {
  using backend::cpu::DnnlPool;
  if (!backend::cpu::dnnl_available() || s.d != Int2(1)) return Tensor();
  if (x.dtype() != DType::f32 && x.dtype() != DType::bf16) return Tensor();
  // bf16 with overlapping windows: an input's gradient is a sum over the windows that hold it,
  // which must be accumulated in float and rounded to bf16 once (PyTorch's opmath rule, the own
  // kernels). oneDNN's AVX-512 bf16 backward rounds each partial sum to bf16 (1-2 ulps off;
  // its AVX2 path goes through f32), so those pools run oneDNN's f32 primitives on f32 copies
  // in the same layout (the forward too: the backward takes its workspace) and round the output
  // and the gradient once. That costs four conversions; the own kernels cost more (an NCHW f32
  // copy each way: ResNet-50's bf16 channels-last step 6 % slower). Windows that do not overlap
  // give every input at most one term, which oneDNN's bf16 kernels round once as well.
  const DType dt = x.dtype();
  const DType pdt = dt == DType::bf16 && (s.k.h > s.s.h || s.k.w > s.s.w) ? DType::f32 : dt;
  const MemoryFormat fmt = x.suggest_memory_format();
  const backend::cpu::DnnlPoolShape d = dnnl_shape(s, fmt);
  if (!backend::cpu::dnnl_pool2d_supported(d, kind, pdt)) return Tensor();
  const Tensor xc = x.detach().to(pdt).contiguous(fmt);
  if (kind == DnnlPool::Max && has_nan(xc)) return Tensor();
  Tensor y, ws;
  if (!backend::cpu::dnnl_pool2d_forward(xc, d, kind, y, ws)) return Tensor();
  if (pdt != dt) y = y.to(dt).contiguous(fmt);
  autograd::record(op, {x}, {y}, [d, kind, ws, dt, pdt, fmt](const std::vector<Tensor>& g) {
    const Tensor gy = g[0].to(pdt).contiguous(fmt);
    Tensor gx;
    DLTRAIN_CHECK(backend::cpu::dnnl_pool2d_backward(gy, d, kind, ws, gx),
                  "pooling backward: oneDNN took the forward but has no backward for input [", d.N,
                  ", ", d.C, ", ", d.H, ", ", d.W, "]; DLTRAIN_DNNL=0 uses the built-in path");
    if (pdt != dt) gx = gx.to(dt).contiguous(fmt);
    return std::vector<Tensor>{gx};
  });
  return y;
}

// oneDNN divides include-pad averages by the whole kernel; dltrain (as PyTorch) by the window
// clipped to input + padding. They agree when no window reaches past the padding.
bool windows_inside_padding(const PoolShape& s) {
  return (s.Ho - 1) * s.s.h + s.k.h <= s.H + 2 * s.p.h &&
         (s.Wo - 1) * s.s.w + s.k.w <= s.W + 2 * s.p.w;
}

}  // namespace

namespace {

std::pair<Tensor, Tensor> max_pool2d_with_indices_impl(const Tensor& x, Int2 kernel,
                                                       std::optional<Int2> stride, Int2 padding,
                                                       Int2 dilation, bool ceil_mode) {
  DLTRAIN_OP_SCOPE("max_pool2d_with_indices", x);
  if (x.defined() && x.dim() == 3) {
    auto [y, i] =
        max_pool2d_with_indices(x.unsqueeze(0), kernel, stride, padding, dilation, ceil_mode);
    return {y.squeeze(0), i.squeeze(0)};
  }
  const PoolShape s = window_shape("max_pool2d", x, kernel, stride, padding, dilation, ceil_mode);
  if (x.device().is_cuda()) return max_pool_cuda(x, s, true);
  const DType dt = x.dtype(), ct = compute_type(dt);
  const MemoryFormat fmt = x.suggest_memory_format();
  Tensor xc = prepared(x, ct);
  Tensor y = empty({s.N, s.C, s.Ho, s.Wo}, TensorOptions(ct));
  Tensor idx = empty({s.N, s.C, s.Ho, s.Wo}, TensorOptions(DType::i64));
  dispatch_compute(ct, "max_pool2d", [&]<class T>() {
    max_forward<T>(static_cast<const T*>(xc.data_ptr()), static_cast<T*>(y.data_ptr()),
                   static_cast<int64_t*>(idx.data_ptr()), s);
  });
  y = finish(y, dt, fmt);
  Tensor idx_out = finish(idx, DType::i64, fmt);
  autograd::record("max_pool2d", {x}, {y, idx_out},
                   [idx, s, dt, fmt](const std::vector<Tensor>& g) {
                     const DType ct = compute_type(dt);
                     Tensor gy = prepared(g[0], ct);
                     Tensor gx = is_k2s2(s) ? empty({s.N, s.C, s.H, s.W}, TensorOptions(ct))
                                            : zeros({s.N, s.C, s.H, s.W}, TensorOptions(ct));
                     dispatch_compute(ct, "max_pool2d_backward", [&]<class T>() {
                       max_backward<T>(static_cast<const T*>(gy.data_ptr()),
                                       static_cast<const int64_t*>(idx.data_ptr()),
                                       static_cast<T*>(gx.data_ptr()), s);
                     });
                     return std::vector<Tensor>{finish(gx, dt, fmt)};
                   });
  return {y, idx_out};
}

Tensor max_pool2d_impl(const Tensor& x, Int2 kernel, std::optional<Int2> stride, Int2 padding,
                       Int2 dilation, bool ceil_mode) {
  DLTRAIN_OP_SCOPE("max_pool2d", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record(
          {x},
          {{"kernel", detail::graph_pair(kernel)},
           {"stride", detail::graph_pair(stride.value_or(kernel))},
           {"padding", detail::graph_pair(padding)},
           {"dilation", detail::graph_pair(dilation)},
           {"ceil_mode", ceil_mode}},
          [&] { return max_pool2d_impl(x, kernel, stride, padding, dilation, ceil_mode); });
    });
  if (!x.defined() || x.dim() != 4)
    return max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode).first;
  const PoolShape s = window_shape("max_pool2d", x, kernel, stride, padding, dilation, ceil_mode);
  if (x.device().is_cuda()) return max_pool_cuda(x, s, false).first;
  if (Tensor y = pool_dnnl("max_pool2d", x, s, backend::cpu::DnnlPool::Max); y.defined()) return y;
  if (!is_k2s2(s))
    return max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode).first;
  const DType dt = x.dtype(), ct = compute_type(dt);
  const MemoryFormat fmt = x.suggest_memory_format();
  Tensor xc = prepared(x, ct);
  Tensor yc = empty({s.N, s.C, s.Ho, s.Wo}, TensorOptions(ct));
  dispatch_compute(ct, "max_pool2d", [&]<class T>() {
    pool2x2_values<T>(static_cast<const T*>(xc.data_ptr()), static_cast<T*>(yc.data_ptr()),
                      s.planes(), s.H, s.W, s.Ho, s.Wo);
  });
  Tensor y = finish(yc, dt, fmt);
  // The backward needs the input and the maxima (both usually alive anyway: the input is the
  // previous activation, the output the next layer's input), not an index tensor.
  autograd::record("max_pool2d", {x}, {y},
                   [xc = x.requires_grad() ? xc : Tensor(), yc = yc.detach(), s, dt,
                    fmt](const std::vector<Tensor>& g) {
                     const DType ct = compute_type(dt);
                     Tensor gy = prepared(g[0], ct);
                     Tensor gx = empty({s.N, s.C, s.H, s.W}, TensorOptions(ct));
                     dispatch_compute(ct, "max_pool2d_backward", [&]<class T>() {
                       pool2x2_values_backward<T>(static_cast<const T*>(xc.data_ptr()),
                                                  static_cast<const T*>(yc.data_ptr()),
                                                  static_cast<const T*>(gy.data_ptr()),
                                                  static_cast<T*>(gx.data_ptr()), s.planes(), s.H,
                                                  s.W, s.Ho, s.Wo);
                     });
                     return std::vector<Tensor>{finish(gx, dt, fmt)};
                   });
  return y;
}

Tensor avg_pool2d_impl(const Tensor& x, Int2 kernel, std::optional<Int2> stride, Int2 padding,
                       bool ceil_mode, bool count_include_pad) {
  DLTRAIN_OP_SCOPE("avg_pool2d", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x},
                                  {{"kernel", detail::graph_pair(kernel)},
                                   {"stride", detail::graph_pair(stride.value_or(kernel))},
                                   {"padding", detail::graph_pair(padding)},
                                   {"ceil_mode", ceil_mode},
                                   {"count_include_pad", count_include_pad}},
                                  [&] {
                                    return avg_pool2d_impl(x, kernel, stride, padding, ceil_mode,
                                                           count_include_pad);
                                  });
    });
  if (x.defined() && x.dim() == 3)
    return avg_pool2d(x.unsqueeze(0), kernel, stride, padding, ceil_mode, count_include_pad)
        .squeeze(0);
  const PoolShape s = window_shape("avg_pool2d", x, kernel, stride, padding, 1, ceil_mode);
  if (x.device().is_cuda()) return avg_pool_cuda(x, s, count_include_pad);
  if (!count_include_pad || windows_inside_padding(s)) {
    const auto kind = count_include_pad ? backend::cpu::DnnlPool::AvgIncludePad
                                        : backend::cpu::DnnlPool::AvgExcludePad;
    if (Tensor y = pool_dnnl("avg_pool2d", x, s, kind); y.defined()) return y;
  }
  const DType dt = x.dtype(), ct = compute_type(dt);
  const MemoryFormat fmt = x.suggest_memory_format();
  Tensor xc = prepared(x, ct);
  Tensor y = empty({s.N, s.C, s.Ho, s.Wo}, TensorOptions(ct));
  dispatch_compute(ct, "avg_pool2d", [&]<class T>() {
    avg_forward<T>(static_cast<const T*>(xc.data_ptr()), static_cast<T*>(y.data_ptr()), s,
                   count_include_pad);
  });
  y = finish(y, dt, fmt);
  autograd::record("avg_pool2d", {x}, {y},
                   [s, dt, fmt, count_include_pad](const std::vector<Tensor>& g) {
                     return std::vector<Tensor>{
                         avg_like_backward(Kind::Avg, g[0], s, count_include_pad, dt, fmt)};
                   });
  return y;
}

Tensor adaptive_avg_pool2d_impl(const Tensor& x, Int2 output_size) {
  DLTRAIN_OP_SCOPE("adaptive_avg_pool2d", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"output_size", detail::graph_pair(output_size)}},
                                  [&] { return adaptive_avg_pool2d_impl(x, output_size); });
    });
  if (x.defined() && x.dim() == 3)
    return adaptive_avg_pool2d(x.unsqueeze(0), output_size).squeeze(0);
  check_input("adaptive_avg_pool2d", x);
  DLTRAIN_CHECK(output_size.h > 0 && output_size.w > 0, "adaptive_avg_pool2d: output_size (",
                output_size.h, ", ", output_size.w, ") must be positive");
  DLTRAIN_CHECK(x.size(2) > 0 && x.size(3) > 0, "adaptive_avg_pool2d: input ", shape_str(x.shape()),
                " has an empty spatial dim");
  const PoolShape s{x.size(0),     x.size(1), x.size(2), x.size(3), output_size.h,
                    output_size.w, 1,         1,         0,         1};
  if (x.device().is_cuda()) return adaptive_avg_pool_cuda(x, s);
  if (s.H % s.Ho == 0 && s.W % s.Wo == 0) {  // a plain average pool: kernel = stride = In / Out
    const PoolShape a{
        s.N, s.C, s.H, s.W, s.Ho, s.Wo, Int2(s.H / s.Ho, s.W / s.Wo), Int2(s.H / s.Ho, s.W / s.Wo),
        0,   1};
    if (Tensor y = pool_dnnl("adaptive_avg_pool2d", x, a, backend::cpu::DnnlPool::AvgExcludePad);
        y.defined())
      return y;
  }
  const DType dt = x.dtype(), ct = compute_type(dt);
  const MemoryFormat fmt = x.suggest_memory_format();
  Tensor xc = prepared(x, ct);
  Tensor y = empty({s.N, s.C, s.Ho, s.Wo}, TensorOptions(ct));
  dispatch_compute(ct, "adaptive_avg_pool2d", [&]<class T>() {
    adaptive_kernel<T, false>(static_cast<const T*>(xc.data_ptr()), static_cast<T*>(y.data_ptr()),
                              s);
  });
  y = finish(y, dt, fmt);
  autograd::record("adaptive_avg_pool2d", {x}, {y}, [s, dt, fmt](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{avg_like_backward(Kind::Adaptive, g[0], s, false, dt, fmt)};
  });
  return y;
}

}  // namespace

// The public pools: the implementations above, plus the adjoint that makes their (linear)
// backward differentiable under create_graph: average pooling's is the pool itself; max
// pooling's gathers at the argmax positions (recomputed from the input when the kernel path
// kept none). A 3-d input is pooled as a batch of one by a nested call, which sets it.
namespace {
Tensor gather_at(const Tensor& gg, const Tensor& idx) {
  const Tensor i = idx.to(gg.device()).reshape({idx.size(0), idx.size(1), -1});
  return gather(gg.reshape({gg.size(0), gg.size(1), -1}), 2, i).reshape(idx.shape());
}
bool batched(const Tensor& x) { return x.defined() && x.dim() == 4; }
}  // namespace

std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& x, Int2 kernel,
                                                  std::optional<Int2> stride, Int2 padding,
                                                  Int2 dilation, bool ceil_mode) {
  auto [y, idx] = max_pool2d_with_indices_impl(x, kernel, stride, padding, dilation, ceil_mode);
  if (batched(x))
    autograd::set_adjoint(y, [idx = idx.detach()](const std::vector<Tensor>& gg) {
      return std::vector<Tensor>{gather_at(gg[0], idx), Tensor()};
    });
  return {y, idx};
}

Tensor max_pool2d(const Tensor& x, Int2 kernel, std::optional<Int2> stride, Int2 padding,
                  Int2 dilation, bool ceil_mode) {
  Tensor y = max_pool2d_impl(x, kernel, stride, padding, dilation, ceil_mode);
  // The with-indices path (a node of two outputs) has its adjoint already.
  if (!batched(x) || !y.grad_fn() || y.grad_fn()->num_outputs() != 1) return y;
  autograd::set_adjoint(y, [xd = x.detach(), kernel, stride, padding, dilation,
                            ceil_mode](const std::vector<Tensor>& gg) {
    Tensor idx;
    {
      NoGradGuard ng;
      idx = max_pool2d_with_indices_impl(xd, kernel, stride, padding, dilation, ceil_mode).second;
    }
    return std::vector<Tensor>{gather_at(gg[0], idx)};
  });
  return y;
}

Tensor avg_pool2d(const Tensor& x, Int2 kernel, std::optional<Int2> stride, Int2 padding,
                  bool ceil_mode, bool count_include_pad) {
  Tensor y = avg_pool2d_impl(x, kernel, stride, padding, ceil_mode, count_include_pad);
  if (batched(x))
    autograd::set_adjoint(y, [=](const std::vector<Tensor>& gg) {
      return std::vector<Tensor>{
          avg_pool2d(gg[0], kernel, stride, padding, ceil_mode, count_include_pad)};
    });
  return y;
}

Tensor adaptive_avg_pool2d(const Tensor& x, Int2 output_size) {
  Tensor y = adaptive_avg_pool2d_impl(x, output_size);
  if (batched(x))
    autograd::set_adjoint(y, [output_size](const std::vector<Tensor>& gg) {
      return std::vector<Tensor>{adaptive_avg_pool2d(gg[0], output_size)};
    });
  return y;
}

}  // namespace dltrain
