// IDX reader and writer.
//
// The reader streams the file once, straight into the result tensor's storage:
// a plain file through stdio, a gzip file (1f 8b magic) through zlib's gz* API
// (src/io/gzip.hpp).
// Before allocating it checks that the file can hold what the header promises (a
// plain file's exact size; for gzip, deflate's maximum ratio of 1032:1), so a
// corrupt header raises an error instead of a huge allocation. Big-endian
// elements are swapped in place after the read.
#include "dltrain/data/idx.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "dltrain/core/error.hpp"
#include "dltrain/core/parallel.hpp"

#include "src/io/gzip.hpp"

namespace dltrain::data {

namespace {

struct TypeInfo {
  uint8_t code;
  size_t file_size;  // bytes per element in the file
  DType dtype;       // dtype of the tensor read_idx returns
  const char* name;
};

constexpr std::array<TypeInfo, 6> kTypes{{{0x08, 1, DType::u8, "uint8"},
                                          {0x09, 1, DType::i32, "int8"},
                                          {0x0B, 2, DType::i32, "int16"},
                                          {0x0C, 4, DType::i32, "int32"},
                                          {0x0D, 4, DType::f32, "float32"},
                                          {0x0E, 8, DType::f64, "float64"}}};

const TypeInfo* find_type(uint8_t code) {
  for (const TypeInfo& t : kTypes)
    if (t.code == code) return &t;
  return nullptr;
}

std::string hex(uint8_t b) {
  static const char* digits = "0123456789abcdef";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

// Swaps each `width`-byte element of [p, p + n * width) in place.
void byteswap_inplace(unsigned char* p, int64_t n, size_t width) {
  if (width == 1 || std::endian::native == std::endian::big) return;
  parallel_for(0, n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::reverse(p + i * width, p + (i + 1) * width);
  });
}

// A sequential byte source over a plain or gzip file. read() returns fewer bytes than
// asked only at the end of the data and throws on a corrupt gzip stream.
class Source {
 public:
  Source(const std::string& path, const char* op) : path_(path), op_(op) {
    std::error_code ec;
    DLTRAIN_CHECK(std::filesystem::exists(path, ec), op_, ": file '", path_,
                  "' does not exist; check the path (and the dataset root)");
    DLTRAIN_CHECK(!std::filesystem::is_directory(path, ec), op_, ": '", path_,
                  "' is a directory, not a file");
    file_size_ = std::filesystem::file_size(path, ec);
    DLTRAIN_CHECK(!ec, op_, ": cannot stat '", path_, "': ", ec.message());
    fp_ = std::fopen(path.c_str(), "rb");
    DLTRAIN_CHECK(fp_ != nullptr, op_, ": cannot open '", path_, "': ", std::strerror(errno));
    unsigned char magic[2] = {0, 0};
    const size_t got = std::fread(magic, 1, 2, fp_);
    gzip_ = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    if (!gzip_) {
      std::rewind(fp_);
      return;
    }
    std::fclose(fp_);
    fp_ = nullptr;
    gz_ = std::make_unique<io::detail::GzipReader>(path, op);
  }
  ~Source() {
    if (fp_) std::fclose(fp_);
  }
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  bool gzip() const { return gzip_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t consumed() const { return consumed_; }

  size_t read(void* dst, size_t n) {
    size_t done = 0;
    auto* out = static_cast<unsigned char*>(dst);
    if (!gzip_) {
      done = std::fread(out, 1, n, fp_);
      DLTRAIN_CHECK(done == n || !std::ferror(fp_), op_, ": read error on '", path_,
                    "': ", std::strerror(errno));
    } else {
      done = gz_->read(out, n);
    }
    consumed_ += done;
    return done;
  }

  // Bytes left after the current position (reads them for gzip).
  uint64_t count_remaining() {
    if (!gzip_) return file_size_ - consumed_;
    uint64_t extra = 0;
    std::vector<unsigned char> buf(1 << 16);
    for (;;) {
      const size_t r = read(buf.data(), buf.size());
      extra += r;
      if (r < buf.size()) return extra;
    }
  }

 private:
  std::string path_;
  const char* op_;
  FILE* fp_ = nullptr;
  std::unique_ptr<io::detail::GzipReader> gz_;
  bool gzip_ = false;
  uint64_t file_size_ = 0;
  uint64_t consumed_ = 0;
};

}  // namespace

bool gzip_supported() { return io::detail::zlib_built_in(); }

Tensor read_idx(const std::string& path) {
  const char* op = "read_idx";
  Source src(path, op);
  unsigned char head[4];
  const size_t got = src.read(head, 4);
  DLTRAIN_CHECK(got == 4, op, ": '", path, "' is truncated: it holds ", got,
                " bytes but an IDX header needs at least 4");
  DLTRAIN_CHECK(head[0] == 0 && head[1] == 0, op, ": '", path, "' has bad magic bytes ",
                hex(head[0]), " ", hex(head[1]),
                " (an IDX file starts with 0x00 0x00 <type code> <ndim>); it is not an IDX file");
  const TypeInfo* type = find_type(head[2]);
  DLTRAIN_CHECK(type != nullptr, op, ": '", path, "' has unknown IDX type code ", hex(head[2]),
                " (expected 0x08 uint8, 0x09 int8, 0x0b int16, 0x0c int32, 0x0d float32 or "
                "0x0e float64)");
  const int ndim = head[3];
  DLTRAIN_CHECK(ndim > 0, op, ": '", path, "' declares 0 dimensions; an IDX file needs at least 1");

  std::vector<unsigned char> dims_raw(static_cast<size_t>(ndim) * 4);
  const size_t got_dims = src.read(dims_raw.data(), dims_raw.size());
  DLTRAIN_CHECK(got_dims == dims_raw.size(), op, ": '", path,
                "' is truncated inside its header: it declares ", ndim, " dimensions (",
                dims_raw.size(), " bytes of sizes) but only ", got_dims, " bytes follow the magic");
  Shape shape(static_cast<size_t>(ndim));
  // Element count with overflow detection: anything above 2^62 bytes is not a real file.
  constexpr uint64_t kMaxBytes = uint64_t{1} << 62;
  uint64_t numel = 1, extent = 1;
  bool too_big = false;
  for (int d = 0; d < ndim; ++d) {
    const unsigned char* b = dims_raw.data() + 4 * d;
    const uint64_t s =
        (uint64_t{b[0]} << 24) | (uint64_t{b[1]} << 16) | (uint64_t{b[2]} << 8) | b[3];
    shape[static_cast<size_t>(d)] = static_cast<int64_t>(s);
    if (s != 0 && numel > kMaxBytes / s) too_big = true;
    numel *= s;
    // The strides multiply the non-zero sizes, even when another size is 0.
    if (s != 0 && extent > kMaxBytes / s) too_big = true;
    extent *= std::max<uint64_t>(s, 1);
  }
  too_big = too_big || numel > kMaxBytes / type->file_size;
  const uint64_t data_bytes = too_big ? kMaxBytes : numel * type->file_size;
  const uint64_t header_bytes = 4 + dims_raw.size();

  auto truncated = [&](uint64_t have) {
    DLTRAIN_FAIL(op, ": '", path, "' is truncated: its header declares shape ", shape_str(shape),
                 " of ", type->name, " (",
                 (too_big ? std::string("an impossible number of") : std::to_string(data_bytes)),
                 " bytes of data) but only ", have, " bytes follow the header",
                 src.gzip() ? " after decompression" : "");
  };
  if (!src.gzip()) {
    const uint64_t have = src.file_size() - header_bytes;
    if (too_big || have < data_bytes) truncated(have);
    if (have > data_bytes)
      DLTRAIN_FAIL(op, ": '", path, "' has ", have - data_bytes,
                   " unexpected bytes after the data its header declares (shape ", shape_str(shape),
                   " of ", type->name, ", ", data_bytes,
                   " bytes); the file is corrupt or not an IDX file");
  } else if (too_big || data_bytes / 1032 > src.file_size()) {
    // deflate never compresses better than 1032:1, so the stream cannot hold the data.
    std::vector<unsigned char> buf(1 << 16);
    uint64_t have = 0;
    for (size_t r; (r = src.read(buf.data(), buf.size())) > 0;) have += r;
    truncated(have);
  }

  Tensor out = empty(shape, TensorOptions(type->dtype));
  const int64_t n = static_cast<int64_t>(numel);
  const bool same_width = dtype_size(type->dtype) == type->file_size;
  std::vector<unsigned char> staging;
  unsigned char* dst = static_cast<unsigned char*>(out.data_ptr());
  if (!same_width) {
    staging.resize(data_bytes);
    dst = staging.data();
  }
  const size_t read_bytes = src.read(dst, data_bytes);
  if (read_bytes < data_bytes) truncated(read_bytes);
  if (src.gzip()) {
    const uint64_t extra = src.count_remaining();
    DLTRAIN_CHECK(extra == 0, op, ": '", path, "' has ", extra,
                  " unexpected bytes after the data its header declares (shape ", shape_str(shape),
                  " of ", type->name, ", ", data_bytes,
                  " bytes, after decompression); the file is corrupt or not an IDX file");
  }

  byteswap_inplace(dst, n, type->file_size);
  if (!same_width) {
    int32_t* o = out.data<int32_t>();
    if (type->file_size == 1) {
      const auto* s = reinterpret_cast<const int8_t*>(staging.data());
      for (int64_t i = 0; i < n; ++i) o[i] = s[i];
    } else {
      for (int64_t i = 0; i < n; ++i) {
        int16_t v;
        std::memcpy(&v, staging.data() + 2 * i, 2);
        o[i] = v;
      }
    }
  }
  return out;
}

void write_idx(const std::string& path, const Tensor& t, bool gzip) {
  const char* op = "write_idx";
  DLTRAIN_CHECK(t.defined(), op, ": cannot write an undefined tensor to '", path, "'");
  uint8_t code = 0;
  switch (t.dtype()) {
    case DType::u8:
      code = 0x08;
      break;
    case DType::i32:
      code = 0x0C;
      break;
    case DType::f32:
      code = 0x0D;
      break;
    case DType::f64:
      code = 0x0E;
      break;
    default:
      DLTRAIN_FAIL(op, ": IDX cannot store ", t.dtype(), " (writing '", path,
                   "'); convert the tensor to uint8, int32, float32 or float64 first, e.g. "
                   ".to(DType::i32)");
  }
  DLTRAIN_CHECK(t.dim() >= 1 && t.dim() <= 255, op,
                ": IDX needs 1 to 255 dimensions but the "
                "tensor for '",
                path, "' has shape ", shape_str(t.shape()));
  std::vector<unsigned char> header{0, 0, code, static_cast<unsigned char>(t.dim())};
  for (int64_t s : t.shape()) {
    DLTRAIN_CHECK(s <= 0xFFFFFFFFll, op, ": size ", s, " of shape ", shape_str(t.shape()),
                  " does not fit IDX's 32-bit sizes (writing '", path, "')");
    const auto u = static_cast<uint32_t>(s);
    for (int k = 3; k >= 0; --k) header.push_back(static_cast<unsigned char>(u >> (8 * k)));
  }
  const Tensor c = t.detach().to(Device::cpu()).contiguous();
  const size_t width = c.element_size();
  const size_t bytes = static_cast<size_t>(c.numel()) * width;
  std::vector<unsigned char> body(bytes);
  if (bytes) std::memcpy(body.data(), c.data_ptr(), bytes);
  byteswap_inplace(body.data(), c.numel(), width);

  if (gzip) {
    io::detail::write_gzip_file(path, {{header.data(), header.size()}, {body.data(), bytes}}, op);
    return;
  }
  FILE* fp = std::fopen(path.c_str(), "wb");
  DLTRAIN_CHECK(fp != nullptr, op, ": cannot create '", path, "': ", std::strerror(errno));
  bool ok = std::fwrite(header.data(), 1, header.size(), fp) == header.size();
  ok = ok && (bytes == 0 || std::fwrite(body.data(), 1, bytes, fp) == bytes);
  ok = (std::fclose(fp) == 0) && ok;
  DLTRAIN_CHECK(ok, op, ": writing '", path, "' failed (disk full or not writable?)");
}

}  // namespace dltrain::data
