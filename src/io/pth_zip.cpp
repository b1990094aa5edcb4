// The ZIP container of a torch.save file (src/io/pth_zip.hpp).
#include "src/io/pth_zip.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "dltrain/io/file_format.hpp"
#include "src/io/crc32.hpp"
#include "src/io/pth_common.hpp"

namespace dltrain::io::pth {

ZipArchive::ZipArchive(const detail::InputFile& f) : f_(f) {
  check_magic();
  read_directory();
}

uint64_t ZipArchive::locate(const ZipEntry& e) const {
  const std::string& path = f_.path();
  if (e.flags & 1u)
    fail(path, "record '", e.name, "' is encrypted; torch.save never encrypts", kResave);
  unsigned char lh[30];
  f_.read_at(e.local_offset, lh, 30, "the local header of record '" + e.name + "'");
  if (le(lh, 4) != 0x04034b50u)
    fail(path, "record '", e.name, "' has no local header at offset ", e.local_offset,
         "; the archive is corrupt, get a fresh copy");
  const auto local_method = static_cast<uint16_t>(le(lh + 8, 2));
  if (e.method != 0 || local_method != 0)
    fail(path, "record '", e.name, "' is compressed (ZIP method ",
         e.method != 0 ? e.method : local_method, e.method == 8 ? ", deflate" : "",
         "), but torch.save stores records uncompressed and dltrain reads only those; the "
         "file was re-zipped by another tool: use the file torch.save wrote, or re-save it "
         "with torch.save(model.state_dict(), path)");
  const uint64_t name_len = le(lh + 26, 2), extra_len = le(lh + 28, 2);
  std::string local_name(static_cast<size_t>(name_len), '\0');
  f_.read_at(e.local_offset + 30, local_name.data(), name_len,
             "the local header of record '" + e.name + "'");
  if (local_name != e.name)
    fail(path, "the local header at offset ", e.local_offset, " names '", local_name,
         "' but the central directory says '", e.name,
         "'; the archive is corrupt, get a fresh copy");
  const uint64_t start = e.local_offset + 30 + name_len + extra_len;
  if (e.comp_size != e.size || start > cd_offset_ || e.size > cd_offset_ - start)
    fail(path, "record '", e.name, "' (", e.size, " bytes at offset ", start,
         ") does not fit before the central directory at offset ", cd_offset_,
         "; the archive is corrupt, get a fresh copy");
  return start;
}

void ZipArchive::read(const ZipEntry& e, void* dst) const {
  const std::string& path = f_.path();
  f_.read_at(locate(e), dst, e.size, "record '" + e.name + "'");
  const uint32_t got = detail::crc32_update(0, dst, e.size);
  if (got != e.crc)
    fail(path, "record '", e.name, "' fails its CRC-32 check (stored ", e.crc, ", computed ", got,
         "): the data is corrupt, get a fresh copy of the file");
}

void ZipArchive::check_magic() {
  const std::string& path = f_.path();
  unsigned char head[4] = {0, 0, 0, 0};
  const uint64_t n = std::min<uint64_t>(4, f_.size());
  if (n > 0) f_.read_at(0, head, n, "the file signature");
  if (n == 4 && le(head, 4) == 0x04034b50u) return;
  const FileFormat kind = detect_file_format(path);
  if (kind == FileFormat::Checkpoint || kind == FileFormat::Hdf5 || kind == FileFormat::Safetensors)
    fail(path, "this is ", describe_file_format(kind), ", not a torch.save file; read it with ",
         kind == FileFormat::Safetensors ? "io::load_safetensors" : "io::read_checkpoint",
         " (or convert it with dltrain-convert)");
  if (n >= 2 && head[0] == 0x80 && head[1] <= 5)
    fail(path,
         "this is a pickle file in the legacy torch.save format (PyTorch < 1.6 or "
         "_use_new_zipfile_serialization=False), which dltrain does not read; load it "
         "in PyTorch and re-save it with torch.save(model.state_dict(), path) (PyTorch "
         ">= 1.6 writes the ZIP format)");
  if (f_.size() >= 262) {
    char ustar[5];
    f_.read_at(257, ustar, 5, "the file signature");
    if (std::memcmp(ustar, "ustar", 5) == 0)
      fail(path,
           "this is a tar archive in PyTorch's oldest torch.save format; load it in "
           "PyTorch and re-save it with torch.save(model.state_dict(), path)");
  }
  fail(path,
       "this is not a torch.save file: it does not start with a ZIP local header "
       "(PK\\3\\4)",
       f_.size() == 0 ? " (the file is empty)" : "", kResave);
}

void ZipArchive::read_directory() {
  const std::string& path = f_.path();
  const uint64_t size = f_.size();
  // The end-of-central-directory record is the last 22 bytes plus a comment of at most
  // 65535 bytes: search backwards for its signature.
  const uint64_t tail_len = std::min<uint64_t>(size, 22 + 65535);
  std::vector<unsigned char> tail(static_cast<size_t>(tail_len));
  f_.read_at(size - tail_len, tail.data(), tail_len, "the end of the archive");
  int64_t eocd = -1;
  for (int64_t k = static_cast<int64_t>(tail_len) - 22; k >= 0; --k) {
    const unsigned char* p = tail.data() + k;
    if (le(p, 4) == 0x06054b50u && static_cast<uint64_t>(k) + 22 + le(p + 20, 2) == tail_len) {
      eocd = k;
      break;
    }
  }
  if (eocd < 0)
    fail(path,
         "the ZIP end-of-central-directory record is missing: the file is truncated "
         "(interrupted save, copy or download); get a complete copy");
  const unsigned char* e = tail.data() + eocd;
  const uint64_t eocd_pos = size - tail_len + static_cast<uint64_t>(eocd);
  uint64_t count = le(e + 10, 2), cd_size = le(e + 12, 4);
  cd_offset_ = le(e + 16, 4);
  uint64_t cd_end_limit = eocd_pos;
  if (le(e + 4, 2) != 0 || le(e + 6, 2) != 0)
    fail(path, "this is a multi-part (split) ZIP archive, which torch.save never writes", kResave);
  if (count == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_offset_ == 0xFFFFFFFFu) {
    // ZIP64: a locator just before the EOCD points at the ZIP64 EOCD record.
    if (eocd_pos < 20) fail(path, "the ZIP64 locator is missing; the archive is corrupt");
    unsigned char loc[20];
    f_.read_at(eocd_pos - 20, loc, 20, "the ZIP64 end-of-central-directory locator");
    if (le(loc, 4) != 0x07064b50u)
      fail(path,
           "the ZIP64 end-of-central-directory locator is missing; the archive is "
           "corrupt, get a fresh copy");
    const uint64_t z64 = le(loc + 8, 8);
    unsigned char rec[56];
    if (z64 > eocd_pos - 20 || eocd_pos - 20 - z64 < 56)
      fail(path,
           "the ZIP64 end-of-central-directory record lies outside the archive; the "
           "archive is corrupt, get a fresh copy");
    f_.read_at(z64, rec, 56, "the ZIP64 end-of-central-directory record");
    if (le(rec, 4) != 0x06064b50u)
      fail(path,
           "the ZIP64 end-of-central-directory record is missing; the archive is "
           "corrupt, get a fresh copy");
    count = le(rec + 32, 8);
    cd_size = le(rec + 40, 8);
    cd_offset_ = le(rec + 48, 8);
    cd_end_limit = z64;
  }
  if (cd_offset_ > cd_end_limit || cd_size > cd_end_limit - cd_offset_)
    fail(path, "the central directory (", cd_size, " bytes at offset ", cd_offset_,
         ") lies outside the archive; the file is truncated or corrupt, get a complete copy");
  std::vector<unsigned char> cd(static_cast<size_t>(cd_size));
  f_.read_at(cd_offset_, cd.data(), cd_size, "the ZIP central directory");
  uint64_t pos = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (cd_size - pos < 46 || le(cd.data() + pos, 4) != 0x02014b50u)
      fail(path, "central directory entry ", i, " of ", count,
           " is missing or damaged; the archive is corrupt, get a fresh copy");
    const unsigned char* p = cd.data() + pos;
    ZipEntry z;
    z.flags = static_cast<uint16_t>(le(p + 8, 2));
    z.method = static_cast<uint16_t>(le(p + 10, 2));
    z.crc = static_cast<uint32_t>(le(p + 16, 4));
    z.comp_size = le(p + 20, 4);
    z.size = le(p + 24, 4);
    const uint64_t name_len = le(p + 28, 2), extra_len = le(p + 30, 2), comment_len = le(p + 32, 2);
    z.local_offset = le(p + 42, 4);
    if (cd_size - pos - 46 < name_len + extra_len + comment_len)
      fail(path, "central directory entry ", i,
           " runs past the directory's end; the archive is corrupt, get a fresh copy");
    z.name.assign(reinterpret_cast<const char*>(p + 46), static_cast<size_t>(name_len));
    // ZIP64 extended information: 8-byte values for the fields saturated above, in order.
    const unsigned char* x = p + 46 + name_len;
    const unsigned char* x_end = x + extra_len;
    while (x_end - x >= 4) {
      const uint64_t id = le(x, 2), len = le(x + 2, 2);
      if (static_cast<uint64_t>(x_end - x - 4) < len) break;
      if (id == 0x0001) {
        const unsigned char* v = x + 4;
        uint64_t left = len;
        for (uint64_t* field : {&z.size, &z.comp_size, &z.local_offset}) {
          if (*field != 0xFFFFFFFFu) continue;
          if (left < 8)
            fail(path, "record '", z.name,
                 "' has a short ZIP64 extra field; the archive is corrupt");
          *field = le(v, 8);
          v += 8;
          left -= 8;
        }
      }
      x += 4 + len;
    }
    if (!index_.emplace(z.name, entries_.size()).second)
      fail(path, "the archive holds two records named '", z.name,
           "'; the archive is corrupt, get a fresh copy");
    entries_.push_back(std::move(z));
    pos += 46 + name_len + extra_len + comment_len;
  }
}

}  // namespace dltrain::io::pth
