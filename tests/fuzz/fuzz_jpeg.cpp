// libFuzzer target: the JPEG paths the loaders use, on arbitrary bytes: header, full
// decode, scaled decode and region decode. After any of them fails, a valid JPEG must
// still decode on the same thread (the poisoned-handle defect of issue 16).
#include <vector>

#include "dltrain/data/image.hpp"
#include "fuzz_common.hpp"

namespace {
const std::vector<uint8_t>& valid_jpeg() {
  static const std::vector<uint8_t> bytes = [] {
    dltrain::data::Image im(8, 6, 3);
    for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>(i * 7);
    return dltrain::data::encode_jpeg(im, 90);
  }();
  return bytes;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dltrain::data;
  if (!jpeg_supported()) return 0;
  dltrain::fuzz::expect_clean([&] {
    const ImageInfo info = read_jpeg_header(data, size);
    // Skip full decodes of huge declared images: they are valid allocations, not findings.
    if (info.width * info.height > (int64_t{1} << 22)) return;
    (void)decode_jpeg(data, size);
    (void)decode_jpeg_scaled(data, size, JpegScale{1, 2});
    if (jpeg_region_decode_supported() && info.width >= 2 && info.height >= 2) {
      CropBox at;
      (void)decode_jpeg_region(data, size, JpegScale{1, 1},
                               CropBox{1, 1, info.height - 1, info.width - 1}, at);
    }
  });
  const Image ok = decode_jpeg(valid_jpeg());
  if (ok.width != 8 || ok.height != 6) __builtin_trap();
  return 0;
}
