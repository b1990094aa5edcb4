// CUDA entry point of the random factories (internal header, no CUDA types; kernel in
// kernels/random.cu, refusals from entry.hpp).
#pragma once

#include <cstdint>

#include "dltrain/core/tensor.hpp"
#include "src/backend/cuda/entry.hpp"

namespace dltrain::backend::cuda {

enum class RandomKind { Uniform, Normal };

/// Fills `out` (a contiguous floating tensor on a CUDA device) with the values rand/uniform
/// (Uniform: [a, b)) or randn/normal (Normal: mean a, std b) give on the CPU for the generator
/// state (seed, base): element i is philox::uniform_at / normal_at(seed, base, i, a, b),
/// rounded once to out's dtype (src/core/philox.hpp). No host synchronisation.
DLTRAIN_CUDA_ENTRY(void, random_fill,
                   (const Tensor& out, RandomKind kind, double a, double b, uint64_t seed,
                    uint64_t base),
                   "drawing random numbers on a CUDA device");

/// multinomial: out [R, n] (contiguous i64) from probs [R, K] (floating, any strides), one
/// thread per row running src/ops/multinomial_row.hpp with the generator state (seed, base);
/// taken [R, K] (u8, zero-filled) is the without-replacement scratch (undefined with
/// replacement).
DLTRAIN_CUDA_ENTRY(void, multinomial,
                   (const Tensor& out, const Tensor& probs, bool replacement, uint64_t seed,
                    uint64_t base, const Tensor& taken),
                   "multinomial on a CUDA device");

}  // namespace dltrain::backend::cuda
