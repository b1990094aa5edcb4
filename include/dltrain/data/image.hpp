// Images in host memory and JPEG coding with libjpeg-turbo (its TurboJPEG API, plus
// libjpeg's own API for region decoding when the build has it).
//
// An Image is 8-bit, interleaved (HWC), row-major and tightly packed: pixel (y, x)
// channel c is pixels[(y * width + x) * channels + c]. Decoders always return 3-channel
// RGB (grayscale and CMYK/YCCK files are converted), and can decode at a reduced size
// through libjpeg-turbo's DCT-domain scaling, which skips most of the inverse DCT,
// upsampling and colour conversion and acts as an antialiasing pre-filter for the
// bilinear resize that follows. The automatic choices use only 1/2, 1/4 and 1/8:
// libjpeg-turbo has SIMD code for those reduced IDCTs, while 3/8, 5/8, 3/4 and 7/8 run in
// plain C and decode slower than the full size (libjpeg-turbo 2.1.5, ~400x350 photos:
// full 0.67 ms, 1/2 0.53 ms, 7/8 1.09 ms). Entropy decoding covers the whole file, so even
// 1/8 costs about half a full decode; decode_jpeg_region also avoids the rows below a crop.
// Every failure (not a JPEG, corrupt or truncated data, including libjpeg warnings such
// as "Premature end of JPEG file") raises dltrain::Error carrying libjpeg's own message;
// callers add the file name. Coding handles are per thread, so all functions here are
// safe to call concurrently, and a handle is recreated after any failure, so a bad file never
// affects the next decode on its thread. In a build without TurboJPEG (jpeg_supported() == false)
// they raise an error that says to install libturbojpeg0-dev and rebuild.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dltrain/core/tensor.hpp"

namespace dltrain::data {

/// True when this build decodes and encodes JPEG (it found TurboJPEG at configure time).
bool jpeg_supported();

/// A rectangle in pixels: rows [top, top + height), columns [left, left + width).
struct CropBox {
  int64_t top = 0;
  int64_t left = 0;
  int64_t height = 0;
  int64_t width = 0;
  bool operator==(const CropBox&) const = default;
};

/// An 8-bit HWC image; see the file comment for the layout.
struct Image {
  int64_t width = 0;
  int64_t height = 0;
  /// 1 (gray), 3 (RGB) or 4 (CMYK, only as an encode_jpeg input).
  int64_t channels = 3;
  std::vector<uint8_t> pixels;

  Image() = default;
  /// A zero-filled image. Throws dltrain::Error unless width, height >= 1 and channels is
  /// 1, 3 or 4.
  Image(int64_t width, int64_t height, int64_t channels = 3);

