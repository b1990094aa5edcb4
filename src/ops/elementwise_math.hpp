// ew::math: float and double overloads of the math functions that the elementwise formulas
// use (internal header, host and device). On the host they are std::'s; compiled by nvcc for
// the device, CUDA's (float calls the f variants, so a float kernel never computes in double
// by accident). Also the GELU constants. Kept apart from elementwise_ops.hpp so that the
// kernels that need only the math (kernels/common.cuh includes it) do not recompile when an
// op is added.
#pragma once

#include <cmath>

namespace dltrain::ew {

namespace math {
#if defined(__CUDA_ARCH__)
#define DLTRAIN_EW_MATH(name, fname)                                    \
  __device__ __forceinline__ float name(float v) { return ::fname(v); } \
  __device__ __forceinline__ double name(double v) { return ::name(v); }
#else
#define DLTRAIN_EW_MATH(name, fname)                  \
  inline float name(float v) { return std::name(v); } \
  inline double name(double v) { return std::name(v); }
#endif
// The unary functions of <cmath> that elementwise formulas may use, all of them, so that a
// new op does not touch this header (every kernel includes it).
DLTRAIN_EW_MATH(exp, expf)
DLTRAIN_EW_MATH(exp2, exp2f)
DLTRAIN_EW_MATH(expm1, expm1f)
DLTRAIN_EW_MATH(log, logf)
DLTRAIN_EW_MATH(log2, log2f)
DLTRAIN_EW_MATH(log10, log10f)
DLTRAIN_EW_MATH(log1p, log1pf)
DLTRAIN_EW_MATH(sqrt, sqrtf)
DLTRAIN_EW_MATH(cbrt, cbrtf)
DLTRAIN_EW_MATH(fabs, fabsf)
DLTRAIN_EW_MATH(floor, floorf)
DLTRAIN_EW_MATH(ceil, ceilf)
DLTRAIN_EW_MATH(trunc, truncf)
DLTRAIN_EW_MATH(round, roundf)
DLTRAIN_EW_MATH(erf, erff)
DLTRAIN_EW_MATH(erfc, erfcf)
DLTRAIN_EW_MATH(lgamma, lgammaf)
DLTRAIN_EW_MATH(sin, sinf)
DLTRAIN_EW_MATH(cos, cosf)
DLTRAIN_EW_MATH(tan, tanf)
DLTRAIN_EW_MATH(asin, asinf)
DLTRAIN_EW_MATH(acos, acosf)
DLTRAIN_EW_MATH(atan, atanf)
DLTRAIN_EW_MATH(sinh, sinhf)
DLTRAIN_EW_MATH(cosh, coshf)
DLTRAIN_EW_MATH(tanh, tanhf)
DLTRAIN_EW_MATH(asinh, asinhf)
DLTRAIN_EW_MATH(acosh, acoshf)
DLTRAIN_EW_MATH(atanh, atanhf)
#undef DLTRAIN_EW_MATH
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float pow(float x, float y) { return ::powf(x, y); }
__device__ __forceinline__ double pow(double x, double y) { return ::pow(x, y); }
#else
inline float pow(float x, float y) { return std::pow(x, y); }
inline double pow(double x, double y) { return std::pow(x, y); }
#endif

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kSqrt2OverPi = 0.79788456080286535588;
}  // namespace math

}  // namespace dltrain::ew
