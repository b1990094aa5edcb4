// The image pipeline: JPEG coding (round trip, DCT-scaled decode, grayscale and CMYK
// files, corrupt and truncated data), the torchvision-semantics transforms against hand
// computations and sampling statistics, the fused pipelines against the plain transforms,
// to_float_batch against a naive loop, and ImageFolder (torchvision ordering, labels,
// batches identical with and without loader workers, corrupt-file policies, errors).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "data/data_test_util.hpp"
#include "dltrain/data/dataloader.hpp"
#include "dltrain/data/image.hpp"
#include "dltrain/data/image_folder.hpp"
#include "dltrain/data/transforms.hpp"
#include "dltrain/dltrain.hpp"
#include "reference_file.hpp"

using namespace dltrain;
using namespace dltrain::data;
using Catch::Contains;
using dltrain::testing::read_bytes;
using dltrain::testing::TempDir;
using dltrain::testing::write_bytes;
namespace fs = std::filesystem;

namespace {

// Skips a JPEG test in a build without TurboJPEG, after checking the error says what to do.
#define REQUIRE_JPEG()                                                   \
  do {                                                                   \
    if (!jpeg_supported()) {                                             \
      REQUIRE_THROWS_WITH(decode_jpeg(std::vector<uint8_t>{0xFF, 0xD8}), \
                          Contains("libturbojpeg0-dev"));                \
      WARN("this build has no TurboJPEG: skipping");                     \
      return;                                                            \
    }                                                                    \
  } while (0)

// A smooth colour test image: gradients plus a bright disc.
Image smooth_image(int64_t w, int64_t h) {
  Image img(w, h, 3);
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      const double dx = static_cast<double>(x) - w / 2.0, dy = static_cast<double>(y) - h / 2.0;
      const bool disc = dx * dx + dy * dy < (h / 4.0) * (h / 4.0);
      img.at(y, x, 0) = static_cast<uint8_t>(40 + 150 * x / w + (disc ? 60 : 0));
      img.at(y, x, 1) = static_cast<uint8_t>(30 + 180 * y / h);
      img.at(y, x, 2) = static_cast<uint8_t>(disc ? 220 : 90);
    }
  return img;
}

double psnr(const Image& a, const Image& b) {
  REQUIRE(a.width == b.width);
  REQUIRE(a.height == b.height);
  REQUIRE(a.channels == b.channels);
  double se = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) {
    const double d = double(a.pixels[i]) - double(b.pixels[i]);
    se += d * d;
  }
  const double mse = se / static_cast<double>(a.pixels.size());
  return mse == 0 ? 99.0 : 10 * std::log10(255.0 * 255.0 / mse);
}

// A 1-channel image from rows of values.
Image gray(const std::vector<std::vector<int>>& rows) {
  Image img(static_cast<int64_t>(rows[0].size()), static_cast<int64_t>(rows.size()), 1);
  for (size_t y = 0; y < rows.size(); ++y)
    for (size_t x = 0; x < rows[0].size(); ++x)
      img.at(static_cast<int64_t>(y), static_cast<int64_t>(x)) = static_cast<uint8_t>(rows[y][x]);
  return img;
}

std::vector<std::vector<int>> rows_of(const Image& img, int64_t c = 0) {
  std::vector<std::vector<int>> out(static_cast<size_t>(img.height));
  for (int64_t y = 0; y < img.height; ++y)
    for (int64_t x = 0; x < img.width; ++x) out[static_cast<size_t>(y)].push_back(img.at(y, x, c));
  return out;
}

void write_jpeg(const std::string& path, const Image& img, int quality = 90) {
  fs::create_directories(fs::path(path).parent_path());
  write_bytes(path, encode_jpeg(img, quality));
}

}  // namespace

// --- JPEG ------------------------------------------------------------------------------

TEST_CASE("JPEG encode/decode round trip and header", "[image][jpeg]") {
  REQUIRE_JPEG();
  const Image src = smooth_image(96, 64);
  for (auto sub : {ChromaSubsampling::S420, ChromaSubsampling::S444}) {
    const auto bytes = encode_jpeg(src, 95, sub);
    REQUIRE(bytes.size() > 100);
    REQUIRE(bytes[0] == 0xFF);
    REQUIRE(bytes[1] == 0xD8);
    const ImageInfo info = read_jpeg_header(bytes);
    REQUIRE(info.width == 96);
    REQUIRE(info.height == 64);
    REQUIRE(info.components == 3);
    REQUIRE(info.subsampling == (sub == ChromaSubsampling::S444 ? 0 : 2));
    const Image dec = decode_jpeg(bytes);
    REQUIRE(dec.width == 96);
    REQUIRE(dec.height == 64);
    REQUIRE(dec.channels == 3);
    CHECK(psnr(src, dec) > 30.0);
  }
  // Lower quality: smaller file, still recognisable.
  const auto q95 = encode_jpeg(src, 95), q30 = encode_jpeg(src, 30);
  REQUIRE(q30.size() < q95.size());
  CHECK(psnr(src, decode_jpeg(q30)) > 24.0);
  REQUIRE_THROWS_WITH(encode_jpeg(src, 0), Contains("quality"));
  REQUIRE_THROWS_WITH(encode_jpeg(Image(), 90), Contains("empty"));
}

TEST_CASE("jpeg_scale_for and DCT-scaled decode", "[image][jpeg]") {
  REQUIRE(jpeg_scale_for(120, 0).num == 1);
  REQUIRE(jpeg_scale_for(120, 120).denom == 1);
  REQUIRE(jpeg_scale_for(120, 500).denom == 1);
  const JpegScale s30 = jpeg_scale_for(120, 30);  // 1/4 -> 30
  REQUIRE((s30.num == 1 && s30.denom == 4));
  const JpegScale s60 = jpeg_scale_for(120, 60);  // 1/2 -> 60
  REQUIRE((s60.num == 1 && s60.denom == 2));
  const JpegScale s61 = jpeg_scale_for(120, 61);  // only the fast factors: not 5/8
  REQUIRE((s61.num == 1 && s61.denom == 1));
  const JpegScale s10 = jpeg_scale_for(120, 10);  // 1/8 -> 15
  REQUIRE((s10.num == 1 && s10.denom == 8));
  REQUIRE(jpeg_scaled(121, {1, 8}) == 16);  // ceil
  const JpegScale c448 = jpeg_scale_for_crop(448, 224), c447 = jpeg_scale_for_crop(447, 224);
  REQUIRE((c448.num == 1 && c448.denom == 2));
  REQUIRE((c447.num == 1 && c447.denom == 1));
  REQUIRE(jpeg_scale_for_crop(1800, 224).denom == 8);
  REQUIRE(jpeg_scale_for_crop(1791, 224).denom == 4);
  REQUIRE(jpeg_scaled(201, {3, 8}) == 76);  // ceil(75.375)

  REQUIRE_JPEG();
  const Image src = smooth_image(200, 120);
  const auto bytes = encode_jpeg(src, 95, ChromaSubsampling::S444);
  const Image quarter = decode_jpeg(bytes, 30);
  REQUIRE(quarter.width == 50);
  REQUIRE(quarter.height == 30);
  // The scaled decode is the image, smaller: compare with a bilinear downscale of the full
  // decode (both are low-pass versions; a wrong scale or layout would give ~10 dB).
  CHECK(psnr(quarter, resize(decode_jpeg(bytes), 30, 50)) > 24.0);
  const Image half = decode_jpeg(bytes, 60);
  REQUIRE(half.width == 100);
  REQUIRE(half.height == 60);
  CHECK(psnr(half, resize(src, 60, 100)) > 26.0);
  REQUIRE(decode_jpeg(bytes, 61).width == 200);
  const Image five8 = decode_jpeg_scaled(bytes.data(), bytes.size(), {5, 8});  // explicit
  REQUIRE(five8.width == 125);
  REQUIRE(five8.height == 75);
  CHECK(psnr(five8, resize(src, 75, 125)) > 26.0);
  REQUIRE(decode_jpeg(bytes, 120).width == 200);
  const Image eighth = decode_jpeg_scaled(bytes.data(), bytes.size(), {1, 8});
  REQUIRE(eighth.width == 25);
  REQUIRE(eighth.height == 15);
  REQUIRE_THROWS_WITH(decode_jpeg_scaled(bytes.data(), bytes.size(), {1, 3}),
                      Contains("cannot scale by 1/3"));
}

