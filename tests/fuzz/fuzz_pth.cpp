// libFuzzer target: io::load_pth (PyTorch's zip + restricted-pickle format) on arbitrary
// bytes. No pickle is ever executed: only the opcodes the reader knows are interpreted.
#include "dltrain/io/pth.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = dltrain::fuzz::scratch_path(".pth");
  dltrain::fuzz::write_file(path, data, size);
  dltrain::fuzz::expect_clean([&] { (void)dltrain::io::load_pth(path); });
  return 0;
}
