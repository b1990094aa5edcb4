// Strided GEMM on Eigen and the im2col / col2im transforms (see gemm.hpp).
//
// gemm_serial maps each operand with Eigen::Map in its own storage order and
// outer stride, so transposed and row-strided views are multiplied without a
// copy; a column-major C is handled by computing C^T = B^T A^T. gemm splits C
// into as many row or column blocks as there are threads (along its longer
// side, in multiples of 16) and runs one single-threaded Eigen product per
// block, except for float when oneDNN is built in: its sgemm (JIT AVX2 / AVX-512 kernels, the
// class of kernel PyTorch's CPU matmul runs) is 1.2-1.6x faster than Eigen's on the tall, thin
// products of MLPs and GNNs ([10^4, 64..192] x [64..192, 64] on 2 threads), so gemm hands the
// whole product to it; gemm_serial (called per image inside parallel regions by the
// convolutions) stays on Eigen. im2col / col2im have a contiguous fast path for stride-1 rows.
#include "src/backend/cpu/gemm.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

// GCC 12 flags Eigen's AVX-512 kernels (_mm256_undefined_pd in its own headers) with a false
// -Wmaybe-uninitialized at their inlining sites in this file.
// (Clang has no such warning and would warn about the unknown option: GCC only.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>

#include "dltrain/core/parallel.hpp"
#include "src/backend/cpu/dnnl.hpp"

namespace dltrain::backend::cpu {

namespace {

template <class T, int Order>
using ConstMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, 0,
                            Eigen::OuterStride<>>;
template <class T>
using RowMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0,
                          Eigen::OuterStride<>>;

template <class T, int Order>
ConstMap<T, Order> as_map(const Mat<const T>& m) {
  return ConstMap<T, Order>(m.data, m.rows, m.cols,
                            Eigen::OuterStride<>(Order == Eigen::RowMajor ? m.rs : m.cs));
}

template <class T, class A, class B>
void product(RowMap<T>& c, const A& a, const B& b, T beta) {
  if (beta == T(0)) {
    c.noalias() = a * b;
  } else {
    if (beta != T(1)) c *= beta;
    c.noalias() += a * b;
  }
}

constexpr int64_t kBlock = 16;

// C = A B + beta C by oneDNN's sgemm (row-major BLAS conventions); false when not taken.
template <class T>
bool gemm_dnnl(Mat<const T> a, Mat<const T> b, Mat<T> c, T beta) {
  if constexpr (!std::is_same_v<T, float>) {
    return false;
  } else {
    if (c.rows == 0 || c.cols == 0 || a.cols == 0) return false;
    const auto cn = normalise(c);
    if (!cn) return false;
    if (cn->cs != 1) {  // column-major C: C^T = B^T A^T into a row-major view
      const Mat<const T> at = a.t();
      a = b.t();
      b = at;
      c = cn->t();
    } else {
      c = *cn;
    }
    const auto an = normalise(a), bn = normalise(b);
    if (!an || !bn) return false;
    // A row-major operand is 'N' with its row stride as leading dimension; a column-major one
    // is the row-major transpose of its transpose: 'T' with its column stride.
    const bool ar = an->cs == 1, br = bn->cs == 1;
    return dnnl_gemm_f32(ar ? 'N' : 'T', br ? 'N' : 'T', c.rows, c.cols, a.cols, an->data,
                         ar ? an->rs : an->cs, bn->data, br ? bn->rs : bn->cs, beta, c.data, c.rs);
  }
}

}  // namespace

template <class T>
void gemm_serial(Mat<const T> a, Mat<const T> b, Mat<T> c, T beta) {
  if (c.rows == 0 || c.cols == 0) return;
  auto cn = normalise(c);
  if (cn->cs != 1) {  // column-major C: compute C^T = B^T A^T into a row-major view
    Mat<const T> at = a.t();
    a = b.t();
    b = at;
    c = cn->t();
  } else {
    c = *cn;
  }
  RowMap<T> cm(c.data, c.rows, c.cols, Eigen::OuterStride<>(c.rs));
  if (a.cols == 0) {
    if (beta == T(0))
      cm.setZero();
    else if (beta != T(1))
      cm *= beta;
    return;
  }
  const Mat<const T> an = *normalise(a), bn = *normalise(b);
  const bool ar = an.cs == 1, br = bn.cs == 1;
  if (ar && br)
    product(cm, as_map<T, Eigen::RowMajor>(an), as_map<T, Eigen::RowMajor>(bn), beta);
  else if (ar)
    product(cm, as_map<T, Eigen::RowMajor>(an), as_map<T, Eigen::ColMajor>(bn), beta);
  else if (br)
    product(cm, as_map<T, Eigen::ColMajor>(an), as_map<T, Eigen::RowMajor>(bn), beta);
  else
    product(cm, as_map<T, Eigen::ColMajor>(an), as_map<T, Eigen::ColMajor>(bn), beta);
}

template <class T>
void gemm(Mat<const T> a, Mat<const T> b, Mat<T> c, T beta) {
  const int64_t threads = get_num_threads();
  const double flops = 2.0 * static_cast<double>(c.rows) * c.cols * a.cols;
  if (!in_parallel_region() && flops >= 2e5 && gemm_dnnl(a, b, c, beta)) return;
  if (threads <= 1 || in_parallel_region() || flops < 2e5) {
    gemm_serial(a, b, c, beta);
    return;
  }
  const bool by_cols = c.cols >= c.rows;
  const int64_t extent = by_cols ? c.cols : c.rows;
  int64_t step = (extent + threads - 1) / threads;
  step = std::max<int64_t>(kBlock, (step + kBlock - 1) / kBlock * kBlock);
  const int64_t blocks = (extent + step - 1) / step;
  parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t s = blk * step, n = std::min(step, extent - s);
      if (by_cols)
        gemm_serial(a, b.block(0, s, b.rows, n), c.block(0, s, c.rows, n), beta);
      else
        gemm_serial(a.block(s, 0, n, a.cols), b, c.block(s, 0, n, c.cols), beta);
    }
  });
}

