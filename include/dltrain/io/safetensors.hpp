// safetensors import/export: the format Hugging Face and PyTorch users exchange weights in.
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}) and then the tensors' raw little-endian, row-major
// bytes; offsets count from the end of the header. The writer stores tensors in
// StateDict order, pads the header with spaces to a multiple of 8 (so every tensor
// starts 8-byte aligned, as the reference implementation does) and replaces the
// destination atomically (write `path + ".tmp"`, then rename). The reader accepts only
// what the reference implementation accepts: a header that fits the file, valid JSON
// (UTF-8, no duplicate key in any object), known dtypes, byte sizes equal to numel * itemsize, and
// offsets that tile the data section exactly (no gaps, no overlaps, no trailing bytes). Anything
// else raises dltrain::Error naming the file, the tensor and the fix.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dltrain/core/state_dict.hpp"

namespace dltrain::io {

/// Description of one tensor of a safetensors file, read from its header only.
struct TensorInfo {
  std::string name;
  Shape shape;
  /// The dtype load_safetensors returns for this tensor (I8 and I16 widen to i32).
  DType dtype = DType::f32;
  /// The dtype string stored in the file ("F32", "BF16", "I8", ...).
  std::string file_dtype;
  /// Byte range [begin, end) relative to the start of the data section.
  uint64_t data_begin = 0;
  uint64_t data_end = 0;
};

/// Writes `sd` to `path` as safetensors, tensors in StateDict order, with optional
/// string metadata (stored under "__metadata__"; PyTorch tools expect {"format": "pt"}).
/// Tensors may live on any device and in any layout (channels-last, transposed, sliced
/// views): each is copied to the CPU and written row-major; requires_grad is dropped.
/// Every dltrain dtype is supported (f32 F32, f64 F64, f16 F16, bf16 BF16, i32 I32,
/// i64 I64, u8 U8, b8 BOOL). The file appears atomically: the data goes to
/// `path + ".tmp"`, is flushed to disk, and is renamed over `path`, so a crash never
/// leaves a half-written file under `path`. Throws dltrain::Error on an empty name or
/// the reserved name "__metadata__", a name or metadata string that is not valid UTF-8
/// (the header is JSON text), an undefined tensor, or an I/O failure (naming the file and
/// the OS error).
void save_safetensors(const std::string& path, const StateDict& sd,
                      const std::map<std::string, std::string>& metadata = {});

/// Reads every tensor of the safetensors file `path` into new contiguous CPU tensors, in
/// the order of their data in the file (for files written by save_safetensors, the
/// order they were saved in). F64 F32 F16 BF16 I64 I32 U8 BOOL load as the matching
/// dltrain dtype; I8 and I16 are widened (losslessly) to i32, since dltrain has no
/// 8/16-bit integer dtypes. Other dtypes (U16, U32, U64, F8_*) raise an error naming
/// the tensor. The file is validated strictly (see the file comment) before any tensor
/// is allocated; every error names the file, the tensor where one is involved, what is
/// wrong and how to fix it.
StateDict load_safetensors(const std::string& path);

/// The tensors of `path` (name, shape, dtype, byte range) in data order, from the header
/// alone: no tensor data is read. Validates the header exactly as load_safetensors does.
std::vector<TensorInfo> list_safetensors(const std::string& path);

/// The "__metadata__" map of `path` (empty when the file has none), from the header alone.
std::map<std::string, std::string> safetensors_metadata(const std::string& path);

}  // namespace dltrain::io