  uint8_t* data() { return pixels.data(); }
  const uint8_t* data() const { return pixels.data(); }
  /// Bytes per row (width * channels).
  int64_t row_stride() const { return width * channels; }
  uint8_t& at(int64_t y, int64_t x, int64_t c = 0) {
    return pixels[static_cast<size_t>((y * width + x) * channels + c)];
  }
  uint8_t at(int64_t y, int64_t x, int64_t c = 0) const {
    return pixels[static_cast<size_t>((y * width + x) * channels + c)];
  }
  bool empty() const { return pixels.empty(); }
};

/// A u8 CPU tensor [height, width, channels] holding a copy of `image`.
Tensor image_to_tensor(const Image& image);
/// The Image held by a u8 CPU tensor [H, W, C] (C = 1, 3 or 4; any strides). Throws
/// dltrain::Error naming the shape or dtype otherwise.
Image image_from_tensor(const Tensor& t);

/// What a JPEG header says, read without decoding the pixels.
struct ImageInfo {
  int64_t width = 0;
  int64_t height = 0;
  /// Components in the file: 1 (grayscale), 3 (YCbCr/RGB) or 4 (CMYK/YCCK).
  int64_t components = 0;
  /// TurboJPEG chroma subsampling (TJSAMP_*: 0 = 4:4:4, 1 = 4:2:2, 2 = 4:2:0, 3 = gray, ...).
  int subsampling = 0;
};

/// Parses the header of the JPEG in `data` (n bytes). Throws dltrain::Error with libjpeg's
/// message when the bytes are not a JPEG or the header is corrupt.
ImageInfo read_jpeg_header(const uint8_t* data, size_t n);
inline ImageInfo read_jpeg_header(const std::vector<uint8_t>& bytes) {
  return read_jpeg_header(bytes.data(), bytes.size());
}

/// A DCT scaling factor num/denom (libjpeg-turbo offers k/8 for k = 1..16; dltrain uses
/// those <= 1).
struct JpegScale {
  int num = 1;
  int denom = 1;
};

/// The size libjpeg-turbo gives `extent` pixels decoded at `s`: ceil(extent * num / denom).
int64_t jpeg_scaled(int64_t extent, JpegScale s);

/// The smallest of 1/8, 1/4, 1/2 (the fast factors, see the file comment) at which an image
/// whose shorter side is `short_side` keeps a shorter side >= min_side, or 1/1 when none does
/// (or min_side <= 0).
JpegScale jpeg_scale_for(int64_t short_side, int64_t min_side);
/// The smallest of 1/8, 1/4, 1/2 that keeps a crop whose shorter side is `crop_short` pixels
/// (at full size) at >= size pixels: crop_short * factor >= size; else 1/1.
JpegScale jpeg_scale_for_crop(int64_t crop_short, int64_t size);

/// Decodes a JPEG to RGB (3 channels), at the smallest DCT scale whose shorter side is
/// still >= min_side (0: full size; see jpeg_scale_for), so a pipeline that needs 256
/// pixels decodes a 1024x768 photo at 1/2 scale (512x384). Grayscale files are replicated
/// to 3 channels and CMYK/YCCK files converted with R = C * K / 255 (Adobe's inverted
/// convention, as libjpeg-turbo's tools). Throws dltrain::Error with libjpeg's message on
/// corrupt, truncated or non-JPEG data.
Image decode_jpeg(const uint8_t* data, size_t n, int64_t min_side = 0);
inline Image decode_jpeg(const std::vector<uint8_t>& bytes, int64_t min_side = 0) {
  return decode_jpeg(bytes.data(), bytes.size(), min_side);
}
/// Decodes at the explicit scale `scale` (a factor libjpeg-turbo supports; see jpeg_scaled()
/// for the output size). Throws dltrain::Error for an unsupported factor or bad data.
Image decode_jpeg_scaled(const uint8_t* data, size_t n, JpegScale scale);

/// True when decode_jpeg_region decodes only the region: this build has libjpeg's own API
/// (jpeg_crop_scanline / jpeg_skip_scanlines; compile definition DLTRAIN_WITH_LIBJPEG and a
/// link to libjpeg). Otherwise decode_jpeg_region decodes the whole image.
bool jpeg_region_decode_supported();

/// Decodes the part of a JPEG that covers `region`, given in the coordinates of the image
/// decoded at `scale` (inside jpeg_scaled(width) x jpeg_scaled(height)), and returns an
/// image that contains it; `region_in_image` receives where the region lies in that image.
/// With jpeg_region_decode_supported(), only the region's rows and the iMCU columns
/// covering it are decoded (plus a 2-pixel margin, so that its pixels equal the full
/// decode's: chroma upsampling at a block's edge lacks its neighbours); rows above it are
/// only entropy-decoded and rows below it not at all (~400x350 photos with
/// RandomResizedCrop boxes: 0.49 ms instead of 0.69 ms). Damage below the region then goes
/// unnoticed, but a truncated file (no end-of-image marker) is still an error. Otherwise
/// the whole image is decoded at `scale` and region_in_image = region. Grayscale and CMYK
/// files give RGB as in decode_jpeg. Throws dltrain::Error with libjpeg's message on bad
/// data, or when the region is not inside the scaled image.
Image decode_jpeg_region(const uint8_t* data, size_t n, JpegScale scale, const CropBox& region,
                         CropBox& region_in_image);

/// Chroma subsampling of encoded colour JPEGs.
enum class ChromaSubsampling { S444, S422, S420 };

/// Encodes `image` as a baseline JPEG at `quality` (1..100): 3 channels as YCbCr with
/// `subsampling` (4:2:0 is what cameras and PIL write by default), 1 channel as grayscale,
/// 4 channels as an Adobe CMYK (YCCK) file. Throws dltrain::Error on an empty image or a
/// quality outside 1..100.
std::vector<uint8_t> encode_jpeg(const Image& image, int quality = 90,
                                 ChromaSubsampling subsampling = ChromaSubsampling::S420);

/// The whole content of the file at `path`. Throws dltrain::Error naming the path when it
/// cannot be opened or read.
std::vector<uint8_t> read_file_bytes(const std::string& path);
/// Reads the file at `path` into `out` (resized; capacity reused across calls).
void read_file_bytes(const std::string& path, std::vector<uint8_t>& out);

}  // namespace dltrain::data
