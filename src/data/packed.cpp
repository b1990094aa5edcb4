// Packed dataset file names (dltrain/data/packed.hpp), in every build. The files themselves:
// packed_format/writer/reader.cpp over HDF5, or no_hdf5.cpp in a build without it.
#include <cstdio>

#include "dltrain/data/packed.hpp"

namespace dltrain::data {

std::string packed_shard_path(const std::string& prefix, int64_t shard) {
  char num[32];
  std::snprintf(num, sizeof num, "-%05lld.h5", static_cast<long long>(shard));
  return prefix + num;
}

std::string packed_index_path(const std::string& prefix) { return prefix + "-index.h5"; }

}  // namespace dltrain::data
