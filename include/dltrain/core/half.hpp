// Storage types for 16-bit floats: IEEE binary16 (Half) and bfloat16 (BFloat16).
//
// Both are plain 16-bit containers converted to and from float with
// round-to-nearest-even; arithmetic on them happens in float (the CPU backend's
// accumulation type for both), which is also what CUDA kernels do.
//
// Half's conversions give exactly the bits of x86's F16C instructions (vcvtps2ph with
// round-to-nearest-even, vcvtph2ps), which the CPU backend's bulk conversions use where the
// CPU has them (src/backend/cpu/half_convert.hpp), so results never depend on the machine:
// overflow gives inf, subnormals are exact both ways, and a NaN stays a NaN of the same sign,
// made quiet, keeping the top of its payload (float -> half: bit 9 set and the payload's top
// 9 bits; half -> float: bit 22 set and the 10 payload bits on top), as IEEE 754 asks of a
// conversion. BFloat16 quiets NaNs the same way.
#pragma once

#include <cstdint>
#include <cstring>

namespace dltrain {

/// IEEE 754 binary16 value. Converts to/from float with round-to-nearest-even.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(from_float(f)) {}  // NOLINT: implicit like a built-in float type
  operator float() const { return to_float(bits); }

  static uint16_t from_float(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u)  // inf, or NaN: quiet, top payload bits kept (as F16C)
      return static_cast<uint16_t>(sign |
                                   (x > 0x7f800000u ? 0x7e00u | ((x >> 13) & 0x3ffu) : 0x7c00u));
    if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
    if (x < 0x38800000u) {                                               // subnormal or zero
      if (x < 0x33000000u) return static_cast<uint16_t>(sign);
      const uint32_t e = x >> 23;
      uint32_t m = (x & 0x7fffffu) | 0x800000u;
      const uint32_t shift = 126 - e;  // 14..24
      uint32_t r = m >> shift;
      const uint32_t rem = m & ((1u << shift) - 1);
      const uint32_t halfway = 1u << (shift - 1);
      if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
      return static_cast<uint16_t>(sign | r);
    }
    uint32_t r = ((x >> 13) - (112u << 10));
    const uint32_t rem = x & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  static float to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0) {
      if (m == 0) {
        x = sign;
      } else {
        e = 113;
        while (!(m & 0x400u)) {
          m <<= 1;
          --e;
        }
        x = sign | (e << 23) | ((m & 0x3ffu) << 13);
      }
    } else if (e == 31) {  // inf, or NaN: quiet, payload kept (as F16C)
      x = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u);
    } else {
      x = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    std::memcpy(&f, &x, 4);
    return f;
  }
};

/// bfloat16 value (the upper half of a float). Converts with round-to-nearest-even.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(from_float(f)) {}  // NOLINT: implicit like a built-in float type
  operator float() const {
    uint32_t x = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
  }
  static uint16_t from_float(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
    x += 0x7fffu + ((x >> 16) & 1u);
    return static_cast<uint16_t>(x >> 16);
  }
};

}  // namespace dltrain
