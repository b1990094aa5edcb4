// CUDA entry point of the random factories (internal header, no CUDA types; kernel in
// kernels/random.cu, stub in stub_random.cpp).
#pragma once

#include <cstdint>

#include "dltrain/core/tensor.hpp"

namespace dltrain::backend::cuda {

enum class RandomKind { Uniform, Normal };

/// Fills `out` (a contiguous floating tensor on a CUDA device) with the values rand/uniform
/// (Uniform: [a, b)) or randn/normal (Normal: mean a, std b) give on the CPU for the generator
/// state (seed, base): element i is philox::uniform_at / normal_at(seed, base, i, a, b),
/// rounded once to out's dtype (src/core/philox.hpp). No host synchronisation.
void random_fill(const Tensor& out, RandomKind kind, double a, double b, uint64_t seed,
                 uint64_t base);

}  // namespace dltrain::backend::cuda
