// Broadcasting elementwise ops, comparisons and selection, each differentiable
// where it makes sense. Binary ops broadcast NumPy-style and promote dtypes
// (promote_types); a double scalar keeps the tensor's dtype (int tensors with
// a fractional scalar become float32). Inputs must share a device.
#pragma once

#include <optional>

#include "dltrain/core/tensor.hpp"

namespace dltrain {

/// a + alpha * b.
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);
/// a - alpha * b.
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
/// The scalar first: a + b, a - b (PyTorch's rsub), a * b, a / b.
Tensor add(double a, const Tensor& b);
Tensor sub(double a, const Tensor& b);
Tensor mul(double a, const Tensor& b);
Tensor div(double a, const Tensor& b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
/// Elementwise maximum / minimum (gradient goes to the larger / smaller; split on ties).
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor square(const Tensor& x);
/// x ** exponent.
Tensor pow(const Tensor& x, double exponent);
/// x ** y elementwise (broadcasting); x must be positive where d/dy is needed.
Tensor pow(const Tensor& x, const Tensor& y);
Tensor relu(const Tensor& x);
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
/// GELU; approximate = false uses erf, true the tanh form (as PyTorch's approximate="tanh").
Tensor gelu(const Tensor& x, bool approximate = false);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
/// x * sigmoid(x) (also called swish).
Tensor silu(const Tensor& x);
/// log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold (PyTorch's).
Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);
/// x for x > 0, alpha * (exp(x) - 1) otherwise.
Tensor elu(const Tensor& x, double alpha = 1.0);
/// x * tanh(softplus(x)).
Tensor mish(const Tensor& x);
/// x * relu6(x + 3) / 6.
Tensor hardswish(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
/// Logarithms to base 2 and 10; under autocast they run in f32, as log.
Tensor log2(const Tensor& x);
Tensor log10(const Tensor& x);
/// log(1 + x), accurate for small x.
Tensor log1p(const Tensor& x);
/// exp(x) - 1, accurate for small x.
Tensor expm1(const Tensor& x);
/// -1, 0 or 1 (0 for NaN); the gradient is zero. Integer inputs give f32, as the other
/// floating unary ops.
Tensor sign(const Tensor& x);
/// Clamps into [min, max] with tensor bounds (either may be undefined, not both), all three
/// broadcasting: min(max(x, min), max) as PyTorch (max wins where min > max). The gradient goes
/// to x where min <= x <= max, to min where x < min, to max where the result is max.
Tensor clamp(const Tensor& x, const Tensor& min, const Tensor& max);
/// Clamps into [min, max]; either bound may be absent. Gradient is 1 inside, 0 outside.
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);

/// cond ? a : b elementwise, with broadcasting; cond is a bool (or u8) tensor.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
/// x with `value` where mask is true (mask broadcasts to x).
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

/// Comparisons: bool tensors, broadcasting, no gradient.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);
Tensor logical_not(const Tensor& x);
/// Elementwise logical and / or / xor of the operands' truth (non-zero), broadcasting, any
/// dtypes; the result is bool (bool with bool stays bool), no gradient.
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);

/// True when a and b have the same shape and all |a-b| <= atol + rtol*|b|.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);

// In-place updates (optimizers, gradient accumulation). They do not record autograd and
// refuse leaves that require grad while grad mode is on (use NoGradGuard).
/// self += alpha * other (other broadcasts to self).
Tensor& add_(Tensor& self, const Tensor& other, double alpha = 1.0);
Tensor& mul_(Tensor& self, const Tensor& other);
Tensor& mul_(Tensor& self, double v);
Tensor& add_(Tensor& self, double v);
/// self += value * t1 * t2
Tensor& addcmul_(Tensor& self, const Tensor& t1, const Tensor& t2, double value = 1.0);
/// self += value * t1 / t2
Tensor& addcdiv_(Tensor& self, const Tensor& t1, const Tensor& t2, double value = 1.0);
/// dst = src * scale converted to dst's dtype, in one pass over the data (src broadcasts to
/// dst; floating dtypes, one device). Equal bit for bit to `dst.copy_(mul(src, scale))`: the
/// product is computed and rounded in src's dtype (16-bit floats in f32) before the
/// conversion, so scaling down before a cast to f16 keeps large values finite. What DDP's
/// gradient_compression uses to divide by the world size while casting to 16 bits. Throws
/// dltrain::Error for non-floating dtypes, two devices, a shape that does not broadcast, or a
/// leaf that requires grad while grad mode is on.
Tensor& copy_scaled_(Tensor& dst, const Tensor& src, double scale);

/// max(self, 0) in place, with autograd: unlike the updates above it may change a tensor that
/// requires grad while grad mode is on (an activation: nn::ReLU({.inplace = true})), whose
/// history then continues through relu_. Refused for a leaf that requires grad, and for a
/// tensor whose memory another tensor shares (a view of it, or a copy an op saved), whose
/// history could not follow; an op that saved self for its backward raises there (the version
/// counter). Saves the memory of relu()'s output.
Tensor& relu_(Tensor& self);

}  // namespace dltrain
