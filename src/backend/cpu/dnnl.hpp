// oneDNN (DNNL) convolution, batch norm and pooling on the CPU: the fast path for f32 and bf16
// in NCHW and channels-last (internal header; no oneDNN types).
//
// Implemented in dnnl.cpp when the library was built with oneDNN (DLTRAIN_DNNL), by
// dnnl_stub.cpp otherwise (dnnl_available() false; the ops keep their own kernels).
// Activations are passed to oneDNN in their own dense layout (nchw or nhwc), so a
// channels-last model never converts its activations; convolution weights are reordered to
// the layout oneDNN's kernel asks for (format "any"). Primitive descriptors and primitives are
// cached by dnnl.cpp per (operation, shapes, strides, dtypes, flags) — the role cuDNN's
// algorithm cache plays on the GPU — so a training step creates none after its first.
// Functions returning bool return false, having done nothing, when oneDNN has no
// implementation for that case (the caller then uses its own kernel).
#pragma once

#include <cstdint>

#include "dltrain/core/tensor.hpp"

namespace dltrain::backend::cpu {

/// Geometry of one 2-d convolution (torch's dilation: 1 = dense).
struct DnnlConvShape {
  int64_t N, Cin, H, W, Cout, kh, kw, Ho, Wo, groups;
  int64_t sh, sw, ph, pw, dh, dw;
};

/// True when oneDNN is built in and not switched off (DLTRAIN_DNNL=0 at run time).
bool dnnl_available();
/// oneDNN's version, e.g. "2.6.3" ("" without it).
const char* dnnl_version();
/// True when oneDNN takes a convolution of this dtype on this CPU (f32 always; bf16 where the
/// CPU has AVX-512 BF16 or AMX, as oneDNN reports).
bool dnnl_conv_supported(DType dt);

/// y = conv(x, w) + b in memory format `fmt` (the convolution's: detail::conv_memory_format;
/// x is brought to it, w is taken in its own layout; b may be undefined).
Tensor dnnl_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b,
                           const DnnlConvShape& s, MemoryFormat fmt);
/// The gradients asked for (non-null outputs) of the convolution computed in `fmt` (gy and x
/// are brought to it): gx in x's own format, gw in w's, gb [Cout]. x is read only for gw (its
/// shape, dtype and format otherwise), w only for gx (its shape, dtype and format otherwise).
void dnnl_conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& gy,
                          const DnnlConvShape& s, MemoryFormat fmt, Tensor* gx, Tensor* gw,
                          Tensor* gb);

/// Batch-norm training forward of x (dense nchw/nhwc or [N, C, ...] contiguous, f32 or bf16)
/// with f32 scale/shift [C]: y in x's layout and dtype, the batch mean and biased variance as
/// f32 [C] (what the backward takes).
bool dnnl_batch_norm_forward_training(const Tensor& x, const Tensor& scale, const Tensor& shift,
                                      double eps, Tensor& y, Tensor& mean, Tensor& var);
/// Its backward: gx in x's layout and dtype, gscale and gshift f32 [C]. gy must be laid out
/// like x (same dtype and strides).
bool dnnl_batch_norm_backward(const Tensor& x, const Tensor& gy, const Tensor& scale,
                              const Tensor& mean, const Tensor& var, double eps, Tensor& gx,
                              Tensor& gscale, Tensor& gshift);

/// Geometry and layout of one 2-d pooling (no dilation; the right/bottom padding follows from
/// the sizes and may exceed ph/pw in ceil mode). The layout is given, not read from strides:
/// a [N, C, 1, 1] gradient's strides do not say which one it is.
struct DnnlPoolShape {
  int64_t N, C, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw;
  bool channels_last;
};
enum class DnnlPool { Max, AvgIncludePad, AvgExcludePad };

/// True when oneDNN takes this pooling (forward and backward) for dtype dt.
bool dnnl_pool2d_supported(const DnnlPoolShape& s, DnnlPool kind, DType dt);
/// Pooling forward of x (f32 or bf16, dense in s's layout): y in that layout; for Max, `ws` gets
/// the workspace the backward needs (a u8 tensor of oneDNN's size). Taken only when the
/// backward is too.
bool dnnl_pool2d_forward(const Tensor& x, const DnnlPoolShape& s, DnnlPool kind, Tensor& y,
                         Tensor& ws);
/// Its backward: gx in s's layout and gy's dtype (gy dense in s's layout).
bool dnnl_pool2d_backward(const Tensor& gy, const DnnlPoolShape& s, DnnlPool kind, const Tensor& ws,
                          Tensor& gx);

/// C = op(A) op(B) + beta C for row-major float storage with BLAS conventions (transa / transb
/// 'N' or 'T', leading dimensions lda, ldb, ldc; C is not read when beta is 0), by oneDNN's
/// sgemm on get_num_threads() threads. False, having done nothing, without oneDNN, when it is
/// switched off, or when oneDNN refuses the arguments.
bool dnnl_gemm_f32(char transa, char transb, int64_t M, int64_t N, int64_t K, const float* A,
                   int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace dltrain::backend::cpu
