// The TensorBoard sink: CRC32C against its check value, the record framing and CRCs read back,
// corruption and truncation detected, and (hidden, run by tests/train/read_events.py) the
// fixture whose event files TensorBoard's own reader must understand.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "dltrain/core/error.hpp"
#include "dltrain/core/tensor.hpp"
#include "dltrain/train/metrics.hpp"
#include "src/train/crc32c.hpp"
#include "tests/train/train_test_util.hpp"

using namespace dltrain;
using namespace dltrain::train;
using Catch::Matchers::Contains;

namespace {
std::vector<std::string> event_files(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      out.push_back(e.path().string());
  return out;
}
}  // namespace

TEST_CASE("TensorBoard: the sink works, or without protobuf names the packages to install",
          "[train][tensorboard]") {
  test::TrainTempDir dir("tb_stub");
  if (tensorboard_available()) {  // the calls the stub refuses work
    CHECK_NOTHROW(MetricsWriter({.tensorboard = dir.file("runs")}));
    CHECK(event_files(dir.file("runs")).size() == 1);
    CHECK(crc32c("123456789", 9) == 0xE3069283u);
    return;
  }
  CHECK_THROWS_WITH(MetricsWriter({.tensorboard = dir.file("runs")}),
                    Contains("libprotobuf-dev") && Contains("libisal-dev"));
  CHECK_THROWS_AS(crc32c("a", 1), Error);
}

TEST_CASE("crc32c: the Castagnoli check value and TensorFlow's mask", "[train][tensorboard]") {
  if (!tensorboard_available()) return;
  CHECK(crc32c("123456789", 9) == 0xE3069283u);  // the CRC-32C catalogue's check value
  CHECK(crc32c("", 0) == 0u);
  CHECK(masked_crc32c("", 0) == 0xa282ead8u);
  const uint32_t c = crc32c("dltrain", 7);
  CHECK(masked_crc32c("dltrain", 7) == ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST_CASE("TensorBoard sink: one framed, CRC-checked record per event", "[train][tensorboard]") {
  if (!tensorboard_available()) return;
  test::TrainTempDir dir("tb_frame");
  const std::string logdir = dir.file("runs/exp1");  // created with its parents
  {
    MetricsWriter w({.tensorboard = logdir});
    w.add_scalar("train/loss", 0.25, 1);
    w.add_histogram("weights", std::vector<double>{1, 2, 3}, 1);
    w.add_text("notes", "hello tensorboard", 1);
    w.add_image("img", from_vector<float>({0, 0.5f, 1, 1}, {1, 2, 2}), 1);
    w.add_hparams({{"lr", 0.1}}, {{"train/loss", 0.25}});
    REQUIRE(w.paths().size() == 1);
    CHECK_THAT(w.paths()[0], Contains("events.out.tfevents."));
  }
  const auto files = event_files(logdir);
  REQUIRE(files.size() == 1);
  const auto records = read_event_records(files[0]);
  REQUIRE(records.size() == 1 + 4 + 3);  // file_version, 4 summaries, 3 hparams events
  CHECK_THAT(records[0], Contains("brain.Event:2"));
  CHECK_THAT(records[1], Contains("train/loss"));
  CHECK_THAT(records[2], Contains("weights"));
  CHECK_THAT(records[3], Contains("hello tensorboard"));
  CHECK_THAT(records[4], Contains("PNG"));
  CHECK_THAT(records[6], Contains("_hparams_/session_start_info"));
  // The file is exactly the records with their 16 bytes of framing each.
  size_t bytes = 0;
  for (const auto& r : records) bytes += r.size() + 16;
  CHECK(std::filesystem::file_size(files[0]) == bytes);
}

TEST_CASE("TensorBoard sink: a flipped byte or a cut file is caught by the reader",
          "[train][tensorboard]") {
  if (!tensorboard_available()) return;
  test::TrainTempDir dir("tb_corrupt");
  { MetricsWriter({.tensorboard = dir.path().string()}).add_scalar("x", 1.0, 3); }
  const auto files = event_files(dir.path());
  REQUIRE(files.size() == 1);
  std::string bytes = test::read_text(files[0]);
  const auto write = [&](const std::string& b) {
    std::ofstream(files[0], std::ios::binary | std::ios::trunc) << b;
  };
  std::string flipped = bytes;
  flipped[bytes.size() - 6] ^= 0x01;  // inside the last payload
  write(flipped);
  CHECK_THROWS_WITH(read_event_records(files[0]), Contains("payload's CRC32C"));
  flipped = bytes;
  flipped[2] ^= 0x01;  // the first length
  write(flipped);
  CHECK_THROWS_WITH(read_event_records(files[0]), Contains("length's CRC32C"));
  write(bytes.substr(0, bytes.size() - 3));
  CHECK_THROWS_WITH(read_event_records(files[0]), Contains("truncated"));
  write(bytes);
  CHECK(read_event_records(files[0]).size() == 2);
}

TEST_CASE("TensorBoard sink: two writers in one directory get two event files",
          "[train][tensorboard]") {
  if (!tensorboard_available()) return;
  test::TrainTempDir dir("tb_two");
  MetricsWriter a({.tensorboard = dir.path().string()});
  MetricsWriter b({.tensorboard = dir.path().string()});
  CHECK(a.paths()[0] != b.paths()[0]);
  CHECK(event_files(dir.path()).size() == 2);
}

// Run by tests/train/read_events.py (not by ctest directly): writes the event files that the
// Python test reads back with TensorBoard's own reader. Keep the values in sync with the script.
TEST_CASE("TensorBoard fixture for read_events.py", "[.tensorboard_fixture]") {
  const char* out = std::getenv("DLTRAIN_TB_FIXTURE_DIR");
  REQUIRE(out != nullptr);
  MetricsWriter w({.csv = std::string(out) + "/metrics.csv",
                   .jsonl = std::string(out) + "/metrics.jsonl",
                   .tensorboard = std::string(out) + "/tb",
                   .histogram_bins = 10});
  for (int s = 0; s < 10; ++s) w.add_scalar("train/loss", 1.0 / (s + 1), s);
  w.add_scalars({{"train/lr", 0.1}, {"train/diverged", std::nan("")}}, 10);
  std::vector<double> v(100);
  for (int i = 0; i < 100; ++i) v[static_cast<size_t>(i)] = i;
  w.add_histogram("weights/fc", v, 5);
  // RGB 2 x 3: channel c, row y, column x = 40 * c + 10 * y + x (u8).
  std::vector<float> rgb;
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 2; ++y)
      for (int x = 0; x < 3; ++x) rgb.push_back(static_cast<float>(40 * c + 10 * y + x));
  w.add_image("samples/rgb", from_vector<float>(rgb, {3, 2, 3}).to(DType::u8), 7);
  w.add_image("samples/grey", from_vector<float>({0, 0.5f, 1, 0.25f}, {2, 2}), 7);
  w.add_text("notes", "**dltrain** fixture", 3);
  w.add_scalar("val/acc", 0.91, 10);
  w.add_hparams({{"lr", 0.1}, {"optimizer", std::string("sgd")}, {"amp", true}},
                {{"val/acc", 0.91}});
  w.flush();
  CHECK(w.paths().size() == 3);
}
