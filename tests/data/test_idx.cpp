// IDX reader/writer: round trips (u8, i32, f32, f64; plain and gzip), the exact
// big-endian bytes on disk, widening of int8/int16 files, and a dltrain::Error that
// names the file for every missing, corrupt, truncated or over-long input.
#include <catch2/catch.hpp>

#include <algorithm>

#include "data/data_test_util.hpp"
#include "dltrain/data/idx.hpp"
#include "dltrain/dltrain.hpp"

using namespace dltrain;
using namespace dltrain::data;
using Catch::Contains;
using dltrain::testing::read_bytes;
using dltrain::testing::TempDir;
using dltrain::testing::write_bytes;
using Bytes = std::vector<uint8_t>;

namespace {

// Header 00 00 code ndim + big-endian sizes.
Bytes idx_header(uint8_t code, const std::vector<uint32_t>& dims) {
  Bytes b{0, 0, code, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int k = 3; k >= 0; --k) b.push_back(static_cast<uint8_t>(d >> (8 * k)));
  return b;
}

Bytes cat_bytes(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

uint32_t crc32(const Bytes& data) {
  uint32_t c = 0xffffffffu;
  for (uint8_t byte : data) {
    c ^= byte;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return ~c;
}

void put_le32(Bytes& b, uint32_t v) {
  for (int k = 0; k < 4; ++k) b.push_back(static_cast<uint8_t>(v >> (8 * k)));
}

// A gzip member holding `payload` in stored (uncompressed) deflate blocks (RFC 1951/1952),
// written without zlib so the reader is checked against an independent writer.
Bytes gzip_stored(const Bytes& payload) {
  Bytes out{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff};
  size_t off = 0;
  do {
    const size_t len = std::min<size_t>(payload.size() - off, 65535);
    const bool last = off + len == payload.size();
    out.push_back(last ? 1 : 0);
    out.push_back(static_cast<uint8_t>(len & 0xff));
    out.push_back(static_cast<uint8_t>(len >> 8));
    out.push_back(static_cast<uint8_t>(~len & 0xff));
    out.push_back(static_cast<uint8_t>((~len >> 8) & 0xff));
    out.insert(out.end(), payload.begin() + static_cast<std::ptrdiff_t>(off),
               payload.begin() + static_cast<std::ptrdiff_t>(off + len));
    off += len;
  } while (off < payload.size());
  put_le32(out, crc32(payload));
  put_le32(out, static_cast<uint32_t>(payload.size()));
  return out;
}

}  // namespace

TEST_CASE("IDX round trip of every dtype, plain and gzip", "[data][idx]") {
  TempDir dir("idx_rt");
  Generator g(7);
  const std::vector<Tensor> inputs{
      randint(0, 256, {3, 4, 5}, DType::u8, &g),
      randn({2, 3}, DType::f32, &g),
      randint(-100000, 100000, {7}, DType::i32, &g),
      randn({2, 2, 2, 2}, DType::f64, &g),
      randn({4, 3}, DType::f32, &g).t(),  // non-contiguous input
  };
  for (bool gz : {false, true}) {
    if (gz && !gzip_supported()) {
      WARN("this build has no zlib: skipping the gzip round trip (plain path still checked)");
      continue;
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::string path = dir.file(std::to_string(i) + (gz ? "_t.idx.gz" : "_t.idx"));
      write_idx(path, inputs[i], gz);
      const Bytes raw = read_bytes(path);
      REQUIRE(raw.size() >= 2);
      REQUIRE((raw[0] == 0x1f && raw[1] == 0x8b) == gz);
      const Tensor back = read_idx(path);
      REQUIRE(back.dtype() == inputs[i].dtype());
      REQUIRE(back.shape() == inputs[i].shape());
      REQUIRE(back.is_contiguous());
      REQUIRE(back.to_vector<double>() == inputs[i].to_vector<double>());
    }
  }
}

TEST_CASE("IDX gzip is detected by magic bytes, not by extension", "[data][idx]") {
  TempDir dir("idx_magic");
  const Tensor t = tensor({1, 2, 3, 250}, DType::u8);
  write_idx(dir.file("plain.gz"), t);  // plain file with a .gz name
  REQUIRE(read_idx(dir.file("plain.gz")).to_vector<int>() == std::vector<int>{1, 2, 3, 250});
  if (!gzip_supported()) {
    WARN("this build has no zlib: skipping the gzip-without-.gz-suffix case");
    write_bytes(dir.file("fake"), {0x1f, 0x8b, 8, 0, 0, 0});
    REQUIRE_THROWS_WITH(read_idx(dir.file("fake")), Contains("gunzip") && Contains("fake"));
    return;
  }
  write_idx(dir.file("compressed.bin"), t, true);
  REQUIRE(read_bytes(dir.file("compressed.bin"))[0] == 0x1f);
  REQUIRE(read_idx(dir.file("compressed.bin")).to_vector<int>() == std::vector<int>{1, 2, 3, 250});
}

TEST_CASE("IDX reads gzip written by an independent encoder (multi-block)", "[data][idx][gzip]") {
  TempDir dir("idx_hand_gz");
  Generator g(11);
  const Tensor t = randint(0, 256, {300, 300}, DType::u8, &g);  // 90000 bytes: 2 stored blocks
  write_idx(dir.file("plain"), t);
  write_bytes(dir.file("hand.gz"), gzip_stored(read_bytes(dir.file("plain"))));
  if (!gzip_supported()) {
    WARN("this build has no zlib: checking the gunzip error instead of the gzip read");
    REQUIRE_THROWS_WITH(read_idx(dir.file("hand.gz")), Contains("gunzip"));
    return;
  }
  const Tensor back = read_idx(dir.file("hand.gz"));
  REQUIRE(back.shape() == Shape{300, 300});
  REQUIRE(back.to_vector<int>() == t.to_vector<int>());
}

TEST_CASE("IDX bytes on disk are big-endian with the documented type codes", "[data][idx]") {
  TempDir dir("idx_bytes");
  write_idx(dir.file("u8"), tensor({1, 2, 3, 4, 5, 6}, DType::u8).reshape({2, 3}));
  REQUIRE(read_bytes(dir.file("u8")) ==
          cat_bytes(idx_header(0x08, {2, 3}), Bytes{1, 2, 3, 4, 5, 6}));
  write_idx(dir.file("f32"), tensor({1.0, -2.0}, DType::f32));
  REQUIRE(read_bytes(dir.file("f32")) ==
          cat_bytes(idx_header(0x0D, {2}), Bytes{0x3f, 0x80, 0, 0, 0xc0, 0, 0, 0}));
  write_idx(dir.file("i32"), tensor({258, -1}, DType::i32));
  REQUIRE(read_bytes(dir.file("i32")) ==
          cat_bytes(idx_header(0x0C, {2}), Bytes{0, 0, 1, 2, 0xff, 0xff, 0xff, 0xff}));
  write_idx(dir.file("f64"), tensor({1.0}, DType::f64));
  REQUIRE(read_bytes(dir.file("f64")) ==
          cat_bytes(idx_header(0x0E, {1}), Bytes{0x3f, 0xf0, 0, 0, 0, 0, 0, 0}));
}

TEST_CASE("IDX int8 and int16 files are widened to int32", "[data][idx]") {
  TempDir dir("idx_widen");
  write_bytes(dir.file("i8"), cat_bytes(idx_header(0x09, {3}), Bytes{0x7f, 0x80, 0xff}));
  const Tensor a = read_idx(dir.file("i8"));
  REQUIRE(a.dtype() == DType::i32);
  REQUIRE(a.to_vector<int>() == std::vector<int>{127, -128, -1});
  write_bytes(dir.file("i16"), cat_bytes(idx_header(0x0B, {1, 2}), Bytes{0x01, 0x02, 0xff, 0xfe}));
  const Tensor b = read_idx(dir.file("i16"));
  REQUIRE(b.dtype() == DType::i32);
  REQUIRE(b.shape() == Shape{1, 2});
  REQUIRE(b.to_vector<int>() == std::vector<int>{258, -2});
}

TEST_CASE("IDX errors name the file and what is wrong", "[data][idx]") {
  TempDir dir("idx_err");
  const auto expect = [&](const std::string& name, const Bytes& bytes, const std::string& what) {
    const std::string path = dir.file(name);
    write_bytes(path, bytes);
    INFO(name);
    REQUIRE_THROWS_AS(read_idx(path), Error);
    REQUIRE_THROWS_WITH(read_idx(path), Contains(path) && Contains(what));
  };
  REQUIRE_THROWS_WITH(read_idx(dir.file("nope.idx")),
                      Contains(dir.file("nope.idx")) && Contains("does not exist"));
  REQUIRE_THROWS_WITH(read_idx(dir.str()), Contains(dir.str()) && Contains("directory"));
  expect("empty", {}, "truncated");
  expect("short_magic", {0, 0, 8}, "truncated");
  expect("bad_magic", {0x12, 0x34, 0x08, 0x01, 0, 0, 0, 1, 5}, "bad magic");
  expect("bad_type", cat_bytes(idx_header(0x07, {1}), {5}), "type code 0x07");
  expect("zero_dims", {0, 0, 0x08, 0}, "0 dimensions");
  expect("short_dims", {0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0, 0, 2}, "truncated inside its header");
  expect("short_data", cat_bytes(idx_header(0x08, {2, 3}), {1, 2, 3, 4, 5}), "truncated");
  expect("short_f32", cat_bytes(idx_header(0x0D, {2}), {0, 0, 0, 0, 0, 0}), "truncated");
  expect("trailing", cat_bytes(idx_header(0x08, {2}), {1, 2, 3}), "1 unexpected bytes");
  // A header promising ~2^96 elements must fail cleanly, not try to allocate.
  expect("huge", idx_header(0x0E, {0xffffffffu, 0xffffffffu, 0xffffffffu}), "truncated");
  // No elements (a 0 size), but strides over the other sizes that overflow 64 bits (found by
  // fuzz_idx: signed overflow in the stride computation before any check).
  expect("zero_but_huge",
         idx_header(0x08, {0xd7063e04u, 0x35660000u, 0, 1, 0x5d929833u, 0x2f200169u}), "truncated");
}

TEST_CASE("A shape whose strides overflow 64 bits is refused", "[core][idx]") {
  CHECK_THROWS_WITH(dltrain::empty({0, int64_t{1} << 40, int64_t{1} << 40}), Contains("too large"));
}

TEST_CASE("IDX gzip stream errors name the file", "[data][idx][gzip]") {
  TempDir dir("idx_gz_err");
  if (!gzip_supported()) {
    WARN("this build has no zlib: checking the gunzip error instead of gzip stream errors");
    write_bytes(dir.file("x.gz"), {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3});
    REQUIRE_THROWS_WITH(read_idx(dir.file("x.gz")),
                        Contains(dir.file("x.gz")) && Contains("gunzip"));
    REQUIRE_THROWS_WITH(write_idx(dir.file("y.gz"), ones({2}), true), Contains("zlib"));
    return;
  }
  Generator g(3);
  const Tensor t = randint(0, 256, {64, 64}, DType::u8, &g);  // incompressible-ish
  const std::string good = dir.file("good.gz");
  write_idx(good, t, true);
  const Bytes gz = read_bytes(good);
  REQUIRE(gz.size() > 200);

  const std::string cut = dir.file("cut.gz");
  write_bytes(cut, Bytes(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2)));
  REQUIRE_THROWS_AS(read_idx(cut), Error);
  REQUIRE_THROWS_WITH(read_idx(cut), Contains(cut) && Contains("gzip"));

  const std::string corrupt = dir.file("corrupt.gz");
  Bytes bad = gz;
  for (size_t i = 40; i < 80; ++i) bad[i] ^= 0x5a;
  write_bytes(corrupt, bad);
  REQUIRE_THROWS_WITH(read_idx(corrupt), Contains(corrupt) && Contains("gzip"));

  // A stored-block gzip built by hand (independent of zlib's writer) whose deflate data is
  // intact but whose CRC no longer matches: a corrupt stream.
  Bytes crc_bad = gzip_stored(cat_bytes(idx_header(0x08, {3}), {9, 8, 7}));
  write_bytes(dir.file("hand.gz"), crc_bad);
  REQUIRE(read_idx(dir.file("hand.gz")).to_vector<int>() == std::vector<int>{9, 8, 7});
  crc_bad[crc_bad.size() - 8] ^= 0xff;
  write_bytes(dir.file("crc.gz"), crc_bad);
  REQUIRE_THROWS_WITH(read_idx(dir.file("crc.gz")),
                      Contains(dir.file("crc.gz")) && Contains("gzip"));

  // Valid gzip streams around bad IDX content: the IDX checks apply after decompression.
  const std::string short_data = dir.file("short_data.gz");
  write_bytes(short_data, gzip_stored(cat_bytes(idx_header(0x08, {2, 3}), {1, 2, 3, 4})));
  REQUIRE_THROWS_WITH(read_idx(short_data),
                      Contains(short_data) && Contains("truncated") && Contains("only 4 bytes"));
  const std::string trailing = dir.file("trailing.gz");
  write_bytes(trailing, gzip_stored(cat_bytes(idx_header(0x08, {2}), {1, 2, 3, 4, 5})));
  REQUIRE_THROWS_WITH(read_idx(trailing), Contains(trailing) && Contains("3 unexpected bytes"));
  const std::string bad_magic = dir.file("bad_magic.gz");
  write_bytes(bad_magic, gzip_stored({0x12, 0x34, 0x08, 0x01, 0, 0, 0, 1, 5}));
  REQUIRE_THROWS_WITH(read_idx(bad_magic), Contains(bad_magic) && Contains("bad magic"));
}
