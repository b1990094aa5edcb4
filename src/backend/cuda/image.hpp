// CUDA entry point of the image input pipeline (internal header, no CUDA types; kernel in
// kernels/image.cu, refusals from entry.hpp).
#pragma once

#include <vector>

#include "dltrain/core/tensor.hpp"
#include "src/backend/cuda/entry.hpp"

namespace dltrain::backend::cuda {

/// out[n, c, h, w] = in[n, h, w, c] * scale[c] + shift[c]: `in` a u8 [N, H, W, C] batch on a
/// CUDA device (any strides), `out` f32/f16/bf16 [N, C, H, W] on the same device, NCHW or
/// channels-last. At most 64 channels.
DLTRAIN_CUDA_ENTRY(void, normalize_image,
                   (const Tensor& out, const Tensor& in, const std::vector<float>& scale,
                    const std::vector<float>& shift),
                   "normalising an image batch on a CUDA device");

}  // namespace dltrain::backend::cuda
