// F16C and scalar loops for float <-> half arrays, chosen at run time (half_convert.hpp).
//
// Only the functions marked target("avx,f16c") contain AVX/F16C instructions; they are called
// only after CPUID said yes, so a portable build runs on any x86-64 (and
// other architectures compile the scalar loops alone). Tails shorter than 8 values take the
// scalar code, which gives the same bits.
#include "src/backend/cpu/half_convert.hpp"

#include <atomic>

#include "dltrain/backend/cpu.hpp"
#include "src/core/env_switch.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define DLTRAIN_F16C_LOOPS 1
#endif

namespace dltrain::backend::cpu {

namespace {

// CPUID leaf 1: ECX bit 29 F16C, bit 28 AVX, bit 27 OSXSAVE, and XCR0 says the OS saves the
// YMM state (bits 1-2). Read directly: clang before 16 has no "f16c" in __builtin_cpu_supports.
bool cpu_has_f16c() {
#ifdef DLTRAIN_F16C_LOOPS
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const bool f16c = (c >> 29) & 1U, avx = (c >> 28) & 1U, osxsave = (c >> 27) & 1U;
    if (!(f16c && avx && osxsave)) return false;
    unsigned lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0x6U) == 0x6U;
  }();
  return has;
#else
  return false;
#endif
}

std::atomic<bool>& f16c_flag() {
  static std::atomic<bool> on{detail::env_switch_on("DLTRAIN_F16C")};
  return on;
}

#ifdef DLTRAIN_F16C_LOOPS
// _MM_FROUND_TO_NEAREST_INT: round to nearest even regardless of MXCSR's rounding mode, as the
// scalar code does.
__attribute__((target("avx,f16c"))) int64_t f32_to_f16_f16c(const float* src, Half* dst, int64_t n,
                                                            float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  const bool mul = scale != 1.0f;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(src + i);
    if (mul) v = _mm256_mul_ps(v, s);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  return i;
}

__attribute__((target("avx,f16c"))) int64_t f16_to_f32_f16c(const Half* src, float* dst, int64_t n,
                                                            float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  const bool mul = scale != 1.0f;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    if (mul) v = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(v, s), _MM_FROUND_TO_NEAREST_INT));
    _mm256_storeu_ps(dst + i, v);
  }
  return i;
}
#endif

}  // namespace

bool f16c_active() { return cpu_has_f16c() && f16c_flag().load(std::memory_order_relaxed); }

void f32_to_f16_scalar(const float* src, Half* dst, int64_t n, float scale) {
  if (scale == 1.0f) {
    for (int64_t i = 0; i < n; ++i) dst[i].bits = Half::from_float(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i].bits = Half::from_float(src[i] * scale);
  }
}

void f16_to_f32_scalar(const Half* src, float* dst, int64_t n, float scale) {
  if (scale == 1.0f) {
    for (int64_t i = 0; i < n; ++i) dst[i] = Half::to_float(src[i].bits);
  } else {
    for (int64_t i = 0; i < n; ++i)
      dst[i] = Half::to_float(Half::from_float(Half::to_float(src[i].bits) * scale));
  }
}

void f32_to_f16(const float* src, Half* dst, int64_t n, float scale) {
  int64_t done = 0;
#ifdef DLTRAIN_F16C_LOOPS
  if (f16c_active()) done = f32_to_f16_f16c(src, dst, n, scale);
#endif
  f32_to_f16_scalar(src + done, dst + done, n - done, scale);
}

void f16_to_f32(const Half* src, float* dst, int64_t n, float scale) {
  int64_t done = 0;
#ifdef DLTRAIN_F16C_LOOPS
  if (f16c_active()) done = f16_to_f32_f16c(src, dst, n, scale);
#endif
  f16_to_f32_scalar(src + done, dst + done, n - done, scale);
}

}  // namespace dltrain::backend::cpu

namespace dltrain::cpu {
bool f16c_supported() { return backend::cpu::cpu_has_f16c(); }
bool f16c_enabled() { return backend::cpu::f16c_active(); }
void set_f16c_enabled(bool on) { backend::cpu::f16c_flag() = on; }
}  // namespace dltrain::cpu
