// CUDA entry points of the elementwise family: copy/convert, unary, binary, gradient
// helpers, comparisons, where and the fused in-place ternaries (internal header, no CUDA
// types; kernels in kernels/copy.cu and kernels/elementwise_*.cu, refusals
// from entry.hpp). Callers (src/ops) check shapes, devices and dtypes, convert the
// inputs to the computing dtype and allocate the outputs; these functions only compute,
// on the current stream of out's device, never synchronising the host.
//
// Shared invariants: every tensor is on one CUDA device; inputs broadcast to out's shape
// and may have any strides (out may alias an input elementwise, as the in-place ops do);
// inputs have out's dtype except where a function says otherwise. 16-bit floats compute
// in float, everything else in itself, with the CPU backend's formulas.
#pragma once

#include "dltrain/core/tensor.hpp"
#include "src/backend/cuda/entry.hpp"
#include "src/ops/elementwise_ops.hpp"

namespace dltrain::backend::cuda {

/// dst[...] = convert(src[...]): src broadcast to dst's shape, any strides and dtypes, both
/// on the same CUDA device.
DLTRAIN_CUDA_ENTRY(void, copy, (const Tensor& dst, const Tensor& src), "copying a CUDA tensor");
/// dst[...] = convert<dst>(convert<src>(src[...] * scale)), the product in src's compute type
/// (float for 16-bit floats): copy_scaled_. Floating dtypes only.
DLTRAIN_CUDA_ENTRY(void, copy_scaled, (const Tensor& dst, const Tensor& src, double scale),
                   "copy_scaled_");

/// Floating unary maps and the fused gradient kernels: one list and one functor per op in
/// src/ops/elementwise_ops.hpp, shared with the CPU loops.
using ew::GradOp;
using ew::op_name;
using ew::UnaryOp;
/// out = op(x); x and out share a floating dtype.
DLTRAIN_CUDA_ENTRY(void, unary,
                   (UnaryOp op, const Tensor& out, const Tensor& x, double a = 0, double b = 0),
                   op_name(op));

/// Binary arithmetic. Add/Sub compute a + alpha * b and a - alpha * b (alpha converted to the
/// computing type, as on the CPU); Max/Min propagate a NaN; Add, Sub, Mul, Max and Min take
/// any numeric dtype, Div and Pow a floating one.
enum class BinaryOp { Add, Sub, Mul, Div, Max, Min, Pow };
constexpr const char* op_name(BinaryOp op) {
  constexpr const char* names[] = {"add", "sub", "mul", "div", "maximum", "minimum", "pow"};
  return names[static_cast<int>(op)];
}
/// out = op(a, b) with a, b and out of one dtype.
DLTRAIN_CUDA_ENTRY(void, binary,
                   (BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
                    double alpha = 1),
                   op_name(op));

/// Gradient helpers of the unary and extremum ops: out = f(g, v) where g is the incoming
/// gradient and v the saved input (or output) that DLTRAIN_GRAD_OPS names; floating dtypes.
DLTRAIN_CUDA_ENTRY(void, binary_grad,
                   (GradOp op, const Tensor& out, const Tensor& g, const Tensor& v, double a = 0,
                    double b = 0),
                   op_name(op));

/// Comparisons: out (bool) = a op b, compared in the computing type of a's dtype (any dtype,
/// bool included; a and b share it).
enum class CompareOp { Eq, Ne, Lt, Le, Gt, Ge };
DLTRAIN_CUDA_ENTRY(void, compare,
                   (CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b), "compare");

/// out = cond ? a : b, cond bool, a, b and out of one dtype (any).
DLTRAIN_CUDA_ENTRY(void, where,
                   (const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b),
                   "where");

/// out = s + value * t1 * t2 (Addcmul) or s + value * t1 / t2 (Addcdiv); any numeric dtype
/// shared by all four tensors.
enum class TernaryOp { Addcmul, Addcdiv };
DLTRAIN_CUDA_ENTRY(void, ternary,
                   (TernaryOp op, const Tensor& out, const Tensor& s, const Tensor& t1,
                    const Tensor& t2, double value),
                   op == TernaryOp::Addcmul ? "addcmul_" : "addcdiv_");

}  // namespace dltrain::backend::cuda
