// A test hook of the packed dataset format (internal header, not installed): tests fake other
// format versions and mismatched files with it. packed_reader.cpp defines it (HDF5 builds);
// no_hdf5.cpp refuses it.
#pragma once

#include <cstdint>
#include <string>

namespace dltrain::data::detail {

/// Overwrites (or creates) the int64 root attribute `name` of the HDF5 file `path`.
void set_packed_int_attribute(const std::string& path, const std::string& name, int64_t value);

}  // namespace dltrain::data::detail
