// train::MetricsWriter's CSV and JSON-lines sinks read back (round trip, NaN/inf, quoting,
// append), histograms, images, and the errors for paths that cannot be written.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dltrain/core/error.hpp"
#include "dltrain/core/tensor.hpp"
#include "dltrain/train/metrics.hpp"
#include "tests/train/train_test_util.hpp"

using namespace dltrain;
using namespace dltrain::train;
using Catch::Matchers::Contains;

namespace {
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream is(text);
  for (std::string l; std::getline(is, l);) out.push_back(l);
  return out;
}
std::vector<std::string> csv_split(const std::string& line) {  // enough for the quoted tags here
  std::vector<std::string> f(1);
  bool q = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (q && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      f.back() += '"';
      ++i;
    } else if (c == '"') {
      q = !q;
    } else if (c == ',' && !q) {
      f.emplace_back();
    } else {
      f.back() += c;
    }
  }
  return f;
}
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

TEST_CASE("CSV sink: header, one row per scalar, values read back exactly", "[train][metrics]") {
  test::TrainTempDir dir("csv");
  const std::string path = dir.file("sub/dir/metrics.csv");  // parents are created
  {
    MetricsWriter w({.csv = path});
    w.add_scalar("train/loss", 0.1 + 0.2, 10);
    w.add_scalars({{"train/lr", 1e-3}, {"train/acc", 0.875}}, 20);
    w.add_scalar("big", 123456789.123456789, 30);
    w.add_histogram("ignored/by/csv", std::vector<double>{1, 2, 3}, 30);
  }
  const auto rows = lines_of(test::read_text(path));
  REQUIRE(rows.size() == 5);
  CHECK(rows[0] == "wall_time,step,tag,value");
  const auto r1 = csv_split(rows[1]);
  REQUIRE(r1.size() == 4);
  CHECK(std::stod(r1[0]) > 1.7e9);  // seconds since the epoch
  CHECK(r1[1] == "10");
  CHECK(r1[2] == "train/loss");
  CHECK(std::stod(r1[3]) == 0.1 + 0.2);         // round-trips the double exactly
  CHECK(csv_split(rows[2])[2] == "train/acc");  // add_scalars: in the map's order
  CHECK(std::stod(csv_split(rows[3])[3]) == 1e-3);
  CHECK(std::stod(csv_split(rows[4])[3]) == 123456789.123456789);
}

TEST_CASE("CSV sink: NaN and infinities as nan/inf/-inf, awkward tags quoted", "[train][metrics]") {
  test::TrainTempDir dir("csv_nan");
  const std::string path = dir.file("m.csv");
  {
    MetricsWriter w({.csv = path});
    w.add_scalar("loss", kNaN, 1);
    w.add_scalar("a,b \"quoted\"", kInf, 2);
    w.add_scalar("neg", -kInf, 3);
  }
  const auto rows = lines_of(test::read_text(path));
  REQUIRE(rows.size() == 4);
  CHECK(csv_split(rows[1])[3] == "nan");
  CHECK(std::isnan(std::stod(csv_split(rows[1])[3])));
  CHECK(csv_split(rows[2])[2] == "a,b \"quoted\"");
  CHECK(csv_split(rows[2])[3] == "inf");
  CHECK(csv_split(rows[3])[3] == "-inf");
}

TEST_CASE("CSV and JSON lines sinks: append keeps earlier rows and writes one header",
          "[train][metrics]") {
  test::TrainTempDir dir("append");
  const std::string csv = dir.file("m.csv"), jsonl = dir.file("m.jsonl");
  { MetricsWriter({.csv = csv, .jsonl = jsonl}).add_scalar("loss", 1.0, 1); }
  { MetricsWriter({.csv = csv, .jsonl = jsonl, .append = true}).add_scalar("loss", 0.5, 2); }
  const auto rows = lines_of(test::read_text(csv));
  REQUIRE(rows.size() == 3);
  CHECK(rows[0] == "wall_time,step,tag,value");
  CHECK(csv_split(rows[2])[1] == "2");
  CHECK(lines_of(test::read_text(jsonl)).size() == 2);
  // Without append, a new run truncates.
  { MetricsWriter({.csv = csv}).add_scalar("loss", 0.25, 1); }
  CHECK(lines_of(test::read_text(csv)).size() == 2);
}

