// oneDNN (DNNL) convolution on the CPU: the fast path for f32 and bf16 in NCHW and
// channels-last (internal header; no oneDNN types).
//
// Implemented in dnnl.cpp when the library was built with oneDNN (DLTRAIN_DNNL), by
// dnnl_stub.cpp otherwise (dnnl_available() false; the ops keep their im2col + Eigen path).
// Activations are passed to oneDNN in their own dense layout (nchw or nhwc), so a
// channels-last model never converts its activations; weights are reordered to the layout
// oneDNN's kernel asks for (format "any"). Primitives come from oneDNN's own primitive cache
// (keyed by shapes, strides and dtypes, the role cuDNN's algorithm cache plays on the GPU).
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

/// y = conv(x, w) + b in x's memory format (x, w dense NCHW/NHWC, b may be undefined).
Tensor dnnl_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b,
                           const DnnlConvShape& s);
/// The gradients asked for (non-null outputs): gx in x's format, gw in w's, gb [Cout].
void dnnl_conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& gy,
                          const DnnlConvShape& s, Tensor* gx, Tensor* gw, Tensor* gb);

}  // namespace dltrain::backend::cpu
