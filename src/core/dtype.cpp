// Names and promotion rules of dtypes.
#include "dltrain/core/dtype.hpp"

namespace dltrain {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "float32";
    case DType::f64:
      return "float64";
    case DType::f16:
      return "float16";
    case DType::bf16:
      return "bfloat16";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
    case DType::u8:
      return "uint8";
    case DType::b8:
      return "bool";
  }
  return "invalid";
}

namespace {
int rank(DType t) {
  switch (t) {
    case DType::b8:
      return 0;
    case DType::u8:
      return 1;
    case DType::i32:
      return 2;
    case DType::i64:
      return 3;
    case DType::f16:
      return 4;
    case DType::bf16:
      return 4;
    case DType::f32:
      return 5;
    case DType::f64:
      return 6;
  }
  return 0;
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if ((a == DType::f16 && b == DType::bf16) || (a == DType::bf16 && b == DType::f16))
    return DType::f32;
  return rank(a) >= rank(b) ? a : b;
}

}  // namespace dltrain
