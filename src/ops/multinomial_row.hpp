// multinomial's per-row sampler, one definition for the CPU loop (src/ops/random_ops.cpp) and
// the CUDA kernel (kernels/random.cu), so both draw the same indices for the same generator
// state (internal header).
//
// Sample s of row r uses the uniform philox::uniform_at(seed, base, r * n + s): inverse-CDF
// search of u * (remaining mass) over the categories not taken yet (without replacement) or all
// (with replacement), accumulating in double. Without replacement, `taken` (K flags of the row)
// marks the chosen categories; the caller zero-fills it.
#pragma once

#include <cstdint>

#include "src/core/hd.hpp"
#include "src/core/philox.hpp"

namespace dltrain::sampling {

template <class T>
DLTRAIN_HD void multinomial_row(const T* p, int64_t sp, int64_t K, int64_t n, bool replacement,
                                uint64_t seed, uint64_t base, int64_t row, int64_t* out, int64_t so,
                                uint8_t* taken) {
  double total = 0;
  for (int64_t k = 0; k < K; ++k) total += static_cast<double>(p[k * sp]);
  for (int64_t s = 0; s < n; ++s) {
    const double u = philox::uniform_at(seed, base, row * n + s, 0.0, 1.0);
    const double target = u * total;
    double cum = 0;
    int64_t pick = -1, last = -1;
    for (int64_t k = 0; k < K; ++k) {
      if (!replacement && taken[k]) continue;
      const double w = static_cast<double>(p[k * sp]);
      if (w <= 0) continue;
      last = k;
      cum += w;
      if (cum > target) {
        pick = k;
        break;
      }
    }
    if (pick < 0) pick = last;  // rounding left u * total at the very end of the mass
    out[s * so] = pick;
    if (!replacement && pick >= 0) {
      taken[pick] = 1;
      total -= static_cast<double>(p[pick * sp]);
    }
  }
}

}  // namespace dltrain::sampling
