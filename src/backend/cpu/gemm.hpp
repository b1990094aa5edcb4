// Dense matrix kernels for the CPU backend (internal header): a strided GEMM on
// Eigen split across the thread pool, and the im2col / col2im transforms that
// turn a 2-d convolution into GEMMs.
//
// Invariants: a Mat is a strided view, element (i, j) at data[i*rs + j*cs];
// gemm accepts only views that are row-major (cs == 1, rs >= cols) or
// column-major (rs == 1, cs >= rows) after normalise(); anything else must be
// copied by the caller. Kernels are instantiated for float and double only
// (16-bit floats are upcast by the ops). gemm called from inside a
// parallel_for chunk runs on the calling thread, so callers may parallelise
// over images or batches and still call it.
#pragma once

#include <cstdint>
#include <optional>

namespace dltrain::backend::cpu {

/// A strided matrix view: element (i, j) lives at data[i * rs + j * cs].
template <class T>
struct Mat {
  T* data = nullptr;
  int64_t rows = 0, cols = 0, rs = 0, cs = 0;
  /// The transposed view (no copy).
  Mat t() const { return {data, cols, rows, cs, rs}; }
  /// The rows x cols block starting at (r0, c0).
  Mat block(int64_t r0, int64_t c0, int64_t nr, int64_t nc) const {
    return {data + r0 * rs + c0 * cs, nr, nc, rs, cs};
  }
};

/// The view with strides canonicalised so that gemm can map it (size-1 dims get the
/// natural stride), or nullopt when it is neither row- nor column-major.
template <class T>
std::optional<Mat<T>> normalise(Mat<T> m) {
  Mat<T> r = m;  // row-major candidate
  if (r.cols <= 1) r.cs = 1;
  if (r.rows <= 1) r.rs = r.cols > 1 ? r.cols : 1;
  if (r.cs == 1 && r.rs >= r.cols) return r;
  Mat<T> c = m;  // column-major candidate
  if (c.rows <= 1) c.rs = 1;
  if (c.cols <= 1) c.cs = c.rows > 1 ? c.rows : 1;
  if (c.rs == 1 && c.cs >= c.rows) return c;
  return std::nullopt;
}

/// C = A * B + beta * C on the calling thread (beta == 0 ignores C's old contents).
template <class T>
void gemm_serial(Mat<const T> a, Mat<const T> b, Mat<T> c, T beta);

/// C = A * B + beta * C, with C split into row or column blocks across the pool.
template <class T>
void gemm(Mat<const T> a, Mat<const T> b, Mat<T> c, T beta);

/// Geometry of one 2-d convolution window sweep over a [C, H, W] image.
struct ConvGeom {
  int64_t C, H, W;  // input planes and size
  int64_t kh, kw;   // kernel
  int64_t sh, sw;   // stride
  int64_t ph, pw;   // padding
  int64_t dh, dw;   // dilation
  int64_t Ho, Wo;   // output size
};

/// col[(c*kh + i)*kw + j, oh*Wo + ow] = x[c, oh*sh - ph + i*dh, ow*sw - pw + j*dw] (0 outside);
/// x is a contiguous [C, H, W] image. Only output rows oh in [oh0, oh1) are produced: col is a
/// row-major [C*kh*kw, (oh1-oh0)*Wo] block whose rows are `ld` elements apart, so that images
/// can sit side by side in one buffer and a conv can be cut into cache-sized row chunks.
template <class T>
void im2col(const T* x, const ConvGeom& g, T* col, int64_t ld, int64_t oh0, int64_t oh1);

/// The adjoint of im2col over the same rows: accumulates col back into x (x must be
/// initialised, usually to 0).
template <class T>
void col2im(const T* col, const ConvGeom& g, T* x, int64_t ld, int64_t oh0, int64_t oh1);

}  // namespace dltrain::backend::cpu
