// libFuzzer targets: a packed image dataset (data/packed.hpp) whose index or shard file is
// arbitrary bytes. Seeds: tests/fuzz/make_seeds writes SEEDS/packed/{index,shard}.bin,
// SEEDS/packed_restamp/index.bin and the valid pack beside them (DLTRAIN_FUZZ_PACK names its
// prefix).
//
// fuzz_packed: the first input byte chooses the file: even, the index (read_packed_index and
// the dataset over it); odd, shard 0 of a pack whose index is the valid seed's. A mutated index
// almost always fails its CRC (src/io/verified_header.hpp) before HDF5 sees it, which is the
// point of the CRC but leaves the parsing behind it unexplored.
//
// fuzz_packed_restamp (this file built with DLTRAIN_FUZZ_RESTAMP): the input is an index file
// whose verified header gets the CRC and size of the mutated bytes stamped back before it is
// read, as if dltrain had written it: every mutation reaches HDF5 and read_packed_index's own
// checks (attributes, shard counts, class names) and the dataset's checks of the valid shard
// against them. HDF5 still checksums the index's metadata (format bounds [1.8, 1.10]), so what
// this mode mostly reaches is the raw data HDF5 does not checksum and the attributes' values.
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "dltrain/data/packed.hpp"
#include "fuzz_common.hpp"
#ifdef DLTRAIN_FUZZ_RESTAMP
#include "src/io/verified_header.hpp"
#endif

namespace fs = std::filesystem;

namespace {

#ifdef DLTRAIN_FUZZ_RESTAMP
// The header's CRC (bytes 20-23, over the whole file with them zero) and size (32-39) made
// right for `bytes`, as stamp_verified_header does; shorter inputs stay as they are.
void restamp(std::vector<uint8_t>& bytes) {
  using dltrain::io::detail::kVerifiedHeaderBytes;
  if (bytes.size() < kVerifiedHeaderBytes) return;
  const uint64_t size = bytes.size();
  for (int i = 0; i < 8; ++i) bytes[32 + i] = static_cast<uint8_t>(size >> (8 * i));
  std::memset(bytes.data() + 20, 0, 4);
  const uint32_t crc = dltrain::io::detail::crc32_update(0, bytes.data(), bytes.size());
  for (int i = 0; i < 4; ++i) bytes[20 + i] = static_cast<uint8_t>(crc >> (8 * i));
}
#endif

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dltrain::data;
  if (size == 0) return 0;
  static const char* valid = std::getenv("DLTRAIN_FUZZ_PACK");
  const std::string& prefix = dltrain::fuzz::scratch_path("-pack");
#ifdef DLTRAIN_FUZZ_RESTAMP
  // The whole input is the index; no selector byte.
  const bool shard = false;
  std::vector<uint8_t> index(data, data + size);
  restamp(index);
#else
  const bool shard = data[0] & 1;
  if (shard && !valid) return 0;
  const std::vector<uint8_t> index(data + 1, data + size);
#endif
  // The other file of the pair comes from the valid pack, copied beside the fuzzed one.
  static bool copied = false;
  if (valid && !copied) {
    fs::copy_file(packed_index_path(valid), packed_index_path(prefix),
                  fs::copy_options::overwrite_existing);
    std::atexit([] {
      const std::string& p = dltrain::fuzz::scratch_path("-pack");
      std::remove(packed_index_path(p).c_str());
      std::remove(packed_shard_path(p, 0).c_str());
    });
    copied = true;
  }
  if (shard) {
    if (valid)
      fs::copy_file(packed_index_path(valid), packed_index_path(prefix),
                    fs::copy_options::overwrite_existing);
    dltrain::fuzz::write_file(packed_shard_path(prefix, 0), data + 1, size - 1);
  } else {
    dltrain::fuzz::write_file(packed_index_path(prefix), index.data(), index.size());
    if (valid)
      fs::copy_file(packed_shard_path(valid, 0), packed_shard_path(prefix, 0),
                    fs::copy_options::overwrite_existing);
    dltrain::fuzz::expect_clean([&] { (void)read_packed_index(prefix); });
  }
  dltrain::fuzz::expect_clean([&] {
    PackedOptions o;
    o.transform = ImagePipeline::eval(8, 8);
    PackedImageDataset ds(prefix, o);
    for (int64_t i = 0; i < ds.size() && i < 4; ++i) (void)ds.get(i);
  });
  return 0;
}
