// Packed datasets (dltrain/data/packed.hpp) in a build without HDF5 (src/data/CMakeLists.txt
// compiles this file instead of packed_format/writer/reader.cpp): every entry point raises
// dltrain::Error naming the package.
#include "dltrain/core/error.hpp"
#include "dltrain/data/packed.hpp"
#include "src/data/packed_attribute.hpp"

namespace dltrain::data {

namespace {
[[noreturn]] void no_hdf5(const char* what, const std::string& path) {
  DLTRAIN_FAIL(what, "('", path, "'): this dltrain was built without HDF5, which packed ",
               "datasets need; install libhdf5-dev (scripts/setup.sh) and rebuild with ",
               "-DDLTRAIN_HDF5=ON");
}
}  // namespace

struct PackedImageDataset::Shards {};

PackResult pack_image_folder(const std::string&, const std::string& prefix, const PackOptions&) {
  no_hdf5("pack_image_folder", prefix);
}
PackedIndex read_packed_index(const std::string& prefix) { no_hdf5("read_packed_index", prefix); }
PackedImageDataset::PackedImageDataset(std::string prefix, PackedOptions options)
    : prefix_(std::move(prefix)), options_(std::move(options)) {
  no_hdf5("PackedImageDataset", prefix_);
}
PackedImageDataset::~PackedImageDataset() = default;
Batch PackedImageDataset::get_batch_for_epoch(const std::vector<int64_t>&, int64_t) const {
  no_hdf5("PackedImageDataset", prefix_);
}
Example PackedImageDataset::get(int64_t) const { no_hdf5("PackedImageDataset", prefix_); }
std::vector<uint8_t> PackedImageDataset::read_jpeg(int64_t) const {
  no_hdf5("PackedImageDataset", prefix_);
}
std::string PackedImageDataset::source_path(int64_t) const {
  no_hdf5("PackedImageDataset", prefix_);
}
void detail::set_packed_int_attribute(const std::string& path, const std::string&, int64_t) {
  no_hdf5("set_packed_int_attribute", path);
}

}  // namespace dltrain::data