TEST_CASE("decode_jpeg_region gives the full decode's pixels in the region", "[image][jpeg]") {
  REQUIRE_JPEG();
  Image src = smooth_image(333, 250);
  for (size_t i = 0; i < src.pixels.size(); ++i)  // texture, so that errors would show
    src.pixels[i] = static_cast<uint8_t>(src.pixels[i] ^ ((i * 2654435761u) >> 28));
  const auto bytes = encode_jpeg(src, 90);
  INFO("region decoding: " << (jpeg_region_decode_supported() ? "libjpeg" : "full decode"));
  for (JpegScale s : {JpegScale{1, 1}, JpegScale{1, 2}}) {
    const Image full = decode_jpeg_scaled(bytes.data(), bytes.size(), s);
    for (CropBox r : {CropBox{0, 0, full.height, full.width}, CropBox{17, 40, 50, 61},
                      CropBox{full.height - 9, full.width - 30, 9, 30}, CropBox{5, 0, 1, 1}}) {
      CropBox at;
      const Image part = decode_jpeg_region(bytes.data(), bytes.size(), s, r, at);
      REQUIRE(at.height == r.height);
      REQUIRE(at.width == r.width);
      REQUIRE(at.top >= 0);
      REQUIRE(at.left >= 0);
      REQUIRE(at.top + at.height <= part.height);
      REQUIRE(at.left + at.width <= part.width);
      REQUIRE(part.channels == 3);
      const Image a = crop(part, at), b = crop(full, r);
      REQUIRE(a.pixels == b.pixels);
    }
  }
  CropBox at;
  REQUIRE_THROWS_WITH(decode_jpeg_region(bytes.data(), bytes.size(), {1, 2}, {0, 0, 126, 10}, at),
                      Contains("not inside the 125x167 image"));
  // A truncated file is an error even when the region lies in the intact part.
  const std::vector<uint8_t> cut(bytes.begin(), bytes.end() - 200);
  REQUIRE_THROWS_WITH(decode_jpeg_region(cut.data(), cut.size(), {1, 1}, {0, 0, 8, 8}, at),
                      Contains("truncated"));
  // Grayscale files give RGB.
  Image g(64, 40, 1);
  for (size_t i = 0; i < g.pixels.size(); ++i) g.pixels[i] = static_cast<uint8_t>(i % 200);
  const auto gb = encode_jpeg(g, 95);
  const Image gp = decode_jpeg_region(gb.data(), gb.size(), {1, 1}, {8, 8, 16, 16}, at);
  REQUIRE(gp.channels == 3);
  REQUIRE(crop(gp, at).pixels == crop(decode_jpeg(gb), {8, 8, 16, 16}).pixels);
}

TEST_CASE("Grayscale and CMYK JPEGs decode to RGB", "[image][jpeg]") {
  REQUIRE_JPEG();
  Image g(40, 24, 1);
  for (int64_t y = 0; y < 24; ++y)
    for (int64_t x = 0; x < 40; ++x) g.at(y, x) = static_cast<uint8_t>(20 + 5 * x);
  const auto bytes = encode_jpeg(g, 95);
  const ImageInfo info = read_jpeg_header(bytes);
  REQUIRE(info.components == 1);
  const Image rgb = decode_jpeg(bytes);
  REQUIRE(rgb.channels == 3);
  REQUIRE(rgb.width == 40);
  int max_err = 0;
  for (int64_t y = 0; y < 24; ++y)
    for (int64_t x = 0; x < 40; ++x) {
      REQUIRE(rgb.at(y, x, 0) == rgb.at(y, x, 1));
      REQUIRE(rgb.at(y, x, 1) == rgb.at(y, x, 2));
      max_err = std::max(max_err, std::abs(int(rgb.at(y, x, 0)) - int(g.at(y, x))));
    }
  CHECK(max_err <= 4);

  // Adobe CMYK with K = 255 (no black ink, inverted convention): RGB = (C, M, Y).
  Image cmyk(32, 16, 4);
  for (int64_t y = 0; y < 16; ++y)
    for (int64_t x = 0; x < 32; ++x) {
      cmyk.at(y, x, 0) = 200;
      cmyk.at(y, x, 1) = static_cast<uint8_t>(60 + 4 * x);
      cmyk.at(y, x, 2) = 30;
      cmyk.at(y, x, 3) = 255;
    }
  const auto cb = encode_jpeg(cmyk, 98);
  REQUIRE(read_jpeg_header(cb).components == 4);
  const Image c2 = decode_jpeg(cb);
  REQUIRE(c2.channels == 3);
  CropBox at;
  const Image c3 = decode_jpeg_region(cb.data(), cb.size(), {1, 1}, {3, 5, 8, 20}, at);
  REQUIRE(crop(c3, at).pixels == crop(c2, {3, 5, 8, 20}).pixels);
  for (int64_t x : {0, 10, 31}) {
    CHECK(std::abs(int(c2.at(8, x, 0)) - 200) <= 4);
    CHECK(std::abs(int(c2.at(8, x, 1)) - int(60 + 4 * x)) <= 6);
    CHECK(std::abs(int(c2.at(8, x, 2)) - 30) <= 4);
  }
}