TEST_CASE("JSON lines sink: every line parses, NaN/inf become null with a 'nonfinite' field",
          "[train][metrics]") {
  test::TrainTempDir dir("jsonl");
  const std::string path = dir.file("m.jsonl");
  {
    MetricsWriter w({.jsonl = path, .histogram_bins = 4});
    w.add_scalar("train/loss", 0.5, 7);
    w.add_scalar("train/loss", kNaN, 8);
    w.add_scalar("grad_norm", kInf, 8);
    w.add_scalar("x", -kInf, 8);
    w.add_histogram("w", std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7, kNaN}, 9);
    w.add_text("notes", "line one\nline \"two\" \xc3\xa9", 9);
    w.add_hparams({{"lr", 0.1}, {"optimizer", std::string("sgd")}, {"amp", true}},
                  {{"val/acc", 0.91}, {"val/loss", kNaN}});
  }
  const auto rows = lines_of(test::read_text(path));
  REQUIRE(rows.size() == 7);
  std::vector<nlohmann::json> j;
  for (const auto& r : rows) j.push_back(nlohmann::json::parse(r));  // throws on invalid JSON
  CHECK(j[0]["tag"] == "train/loss");
  CHECK(j[0]["step"] == 7);
  CHECK(j[0]["value"] == 0.5);
  CHECK_FALSE(j[0].contains("nonfinite"));
  CHECK(j[1]["value"].is_null());
  CHECK(j[1]["nonfinite"] == "nan");
  CHECK(j[2]["nonfinite"] == "inf");
  CHECK(j[3]["nonfinite"] == "-inf");
  CHECK(rows[1].find("NaN") == std::string::npos);
  CHECK(j[4]["kind"] == "histogram");
  CHECK(j[4]["num"] == 8);
  CHECK(j[4]["nonfinite_count"] == 1);
  CHECK(j[4]["bucket"] == std::vector<double>{2, 2, 2, 2});
  CHECK(j[5]["kind"] == "text");
  CHECK(j[5]["text"] == "line one\nline \"two\" \xc3\xa9");
  CHECK(j[6]["kind"] == "hparams");
  CHECK(j[6]["hparams"]["optimizer"] == "sgd");
  CHECK(j[6]["hparams"]["amp"] == true);
  CHECK(j[6]["hparams"]["lr"] == 0.1);
  CHECK(j[6]["metrics"]["val/acc"] == 0.91);
  CHECK(j[6]["metrics"]["val/loss"].is_null());
}

TEST_CASE("make_histogram: equal-width buckets over the finite range", "[train][metrics]") {
  const Histogram h = make_histogram({-1, 0, 0.5, 1, 3, kInf}, 2);
  CHECK(h.num == 5);
  CHECK(h.nonfinite == 1);
  CHECK(h.min == -1);
  CHECK(h.max == 3);
  CHECK(h.sum == Approx(3.5));
  CHECK(h.sum_squares == Approx(1 + 0.25 + 1 + 9));
  REQUIRE(h.bucket_limit.size() == 2);
  CHECK(h.bucket_limit[0] == Approx(1));
  CHECK(h.bucket_limit[1] == 3);
  CHECK(h.bucket[0] == 3);  // -1, 0, 0.5 (1 is the edge: it falls in the upper bucket)
  CHECK(h.bucket[1] == 2);
  const Histogram same = make_histogram({2, 2, 2}, 10);
  CHECK(same.bucket.size() == 1);
  CHECK(same.bucket[0] == 3);
  CHECK(make_histogram({kNaN}, 5).bucket.empty());
  const Histogram wide = make_histogram({-1e308, 1e308}, 2);  // max - min overflows a double
  CHECK(wide.bucket == std::vector<double>{1, 1});
  CHECK_THROWS_WITH(make_histogram({1}, 0), Contains("bins"));
}

