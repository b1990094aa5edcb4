// libFuzzer target: a packed image dataset (data/packed.hpp) whose index or shard file is
// arbitrary bytes. The first input byte chooses the file: even, the index (read_packed_index
// and the dataset over it); odd, shard 0 of a pack whose index is the valid seed's. Seeds:
// tests/fuzz/make_seeds writes SEEDS/packed/{index,shard}.bin and the valid pack beside them
// (DLTRAIN_FUZZ_PACK names its prefix).
#include <cstdlib>
#include <filesystem>

#include "dltrain/data/packed.hpp"
#include "fuzz_common.hpp"

namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dltrain::data;
  if (size == 0) return 0;
  static const char* valid = std::getenv("DLTRAIN_FUZZ_PACK");
  const std::string& prefix = dltrain::fuzz::scratch_path("-pack");
  const bool shard = data[0] & 1;
  if (shard && !valid) return 0;
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
    dltrain::fuzz::write_file(packed_index_path(prefix), data + 1, size - 1);
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
