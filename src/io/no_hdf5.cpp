// The checkpoint files of dltrain/io/checkpoint.hpp in a build without HDF5
// (src/io/CMakeLists.txt compiles this file instead of checkpoint_hdf5.cpp): every entry point
// raises dltrain::Error naming the package.
#include "dltrain/core/error.hpp"
#include "dltrain/io/checkpoint.hpp"
#include "src/io/checkpoint_header.hpp"

namespace dltrain::io {

bool hdf5_supported() { return false; }

void write_checkpoint(const std::string& path, const Checkpoint&, const SaveOptions&) {
  DLTRAIN_FAIL("write_checkpoint('", path, "'): this dltrain was built without HDF5; install ",
               "libhdf5-dev (scripts/setup.sh) and rebuild with -DDLTRAIN_HDF5=ON");
}

Checkpoint read_checkpoint(const std::string& path) {
  DLTRAIN_FAIL("read_checkpoint('", path, "'): this dltrain was built without HDF5; install ",
               "libhdf5-dev (scripts/setup.sh) and rebuild with -DDLTRAIN_HDF5=ON");
}

Checkpoint detail::read_unverified_checkpoint(const std::string& path) {
  return read_checkpoint(path);
}

}  // namespace dltrain::io