TEST_CASE("Corrupt and truncated JPEG data raise errors", "[image][jpeg]") {
  REQUIRE_JPEG();
  // Texture, so that the entropy-coded scan dominates the file (tables take ~600 bytes).
  Image tex = smooth_image(256, 192);
  for (size_t i = 0; i < tex.pixels.size(); ++i)
    tex.pixels[i] = static_cast<uint8_t>(tex.pixels[i] ^ ((i * 2654435761u) >> 27));
  const auto bytes = encode_jpeg(tex, 90);
  REQUIRE(bytes.size() > 8000);
  // Not a JPEG at all.
  std::vector<uint8_t> junk(500);
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 37 + 11);
  REQUIRE_THROWS_WITH(decode_jpeg(junk), Contains("not a valid JPEG") && Contains("500 bytes"));
  REQUIRE_THROWS_AS(read_jpeg_header(junk), Error);
  REQUIRE_THROWS_WITH(decode_jpeg(std::vector<uint8_t>{}), Contains("empty"));
  // Truncated after the header: libjpeg's "Premature end of JPEG file" warning is an error.
  std::vector<uint8_t> half(bytes.begin(), bytes.begin() + static_cast<long>(bytes.size() / 2));
  REQUIRE(read_jpeg_header(half).width == 256);  // the header itself is intact
  REQUIRE_THROWS_WITH(decode_jpeg(half),
                      Contains("corrupt or truncated") && Contains("Premature end of JPEG file"));
  // Truncated inside the header.
  std::vector<uint8_t> head(bytes.begin(), bytes.begin() + 40);
  REQUIRE_THROWS_AS(decode_jpeg(head), Error);
  // Corrupt entropy-coded data (markers injected into the scan).
  std::vector<uint8_t> bad = bytes;
  for (size_t i = bad.size() / 2; i < bad.size() / 2 + 40; i += 2) {
    bad[i] = 0xFF;
    bad[i + 1] = 0xD9;
  }
  REQUIRE_THROWS_WITH(decode_jpeg(bad), Contains("decode_jpeg"));
}

// Issue 16: a failed call must not poison this thread's decoder handles. Every bad input
// below fails (or, for CMYK, succeeds) through each entry point, and a valid file decoded
// right after it, on the same thread, gives exactly the pixels it gives on a fresh thread.
TEST_CASE("A bad JPEG never breaks later decodes on the same thread", "[image][jpeg]") {
  REQUIRE_JPEG();
  Image tex = smooth_image(120, 80);
  for (size_t i = 0; i < tex.pixels.size(); ++i)
    tex.pixels[i] = static_cast<uint8_t>(tex.pixels[i] ^ ((i * 2654435761u) >> 28));
  const auto good = encode_jpeg(tex, 90);
  const CropBox region{10, 20, 30, 40};
  // The reference decodes, made on a thread of their own (fresh handles).
  Image want_full, want_half, want_region;
  CropBox want_at;
  std::thread([&] {
    want_full = decode_jpeg(good);
    want_half = decode_jpeg_scaled(good.data(), good.size(), {1, 2});
    want_region = decode_jpeg_region(good.data(), good.size(), {1, 1}, region, want_at);
  }).join();

  // Locates a marker segment (FF xx) in the header; returns the index of its FF.
  auto find_marker = [&](uint8_t m) {
    for (size_t i = 2; i + 1 < good.size(); ++i)
      if (good[i] == 0xFF && good[i + 1] == m) return i;
    FAIL("marker not found");
    return size_t{0};
  };
  std::vector<std::pair<std::string, std::vector<uint8_t>>> bad;
  bad.push_back(
      {"truncated scan",
       std::vector<uint8_t>(good.begin(), good.begin() + static_cast<long>(good.size() / 2))});
  bad.push_back({"truncated header", std::vector<uint8_t>(good.begin(), good.begin() + 60)});
  std::vector<uint8_t> junk(700);
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 37 + 11);
  bad.push_back({"garbage", junk});
  junk[0] = 0xFF;  // a JPEG signature followed by garbage
  junk[1] = 0xD8;
  bad.push_back({"SOI + garbage", junk});
  bad.push_back({"zero-length", {}});
  {
    auto b = good;  // SOF0: FF C0, length(2), precision(1), height(2), width(2), ...
    b[find_marker(0xC0) + 4] = 12;  // 12-bit precision: unsupported
    bad.push_back({"12-bit SOF", b});
  }
  {
    auto b = good;  // height 0 (DNL-defined height, which libjpeg does not support)
    const size_t sof = find_marker(0xC0);
    b[sof + 5] = 0;
    b[sof + 6] = 0;
    bad.push_back({"zero height", b});
  }
  {
    auto b = good;  // a Huffman table whose code counts overflow
    const size_t dht = find_marker(0xC4);
    for (size_t k = 0; k < 16; ++k) b[dht + 5 + k] = 0xFF;
    bad.push_back({"bogus Huffman table", b});
  }
  {
    auto b = good;  // a quantisation table segment with a bad length
    const size_t dqt = find_marker(0xDB);
    b[dqt + 2] = 0;
    b[dqt + 3] = 1;
    bad.push_back({"bad DQT length", b});
  }
  {
    auto b = good;  // markers injected into the entropy-coded scan
    for (size_t i = b.size() / 2; i < b.size() / 2 + 40; i += 2) {
      b[i] = 0xFF;
      b[i + 1] = 0xD9;
    }
    bad.push_back({"corrupt scan", b});
  }
  Image cmyk(32, 16, 4);
  for (size_t i = 0; i < cmyk.pixels.size(); ++i) cmyk.pixels[i] = static_cast<uint8_t>(i * 7);
  const auto cmyk_bytes = encode_jpeg(cmyk, 95);  // decodes (converted to RGB)

  auto check_good = [&] {
    REQUIRE(read_jpeg_header(good).width == 120);
    REQUIRE(decode_jpeg(good).pixels == want_full.pixels);
    REQUIRE(decode_jpeg_scaled(good.data(), good.size(), {1, 2}).pixels == want_half.pixels);
    CropBox at;
    const Image r = decode_jpeg_region(good.data(), good.size(), {1, 1}, region, at);
    REQUIRE(crop(r, at).pixels == crop(want_region, want_at).pixels);
  };
  int failures = 0;
  for (const auto& entry : bad) {
    const auto& what = entry.first;
    const auto& bytes = entry.second;  // a reference, not a binding: lambdas capture it
    INFO("after: " << what);
    // Each entry point in turn, each followed by the valid file.
    auto expect_error = [&](auto&& call) {
      try {
        call();
      } catch (const Error&) {
        ++failures;
      }
      check_good();
    };
    expect_error([&] { read_jpeg_header(bytes); });
    expect_error([&] { decode_jpeg(bytes); });
    expect_error([&] { decode_jpeg_scaled(bytes.data(), bytes.size(), {1, 2}); });
    expect_error([&] {
      CropBox at;
      decode_jpeg_region(bytes.data(), bytes.size(), {1, 1}, {0, 0, 8, 8}, at);
    });
    // decode_jpeg (the full decode) rejects every one of them.
    REQUIRE_THROWS_AS(decode_jpeg(bytes), Error);
    check_good();
  }
  INFO("after: CMYK");
  REQUIRE(decode_jpeg(cmyk_bytes).channels == 3);
  check_good();
  // Most entry points fail on most inputs (a header read succeeds on a truncated scan).
  REQUIRE(failures >= 3 * static_cast<int>(bad.size()));
}

