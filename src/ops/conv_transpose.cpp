// conv_transpose2d: the transposed convolution, built from conv2d's own halves; conv1d, a
// conv2d on a height-1 view.
//
// A transposed convolution with weight [C_in, C_out/groups, kh, kw] is exactly the input
// gradient of the conv2d that maps [N, C_out, Ho, Wo] to [N, C_in, H, W] with the same weight,
// stride, padding, dilation and groups. So forward is that conv2d's input gradient
// (detail::conv2d_input_grad: cuDNN backward-data on CUDA, oneDNN backward-data or col2im on the
// CPU), the input gradient is that conv2d's forward, and the weight gradient is its weight
// gradient with the roles of input and output gradient swapped. Every backend conv2d has is
// reused; the output takes conv2d's layout rule (channels-last when the input or the weight
// is). output_padding only adds rows/columns that no input reaches when it is smaller than the
// stride; PyTorch also allows it up to the dilation, and then the conv2d that inverts the
// shape does not exist, so that case computes the unpadded transposed convolution and
// cuts/extends it (padding ranges are views, the extension is zeros).
#include <algorithm>
#include <sstream>

#include "dltrain/autograd/node.hpp"
#include "dltrain/ops/conv.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/reduction.hpp"
#include "dltrain/ops/shape.hpp"
#include "src/core/trace.hpp"
#include "src/ops/common.hpp"
#include "src/ops/conv_impl.hpp"

