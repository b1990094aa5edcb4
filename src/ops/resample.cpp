// interpolate, pad, pixel_shuffle / pixel_unshuffle, composed from differentiable ops.
//
// Each op is a gather along one dim at a time (index_select) with host-computed indices, plus,
// for bilinear, a per-row/column blend with host-computed weights, so forward and backward
// run on every device index_select runs on (CPU loops; CUDA gather / atomic scatter-add) and
// the gradients are index_select's and mul's own. The index and weight tables follow
// PyTorch's formulas exactly (aten/src/ATen/native/UpSample.h: nearest in float, bilinear in
// double here, PyTorch's opmath type for f64), so results match torch to the last bits in f64.
// Cost: two to four passes over the tensor and a small host-to-device copy of the tables per
// call on CUDA; fused kernels (one pass, no tables) are the planned follow-up (issue 14).
// Outputs are brought back to the input's memory format (index_select returns NCHW).
#include "dltrain/ops/resample.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/indexing.hpp"
#include "dltrain/ops/shape.hpp"
#include "src/ops/common.hpp"

namespace dltrain {

namespace {

Tensor index_tensor(const std::vector<int64_t>& idx, Device dev) {
  return from_vector(idx).to(dev);
}

// PyTorch's nearest_idx: float arithmetic, identity and exact 2x fast paths.
std::vector<int64_t> nearest_indices(int64_t in, int64_t out, std::optional<double> scale) {
  std::vector<int64_t> idx(static_cast<size_t>(out));
  const float s = scale && *scale > 0 ? static_cast<float>(1.0 / *scale)
                                      : static_cast<float>(in) / static_cast<float>(out);
  for (int64_t o = 0; o < out; ++o) {
    int64_t i;
    if (out == in) {
      i = o;
    } else if (out == 2 * in) {
      i = o >> 1;
    } else {
      i = std::min(static_cast<int64_t>(std::floor(static_cast<float>(o) * s)), in - 1);
    }
    idx[static_cast<size_t>(o)] = i;
  }
  return idx;
}

struct LinearTable {
  std::vector<int64_t> i0, i1;
  std::vector<double> l0, l1;
};

// PyTorch's compute_source_index_and_lambda with area_pixel_compute_scale / _source_index.
LinearTable linear_table(int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  double ratio;
  if (align_corners) {
    ratio = out > 1 ? static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0.0;
  } else {
    ratio = scale && *scale > 0 ? 1.0 / *scale : static_cast<double>(in) / static_cast<double>(out);
  }
  LinearTable t;
  for (int64_t o = 0; o < out; ++o) {
    double src = align_corners ? ratio * static_cast<double>(o)
                               : ratio * (static_cast<double>(o) + 0.5) - 0.5;
    if (!align_corners && src < 0) src = 0;
    const int64_t i0 = static_cast<int64_t>(src);
    const int64_t i1 = i0 + (i0 < in - 1 ? 1 : 0);
    const double l1 = std::clamp(src - static_cast<double>(i0), 0.0, 1.0);
    t.i0.push_back(i0);
    t.i1.push_back(i1);
    t.l0.push_back(1.0 - l1);
    t.l1.push_back(l1);
  }
  return t;
}

// Linear interpolation of x along dim d (2 or 3 of a 4-d tensor) to `out` entries.
Tensor lerp_dim(const Tensor& x, int64_t d, int64_t out, bool align_corners,
                std::optional<double> scale) {
  const int64_t in = x.size(d);
  if (in == out) return x;  // PyTorch: identity weights
  const LinearTable t = linear_table(in, out, align_corners, scale);
  const DType wt = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Shape wshape = d == 2 ? Shape{out, 1} : Shape{out};
  const TensorOptions wo = TensorOptions(wt).with_device(x.device());
  const Tensor w0 = from_vector(t.l0, wshape).to(wo.dtype).to(x.device());
  const Tensor w1 = from_vector(t.l1, wshape).to(wo.dtype).to(x.device());
  const Tensor a = index_select(x, d, index_tensor(t.i0, x.device()));
  const Tensor b = index_select(x, d, index_tensor(t.i1, x.device()));
  return add(mul(a, w0), mul(b, w1));
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

}  // namespace

Tensor interpolate(const Tensor& x, const InterpolateOptions& o) {
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
  Tensor y = x;
  if (o.mode == InterpolateMode::Nearest) {
    if (Ho != H) y = index_select(y, 2, index_tensor(nearest_indices(H, Ho, sh), x.device()));
    if (Wo != W) y = index_select(y, 3, index_tensor(nearest_indices(W, Wo, sw), x.device()));
  } else {
    y = lerp_dim(lerp_dim(y, 2, Ho, o.align_corners, sh), 3, Wo, o.align_corners, sw);
    if (y.dtype() != x.dtype()) y = y.to(x.dtype());
  }
  if (y.impl() == x.impl()) y = y.clone(fmt);  // a fresh tensor, as PyTorch returns
  return y.suggest_memory_format() == fmt ? y : y.contiguous(fmt);
}

Tensor pad(const Tensor& x, const std::vector<int64_t>& p, PadMode mode, double value) {
  const char* op = "pad";
  detail::check_defined(op, x, "input");
  DLTRAIN_CHECK(p.size() % 2 == 0 && static_cast<int64_t>(p.size() / 2) <= x.dim(),
                "pad: the amounts ", pair_str(p),
                " must come in (before, after) pairs, one pair per padded dim starting from the "
                "last, at most ",
                x.dim(), " pairs for input ", shape_str(x.shape()));
  const MemoryFormat fmt = format_of(x);
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
