// CRC32C (Castagnoli) and TensorFlow's masked form of it, which frame the records of
// TensorBoard event files (internal header: tensorboard.cpp defines them, no_tensorboard.cpp
// refuses them; tests/train/test_tensorboard.cpp checks them against the standard check value).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dltrain::train {

/// CRC32C of `size` bytes at `data` (polynomial 0x1EDC6F41, reflected, initial and final XOR
/// 0xFFFFFFFF).
uint32_t crc32c(const void* data, size_t size);
/// TensorFlow's masked CRC: rotate right by 15, plus 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace dltrain::train
