// Source indices and weights of interpolate (and pad's source indices), shared by the CPU kernels
// (src/ops/resample.cpp) and the CUDA kernels (kernels/resample.cu) so both pick the same taps
// (internal header).
//
// These are PyTorch's formulas (aten/src/ATen/native/UpSample.h): nearest in float
// arithmetic with its identity and exact-2x shortcuts; bilinear in double (PyTorch's opmath
// for f64; for f32 PyTorch computes the coordinate in float, which can move a weight by an
// ulp). `scale` is 1/scale_factor when the caller gave one, else <= 0 (then in/out is used).
#pragma once

#include <math.h>  // floorf, on the host and the device

#include <cstdint>

#include "src/core/hd.hpp"

namespace dltrain::resample {

/// Nearest: the input index read by output index o.
DLTRAIN_HD int64_t nearest_index(int64_t o, int64_t in, int64_t out, double scale) {
  if (out == in) return o;
  if (out == 2 * in) return o >> 1;
  const float s =
      scale > 0 ? static_cast<float>(scale) : static_cast<float>(in) / static_cast<float>(out);
  const int64_t i = static_cast<int64_t>(floorf(static_cast<float>(o) * s));
  return i < in - 1 ? i : in - 1;
}

/// The ratio bilinear multiplies output coordinates by.
DLTRAIN_HD double linear_ratio(int64_t in, int64_t out, bool align_corners, double scale) {
  if (align_corners)
    return out > 1 ? static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0.0;
  return scale > 0 ? scale : static_cast<double>(in) / static_cast<double>(out);
}

/// Bilinear: the two input indices output index o blends and the weight l1 of the second
/// (the first gets 1 - l1). Same sizes: the identity (i0 = i1 = o, l1 = 0).
DLTRAIN_HD void linear_taps(int64_t o, int64_t in, int64_t out, bool align_corners, double ratio,
                            int64_t& i0, int64_t& i1, double& l1) {
  if (in == out) {
    i0 = i1 = o;
    l1 = 0;
    return;
  }
  double src =
      align_corners ? ratio * static_cast<double>(o) : ratio * (static_cast<double>(o) + 0.5) - 0.5;
  if (!align_corners && src < 0) src = 0;
  i0 = static_cast<int64_t>(src);
  i1 = i0 + (i0 < in - 1 ? 1 : 0);
  l1 = src - static_cast<double>(i0);
  l1 = l1 < 0 ? 0 : (l1 > 1 ? 1 : l1);
}

/// pad: the input index output index o reads along a dim of size n padded by `before` in front:
/// reflect mirrors without repeating the edge (before, after < n), replicate clamps (n > 0).
DLTRAIN_HD int64_t pad_index(int64_t o, int64_t n, int64_t before, bool reflect) {
  const int64_t i = o - before;
  if (reflect) return i < 0 ? -i : (i >= n ? 2 * (n - 1) - i : i);
  return i < 0 ? 0 : (i >= n ? n - 1 : i);
}

}  // namespace dltrain::resample
