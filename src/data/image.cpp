// Images in memory (data/image.hpp): the Image buffer, its conversions to and from tensors,
// JPEG scale arithmetic and whole-file reads. The JPEG coder itself is jpeg.cpp (or
// no_jpeg.cpp in a build without TurboJPEG).
#include "dltrain/data/image.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "dltrain/core/error.hpp"

namespace dltrain::data {

Image::Image(int64_t w, int64_t h, int64_t c) : width(w), height(h), channels(c) {
  DLTRAIN_CHECK(w >= 1 && h >= 1, "Image: width and height must be >= 1, got ", w, "x", h);
  DLTRAIN_CHECK(c == 1 || c == 3 || c == 4, "Image: channels must be 1, 3 or 4, got ", c);
  pixels.assign(static_cast<size_t>(w * h * c), 0);
}

Tensor image_to_tensor(const Image& image) {
  DLTRAIN_CHECK(!image.empty(), "image_to_tensor: the image is empty");
  Tensor t = empty({image.height, image.width, image.channels}, DType::u8);
  std::memcpy(t.data_ptr(), image.data(), image.pixels.size());
  return t;
}

Image image_from_tensor(const Tensor& t) {
  DLTRAIN_CHECK(t.defined() && t.dtype() == DType::u8 && t.dim() == 3 &&
                    (t.size(2) == 1 || t.size(2) == 3 || t.size(2) == 4),
                "image_from_tensor: expected a u8 tensor [H, W, C] with C = 1, 3 or 4, got ",
                t.defined() ? dtype_name(t.dtype()) : "undefined", " ",
                t.defined() ? shape_str(t.shape()) : "");
  DLTRAIN_CHECK(t.device().is_cpu(),
                "image_from_tensor: the tensor must be on the CPU; call "
                ".to(Device::cpu()) first");
  Image img(t.size(1), t.size(0), t.size(2));
  Tensor c = t.contiguous();
  std::memcpy(img.data(), c.data_ptr(), img.pixels.size());
  return img;
}

int64_t jpeg_scaled(int64_t extent, JpegScale s) {
  return (extent * s.num + s.denom - 1) / s.denom;
}

JpegScale jpeg_scale_for(int64_t short_side, int64_t min_side) {
  if (min_side <= 0 || min_side >= short_side) return {1, 1};
  for (int denom : {8, 4, 2})
    if (jpeg_scaled(short_side, {1, denom}) >= min_side) return {1, denom};
  return {1, 1};
}

JpegScale jpeg_scale_for_crop(int64_t crop_short, int64_t size) {
  for (int denom : {8, 4, 2})
    if (size > 0 && crop_short >= size * denom) return {1, denom};
  return {1, 1};
}
void read_file_bytes(const std::string& path, std::vector<uint8_t>& out) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  DLTRAIN_CHECK(f != nullptr, "cannot open '", path, "': ", std::strerror(errno));
  DLTRAIN_CHECK(std::fseek(f.get(), 0, SEEK_END) == 0, "cannot seek in '", path,
                "': ", std::strerror(errno));
  const long size = std::ftell(f.get());
  DLTRAIN_CHECK(size >= 0, "cannot read '", path, "': ", std::strerror(errno));
  std::rewind(f.get());
  out.resize(static_cast<size_t>(size));
  const size_t got = size > 0 ? std::fread(out.data(), 1, out.size(), f.get()) : 0;
  DLTRAIN_CHECK(got == out.size(), "cannot read '", path, "': got ", got, " of ", size, " bytes (",
                std::ferror(f.get()) ? std::strerror(errno) : "file shrank", ")");
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::vector<uint8_t> out;
  read_file_bytes(path, out);
  return out;
}

}  // namespace dltrain::data
