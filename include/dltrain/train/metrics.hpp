// train::MetricsWriter: one call site for a training loop's metrics, fanned out to sinks:
//   CSV          wall_time,step,tag,value rows (scalars only; NaN/inf written as nan/inf/-inf,
//                which Python's float() and pandas read);
//   JSON lines   one object per record: scalars, histograms (summary + buckets), text, hparams;
//                a NaN/inf value is written as null with "nonfinite": "nan" | "inf" | "-inf";
//   TensorBoard  event files (events.out.tfevents.*) that TensorBoard and tbparse read: scalars,
//                histograms, images (PNG), text and hparams. Needs a build with protobuf and
//                ISA-L (DLTRAIN_WITH_PROTOBUF); otherwise opening one raises dltrain::Error
//                naming the missing packages.
//
// Every sink creates its parent directories, opens its file when constructed and raises
// dltrain::Error naming the path, the OS error and the fix when it cannot; a failed write (disk
// full) raises too, never drops records silently. Records are buffered and flushed every
// `flush_seconds`, on flush() and on destruction. In a distributed job the writer is a no-op
// on every rank but 0 unless `all_ranks` is set (a metric is the same on every rank after the
// gradients' allreduce). Not thread-safe: one writer per training loop.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "dltrain/core/tensor.hpp"

namespace dltrain::train {

/// A histogram in TensorBoard's form: bucket i counts the values in
/// [bucket_limit[i-1], bucket_limit[i]) as TensorFlow's do (the first bucket starts at min, the
/// last one also holds max).
struct Histogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> bucket_limit, bucket;
  /// Values left out because they were NaN or infinite.
  int64_t nonfinite = 0;
};
/// `bins` equal-width buckets between the finite min and max of `values` (one bucket when they
/// are all equal). Non-finite values are counted in `nonfinite` and left out. Throws for bins < 1.
Histogram make_histogram(const std::vector<double>& values, int bins = 30);

/// An 8-bit image, rows top to bottom, channels interleaved (HWC): 1 grey, 3 RGB, 4 RGBA.
struct Image {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;  ///< height * width * channels bytes
};
/// A tensor as an image: shape (C, H, W) with C in {1, 3, 4}, or (H, W). u8 values are taken as
/// they are; floating values are taken as [0, 1], scaled by 255, rounded and clamped (NaN -> 0).
/// Any device (copied to the host). Throws dltrain::Error for other shapes or dtypes.
Image image_from_tensor(const Tensor& chw);
/// PNG bytes of `image` (libpng). Throws dltrain::Error in a build without libpng.
std::string encode_png(const Image& image);

/// An hparams value: a number, a string or a flag.
using HParamValue = std::variant<double, std::string, bool>;

/// One destination for metrics. The writer calls these on rank 0 only (see MetricsWriter).
/// Sinks that cannot show a kind of record ignore it (CSV keeps scalars only).
class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  virtual void scalar(const std::string& tag, double value, int64_t step, double wall_time) = 0;
  virtual void histogram(const std::string& /*tag*/, const Histogram& /*h*/, int64_t /*step*/,
                         double /*wall_time*/) {}
  virtual void image(const std::string& /*tag*/, const Image& /*img*/, int64_t /*step*/,
                     double /*wall_time*/) {}
  virtual void text(const std::string& /*tag*/, const std::string& /*text*/, int64_t /*step*/,
                    double /*wall_time*/) {}
  /// The run's hyper-parameters and the metrics that sum it up (final accuracy, loss).
  virtual void hparams(const std::map<std::string, HParamValue>& /*hparams*/,
                       const std::map<std::string, double>& /*metrics*/, double /*wall_time*/) {}
  /// Writes buffered records to the OS. Throws dltrain::Error when the write fails.
  virtual void flush() = 0;
  /// The file (or, for TensorBoard, the event file) this sink writes.
  virtual std::string path() const = 0;
};

