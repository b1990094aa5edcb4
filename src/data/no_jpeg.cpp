// The JPEG entry points of data/image.hpp in a build without TurboJPEG (src/data/CMakeLists.txt
// compiles this file instead of jpeg.cpp): each raises dltrain::Error naming the package.
#include "dltrain/core/error.hpp"
#include "dltrain/data/image.hpp"

namespace dltrain::data {

namespace {
[[noreturn]] void no_jpeg(const char* op) {
  DLTRAIN_FAIL(op,
               ": this dltrain build has no JPEG support (TurboJPEG was not found at configure "
               "time); install libturbojpeg0-dev (Debian/Ubuntu) or libjpeg-turbo-devel and "
               "rebuild dltrain with -DDLTRAIN_JPEG=ON");
}
}  // namespace

bool jpeg_supported() { return false; }
bool jpeg_region_decode_supported() { return false; }

ImageInfo read_jpeg_header(const uint8_t*, size_t) { no_jpeg("read_jpeg_header"); }
Image decode_jpeg_scaled(const uint8_t*, size_t, JpegScale) { no_jpeg("decode_jpeg"); }
Image decode_jpeg(const uint8_t*, size_t, int64_t) { no_jpeg("decode_jpeg"); }
Image decode_jpeg_region(const uint8_t*, size_t, JpegScale, const CropBox&, CropBox&) {
  no_jpeg("decode_jpeg_region");
}
std::vector<uint8_t> encode_jpeg(const Image&, int, ChromaSubsampling) { no_jpeg("encode_jpeg"); }

}  // namespace dltrain::data
