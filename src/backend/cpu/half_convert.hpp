// Bulk conversion between float and IEEE binary16 (Half) arrays (internal header).
//
// The library is built portable (no -march by default), so the F16C instructions
// (vcvtps2ph/vcvtph2ps, 8 values each) are used through functions compiled for them alone and
// chosen at run time (__builtin_cpu_supports), with Half's scalar code as the fallback. Both
// give the same bits for every input: round to nearest even, overflow to inf, subnormals
// exact, and NaN quieted with the top of its payload kept (half.hpp says how), so a result
// never depends on the machine it was computed on. DLTRAIN_F16C=0 in the environment or
// cpu::set_f16c_enabled(false) takes the scalar code (benchmarks, tests).
#pragma once

#include <cstdint>

#include "dltrain/core/half.hpp"

namespace dltrain::backend::cpu {

/// True when the bulk loops below use F16C now (the CPU has F16C and AVX, not switched off).
bool f16c_active();

/// dst[i] = Half(src[i] * scale) for i < n (no multiplication when scale is 1).
void f32_to_f16(const float* src, Half* dst, int64_t n, float scale = 1.0f);
/// dst[i] = float(src[i]) for i < n; with scale != 1, float(Half(float(src[i]) * scale)) (the
/// product rounded to half first, as f16 arithmetic does).
void f16_to_f32(const Half* src, float* dst, int64_t n, float scale = 1.0f);

/// The scalar loops, whatever the CPU (the reference the tests compare the F16C loops with).
void f32_to_f16_scalar(const float* src, Half* dst, int64_t n, float scale = 1.0f);
void f16_to_f32_scalar(const Half* src, float* dst, int64_t n, float scale = 1.0f);

}  // namespace dltrain::backend::cpu
