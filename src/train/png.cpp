// train::encode_png over libpng's simplified API (compiled when libpng is found; a build
// without it compiles no_png.cpp instead: src/train/CMakeLists.txt).
#include <png.h>

#include "dltrain/core/error.hpp"
#include "dltrain/train/metrics.hpp"

namespace dltrain::train {

std::string encode_png(const Image& img) {
  DLTRAIN_CHECK(img.channels == 1 || img.channels == 3 || img.channels == 4,
                "train::encode_png: ", img.channels, " channels; pass 1, 3 or 4");
  DLTRAIN_CHECK(static_cast<int64_t>(img.pixels.size()) == img.height * img.width * img.channels,
                "train::encode_png: ", img.pixels.size(), " bytes of pixels for a ", img.height,
                "x", img.width, "x", img.channels, " image");
  png_image p{};
  p.version = PNG_IMAGE_VERSION;
  p.width = static_cast<png_uint_32>(img.width);
  p.height = static_cast<png_uint_32>(img.height);
  p.format = img.channels == 1   ? PNG_FORMAT_GRAY
             : img.channels == 3 ? PNG_FORMAT_RGB
                                 : PNG_FORMAT_RGBA;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&p, nullptr, &size, 0, img.pixels.data(), 0, nullptr))
    DLTRAIN_FAIL("train::encode_png: libpng: ", p.message);
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&p, out.data(), &size, 0, img.pixels.data(), 0, nullptr))
    DLTRAIN_FAIL("train::encode_png: libpng: ", p.message);
  out.resize(size);
  return out;
}

}  // namespace dltrain::train
