// libFuzzer target: data::read_idx on arbitrary bytes (plain IDX, and gzip when the input
// starts with gzip's magic).
#include "dltrain/data/idx.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const bool gz = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  const std::string& path = dltrain::fuzz::scratch_path(gz ? ".idx.gz" : ".idx");
  dltrain::fuzz::write_file(path, data, size);
  dltrain::fuzz::expect_clean([&] { (void)dltrain::data::read_idx(path); });
  return 0;
}
