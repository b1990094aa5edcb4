// The JPEG backend of data/image.hpp (compiled when TurboJPEG is found; a build without it
// compiles no_jpeg.cpp instead: src/data/CMakeLists.txt).
//
// JPEG coding over TurboJPEG's tj* API (libjpeg-turbo 2.x; the tj3 API of 3.x is not
// used so that Debian 12's libturbojpeg0-dev suffices).
//
// Each thread keeps one decompressor and one compressor handle (thread_local), so a
// successful call allocates no handle and concurrent calls never share one. Every tj* call
// that fails -- warnings included, which is how libjpeg reports a truncated file -- raises
// dltrain::Error with tjGetErrorStr2's text, and the handle is destroyed and recreated first:
// TurboJPEG 2.x leaves a handle whose header parse failed in a state where every later call
// fails ("Unsupported marker type", "Improper call to JPEG library in state ..."), so one bad
// file would otherwise poison every later decode on its thread (issue 16).
//
// decode_jpeg_region uses libjpeg's own API when the build provides it
// (DLTRAIN_WITH_LIBJPEG): TurboJPEG 2.x cannot decode part of an image. libjpeg reports
// errors through error_exit, which must not return; it longjmps back to the setjmp in
// lj_decode_region, a function that creates no C++ objects after setjmp, so no destructor
// is skipped. Warnings are promoted to errors there as well.
#include "dltrain/data/image.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "dltrain/core/error.hpp"

#include <turbojpeg.h>

#ifdef DLTRAIN_WITH_LIBJPEG
#include <csetjmp>
// jpeglib.h needs <cstdio> (included above) and jerror.h needs jpeglib.h.
// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 1005000
#error "DLTRAIN_WITH_LIBJPEG needs libjpeg-turbo >= 1.5 (jpeg_crop_scanline, jpeg_skip_scanlines)"
#endif
#endif