// --- transforms ------------------------------------------------------------------------

TEST_CASE("SampleRandom is a pure function of (seed, epoch, index, stream)", "[image][random]") {
  auto draws = [](uint64_t seed, int64_t epoch, int64_t index, uint32_t stream) {
    SampleRandom r(seed, epoch, index, stream);
    std::vector<double> v;
    for (int i = 0; i < 9; ++i) v.push_back(r.uniform());
    return v;
  };
  const auto a = draws(1, 2, 3, 0);
  REQUIRE(a == draws(1, 2, 3, 0));
  REQUIRE(a != draws(1, 2, 3, 1));
  REQUIRE(a != draws(1, 3, 3, 0));
  REQUIRE(a != draws(1, 2, 4, 0));
  REQUIRE(a != draws(2, 2, 3, 0));
  std::set<double> distinct(a.begin(), a.end());
  REQUIRE(distinct.size() == a.size());
  SampleRandom r(0, 0, 0);
  double sum = 0;
  for (int i = 0; i < 4000; ++i) {
    const double u = r.uniform();
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    sum += u;
    const int64_t k = r.randint(3, 7);
    REQUIRE(k >= 3);
    REQUIRE(k < 7);
  }
  CHECK(std::abs(sum / 4000 - 0.5) < 0.02);
  REQUIRE_THROWS_WITH(SampleRandom(0, -1, 0), Contains("epoch"));
}

TEST_CASE("RandomResizedCrop boxes follow torchvision's distribution", "[image][transforms]") {
  const RandomResizedCrop rrc(224);
  const int64_t H = 375, W = 500;
  double area_sum = 0;
  int64_t ratio_lo = 0, ratio_hi = 0, flipped = 0;
  std::set<int64_t> tops, lefts;
  const int n = 3000;
  for (int i = 0; i < n; ++i) {
    SampleRandom r(42, 0, i);
    const CropBox b = rrc.get_params(H, W, r);
    REQUIRE(b.top >= 0);
    REQUIRE(b.left >= 0);
    REQUIRE(b.top + b.height <= H);
    REQUIRE(b.left + b.width <= W);
    const double frac = double(b.height * b.width) / double(H * W);
    // Rounding w and h to integers moves the area by < 1 pixel row/column.
    REQUIRE(frac >= 0.08 * 0.97);
    REQUIRE(frac <= 1.0);
    const double ratio = double(b.width) / double(b.height);
    REQUIRE(ratio >= 0.75 * 0.97);
    REQUIRE(ratio <= 4.0 / 3.0 * 1.03);
    area_sum += frac;
    ratio_lo += ratio < 1.0;
    ratio_hi += ratio > 1.0;
    tops.insert(b.top);
    lefts.insert(b.left);
    // Same (seed, epoch, index): same box. Next epoch: a different box (almost always).
    SampleRandom again(42, 0, i), next(42, 1, i);
    REQUIRE(rrc.get_params(H, W, again) == b);
    if (rrc.get_params(H, W, next) == b) ++flipped;
  }
  // Area fraction ~ U(0.08, 1) minus the rejected large ones: mean a little under 0.54.
  const double mean = area_sum / n;
  CHECK(mean > 0.42);
  CHECK(mean < 0.56);
  // A 4:3 landscape image rejects more tall boxes than wide ones.
  CHECK(ratio_hi > ratio_lo);
  CHECK(tops.size() > 100);
  CHECK(lefts.size() > 100);
  CHECK(flipped < 5);
  // On a square image the log-uniform ratio gives as many tall boxes as wide ones.
  int64_t tall = 0, wide = 0;
  for (int i = 0; i < n; ++i) {
    SampleRandom r(7, 0, i);
    const CropBox b = rrc.get_params(400, 400, r);
    tall += b.height > b.width;
    wide += b.width > b.height;
  }
  CHECK(std::abs(double(tall - wide)) < 0.06 * n);
}

TEST_CASE("RandomResizedCrop falls back to a ratio-clamped centre crop", "[image][transforms]") {
  const RandomResizedCrop rrc(32);
  SampleRandom r(0, 0, 0);
  // 1000 x 10 (W x H): every attempt needs h >= sqrt(800 * 3/4) > 10, so all fail.
  REQUIRE(rrc.get_params(10, 1000, r) == CropBox{0, 493, 10, 13});  // w = round(10 * 4/3)
  REQUIRE(rrc.get_params(1000, 10, r) == CropBox{493, 0, 13, 10});  // h = round(10 / (3/4))
  // Area fractions > 1 never fit: the whole image when its ratio is in range.
  const RandomResizedCrop big(32, {2.0, 3.0});
  REQUIRE(big.get_params(90, 100, r) == CropBox{0, 0, 90, 100});
  // The transform itself: output size x size.
  Image tall(10, 1000, 3);
  const Image out = rrc(tall, r);
  REQUIRE(out.width == 32);
  REQUIRE(out.height == 32);
  REQUIRE_THROWS_WITH(RandomResizedCrop(0), Contains("size"));
  REQUIRE_THROWS_WITH(RandomResizedCrop(8, {0.5, 0.1}), Contains("scale"));
  REQUIRE_THROWS_WITH(RandomResizedCrop(8, {0.1, 1}, {-1, 1}), Contains("ratio"));
}

TEST_CASE("Bilinear resize matches hand-computed values", "[image][transforms]") {
  // 2x downscale of v = 10 x + 40 y (8 x 4): every output averages a 2x2 block exactly,
  // src = 2 d + 0.5, so out(y, x) = 10 (2x + 0.5) + 40 (2y + 0.5) = 20 x + 80 y + 25.
  std::vector<std::vector<int>> rows(4, std::vector<int>(8));
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 8; ++x) rows[y][x] = 10 * x + 40 * y;
  const Image src = gray(rows);
  const Image half = Resize(2)(src);
  REQUIRE(half.height == 2);
  REQUIRE(half.width == 4);
  REQUIRE(rows_of(half) == std::vector<std::vector<int>>{{25, 45, 65, 85}, {105, 125, 145, 165}});

  // 2x upscale of [[0, 100], [40, 140]]: source coordinates -0.25 (clamped to 0), 0.25, 0.75,
  // 1.25 (second neighbour clamped), so along x: 0, 25, 75, 100 and along y: 0, 10, 30, 40.
  const Image up = resize(gray({{0, 100}, {40, 140}}), 4, 4);
  REQUIRE(rows_of(up) ==
          std::vector<std::vector<int>>{
              {0, 25, 75, 100}, {10, 35, 85, 110}, {30, 55, 105, 130}, {40, 65, 115, 140}});
  // Round half to even (torch.round): [0 1 2 3] -> width 2 averages 0.5 and 2.5 -> 0 and 2.
  REQUIRE(rows_of(resize(gray({{0, 1, 2, 3}}), 1, 2)) == std::vector<std::vector<int>>{{0, 2}});
  // Same size is the identity.
  REQUIRE(rows_of(resize(src, 4, 8)) == rows);
  // Channels are independent.
  Image rgb(2, 1, 3);
  rgb.pixels = {0, 10, 200, 100, 30, 0};
  const Image rgb4 = resize(rgb, 1, 4);
  REQUIRE(rgb4.pixels == std::vector<uint8_t>{0, 10, 200, 25, 15, 150, 75, 25, 50, 100, 30, 0});
}