template <class T>
void im2col(const T* x, const ConvGeom& g, T* col, int64_t ld, int64_t oh0, int64_t oh1) {
  for (int64_t c = 0; c < g.C; ++c) {
    const T* plane = x + c * g.H * g.W;
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        T* dst = col + ((c * g.kh + i) * g.kw + j) * ld;
        const int64_t iw0 = j * g.dw - g.pw;
        // ow range where iw = ow*sw + iw0 lies in [0, W)
        const int64_t lo = iw0 >= 0 ? 0 : std::min(g.Wo, (-iw0 + g.sw - 1) / g.sw);
        const int64_t hi = std::max(lo, std::min(g.Wo, (g.W - iw0 + g.sw - 1) / g.sw));
        for (int64_t oh = oh0; oh < oh1; ++oh, dst += g.Wo) {
          const int64_t ih = oh * g.sh - g.ph + i * g.dh;
          if (ih < 0 || ih >= g.H) {
            std::fill(dst, dst + g.Wo, T(0));
            continue;
          }
          const T* src = plane + ih * g.W;
          std::fill(dst, dst + lo, T(0));
          if (g.sw == 1) {
            if (hi > lo) std::memcpy(dst + lo, src + lo + iw0, sizeof(T) * (hi - lo));
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) dst[ow] = src[ow * g.sw + iw0];
          }
          std::fill(dst + hi, dst + g.Wo, T(0));
        }
      }
    }
  }
}

template <class T>
void col2im(const T* col, const ConvGeom& g, T* x, int64_t ld, int64_t oh0, int64_t oh1) {
  for (int64_t c = 0; c < g.C; ++c) {
    T* plane = x + c * g.H * g.W;
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const T* src = col + ((c * g.kh + i) * g.kw + j) * ld;
        const int64_t iw0 = j * g.dw - g.pw;
        const int64_t lo = iw0 >= 0 ? 0 : std::min(g.Wo, (-iw0 + g.sw - 1) / g.sw);
        const int64_t hi = std::max(lo, std::min(g.Wo, (g.W - iw0 + g.sw - 1) / g.sw));
        for (int64_t oh = oh0; oh < oh1; ++oh, src += g.Wo) {
          const int64_t ih = oh * g.sh - g.ph + i * g.dh;
          if (ih < 0 || ih >= g.H) continue;
          T* dst = plane + ih * g.W;
          if (g.sw == 1) {
            T* d = dst + lo + iw0;
            const T* s1 = src + lo;
            for (int64_t k = 0; k < hi - lo; ++k) d[k] += s1[k];
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) dst[ow * g.sw + iw0] += src[ow];
          }
        }
      }
    }
  }
}

#define DLTRAIN_GEMM_INSTANTIATE(T)                                                  \
  template void gemm_serial<T>(Mat<const T>, Mat<const T>, Mat<T>, T);               \
  template void gemm<T>(Mat<const T>, Mat<const T>, Mat<T>, T);                      \
  template void im2col<T>(const T*, const ConvGeom&, T*, int64_t, int64_t, int64_t); \
  template void col2im<T>(const T*, const ConvGeom&, T*, int64_t, int64_t, int64_t);
DLTRAIN_GEMM_INSTANTIATE(float)
DLTRAIN_GEMM_INSTANTIATE(double)
#undef DLTRAIN_GEMM_INSTANTIATE

}  // namespace dltrain::backend::cpu

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
