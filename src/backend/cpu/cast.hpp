// Scalar conversion between element types, going through float for 16-bit floats.
#pragma once

#include <type_traits>

#include "dltrain/core/dtype.hpp"

namespace dltrain::backend::cpu {

template <class To, class From>
inline To cast(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return To(static_cast<float>(v));
  } else if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>) {
    return static_cast<To>(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace dltrain::backend::cpu