TEST_CASE("Transforms reproduce torchvision's output", "[image][transforms][reference]") {
  // tests/reference/make_image_reference.py: torchvision 0.14 tensor path, antialias=False.
  // The weights are torch's to the last bit; only a value that lands within float noise of
  // an exact .5 may round the other way (torch's summation order differs), so: at most one
  // level apart, and at most 1 value in 1000 not identical.
  const auto ref = dltrain::testing::read_reference(DLTRAIN_REFERENCE_DIR "/image_reference.txt");
  auto as_image = [](const Tensor& hwc) { return image_from_tensor(hwc.to(DType::u8)); };
  auto same = [](const std::vector<uint8_t>& got, const Image& expect) {
    REQUIRE(got.size() == expect.pixels.size());
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      REQUIRE(std::abs(int(got[i]) - int(expect.pixels[i])) <= 1);
      differ += got[i] != expect.pixels[i];
    }
    CHECK(differ * 1000 <= got.size());
  };
  const Image src = as_image(ref.at("input"));
  REQUIRE(src.height == 37);
  REQUIRE(src.width == 53);
  for (auto [h, w] :
       std::vector<std::pair<int64_t, int64_t>>{{20, 29}, {37, 11}, {9, 53}, {48, 60}, {50, 50}}) {
    const std::string key = "resize." + std::to_string(h) + "x" + std::to_string(w);
    INFO(key);
    same(resize(src, h, w).pixels, as_image(ref.at(key)));
  }
  Image out(32, 32, 3);
  resample_bilinear(src, {3, 5, 25, 30}, 32, 32, {0, 0, 32, 32}, false, out.data(), 32 * 3);
  same(out.pixels, as_image(ref.at("resized_crop.32")));
  Image flipped(24, 24, 3);
  resample_bilinear(src, {3, 5, 25, 30}, 24, 24, {0, 0, 24, 24}, true, flipped.data(), 24 * 3);
  same(flipped.pixels, as_image(ref.at("resized_crop_flip.24")));
  same(CenterCrop(24)(Resize(30)(src)).pixels, as_image(ref.at("eval.30.24")));
  std::vector<uint8_t> fused(24 * 24 * 3);
  ImagePipeline::eval(30, 24).apply(src, 0, 0, 0, fused.data());
  same(fused, as_image(ref.at("eval.30.24")));
  // Normalize: (x / 255 - mean) / std in float32, bit for bit.
  const Tensor patch = image_to_tensor(crop(src, {0, 0, 5, 7})).unsqueeze(0);
  const auto got = to_float_batch(patch, kImageNetMean, kImageNetStd, MemoryFormat::ChannelsLast)
                       .permute({0, 2, 3, 1})
                       .contiguous()
                       .to_vector<float>();
  const auto expect = ref.at("normalize").to_vector<double>();
  REQUIRE(got.size() == expect.size());
  for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == static_cast<float>(expect[i]));
}

TEST_CASE("Resize and CenterCrop sizes and values follow torchvision", "[image][transforms]") {
  // Output sizes: shorter side -> size, longer int(size * long / short).
  REQUIRE(Resize(256).output_size(375, 500) == std::array<int64_t, 2>{256, 341});
  REQUIRE(Resize(256).output_size(500, 375) == std::array<int64_t, 2>{341, 256});
  REQUIRE(Resize(2).output_size(3, 10) == std::array<int64_t, 2>{2, 6});
  REQUIRE(Resize(256).output_size(300, 300) == std::array<int64_t, 2>{256, 256});
  const Image r = Resize(10)(smooth_image(40, 20));
  REQUIRE(r.height == 10);
  REQUIRE(r.width == 20);

  // CenterCrop: top = round((H - size) / 2), half to even as Python's round.
  std::vector<std::vector<int>> rows(7, std::vector<int>(7));
  for (int y = 0; y < 7; ++y)
    for (int x = 0; x < 7; ++x) rows[y][x] = 10 * y + x;
  REQUIRE(CenterCrop(2).box(5, 5) == CropBox{2, 2, 2, 2});  // round(1.5) = 2
  REQUIRE(CenterCrop(2).box(7, 7) == CropBox{2, 2, 2, 2});  // round(2.5) = 2
  REQUIRE(CenterCrop(3).box(7, 6) == CropBox{2, 2, 3, 3});  // round(2), round(1.5)
  REQUIRE(rows_of(CenterCrop(3)(gray(rows))) ==
          std::vector<std::vector<int>>{{22, 23, 24}, {32, 33, 34}, {42, 43, 44}});
  // Larger than the image: zero padding, (size - extent) // 2 on the top/left.
  REQUIRE(CenterCrop(4).box(2, 3) == CropBox{-1, 0, 4, 4});
  REQUIRE(rows_of(CenterCrop(4)(gray({{1, 2, 3}, {4, 5, 6}}))) ==
          std::vector<std::vector<int>>{{0, 0, 0, 0}, {1, 2, 3, 0}, {4, 5, 6, 0}, {0, 0, 0, 0}});

  // hflip and crop.
  REQUIRE(rows_of(hflip(gray({{1, 2, 3}, {4, 5, 6}}))) ==
          std::vector<std::vector<int>>{{3, 2, 1}, {6, 5, 4}});
  REQUIRE(rows_of(crop(gray(rows), {1, 2, 2, 3})) ==
          std::vector<std::vector<int>>{{12, 13, 14}, {22, 23, 24}});
  REQUIRE_THROWS_WITH(crop(gray(rows), {5, 5, 3, 3}), Contains("not inside"));
}

