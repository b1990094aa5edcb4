// Device: where a tensor's storage lives (CPU memory or one CUDA device).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace dltrain {

/// Kind of device.
enum class DeviceType : uint8_t { CPU, CUDA };

/// A device: CPU, or CUDA device `index`. Comparable, printable ("cpu", "cuda:0").
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

/// Memory layout of a 4-d NCHW tensor. ChannelsLast keeps the logical NCHW shape
/// and orders strides as N, H, W, C (C fastest), as PyTorch does.
enum class MemoryFormat : uint8_t { Contiguous, ChannelsLast, Preserve };

}  // namespace dltrain
