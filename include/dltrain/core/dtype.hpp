// Element types of tensors and the compile-time visitor that dispatches on them.
//
// Kernels are written once as a template over the element type and
// instantiated through dispatch_* below, never through hand-written switch
// blocks. Half and BFloat16 compute in float (acc_t), everything else in itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <type_traits>

#include "dltrain/core/error.hpp"
#include "dltrain/core/half.hpp"

namespace dltrain {

/// Element type of a tensor.
enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, u8, b8 };

/// Size of one element in bytes.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::u8:
    case DType::b8:
      return 1;
  }
  return 0;
}

/// Name as written in messages and files ("float32", "bfloat16", ...).
const char* dtype_name(DType t);
inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

/// True for f32, f64, f16, bf16.
constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

/// The dtype an op on `a` and `b` computes in (PyTorch's promotion lattice:
/// bool < integers < floating; within floating the wider wins, f16+bf16 -> f32).
DType promote_types(DType a, DType b);

/// C++ element type of each DType.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<Half> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<BFloat16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::b8;
};
template <class T>
inline constexpr DType dtype_v = dtype_of<T>::value;

/// Accumulation / compute type: float for 16-bit floats, the type itself otherwise.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

/// Calls `f.template operator()<T>()` with T the C++ type of a floating dtype.
/// Throws dltrain::Error naming `op` for non-floating dtypes.
template <class F>
decltype(auto) dispatch_floating(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32:
      return f.template operator()<float>();
    case DType::f64:
      return f.template operator()<double>();
    case DType::f16:
      return f.template operator()<Half>();
    case DType::bf16:
      return f.template operator()<BFloat16>();
    default:
      DLTRAIN_FAIL(
          op, ": expected a floating-point tensor (float32, float64, float16, bfloat16) but got ",
          dtype_name(t), "; convert it first with .to(DType::f32)");
  }
}

/// Like dispatch_floating, plus i32/i64/u8 (every type with arithmetic; bool excluded).
template <class F>
decltype(auto) dispatch_numeric(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::i32:
      return f.template operator()<int32_t>();
    case DType::i64:
      return f.template operator()<int64_t>();
    case DType::u8:
      return f.template operator()<uint8_t>();
    case DType::b8:
      DLTRAIN_FAIL(op,
                   ": arithmetic is not defined on bool tensors; convert with .to(DType::f32) or "
                   "use logical ops");
    default:
      return dispatch_floating(t, op, std::forward<F>(f));
  }
}

/// Every dtype, bool included.
template <class F>
decltype(auto) dispatch_all(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f.template operator()<float>();
    case DType::f64:
      return f.template operator()<double>();
    case DType::f16:
      return f.template operator()<Half>();
    case DType::bf16:
      return f.template operator()<BFloat16>();
    case DType::i32:
      return f.template operator()<int32_t>();
    case DType::i64:
      return f.template operator()<int64_t>();
    case DType::u8:
      return f.template operator()<uint8_t>();
    case DType::b8:
      return f.template operator()<bool>();
  }
  DLTRAIN_FAIL("dispatch_all: invalid dtype value ", static_cast<int>(t));
}

/// Integer index dtypes (i32/i64) only.
template <class F>
decltype(auto) dispatch_index(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::i32:
      return f.template operator()<int32_t>();
    case DType::i64:
      return f.template operator()<int64_t>();
    default:
      DLTRAIN_FAIL(op, ": expected an index tensor of dtype int64 or int32 but got ", dtype_name(t),
                   "; convert it with .to(DType::i64)");
  }
}

}  // namespace dltrain
