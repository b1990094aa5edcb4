// train::encode_png in a build without libpng (src/train/CMakeLists.txt compiles this file
// instead of png.cpp): it raises dltrain::Error naming the package.
#include "dltrain/core/error.hpp"
#include "dltrain/train/metrics.hpp"

namespace dltrain::train {

std::string encode_png(const Image&) {
  DLTRAIN_FAIL("train::encode_png: this dltrain was built without libpng, so it cannot write ",
               "images; install libpng-dev (Debian) and rebuild");
}

}  // namespace dltrain::train