TEST_CASE("Fused pipelines equal the plain transforms", "[image][transforms]") {
  const Image src = smooth_image(123, 97);
  // Eval: Resize(64) + CenterCrop(48) in one resampling pass == the two transforms.
  ImagePipeline ev = ImagePipeline::eval(64, 48);
  std::vector<uint8_t> out(48 * 48 * 3);
  ev.apply(src, 0, 0, 0, out.data());
  REQUIRE(out == CenterCrop(48)(Resize(64)(src)).pixels);
  // Eval with resize < size pads with zeros like torchvision.
  ImagePipeline pad = ImagePipeline::eval(40, 48);
  pad.apply(src, 0, 0, 0, out.data());
  REQUIRE(out == CenterCrop(48)(Resize(40)(src)).pixels);

  // Train: RandomResizedCrop from stream 0, flip from stream 1.
  const ImagePipeline tr = ImagePipeline::train(40);
  int flips = 0;
  for (int64_t idx = 0; idx < 20; ++idx) {
    std::vector<uint8_t> got(40 * 40 * 3);
    tr.apply(src, 7, 3, idx, got.data());
    SampleRandom r0(7, 3, idx, 0), r1(7, 3, idx, 1);
    Image expect = RandomResizedCrop(40)(src, r0);
    if (RandomHorizontalFlip(0.5).draw(r1)) {
      expect = hflip(expect);
      ++flips;
    }
    REQUIRE(got == expect.pixels);
  }
  CHECK(flips > 3);
  CHECK(flips < 17);

  REQUIRE_JPEG();
  // On JPEG bytes without DCT scaling: identical to the transform of the full decode.
  const Image photo = smooth_image(640, 480);
  const auto bytes = encode_jpeg(photo, 92);
  const Image full = decode_jpeg(bytes);
  ImagePipeline exact = ImagePipeline::train(64);
  exact.dct_scaling = false;
  ImagePipeline scaled = ImagePipeline::train(64);
  int differ = 0;
  for (int64_t idx = 0; idx < 12; ++idx) {
    std::vector<uint8_t> a(64 * 64 * 3), b(64 * 64 * 3), c(64 * 64 * 3);
    exact.apply_jpeg(bytes.data(), bytes.size(), 1, 0, idx, a.data());
    exact.apply(full, 1, 0, idx, b.data());
    REQUIRE(a == b);
    // With DCT scaling (crops of 128+ px from 640x480 decode at 1/2 or 1/4): same picture.
    scaled.apply_jpeg(bytes.data(), bytes.size(), 1, 0, idx, c.data());
    Image ia(64, 64, 3), ic(64, 64, 3);
    ia.pixels = a;
    ic.pixels = c;
    CHECK(psnr(ia, ic) > 26.0);
    differ += a != c;
  }
  CHECK(differ > 6);  // most crops were decoded scaled
  // Eval on JPEG bytes: 640x480 cannot go to 1/2 (240 < 256): full decode, identical.
  const ImagePipeline ev2 = ImagePipeline::eval(256, 224);
  std::vector<uint8_t> e1(224 * 224 * 3), e2(224 * 224 * 3);
  ev2.apply_jpeg(bytes.data(), bytes.size(), 0, 0, 0, e1.data());
  ev2.apply(full, 0, 0, 0, e2.data());
  REQUIRE(e1 == e2);
  // 1100x600 decodes at 1/2 (550x300) for Resize(256): the same picture.
  const auto big = encode_jpeg(smooth_image(1100, 600), 92);
  ev2.apply_jpeg(big.data(), big.size(), 0, 0, 0, e1.data());
  ev2.apply(decode_jpeg(big), 0, 0, 0, e2.data());
  REQUIRE(e1 != e2);
  Image i1(224, 224, 3), i2(224, 224, 3);
  i1.pixels = e1;
  i2.pixels = e2;
  CHECK(psnr(i1, i2) > 30.0);
}

TEST_CASE("to_float_batch matches a naive loop in both layouts", "[image][normalize]") {
  Generator g(3);
  const int64_t N = 3, H = 5, W = 7, C = 3;
  const Tensor u8 = randint(0, 256, {N, H, W, C}, DType::u8, &g);
  const auto in = u8.to_vector<int>();
  const std::vector<float> mean = kImageNetMean, sd = kImageNetStd;
  for (auto fmt : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
    const Tensor f = to_float_batch(u8, mean, sd, fmt);
    REQUIRE(f.dtype() == DType::f32);
    REQUIRE(f.shape() == Shape{N, C, H, W});
    REQUIRE(f.is_contiguous(fmt));
    const Tensor nchw = f.contiguous();
    const auto got = nchw.to_vector<float>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t y = 0; y < H; ++y)
          for (int64_t x = 0; x < W; ++x) {
            const float v =
                static_cast<float>(in[static_cast<size_t>(((n * H + y) * W + x) * C + c)]);
            const float expect =
                (v / 255.f - mean[static_cast<size_t>(c)]) / sd[static_cast<size_t>(c)];
            REQUIRE(got[static_cast<size_t>(((n * C + c) * H + y) * W + x)] == expect);
          }
  }
  // One value for all channels; empty = no normalisation (x / 255).
  const auto plain = to_float_batch(u8, {}, {}).contiguous().to_vector<float>();
  REQUIRE(plain[0] == static_cast<float>(in[0]) / 255.f);
  const auto one = to_float_batch(u8, {0.5f}, {0.25f}).contiguous().to_vector<float>();
  REQUIRE(one[1] == (static_cast<float>(in[3]) / 255.f - 0.5f) / 0.25f);  // (n0,c0,y0,x1)
  REQUIRE_THROWS_WITH(to_float_batch(u8, {0.1f, 0.2f}, {}), Contains("mean has 2 values"));
  REQUIRE_THROWS_WITH(to_float_batch(u8, {}, {0.f}), Contains("std must be > 0"));
  REQUIRE_THROWS_WITH(to_float_batch(u8.to(DType::f32), {}, {}), Contains("u8 batch"));
}

// --- ImageFolder ---------------------------------------------------------------------------