TEST_CASE("image_from_tensor: CHW floats in [0,1] and u8 to HWC bytes, bad shapes refused",
          "[train][metrics]") {
  // 3 x 1 x 2: red channel (0, 1), green (0.5, 2.0 -> clamped), blue (NaN -> 0, -1 -> 0).
  const Tensor t = from_vector<float>({0, 1, 0.5f, 2, std::nanf(""), -1}, {3, 1, 2});
  const Image img = image_from_tensor(t);
  CHECK(img.channels == 3);
  CHECK(img.height == 1);
  CHECK(img.width == 2);
  CHECK(img.pixels == std::vector<uint8_t>{0, 128, 0, 255, 255, 0});
  const Image grey = image_from_tensor(from_vector<float>({0, 1, 2, 3}, {2, 2}).to(DType::u8));
  CHECK(grey.channels == 1);
  CHECK(grey.pixels == std::vector<uint8_t>{0, 1, 2, 3});
  CHECK_THROWS_WITH(image_from_tensor(zeros({2, 4, 4})), Contains("channels"));
  CHECK_THROWS_WITH(image_from_tensor(zeros({1, 1, 4, 4})), Contains("select"));
  CHECK_THROWS_WITH(image_from_tensor(zeros({4, 4}, DType::i64)), Contains("u8"));
}

TEST_CASE("encode_png: a PNG signature, IHDR with the size, and IEND", "[train][metrics]") {
  Image img{.height = 3, .width = 5, .channels = 3, .pixels = std::vector<uint8_t>(45, 200)};
  std::string png;
  try {
    png = encode_png(img);
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Contains("libpng-dev"));  // a build without libpng says what to install
    return;
  }
  REQUIRE(png.size() > 33);
  CHECK(png.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
  CHECK(png.compare(12, 4, "IHDR") == 0);
  CHECK(static_cast<unsigned char>(png[19]) == 5);  // width, big-endian
  CHECK(static_cast<unsigned char>(png[23]) == 3);  // height
  CHECK(png.compare(png.size() - 8, 4, "IEND") == 0);
  img.pixels.pop_back();
  CHECK_THROWS_WITH(encode_png(img), Contains("bytes of pixels"));
}

TEST_CASE("Sinks refuse paths they cannot write with dltrain::Error naming path and fix",
          "[train][metrics]") {
  test::TrainTempDir dir("bad");
  const std::string file = dir.file("a_file");
  { MetricsWriter({.csv = file}).add_scalar("x", 1, 1); }
  // A directory under a regular file cannot exist.
  CHECK_THROWS_WITH(MetricsWriter({.csv = file + "/sub/m.csv"}),
                    Contains(file + "/sub") && Contains("writable directory"));
  CHECK_THROWS_WITH(MetricsWriter({.jsonl = file + "/m.jsonl"}), Contains("JSON lines"));
  // A path that is a directory cannot be opened as a file.
  CHECK_THROWS_WITH(MetricsWriter({.csv = dir.path().string()}),
                    Contains("cannot open the metrics CSV file"));
  if (tensorboard_available())
    CHECK_THROWS_WITH(MetricsWriter({.tensorboard = file + "/runs"}), Contains("TensorBoard"));
  else
    CHECK_THROWS_WITH(MetricsWriter({.tensorboard = dir.file("runs")}),
                      Contains("libprotobuf-dev"));
  CHECK_THROWS_WITH(MetricsWriter({.histogram_bins = 0}), Contains("histogram_bins"));
}

TEST_CASE("MetricsWriter: with no sink every call is a no-op, ranks other than 0 open nothing",
          "[train][metrics]") {
  MetricsWriter none;
  CHECK_FALSE(none.active());
  none.add_scalar("x", 1, 1);
  none.add_image("img", Tensor(), 1);  // not even inspected
  none.flush();
  CHECK(none.paths().empty());

  test::TrainTempDir dir("rank");
  const std::string path = dir.file("rank1.csv");
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  {
    MetricsWriter w({.csv = path});
    CHECK_FALSE(w.active());
    MetricsWriter all({.csv = path, .all_ranks = true});
    CHECK(all.active());
  }
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  CHECK(lines_of(test::read_text(path)).size() == 1);  // only the all_ranks writer's header
}
