// Philox-4x32-10 and the element draws of rand()/randn(), one definition for the CPU and the
// GPU (internal header; included by src/core and kernels/*.cu, host and device).
//
// Invariant: element i of a uniform or normal draw with (seed, base) is a pure function of
// (seed, base, i), computed in double by these functions on either device, so a tensor drawn
// on a GPU equals the CPU's draw from the same generator state (bit for bit in f32; in f64
// up to the last bit of the device's log/sin/cos for normals). Uniforms use counter
// base + i / 2, lanes (0, 1) or (2, 3); normals use counter base + i / 2 for a Box-Muller pair.
#pragma once

#include <math.h>  // ::log, ::sqrt, ::cos, ::sin: the overloads CUDA also provides on the device

#include <cstdint>

#include "src/core/hd.hpp"

namespace dltrain::philox {

struct Words {
  uint32_t w[4];
};

DLTRAIN_HD uint32_t mulhi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

/// The 10-round Philox-4x32 block for (counter, subsequence) under `key`.
DLTRAIN_HD Words philox4x32_10(uint64_t counter, uint64_t subsequence, uint64_t key) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(subsequence), c3 = static_cast<uint32_t>(subsequence >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = mulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = mulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

/// Uniform double in (0, 1] from two 32-bit words (53 bits).
DLTRAIN_HD double u01(uint32_t hi, uint32_t lo) {
  const uint64_t x = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
  return (static_cast<double>(x & ((1ull << 53) - 1)) + 1.0) / 9007199254740992.0;
}

/// Element i of uniform(low, high) in [low, high).
DLTRAIN_HD double uniform_at(uint64_t seed, uint64_t base, int64_t i, double low, double high) {
  const Words w = philox4x32_10(base + static_cast<uint64_t>(i) / 2, 0, seed);
  const int lane = static_cast<int>(i % 2) * 2;
  return low + (high - low) * (1.0 - u01(w.w[lane], w.w[lane + 1]));
}

/// Element i of normal(mean, std) (Box-Muller on the pair's four words).
DLTRAIN_HD double normal_at(uint64_t seed, uint64_t base, int64_t i, double mean, double std) {
  const Words w = philox4x32_10(base + static_cast<uint64_t>(i) / 2, 0, seed);
  const double r = ::sqrt(-2.0 * ::log(u01(w.w[0], w.w[1])));
  const double th = 6.283185307179586476925286766559 * u01(w.w[2], w.w[3]);
  return mean + std * (i % 2 == 0 ? r * ::cos(th) : r * ::sin(th));
}

}  // namespace dltrain::philox