TEST_CASE("ImageFolder follows torchvision's ordering and labels", "[image][folder]") {
  REQUIRE_JPEG();
  TempDir dir("imgfolder");
  const std::string root = dir.str();
  write_jpeg(root + "/zebra/x.jpg", smooth_image(50, 40));
  write_jpeg(root + "/apple/sub/y.JPEG", smooth_image(60, 30));
  write_jpeg(root + "/apple/b.jpeg", smooth_image(30, 60));
  write_jpeg(root + "/apple/a.jpg", smooth_image(45, 45));
  write_bytes(root + "/apple/notes.txt", {1, 2, 3});
  write_bytes(root + "/stray.jpg", {1, 2, 3});  // files at the root are not classes

  ImageFolder ds(root);
  REQUIRE(ds.classes() == std::vector<std::string>{"apple", "zebra"});
  REQUIRE(ds.size() == 4);
  const auto& s = ds.samples();
  REQUIRE(s[0] == std::pair<std::string, int64_t>{root + "/apple/a.jpg", 0});
  REQUIRE(s[1] == std::pair<std::string, int64_t>{root + "/apple/b.jpeg", 0});
  REQUIRE(s[2] == std::pair<std::string, int64_t>{root + "/apple/sub/y.JPEG", 0});
  REQUIRE(s[3] == std::pair<std::string, int64_t>{root + "/zebra/x.jpg", 1});
  REQUIRE(ds.targets() == std::vector<int64_t>{0, 0, 0, 1});

  const Batch b = ds.get_batch({3, 0, 2});
  REQUIRE(b.data.dtype() == DType::u8);
  REQUIRE(b.data.shape() == Shape{3, 224, 224, 3});
  REQUIRE(b.target.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0});
  // Each slice is the pipeline applied to that file with its index.
  const auto bytes = read_bytes(s[2].first);
  std::vector<uint8_t> expect(224 * 224 * 3);
  ds.options().transform.apply_jpeg(bytes.data(), bytes.size(), 0, 0, 2, expect.data());
  const Tensor slice = b.data.select(0, 2).contiguous();
  REQUIRE(std::equal(expect.begin(), expect.end(), slice.data<uint8_t>()));
  // get() is one sample of the same epoch.
  const Example e = ds.get(2);
  REQUIRE(e.data.shape() == Shape{224, 224, 3});
  REQUIRE(e.target.item<int64_t>() == 0);
  REQUIRE(e.data.contiguous().to_vector<int>() == slice.to_vector<int>());
  // The epoch changes the augmentation; going back reproduces it.
  ds.set_epoch(1);
  REQUIRE(ds.get(2).data.contiguous().to_vector<int>() != slice.to_vector<int>());
  ds.set_epoch(0);
  REQUIRE(ds.get(2).data.contiguous().to_vector<int>() == slice.to_vector<int>());
  REQUIRE_THROWS_WITH(ds.get_batch({4}), Contains("index 4 is out of range for 4"));
  REQUIRE_THROWS_WITH(ds.get_batch({}), Contains("empty"));

  // Eval pipeline, and extensions restricted to .jpg (case-insensitive).
  ImageFolderOptions o;
  o.transform = ImagePipeline::eval(256, 224);
  o.extensions = {".JPG"};
  ImageFolder ev(root, o);
  REQUIRE(ev.size() == 2);
  REQUIRE(ev.get_batch({0, 1}).data.shape() == Shape{2, 224, 224, 3});
}

TEST_CASE("ImageFolder batches are identical with and without loader workers",
          "[image][folder][loader]") {
  REQUIRE_JPEG();
  TempDir dir("imgfolder_gen");
  Generator g(11);
  const Tensor images = randint(0, 256, {40, 28, 28}, DType::u8, &g);
  std::vector<int64_t> lab;
  for (int i = 0; i < 40; ++i) lab.push_back(i % 4);
  MakeImageFolderOptions mo;
  mo.classes = 4;
  mo.per_class = 6;
  mo.size = 64;
  mo.seed = 5;
  REQUIRE(write_image_folder(dir.str(), images, from_vector(lab, {40}), mo) == 24);
  const auto names = image_folder_class_names(4);
  REQUIRE(names[0] == "n00000000_tshirt");
  REQUIRE(names[3] == "n00000003_dress");
  REQUIRE(fs::exists(dir.str() + "/n00000002_pullover/n00000002_00005.JPEG"));

  auto ds = std::make_shared<ImageFolder>(dir.str(), ImageFolderOptions{});
  REQUIRE(ds->classes() == names);
  REQUIRE(ds->size() == 24);
  REQUIRE(ds->targets() == std::vector<int64_t>{0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1,
                                                2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3});

  auto run = [&](int64_t workers, int64_t epoch) {
    DataLoaderOptions lo;
    lo.batch_size = 5;
    lo.shuffle = true;
    lo.seed = 9;
    lo.num_workers = workers;
    DataLoader loader(ds, lo);
    loader.set_epoch(epoch);
    std::vector<std::vector<int>> out;
    std::vector<int64_t> targets;
    for (const Batch& b : loader) {
      REQUIRE(b.data.shape()[1] == 224);
      out.push_back(b.data.to_vector<int>());
      for (int64_t t : b.target.to_vector<int64_t>()) targets.push_back(t);
    }
    return std::make_pair(out, targets);
  };
  const auto sync0 = run(0, 0);
  REQUIRE(sync0.first.size() == 5);  // 24 samples, batch 5
  REQUIRE(run(2, 0) == sync0);
  REQUIRE(run(3, 0) == sync0);
  const auto sync1 = run(0, 1);
  REQUIRE(run(2, 1) == sync1);
  REQUIRE(sync1.first != sync0.first);
  // Targets follow the shuffled order: the loader's batch k is ds.get_batch_for_epoch(order).
  DataLoaderOptions lo;
  lo.batch_size = 5;
  lo.shuffle = true;
  lo.seed = 9;
  DataLoader loader(ds, lo);
  const auto order = loader.batch_indices();
  const Batch direct = ds->get_batch_for_epoch(order[1], 0);
  REQUIRE(direct.data.to_vector<int>() == sync0.first[1]);
  std::vector<int64_t> expect_t;
  for (const auto& bi : order)
    for (int64_t i : bi) expect_t.push_back(ds->targets()[static_cast<size_t>(i)]);
  REQUIRE(sync0.second == expect_t);

  // The generator is deterministic for a seed.
  TempDir again("imgfolder_gen2");
  write_image_folder(again.str(), images, from_vector(lab, {40}), mo);
  const std::string f = "/n00000001_trouser/n00000001_00003.JPEG";
  REQUIRE(read_bytes(dir.str() + f) == read_bytes(again.str() + f));
  const Image img = decode_jpeg(read_bytes(dir.str() + f));
  REQUIRE(std::min(img.width, img.height) >= 48);
  REQUIRE(std::min(img.width, img.height) <= 80);
  mo.seed = 6;
  TempDir other("imgfolder_gen3");
  write_image_folder(other.str(), images, from_vector(lab, {40}), mo);
  REQUIRE(read_bytes(dir.str() + f) != read_bytes(other.str() + f));
}

