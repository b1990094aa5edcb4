// Error bounds from the arithmetic for results accumulated in float and rounded once to their
// dtype (PyTorch's opmath rule for 16-bit tensors), so that a test states what any correct
// kernel must give on every CPU and ISA instead of what one machine gave.
//
// A result computed as f = a float sum of K terms t_i (each product or quotient itself rounded
// once) satisfies |f - e| <= K * u * sum |t_i| (u = 2^-24, first order; Higham, "Accuracy and
// Stability of Numerical Algorithms", 3.1), where e is the exact value of the same sum over the
// same (already rounded) inputs. Stored in dtype dt, it becomes g = round_dt(f). Then
//   |g - e| <= |g - f| + |f - e| <= |round_dt(e) - f| + |f - e| <= |round_dt(e) - e| + 2 slack,
// with slack >= |f - e|: g is e rounded once, up to the float error. A kernel that rounds its
// partial sums to bf16 is off by about 2^-9 of them, which is far beyond the slack.
#pragma once

#include <cmath>

#include "dltrain/dltrain.hpp"

namespace dltrain::testing {

/// The unit roundoff of f32.
inline constexpr double kFloatUnit = 0x1p-24;

/// max over elements of |got - exact| - |round_dt(exact) - exact| - 2 * slack: <= 0 when every
/// element of `got` (a dt result, any dtype) is `exact` (f64) rounded once to dt, up to `slack`
/// (a tensor broadcast against exact, or a number) for the float accumulation before it.
inline double beyond_rounding(const Tensor& got, const Tensor& exact, DType dt,
                              const Tensor& slack) {
  const Tensor e = exact.to(DType::f64);
  const Tensor err = abs(sub(got.to(DType::f64), e));
  const Tensor own = abs(sub(e.to(dt).to(DType::f64), e));
  return max(sub(sub(err, own), mul(slack.to(DType::f64), 2.0))).item<double>();
}

inline double beyond_rounding(const Tensor& got, const Tensor& exact, DType dt, double slack) {
  return beyond_rounding(got, exact, dt, full({}, slack, TensorOptions(DType::f64)));
}

}  // namespace dltrain::testing
