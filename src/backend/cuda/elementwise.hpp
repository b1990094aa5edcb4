// CUDA entry points of the elementwise family: copy/convert, unary, binary, gradient
// helpers, comparisons, where and the fused in-place ternaries (internal header, no CUDA
// types; kernels in kernels/copy.cu and kernels/elementwise_*.cu, stubs in
// stub_elementwise.cpp). Callers (src/ops) check shapes, devices and dtypes, convert the
// inputs to the computing dtype and allocate the outputs; these functions only compute,
// on the current stream of out's device, never synchronising the host.
//
// Shared invariants: every tensor is on one CUDA device; inputs broadcast to out's shape
// and may have any strides (out may alias an input elementwise, as the in-place ops do);
// inputs have out's dtype except where a function says otherwise. 16-bit floats compute
// in float, everything else in itself, with the CPU backend's formulas.
#pragma once

#include "dltrain/core/tensor.hpp"

namespace dltrain::backend::cuda {

/// dst[...] = convert(src[...]): src broadcast to dst's shape, any strides and dtypes, both
/// on the same CUDA device.
void copy(const Tensor& dst, const Tensor& src);
/// dst[...] = convert<dst>(convert<src>(src[...] * scale)), the product in src's compute type
/// (float for 16-bit floats): copy_scaled_. Floating dtypes only.
void copy_scaled(const Tensor& dst, const Tensor& src, double scale);

/// Floating unary maps. Parameters: LeakyRelu a = negative slope; Clamp [a, b] (infinite for
/// an absent bound); Pow a = exponent; Softplus a = beta, b = threshold; Elu a = alpha.
enum class UnaryOp {
  Neg,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Abs,
  Relu,
  LeakyRelu,
  GeluErf,
  GeluTanh,
  Sigmoid,
  Tanh,
  Clamp,
  Pow,
  Silu,
  Softplus,
  Elu,
  Mish,
  Hardswish,
  Sin,
  Cos,
  Log1p,
  Expm1,
  Sign
};
/// The op's public name ("relu", "gelu", ...), for error messages.
constexpr const char* op_name(UnaryOp op) {
  constexpr const char* names[] = {
      "neg",  "exp",  "log",       "sqrt", "rsqrt", "abs",   "relu",  "leaky_relu",
      "gelu", "gelu", "sigmoid",   "tanh", "clamp", "pow",   "silu",  "softplus",
      "elu",  "mish", "hardswish", "sin",  "cos",   "log1p", "expm1", "sign"};
  return names[static_cast<int>(op)];
}
/// out = op(x); x and out share a floating dtype.
void unary(UnaryOp op, const Tensor& out, const Tensor& x, double a = 0, double b = 0);

/// Binary arithmetic. Add/Sub compute a + alpha * b and a - alpha * b (alpha converted to the
/// computing type, as on the CPU); Max/Min propagate a NaN; Add, Sub, Mul, Max and Min take
/// any numeric dtype, Div and Pow a floating one.
enum class BinaryOp { Add, Sub, Mul, Div, Max, Min, Pow };
constexpr const char* op_name(BinaryOp op) {
  constexpr const char* names[] = {"add", "sub", "mul", "div", "maximum", "minimum", "pow"};
  return names[static_cast<int>(op)];
}
/// out = op(a, b) with a, b and out of one dtype.
void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, double alpha = 1);

/// Gradient helpers of the unary and extremum ops: out = f(g, v) where g is the incoming
/// gradient and v the saved input (or output) named below; floating dtypes only.
///   Relu: v = output; LeakyRelu: v = input, a = slope; GeluErf, GeluTanh, Abs: v = input;
///   Sigmoid, Tanh: v = output; Clamp: v = input, [a, b] the bounds;
///   MaxWeight / MinWeight: (g, v) are the operands (a, b) of maximum / minimum and the
///   result is a's share of the gradient: 1 where a wins, 0.5 on ties, 0 where b wins.
///   Silu, Mish, Hardswish: v = input; Softplus: v = input, a = beta, b = threshold;
///   Elu: v = input, a = alpha.
enum class GradOp {
  Relu,
  LeakyRelu,
  GeluErf,
  GeluTanh,
  Sigmoid,
  Tanh,
  Clamp,
  Abs,
  MaxWeight,
  MinWeight,
  Silu,
  Softplus,
  Elu,
  Mish,
  Hardswish
};
constexpr const char* op_name(GradOp op) {
  constexpr const char* names[] = {
      "relu_backward",     "leaky_relu_backward", "gelu_backward",     "gelu_backward",
      "sigmoid_backward",  "tanh_backward",       "clamp_backward",    "abs_backward",
      "extremum_backward", "extremum_backward",   "silu_backward",     "softplus_backward",
      "elu_backward",      "mish_backward",       "hardswish_backward"};
  return names[static_cast<int>(op)];
}
void binary_grad(GradOp op, const Tensor& out, const Tensor& g, const Tensor& v, double a = 0,
                 double b = 0);

/// Comparisons: out (bool) = a op b, compared in the computing type of a's dtype (any dtype,
/// bool included; a and b share it).
enum class CompareOp { Eq, Ne, Lt, Le, Gt, Ge };
void compare(CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b);

/// out = cond ? a : b, cond bool, a, b and out of one dtype (any).
void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);

/// out = s + value * t1 * t2 (Addcmul) or s + value * t1 / t2 (Addcdiv); any numeric dtype
/// shared by all four tensors.
enum class TernaryOp { Addcmul, Addcdiv };
void ternary(TernaryOp op, const Tensor& out, const Tensor& s, const Tensor& t1, const Tensor& t2,
             double value);

}  // namespace dltrain::backend::cuda