// Issue 16: corrupt files among valid ones, all decoded by one loader worker (one thread,
// one set of decoder handles). The error policy fails exactly the corrupt samples, each
// error naming its own file; the skip policy skips exactly the corrupt samples. Every valid
// sample gives the pixels it gives on a thread that never saw a corrupt file.
TEST_CASE("ImageFolder with corrupt files among valid ones on one worker", "[image][folder]") {
  REQUIRE_JPEG();
  TempDir dir("imgfolder_mixed");
  const std::string root = dir.str();
  const auto valid = [](int k) { return encode_jpeg(smooth_image(60 + 4 * k, 50 + 3 * k), 90); };
  const auto good = valid(0);
  std::vector<uint8_t> garbage(600), soi_garbage(600);
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<uint8_t>(i * 37 + 11);
  soi_garbage = garbage;
  soi_garbage[0] = 0xFF;  // the kind that used to poison the thread's decoder
  soi_garbage[1] = 0xD8;
  auto twelve_bit = good;
  for (size_t i = 2; i + 4 < twelve_bit.size(); ++i)
    if (twelve_bit[i] == 0xFF && twelve_bit[i + 1] == 0xC0) {
      twelve_bit[i + 4] = 12;
      break;
    }
  // Sorted order interleaves them; sample 0 is valid (begin() builds the first batch).
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> files = {
      {"a/00.jpg", valid(1)},
      {"a/01_soi_garbage.jpg", soi_garbage},
      {"a/02.jpg", valid(2)},
      {"a/03_truncated.jpg",
       std::vector<uint8_t>(good.begin(), good.begin() + static_cast<long>(good.size() / 2))},
      {"a/04.jpg", valid(3)},
      {"b/05_garbage.jpg", garbage},
      {"b/06.jpg", valid(4)},
      {"b/07_empty.jpg", {}},
      {"b/08.jpg", valid(5)},
      {"b/09_12bit.jpg", twelve_bit},
      {"b/10.jpg", valid(6)},
      {"b/11.jpg", valid(7)},
  };
  std::set<int64_t> corrupt;
  for (size_t i = 0; i < files.size(); ++i) {
    fs::create_directories(fs::path(root + "/" + files[i].first).parent_path());
    write_bytes(root + "/" + files[i].first, files[i].second);
    if (files[i].first.find('_') != std::string::npos) corrupt.insert(static_cast<int64_t>(i));
  }
  const int64_t n = static_cast<int64_t>(files.size());
  // The reference: each valid sample alone, on a fresh thread.
  std::map<int64_t, std::vector<int>> want;
  std::thread([&] {
    ImageFolder ref(root);
    for (int64_t i = 0; i < n; ++i)
      if (!corrupt.count(i)) want[i] = ref.get_batch({i}).data.contiguous().to_vector<int>();
  }).join();
  REQUIRE(want.size() == 7);

  SECTION("CorruptPolicy::Error names each corrupt file, and only those") {
    auto ds = std::make_shared<ImageFolder>(root);
    DataLoader loader(ds, DataLoaderOptions{.batch_size = 1, .num_workers = 1});
    auto it = loader.begin();
    std::set<int64_t> failed;
    for (int64_t i = 0; i < n; ++i) {
      INFO("sample " << i << ": " << files[static_cast<size_t>(i)].first);
      if (i > 0) {
        try {
          ++it;
        } catch (const Error& e) {
          failed.insert(i);
          const std::string msg = e.what();
          REQUIRE_THAT(msg, Contains(root + "/" + files[static_cast<size_t>(i)].first) &&
                                Contains("CorruptPolicy::Skip"));
          for (size_t j = 0; j < files.size(); ++j)  // no other file is blamed
            if (j != static_cast<size_t>(i)) REQUIRE_THAT(msg, !Contains(files[j].first));
          continue;
        }
      }
      REQUIRE(it->data.contiguous().to_vector<int>() == want.at(i));
      REQUIRE(it->target.item<int64_t>() == (i < 5 ? 0 : 1));
    }
    REQUIRE(failed == corrupt);
    REQUIRE(ds->skipped() == 0);
  }

  SECTION("CorruptPolicy::Skip skips exactly the corrupt files") {
    ImageFolderOptions o;
    o.on_corrupt = CorruptPolicy::Skip;
    auto ds = std::make_shared<ImageFolder>(root, o);
    DataLoader loader(ds, DataLoaderOptions{.batch_size = 4, .num_workers = 1});
    int64_t i = 0;
    for (const Batch& b : loader) {
      for (int64_t k = 0; k < b.data.size(0); ++k, ++i) {
        int64_t j = i;  // a corrupt sample is replaced by the next valid one
        while (corrupt.count(j)) j = (j + 1) % n;
        INFO("sample " << i << " -> " << j);
        REQUIRE(b.data.select(0, k).contiguous().to_vector<int>() == want.at(j));
      }
    }
    REQUIRE(i == n);
    REQUIRE(ds->skipped() == static_cast<int64_t>(corrupt.size()));
  }
}

TEST_CASE("ImageFolder corrupt-file policies and errors", "[image][folder]") {
  REQUIRE_JPEG();
  TempDir dir("imgfolder_bad");
  const std::string root = dir.str();
  fs::create_directories(root + "/b");
  write_jpeg(root + "/a/0.jpg", smooth_image(64, 48));
  write_jpeg(root + "/a/1.jpg", smooth_image(48, 64));
  const auto good = encode_jpeg(smooth_image(80, 60), 90);
  write_bytes(
      root + "/b/2.jpg",
      std::vector<uint8_t>(good.begin(), good.begin() + static_cast<long>(good.size() * 2 / 3)));
  write_jpeg(root + "/b/3.jpg", smooth_image(70, 70));

  ImageFolder strict(root);
  REQUIRE(strict.size() == 4);
  REQUIRE_THROWS_WITH(strict.get_batch({0, 2}), Contains(root + "/b/2.jpg") &&
                                                    Contains("truncated") &&
                                                    Contains("CorruptPolicy::Skip"));
  REQUIRE_NOTHROW(strict.get_batch({0, 1, 3}));
  // Through a loader with workers, the error reaches the consumer.
  {
    DataLoaderOptions lo;
    lo.batch_size = 2;
    lo.num_workers = 2;
    DataLoader loader(std::make_shared<ImageFolder>(root), lo);
    auto it = loader.begin();  // batch 0 = {0, 1}
    REQUIRE(it->size() == 2);
    REQUIRE_THROWS_WITH(++it, Contains(root + "/b/2.jpg"));
  }

  ImageFolderOptions o;
  o.on_corrupt = CorruptPolicy::Skip;
  ImageFolder lenient(root, o);
  const Batch b = lenient.get_batch({2, 0, 2});
  REQUIRE(lenient.skipped() == 2);
  // Sample 2 is replaced by sample 3 (its label and its augmentation).
  REQUIRE(b.target.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 1});
  const Batch three = lenient.get_batch({3});
  REQUIRE(b.data.select(0, 0).contiguous().to_vector<int>() ==
          three.data.select(0, 0).contiguous().to_vector<int>());
  REQUIRE(lenient.skipped() == 2);

  // Errors on construction.
  REQUIRE_THROWS_WITH(ImageFolder(root + "/missing"), Contains("does not exist"));
  TempDir empty_root("imgfolder_empty");
  REQUIRE_THROWS_WITH(ImageFolder(empty_root.str()), Contains("holds no class folder"));
  write_bytes(empty_root.file("file.jpg"), good);
  REQUIRE_THROWS_WITH(ImageFolder(empty_root.file("file.jpg")), Contains("not a directory"));
  fs::create_directories(root + "/c_empty/sub");
  write_bytes(root + "/c_empty/readme.txt", {1});
  REQUIRE_THROWS_WITH(ImageFolder(root), Contains(root + "/c_empty") &&
                                             Contains("no file with an accepted extension") &&
                                             Contains(".jpg, .jpeg, .JPEG"));
  ImageFolderOptions bad;
  bad.transform.size = 0;
  fs::remove_all(root + "/c_empty");
  REQUIRE_THROWS_WITH(ImageFolder(root, bad), Contains("size must be >= 1"));
}
