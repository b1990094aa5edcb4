// libFuzzer target: io::list_safetensors, safetensors_metadata and load_safetensors on
// arbitrary bytes.
#include "dltrain/io/safetensors.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = dltrain::fuzz::scratch_path(".safetensors");
  dltrain::fuzz::write_file(path, data, size);
  dltrain::fuzz::expect_clean([&] { (void)dltrain::io::list_safetensors(path); });
  dltrain::fuzz::expect_clean([&] { (void)dltrain::io::safetensors_metadata(path); });
  dltrain::fuzz::expect_clean([&] { (void)dltrain::io::load_safetensors(path); });
  return 0;
}
