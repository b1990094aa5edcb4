// IDX files (the format of MNIST and Fashion-MNIST): read and write.
//
// An IDX file is a 4-byte magic (0x00 0x00 <type code> <ndim>), ndim big-endian
// uint32 sizes, then the elements row-major and big-endian. The reader accepts
// plain and gzip-compressed files (recognised by the 1f 8b magic bytes, never by
// the extension) and checks everything: magic, type code, dimension count, that
// exactly as many bytes follow the header as it promises. Every failure raises
// dltrain::Error naming the file and what was wrong.
#pragma once

#include <string>

#include "dltrain/core/tensor.hpp"

namespace dltrain::data {

/// True when this build can read and write gzip files (it was built with zlib).
bool gzip_supported();

/// Reads an IDX file, plain or gzip-compressed, into a contiguous CPU tensor of the
/// file's shape and dtype: type code 0x08 -> u8, 0x0C -> i32, 0x0D -> f32, 0x0E -> f64;
/// 0x09 (int8) and 0x0B (int16) are widened to i32. Throws dltrain::Error naming
/// `path` when the file is missing or unreadable, the magic or type code is wrong,
/// the header declares 0 dimensions, the data is truncated or followed by extra
/// bytes, or the gzip stream is corrupt; a gzip file in a build without zlib raises
/// an error that says to gunzip it.
Tensor read_idx(const std::string& path);

/// Writes `t` (u8, i32, f32 or f64, at least 1-d, any layout, any device) as an IDX
/// file, gzip-compressed when `gzip` is true (requires gzip_supported()). Throws
/// dltrain::Error naming `path` for other dtypes (convert with .to(DType::i32)),
/// 0-d tensors, sizes that do not fit 32 bits, or a file that cannot be written.
void write_idx(const std::string& path, const Tensor& t, bool gzip = false);

}  // namespace dltrain::data