namespace dltrain::data {

namespace {

// One thread's TurboJPEG handle, created on first use and after every failure.
class Handle {
 public:
  explicit Handle(bool compress) : compress_(compress) {}
  ~Handle() { destroy(); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  tjhandle get() {
    if (!h_) {
      h_ = compress_ ? tjInitCompress() : tjInitDecompress();
      DLTRAIN_CHECK(h_ != nullptr, "TurboJPEG: cannot create a ",
                    compress_ ? "compressor" : "decompressor", ": ", tjGetErrorStr2(nullptr));
    }
    return h_;
  }
  // The handle's error text, after which the handle is dropped (the next get() makes a new
  // one). Copied out first: tjGetErrorStr2 points into the handle.
  std::string fail() {
    std::string why = tjGetErrorStr2(h_);
    destroy();
    return why;
  }

 private:
  void destroy() {
    if (h_) tjDestroy(h_);
    h_ = nullptr;
  }
  tjhandle h_ = nullptr;
  bool compress_;
};

Handle& decompressor() {
  thread_local Handle handle(false);
  return handle;
}

Handle& compressor() {
  thread_local Handle handle(true);
  return handle;
}

struct Header {
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
};

Header header(Handle& h, const uint8_t* data, size_t n, const char* op) {
  DLTRAIN_CHECK(data != nullptr && n > 0, op, ": the JPEG data is empty");
  Header hd;
  if (tjDecompressHeader3(h.get(), data, static_cast<unsigned long>(n), &hd.width, &hd.height,
                          &hd.subsamp, &hd.colorspace) != 0)
    DLTRAIN_FAIL(op, ": not a valid JPEG (", n, " bytes): ", h.fail());
  DLTRAIN_CHECK(hd.width > 0 && hd.height > 0, op, ": the JPEG header declares a ", hd.width, "x",
                hd.height, " image");
  return hd;
}

int components_of(int colorspace) {
  switch (colorspace) {
    case TJCS_GRAY:
      return 1;
    case TJCS_CMYK:
    case TJCS_YCCK:
      return 4;
    default:
      return 3;
  }
}

// libjpeg-turbo's own CMYK -> RGB (cmyk.h): the stored values are Adobe-inverted.
void cmyk_to_rgb(const uint8_t* s, uint8_t* o, int64_t pixels) {
  for (int64_t i = 0; i < pixels; ++i, s += 4, o += 3) {
    const int k = s[3];
    o[0] = static_cast<uint8_t>(s[0] * k / 255);
    o[1] = static_cast<uint8_t>(s[1] * k / 255);
    o[2] = static_cast<uint8_t>(s[2] * k / 255);
  }
}

bool supported_factor(JpegScale s) {
  int count = 0;
  const tjscalingfactor* f = tjGetScalingFactors(&count);
  for (int i = 0; f && i < count; ++i)
    if (static_cast<int64_t>(f[i].num) * s.denom == static_cast<int64_t>(s.num) * f[i].denom)
      return true;
  return false;
}

}  // namespace

bool jpeg_supported() { return true; }

ImageInfo read_jpeg_header(const uint8_t* data, size_t n) {
  const Header hd = header(decompressor(), data, n, "read_jpeg_header");
  return {hd.width, hd.height, components_of(hd.colorspace), hd.subsamp};
}

Image decode_jpeg_scaled(const uint8_t* data, size_t n, JpegScale scale) {
  Handle& h = decompressor();
  const Header hd = header(h, data, n, "decode_jpeg");
  DLTRAIN_CHECK(scale.num >= 1 && scale.denom >= 1 && supported_factor(scale),
                "decode_jpeg: libjpeg-turbo cannot scale by ", scale.num, "/", scale.denom,
                "; use k/8 for k = 1..16");
  const int64_t w = jpeg_scaled(hd.width, scale), ht = jpeg_scaled(hd.height, scale);
  const bool cmyk = components_of(hd.colorspace) == 4;
  std::vector<uint8_t> cmyk_buf;
  Image img(w, ht, 3);
  uint8_t* dst = img.data();
  if (cmyk) {
    cmyk_buf.resize(static_cast<size_t>(w * ht * 4));
    dst = cmyk_buf.data();
  }
  // width/height arguments are the desired scaled size: TurboJPEG picks the factor from them.
  if (tjDecompress2(h.get(), data, static_cast<unsigned long>(n), dst, static_cast<int>(w), 0,
                    static_cast<int>(ht), cmyk ? TJPF_CMYK : TJPF_RGB, 0) != 0)
    DLTRAIN_FAIL("decode_jpeg: corrupt or truncated JPEG (", hd.width, "x", hd.height, ", ", n,
                 " bytes): ", h.fail());
  if (cmyk) cmyk_to_rgb(cmyk_buf.data(), img.data(), w * ht);
  return img;
}

Image decode_jpeg(const uint8_t* data, size_t n, int64_t min_side) {
  const Header hd = header(decompressor(), data, n, "decode_jpeg");
  return decode_jpeg_scaled(data, n, jpeg_scale_for(std::min(hd.width, hd.height), min_side));
}

#ifdef DLTRAIN_WITH_LIBJPEG
namespace {

struct LjError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void lj_error_exit(j_common_ptr c) {
  auto* e = reinterpret_cast<LjError*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

// Level -1 is a warning (e.g. corrupt entropy data): an error here, as with TurboJPEG.
void lj_emit_message(j_common_ptr c, int level) {
  if (level < 0) lj_error_exit(c);
}

bool lj_create(jpeg_decompress_struct* d, LjError* e) {
  if (setjmp(e->jump)) return false;
  jpeg_create_decompress(d);
  return true;
}

struct LjDecoder {
  jpeg_decompress_struct d{};
  LjError err{};
  bool ok = false;
  LjDecoder() {
    d.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = lj_error_exit;
    err.mgr.emit_message = lj_emit_message;
    ok = lj_create(&d, &err);
  }
  ~LjDecoder() {
    if (ok) jpeg_destroy_decompress(&d);
  }
  LjDecoder(const LjDecoder&) = delete;
  LjDecoder& operator=(const LjDecoder&) = delete;
};

struct LjRegion {
  JDIMENSION x0 = 0, width = 0;
  int components = 3;
};

// Decodes rows [top, top + height) and the iMCU columns covering [left, left + width) at
// scale s into *out (width x height x components, RGB or CMYK). False on a libjpeg error,
// with the message in e->message.
bool lj_decode_region(jpeg_decompress_struct* d, LjError* e, const uint8_t* data, size_t n,
                      JpegScale s, const CropBox& r, std::vector<uint8_t>* out, LjRegion* res) {
  if (setjmp(e->jump)) {
    jpeg_abort_decompress(d);
    return false;
  }
  jpeg_mem_src(d, data, static_cast<unsigned long>(n));
  jpeg_read_header(d, TRUE);
  d->scale_num = static_cast<unsigned>(s.num);
  d->scale_denom = static_cast<unsigned>(s.denom);
  const bool four = d->jpeg_color_space == JCS_CMYK || d->jpeg_color_space == JCS_YCCK;
  d->out_color_space = four ? JCS_CMYK : JCS_RGB;
  jpeg_start_decompress(d);
  JDIMENSION x0 = static_cast<JDIMENSION>(r.left), w = static_cast<JDIMENSION>(r.width);
  jpeg_crop_scanline(d, &x0, &w);
  if (r.top > 0) jpeg_skip_scanlines(d, static_cast<JDIMENSION>(r.top));
  const size_t pc = static_cast<size_t>(d->output_components);
  out->resize(static_cast<size_t>(w) * pc * static_cast<size_t>(r.height));
  const JDIMENSION end = static_cast<JDIMENSION>(r.top + r.height);
  while (d->output_scanline < end) {
    JSAMPROW row = out->data() + static_cast<size_t>(d->output_scanline - r.top) * w * pc;
    if (jpeg_read_scanlines(d, &row, 1) != 1) ERREXIT(d, JERR_INPUT_EOF);
  }
  jpeg_abort_decompress(d);  // rows below the region are never decoded
  res->x0 = x0;
  res->width = w;
  res->components = static_cast<int>(pc);
  return true;
}

// Whether an end-of-image marker (FF D9) is among the last bytes: a truncated file has
// none. (FF D9 cannot occur inside entropy-coded data, where FF is followed by 00.)
bool has_eoi(const uint8_t* data, size_t n) {
  const size_t from = n > 4096 ? n - 4096 : 0;
  for (size_t i = n; i-- > from + 1;)
    if (data[i] == 0xD9 && data[i - 1] == 0xFF) return true;
  return false;
}

}  // namespace
#endif

bool jpeg_region_decode_supported() {
#ifdef DLTRAIN_WITH_LIBJPEG
  return true;
#else
  return false;
#endif
}

Image decode_jpeg_region(const uint8_t* data, size_t n, JpegScale scale, const CropBox& region,
                         CropBox& region_in_image) {
  const ImageInfo info = read_jpeg_header(data, n);
  DLTRAIN_CHECK(scale.num >= 1 && scale.denom >= 1 && supported_factor(scale),
                "decode_jpeg_region: libjpeg-turbo cannot scale by ", scale.num, "/", scale.denom,
                "; use k/8 for k = 1..16");
  const int64_t sw = jpeg_scaled(info.width, scale), sh = jpeg_scaled(info.height, scale);
  DLTRAIN_CHECK(region.top >= 0 && region.left >= 0 && region.height >= 1 && region.width >= 1 &&
                    region.top + region.height <= sh && region.left + region.width <= sw,
                "decode_jpeg_region: region (top ", region.top, ", left ", region.left, ", ",
                region.height, "x", region.width, ") is not inside the ", sh, "x", sw,
                " image decoded at ", scale.num, "/", scale.denom);
#ifdef DLTRAIN_WITH_LIBJPEG
  DLTRAIN_CHECK(has_eoi(data, n), "decode_jpeg_region: truncated JPEG (", n,
                " bytes): no end-of-image marker (FF D9) at its end");
  // Recreated after a failure, as the TurboJPEG handles are: jpeg_abort_decompress should
  // leave it reusable, but a fresh decoder does not depend on that.
  thread_local std::unique_ptr<LjDecoder> decoder;
  if (!decoder) decoder = std::make_unique<LjDecoder>();
  LjDecoder& dec = *decoder;
  if (!dec.ok) {
    const std::string why = dec.err.message;
    decoder.reset();
    DLTRAIN_FAIL("decode_jpeg_region: cannot create a libjpeg decompressor: ", why);
  }
  // A 2-pixel margin keeps the region away from the decoded block's edges, where chroma
  // upsampling lacks its neighbours and can differ from the full decode.
  constexpr int64_t kMargin = 2;
  CropBox padded;
  padded.top = std::max<int64_t>(0, region.top - kMargin);
  padded.left = std::max<int64_t>(0, region.left - kMargin);
  padded.height = std::min(sh, region.top + region.height + kMargin) - padded.top;
  padded.width = std::min(sw, region.left + region.width + kMargin) - padded.left;
  std::vector<uint8_t> buf;
  LjRegion r;
  if (!lj_decode_region(&dec.d, &dec.err, data, n, scale, padded, &buf, &r)) {
    const std::string why = dec.err.message;
    decoder.reset();
    DLTRAIN_FAIL("decode_jpeg_region: corrupt or truncated JPEG (", info.width, "x", info.height,
                 ", ", n, " bytes): ", why);
  }
  Image img(static_cast<int64_t>(r.width), padded.height, 3);
  if (r.components == 4)
    cmyk_to_rgb(buf.data(), img.data(), img.width * img.height);
  else
    img.pixels = std::move(buf);
  region_in_image = {region.top - padded.top, region.left - static_cast<int64_t>(r.x0),
                     region.height, region.width};
  return img;
#else
  region_in_image = region;
  return decode_jpeg_scaled(data, n, scale);
#endif
}

std::vector<uint8_t> encode_jpeg(const Image& image, int quality, ChromaSubsampling subsampling) {
  DLTRAIN_CHECK(
      !image.empty() && image.width >= 1 && image.height >= 1 &&
          static_cast<int64_t>(image.pixels.size()) == image.width * image.height * image.channels,
      "encode_jpeg: the image is empty or its pixel buffer does not hold width x "
      "height x channels bytes");
  DLTRAIN_CHECK(quality >= 1 && quality <= 100, "encode_jpeg: quality must be in 1..100, got ",
                quality);
  int pf = TJPF_RGB, samp = TJSAMP_420;
  if (image.channels == 1) {
    pf = TJPF_GRAY;
    samp = TJSAMP_GRAY;
  } else {
    pf = image.channels == 4 ? TJPF_CMYK : TJPF_RGB;
    samp = subsampling == ChromaSubsampling::S444   ? TJSAMP_444
           : subsampling == ChromaSubsampling::S422 ? TJSAMP_422
                                                    : TJSAMP_420;
  }
  Handle& h = compressor();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  if (tjCompress2(h.get(), image.data(), static_cast<int>(image.width), 0,
                  static_cast<int>(image.height), pf, &out, &size, samp, quality, 0) != 0) {
    if (out) tjFree(out);
    DLTRAIN_FAIL("encode_jpeg: TurboJPEG failed on a ", image.width, "x", image.height, "x",
                 image.channels, " image: ", h.fail());
  }
  std::vector<uint8_t> bytes(out, out + size);
  tjFree(out);
  return bytes;
}

}  // namespace dltrain::data
