// libFuzzer target: io::read_checkpoint (HDF5 with a checksummed header) on arbitrary
// bytes: corruption must be rejected before libhdf5 walks damaged metadata.
//
// Files that start with the bare HDF5 signature (checkpoints written before the integrity
// header, or HDF5 from another program) are fuzzed too: read_checkpoint refuses them before
// HDF5 sees them (issue 28: libhdf5 1.10 crashed on their corruption, e.g. a heap overflow in
// H5O__attr_exists found by this target within a second), naming dltrain-convert restamp,
// which reads them in a child process it can lose.
#include "dltrain/io/checkpoint.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!dltrain::io::hdf5_supported()) return 0;
  const std::string& path = dltrain::fuzz::scratch_path(".h5");
  dltrain::fuzz::write_file(path, data, size);
  dltrain::fuzz::expect_clean([&] { (void)dltrain::io::read_checkpoint(path); });
  return 0;
}
