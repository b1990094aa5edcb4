// The ZIP container of a torch.save file (internal header): its central directory, and exact,
// CRC-checked reads of its STORED records (torch.save stores records uncompressed; compressed
// and encrypted entries are refused). Every offset and size read from the file is checked
// against the file's size before it is used. Defined in pth_zip.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "src/io/raw_file.hpp"

namespace dltrain::io::pth {

struct ZipEntry {
  std::string name;
  uint64_t size = 0, comp_size = 0, local_offset = 0;
  uint32_t crc = 0;
  uint16_t method = 0, flags = 0;
};

// The central directory of a ZIP archive, and exact reads of its STORED records.
class ZipArchive {
 public:
  /// Reads the central directory of `f` (which must outlive the archive).
  explicit ZipArchive(const detail::InputFile& f);

  const std::vector<ZipEntry>& entries() const { return entries_; }
  const ZipEntry* find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &entries_[it->second];
  }
  // Checks the record's local header and bounds; returns the file offset of its data.
  uint64_t locate(const ZipEntry& e) const;

  // Reads the whole record into dst (entry.size bytes) and verifies its CRC-32.
  void read(const ZipEntry& e, void* dst) const;

 private:
  void check_magic();
  void read_directory();

  const detail::InputFile& f_;
  std::vector<ZipEntry> entries_;
  std::map<std::string, size_t> index_;
  uint64_t cd_offset_ = 0;
};

}  // namespace dltrain::io::pth