/// CSV: a header "wall_time,step,tag,value" (left out when appending to a non-empty file), then
/// one row per scalar. Tags with a comma, a quote or a newline are quoted (RFC 4180).
std::unique_ptr<MetricsSink> make_csv_sink(const std::string& path, bool append = false);
/// JSON lines: {"wall_time":..,"step":..,"tag":..,"value":..} per scalar; {"kind":"histogram",..},
/// {"kind":"text",..}, {"kind":"hparams",..} for the others (images are left out).
std::unique_ptr<MetricsSink> make_jsonl_sink(const std::string& path, bool append = false);
/// TensorBoard: a new event file in `log_dir` (created if needed), named
/// events.out.tfevents.<seconds>.<host>.<pid>.<n> as TensorFlow names them. Throws
/// dltrain::Error naming the packages to install in a build without protobuf.
std::unique_ptr<MetricsSink> make_tensorboard_sink(const std::string& log_dir);
/// True when this build can write TensorBoard event files.
bool tensorboard_available();

struct MetricsOptions {
  std::string csv{};          ///< CSV file path ("" for none)
  std::string jsonl{};        ///< JSON lines file path ("" for none)
  std::string tensorboard{};  ///< TensorBoard log directory ("" for none)
  /// Append to existing CSV / JSON lines files (a resumed run) instead of truncating them.
  bool append = false;
  /// Write on every rank (each rank then needs its own paths), not only on rank 0.
  bool all_ranks = false;
  /// Flush the sinks when this many seconds have passed since the last flush (0: every record).
  double flush_seconds = 5;
  /// Buckets of add_histogram.
  int histogram_bins = 30;
};

class MetricsWriter {
 public:
  /// Opens the sinks named in `options` (none: a writer that drops everything, so a program can
  /// always call it). On ranks other than 0 of a distributed job (distributed::
  /// detect_environment) nothing is opened unless `all_ranks`.
  explicit MetricsWriter(const MetricsOptions& options = {});
  ~MetricsWriter();
  MetricsWriter(MetricsWriter&&) noexcept;
  MetricsWriter& operator=(MetricsWriter&&) noexcept;

  /// Adds a sink of the caller's (also on a writer that is a no-op on this rank: the caller chose).
  void add_sink(std::unique_ptr<MetricsSink> sink);
  /// True when at least one sink is open here.
  bool active() const { return !sinks_.empty(); }

  void add_scalar(const std::string& tag, double value, int64_t step);
  /// Several scalars at one step, e.g. {{"train/loss", l}, {"train/lr", lr}}.
  void add_scalars(const std::map<std::string, double>& values, int64_t step);
  /// A histogram of the tensor's values (any dtype and device; copied to the host), e.g. a
  /// layer's weights or gradients.
  void add_histogram(const std::string& tag, const Tensor& values, int64_t step);
  void add_histogram(const std::string& tag, const std::vector<double>& values, int64_t step);
  /// An image tensor, (C, H, W) or (H, W), see image_from_tensor.
  void add_image(const std::string& tag, const Tensor& chw, int64_t step);
  void add_image(const std::string& tag, const Image& image, int64_t step);
  /// Text (TensorBoard renders it as Markdown).
  void add_text(const std::string& tag, const std::string& text, int64_t step);
  /// The run's hyper-parameters with its summary metrics (TensorBoard's HPARAMS tab). The
  /// metric names should also be scalar tags of the run (TensorBoard reads their values there).
  void add_hparams(const std::map<std::string, HParamValue>& hparams,
                   const std::map<std::string, double>& metrics);
  void flush();
  /// The files written here, one per sink.
  std::vector<std::string> paths() const;

 private:
  void maybe_flush();
  std::vector<std::unique_ptr<MetricsSink>> sinks_;
  MetricsOptions options_;
  double last_flush_ = 0;
};

/// Seconds since the Unix epoch (the wall_time of records).
double wall_time_now();

/// Reads the records of a TFRecord / TensorBoard event file: each is a little-endian u64 length,
/// its masked CRC32C (u32), the payload and the payload's masked CRC32C. Throws dltrain::Error on
/// a truncated record or a CRC mismatch, naming the record and offset. Needs DLTRAIN_WITH_PROTOBUF.
std::vector<std::string> read_event_records(const std::string& path);

}  // namespace dltrain::train
