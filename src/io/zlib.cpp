// What dltrain takes from zlib (compiled when zlib is found; a build without it compiles
// no_zlib.cpp instead: src/io/CMakeLists.txt): gzip files (gzip.hpp) and zlib's CRC-32
// (crc32.hpp), which gives the same values as the portable table version in crc32.cpp.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "dltrain/core/error.hpp"
#include "src/io/crc32.hpp"
#include "src/io/gzip.hpp"

namespace dltrain::io::detail {

bool zlib_built_in() { return true; }

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {  // zlib takes a uInt length
    const size_t step = std::min<size_t>(n, size_t{1} << 30);
    crc = static_cast<uint32_t>(::crc32(crc, p, static_cast<uInt>(step)));
    p += step;
    n -= step;
  }
  return crc;
}

GzipReader::GzipReader(const std::string& path, const char* op) : path_(path), op_(op) {
  gzFile gz = gzopen(path.c_str(), "rb");
  DLTRAIN_CHECK(gz != nullptr, op_, ": cannot open gzip file '", path_,
                "': ", std::strerror(errno));
  gzbuffer(gz, 1 << 18);
  gz_ = gz;
}

GzipReader::~GzipReader() {
  if (gz_) gzclose(static_cast<gzFile>(gz_));
}

size_t GzipReader::read(void* dst, size_t n) {
  auto* gz = static_cast<gzFile>(gz_);
  auto* out = static_cast<unsigned char*>(dst);
  auto fail = [&] {
    int errnum = Z_OK;
    const char* msg = gzerror(gz, &errnum);
    DLTRAIN_FAIL(op_, ": '", path_,
                 "' is a corrupt or truncated gzip stream (zlib: ", msg ? msg : "unknown error",
                 "); download or decompress it again");
  };
  size_t done = 0;
  while (done < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, size_t{1} << 30));
    const int r = gzread(gz, out + done, chunk);
    if (r < 0) fail();
    done += static_cast<size_t>(r);
    if (static_cast<unsigned>(r) < chunk) break;
  }
  // A stream cut short reads as end of data with the error set: report it as corrupt.
  int errnum = Z_OK;
  gzerror(gz, &errnum);
  if (errnum != Z_OK && errnum != Z_STREAM_END) fail();
  return done;
}

void write_gzip_file(const std::string& path,
                     const std::vector<std::pair<const void*, size_t>>& parts, const char* op) {
  gzFile gz = gzopen(path.c_str(), "wb");
  DLTRAIN_CHECK(gz != nullptr, op, ": cannot create '", path, "': ", std::strerror(errno));
  bool ok = true;
  for (const auto& part : parts) {
    const auto* p = static_cast<const unsigned char*>(part.first);
    for (size_t off = 0; ok && off < part.second;) {
      const unsigned chunk =
          static_cast<unsigned>(std::min<size_t>(part.second - off, size_t{1} << 30));
      ok = gzwrite(gz, p + off, chunk) == static_cast<int>(chunk);
      off += chunk;
    }
  }
  ok = (gzclose(gz) == Z_OK) && ok;
  DLTRAIN_CHECK(ok, op, ": writing gzip file '", path, "' failed (disk full or not writable?)");
}

}  // namespace dltrain::io::detail