namespace dltrain {

namespace {

// (A stream, not "(" + std::to_string(...): GCC 12 gives a false -Wrestrict on that.)
std::string int2_str(Int2 v) {
  std::ostringstream os;
  os << '(' << v.h << ", " << v.w << ')';
  return os.str();
}

// y [N, C, Hf, Wf] cut to rows [ph, ph + Ho) and columns [pw, pw + Wo), zeros past its end.
Tensor cut_or_extend(const Tensor& y, int64_t dim, int64_t start, int64_t len) {
  const int64_t have = std::min(len, y.size(dim) - start);
  Tensor out = y.narrow(dim, start, have);
  if (have == len) return out;
  Shape zs = y.shape();
  zs[static_cast<size_t>(dim)] = len - have;
  return cat({out, zeros(zs, y.options())}, dim);
}

}  // namespace

Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Int2 stride,
                        Int2 padding, Int2 output_padding, int64_t groups, Int2 dilation) {
  DLTRAIN_OP_SCOPE("conv_transpose2d", x, weight, bias);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x, weight, bias},
                                  {{"stride", detail::graph_pair(stride)},
                                   {"padding", detail::graph_pair(padding)},
                                   {"output_padding", detail::graph_pair(output_padding)},
                                   {"dilation", detail::graph_pair(dilation)},
                                   {"groups", groups}},
                                  [&] {
                                    return conv_transpose2d(x, weight, bias, stride, padding,
                                                            output_padding, groups, dilation);
                                  });
    });
  if (auto ac = amp::detail::autocast_args(amp::Op::conv_transpose2d, {&x, &weight, &bias}))
    return conv_transpose2d((*ac)[0], (*ac)[1], (*ac)[2], stride, padding, output_padding, groups,
                            dilation);
  detail::check_defined("conv_transpose2d", x, "input");
  detail::check_defined("conv_transpose2d", weight, "weight");
  detail::check_same_device("conv_transpose2d", {&x, &weight, &bias});
  DLTRAIN_CHECK(x.dim() == 4, "conv_transpose2d: expected a 4-d input [N, C, H, W] but got shape ",
                shape_str(x.shape()), "; add a batch dim with unsqueeze(0)");
  DLTRAIN_CHECK(weight.dim() == 4,
                "conv_transpose2d: expected a 4-d weight [C_in, C_out/groups, kH, kW] but got ",
                shape_str(weight.shape()));
  DLTRAIN_CHECK(is_floating(x.dtype()) && x.dtype() == weight.dtype() &&
                    (!bias.defined() || bias.dtype() == x.dtype()),
                "conv_transpose2d: input, weight and bias must share one floating dtype but got ",
                x.dtype(), ", ", weight.dtype(), bias.defined() ? ", " : "",
                bias.defined() ? dtype_name(bias.dtype()) : "", "; convert them with .to(dtype)");
  DLTRAIN_CHECK(groups >= 1, "conv_transpose2d: groups must be >= 1 but got ", groups);
  DLTRAIN_CHECK(stride.h > 0 && stride.w > 0 && dilation.h > 0 && dilation.w > 0 &&
                    padding.h >= 0 && padding.w >= 0 && output_padding.h >= 0 &&
                    output_padding.w >= 0,
                "conv_transpose2d: stride ", int2_str(stride), " and dilation ", int2_str(dilation),
                " must be positive, padding ", int2_str(padding), " and output_padding ",
                int2_str(output_padding), " non-negative");
  DLTRAIN_CHECK((output_padding.h < stride.h || output_padding.h < dilation.h) &&
                    (output_padding.w < stride.w || output_padding.w < dilation.w),
                "conv_transpose2d: output_padding ", int2_str(output_padding),
                " must be smaller than either stride ", int2_str(stride), " or dilation ",
                int2_str(dilation),
                " in each dim; it only picks among the output sizes that "
                "stride makes ambiguous");
  const int64_t N = x.size(0), Cin = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t kh = weight.size(2), kw = weight.size(3), Cout = weight.size(1) * groups;
  DLTRAIN_CHECK(
      weight.size(0) == Cin && Cin % groups == 0, "conv_transpose2d: input ", shape_str(x.shape()),
      " has ", Cin, " channels but weight ", shape_str(weight.shape()),
      " is [C_in, C_out/groups, kH, kW] with C_in = ", weight.size(0), " (groups=", groups,
      ", which must divide C_in); note the transposed layout: a "
      "conv2d weight [C_out, C_in/groups, kH, kW] is the other way round");
  DLTRAIN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == Cout),
                "conv_transpose2d: bias must be [", Cout, "] (weight.size(1) * groups) but got ",
                bias.defined() ? shape_str(bias.shape()) : std::string());
  DLTRAIN_CHECK(kh > 0 && kw > 0, "conv_transpose2d: weight ", shape_str(weight.shape()),
                " has an empty kernel");
  const int64_t Ho =
      (H - 1) * stride.h - 2 * padding.h + dilation.h * (kh - 1) + output_padding.h + 1;
  const int64_t Wo =
      (W - 1) * stride.w - 2 * padding.w + dilation.w * (kw - 1) + output_padding.w + 1;
  DLTRAIN_CHECK(H > 0 && W > 0 && Ho > 0 && Wo > 0, "conv_transpose2d: input ",
                shape_str(x.shape()), " with weight ", shape_str(weight.shape()), ", stride ",
                int2_str(stride), " and padding ", int2_str(padding), " gives an empty output (",
                Ho, " x ", Wo, "); reduce the padding");
  // The output's format by conv2d's rule (channels-last when x or the weight is); gradients
  // in their operand's own format.
  const MemoryFormat fmt = detail::conv_memory_format(x, weight), x_fmt = x.suggest_memory_format();

  if (output_padding.h >= stride.h || output_padding.w >= stride.w) {
    // No conv2d maps [Ho, Wo] back to [H, W] (see the file comment): cut the unpadded result.
    Tensor full = conv_transpose2d(x, weight, Tensor(), stride, 0, 0, groups, dilation);
    Tensor y = cut_or_extend(cut_or_extend(full, 2, padding.h, Ho), 3, padding.w, Wo);
    if (bias.defined()) y = add(y, bias.view({1, Cout, 1, 1}));
    return y.contiguous(fmt);
  }

  // The conv2d whose input gradient this is: [N, Cout, Ho, Wo] -> [N, Cin, H, W].
  const detail::ConvGeometry g{N, Cout, Ho,     Wo,     Cin,     kh,      kw,
                               H, W,    groups, stride, padding, dilation};
  Tensor y;
  {
    NoGradGuard ng;
    y = detail::conv2d_input_grad(x, weight, g, fmt);
    if (bias.defined()) {
      y = add(y, bias.detach().view({1, Cout, 1, 1}));
      if (y.suggest_memory_format() != fmt) y = y.contiguous(fmt);
    }
  }
  const bool rx = x.requires_grad(), rw = weight.requires_grad(),
             rb = bias.defined() && bias.requires_grad();
  autograd::record(
      "conv_transpose2d", {x, weight, bias}, {y},
      [xs = rw ? x.detach() : Tensor(), ws = rx ? weight.detach() : Tensor(), g, x_fmt,
       w_fmt = weight.suggest_memory_format(), rx, rw, rb,
       xh = rw ? autograd::SavedInput(x, x) : autograd::SavedInput(),
       wh = rx ? autograd::SavedInput(weight, weight)
               : autograd::SavedInput()](const std::vector<Tensor>& grads) {
        const Tensor& gy = grads[0];
        if (autograd::grad_mode_enabled()) {  // create_graph: differentiable ops
          Tensor gx, gw, gb;
          if (rx)
            gx = conv2d(gy.to(ws.dtype()), wh.get(), Tensor(), g.stride, g.pad, g.dil, g.groups);
          if (rw) gw = detail::conv2d_weight_grad_op(gy, xh.get(), g, w_fmt);
          if (rb) gb = sum(gy, {0, 2, 3});
          return std::vector<Tensor>{gx, gw, gb};
        }
        NoGradGuard ng;
        Tensor gx, gw, gb;
        if (rx) {
          gx = conv2d(gy.to(ws.dtype()), ws, Tensor(), g.stride, g.pad, g.dil, g.groups);
          if (gx.suggest_memory_format() != x_fmt) gx = gx.contiguous(x_fmt);
        }
        if (rw) gw = detail::conv2d_weight_grad(gy.to(xs.dtype()), xs, g, w_fmt);
        if (rb) gb = sum(gy, {0, 2, 3});
        return std::vector<Tensor>{gx, gw, gb};
      },
      autograd::HigherOrder::Supported);
  return y;
}

Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride,
              int64_t padding, int64_t dilation, int64_t groups) {
  DLTRAIN_OP_SCOPE("conv1d", x, weight, bias);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record(
          {x, weight, bias},
          {{"stride", stride}, {"padding", padding}, {"dilation", dilation}, {"groups", groups}},
          [&] { return conv1d(x, weight, bias, stride, padding, dilation, groups); });
    });
  detail::check_defined("conv1d", x, "input");
  detail::check_defined("conv1d", weight, "weight");
  DLTRAIN_CHECK(x.dim() == 3, "conv1d: expected a 3-d input [N, C, L] but got shape ",
                shape_str(x.shape()), "; add a batch dim with unsqueeze(0)");
  DLTRAIN_CHECK(weight.dim() == 3, "conv1d: expected a 3-d weight [C_out, C_in/groups, k] but got ",
                shape_str(weight.shape()));
  return conv2d(x.unsqueeze(2), weight.unsqueeze(2), bias, Int2(1, stride), Int2(0, padding),
                Int2(1, dilation), groups)
      .squeeze(2);
}

}  // namespace dltrain
