// train::MetricsWriter and its CSV and JSON-lines sinks; histograms, images and PNG encoding
// (png.cpp, libpng's simplified API, or no_png.cpp). The TensorBoard sink is in tensorboard.cpp
// (or no_tensorboard.cpp).
#include "dltrain/train/metrics.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "dltrain/core/error.hpp"
#include "dltrain/distributed/env.hpp"
#include "src/train/file_util.hpp"
#include "src/train/json_util.hpp"

namespace dltrain::train {

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// --- histograms and images ------------------------------------------------------------------

Histogram make_histogram(const std::vector<double>& values, int bins) {
  DLTRAIN_CHECK(bins >= 1, "train::make_histogram: bins is ", bins, "; pass 1 or more");
  Histogram h;
  double lo = INFINITY, hi = -INFINITY;
  for (double v : values) {
    if (!std::isfinite(v)) {
      ++h.nonfinite;
      continue;
    }
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    h.num += 1;
    h.sum += v;
    h.sum_squares += v * v;
  }
  if (h.num == 0) return h;  // no buckets: TensorBoard shows an empty histogram
  h.min = lo;
  h.max = hi;
  if (hi == lo) bins = 1;
  const double width = hi / bins - lo / bins;  // no overflow for a range past DBL_MAX
  h.bucket.assign(static_cast<size_t>(bins), 0.0);
  h.bucket_limit.resize(static_cast<size_t>(bins));
  for (int i = 0; i < bins; ++i) h.bucket_limit[i] = i + 1 == bins ? hi : lo + width * (i + 1);
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    // v / width - lo / width, not (v - lo) / width: the difference can overflow; the clamp in
    // double keeps the cast defined.
    const double x = width > 0 ? std::floor(v / width - lo / width) : 0.0;
    h.bucket[static_cast<size_t>(std::clamp(x, 0.0, static_cast<double>(bins - 1)))] += 1;
  }
  return h;
}

Image image_from_tensor(const Tensor& t) {
  DLTRAIN_CHECK(t.defined(), "train::image_from_tensor: the tensor is undefined");
  DLTRAIN_CHECK(t.dim() == 2 || t.dim() == 3, "train::image_from_tensor: shape ",
                shape_str(t.shape()), " is not an image; pass (C, H, W) with C = 1, 3 or 4, or ",
                "(H, W) (select one image of a batch with x.select(0, i))");
  const bool floating = is_floating(t.dtype());
  DLTRAIN_CHECK(floating || t.dtype() == DType::u8, "train::image_from_tensor: dtype ",
                dtype_name(t.dtype()), " is not an image dtype; pass u8 (0..255) or a floating ",
                "tensor in [0, 1]");
  Image img;
  img.channels = t.dim() == 2 ? 1 : t.size(0);
  img.height = t.size(t.dim() - 2);
  img.width = t.size(t.dim() - 1);
  DLTRAIN_CHECK(img.channels == 1 || img.channels == 3 || img.channels == 4,
                "train::image_from_tensor: ", img.channels, " channels in shape ",
                shape_str(t.shape()), "; pass 1 (grey), 3 (RGB) or 4 (RGBA) channels first (CHW)");
  DLTRAIN_CHECK(img.height > 0 && img.width > 0, "train::image_from_tensor: empty image, shape ",
                shape_str(t.shape()));
  const std::vector<double> v = t.detach().to_vector<double>();  // CHW order
  const int64_t hw = img.height * img.width;
  img.pixels.resize(static_cast<size_t>(hw * img.channels));
  for (int64_t c = 0; c < img.channels; ++c)
    for (int64_t p = 0; p < hw; ++p) {
      double x = v[static_cast<size_t>(c * hw + p)];
      if (floating) x = std::isnan(x) ? 0.0 : std::round(x * 255.0);
      img.pixels[static_cast<size_t>(p * img.channels + c)] =
          static_cast<uint8_t>(std::clamp(x, 0.0, 255.0));
    }
  return img;
}

// --- CSV ------------------------------------------------------------------------------------

namespace {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

/// Shortest text that reads back as the same double ("%.17g" is exact; "%.9g" is enough for the
/// floats most metrics are, but a double metric must round-trip).
std::string number_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  for (int prec = 6; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

class CsvSink final : public MetricsSink {
 public:
  CsvSink(const std::string& path, bool append)
      : fresh_(!append || empty_or_missing(path)), file_(path, append, "metrics CSV file") {
    if (fresh_) file_.write("wall_time,step,tag,value\n");
  }
  void scalar(const std::string& tag, double value, int64_t step, double wall_time) override {
    char head[64];
    std::snprintf(head, sizeof head, "%.3f,%lld,", wall_time, static_cast<long long>(step));
    file_.write(head + csv_field(tag) + "," + number_text(value) + "\n");
  }
  void flush() override { file_.flush(); }
  std::string path() const override { return file_.path(); }

 private:
  static bool empty_or_missing(const std::string& path) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    return ec || size == 0;
  }
  bool fresh_;
  OutputFile file_;
};

class JsonlSink final : public MetricsSink {
 public:
  JsonlSink(const std::string& path, bool append)
      : file_(path, append, "metrics JSON lines file") {}
  void scalar(const std::string& tag, double value, int64_t step, double wall_time) override {
    nlohmann::json j = head(tag, step, wall_time);
    put_number(j, "value", value);
    line(j);
  }
  void histogram(const std::string& tag, const Histogram& h, int64_t step,
                 double wall_time) override {
    nlohmann::json j = head(tag, step, wall_time);
    j["kind"] = "histogram";
    j["min"] = h.min;
    j["max"] = h.max;
    j["num"] = h.num;
    put_number(j, "sum", h.sum);
    put_number(j, "sum_squares", h.sum_squares);
    j["bucket_limit"] = h.bucket_limit;
    j["bucket"] = h.bucket;
    j["nonfinite_count"] = h.nonfinite;
    line(j);
  }
  void text(const std::string& tag, const std::string& text, int64_t step,
            double wall_time) override {
    nlohmann::json j = head(tag, step, wall_time);
    j["kind"] = "text";
    j["text"] = text;
    line(j);
  }
  void hparams(const std::map<std::string, HParamValue>& hp,
               const std::map<std::string, double>& metrics, double wall_time) override {
    nlohmann::json j;
    j["wall_time"] = wall_time;
    j["kind"] = "hparams";
    nlohmann::json h = nlohmann::json::object(), m = nlohmann::json::object();
    for (const auto& [k, v] : hp) std::visit([&, &k = k](const auto& x) { h[k] = x; }, v);
    for (const auto& [k, v] : metrics) m[k] = json_number(v);
    j["hparams"] = h;
    j["metrics"] = m;
    line(j);
  }
  void flush() override { file_.flush(); }
  std::string path() const override { return file_.path(); }

 private:
  static nlohmann::json head(const std::string& tag, int64_t step, double wall_time) {
    nlohmann::json j;
    j["wall_time"] = wall_time;
    j["step"] = step;
    j["tag"] = tag;
    return j;
  }
  /// A number, or null plus "nonfinite": "nan" | "inf" | "-inf" (JSON has neither).
  static void put_number(nlohmann::json& j, const char* key, double v) {
    j[key] = json_number(v);
    if (!std::isfinite(v))
      j[std::string(key) == "value" ? "nonfinite" : std::string(key) + "_nonfinite"] =
          nonfinite_name(v);
  }
  void line(const nlohmann::json& j) { file_.write(dump_json(j) + "\n"); }
  OutputFile file_;
};

}  // namespace

std::unique_ptr<MetricsSink> make_csv_sink(const std::string& path, bool append) {
  return std::make_unique<CsvSink>(path, append);
}
std::unique_ptr<MetricsSink> make_jsonl_sink(const std::string& path, bool append) {
  return std::make_unique<JsonlSink>(path, append);
}

// --- MetricsWriter --------------------------------------------------------------------------

MetricsWriter::MetricsWriter(const MetricsOptions& options) : options_(options) {
  DLTRAIN_CHECK(options.histogram_bins >= 1, "train::MetricsWriter: histogram_bins is ",
                options.histogram_bins, "; pass 1 or more");
  last_flush_ = wall_time_now();
  if (!options.all_ranks && distributed::detect_environment().rank != 0) return;
  if (!options.csv.empty()) sinks_.push_back(make_csv_sink(options.csv, options.append));
  if (!options.jsonl.empty()) sinks_.push_back(make_jsonl_sink(options.jsonl, options.append));
  if (!options.tensorboard.empty()) sinks_.push_back(make_tensorboard_sink(options.tensorboard));
}

MetricsWriter::~MetricsWriter() {
  for (auto& s : sinks_) {
    try {
      s->flush();
    } catch (const Error& e) {
      // A destructor must not throw; say what was lost instead of losing it silently.
      std::fprintf(stderr, "dltrain: %s\n", e.what());
    }
  }
}
MetricsWriter::MetricsWriter(MetricsWriter&&) noexcept = default;
MetricsWriter& MetricsWriter::operator=(MetricsWriter&&) noexcept = default;

void MetricsWriter::add_sink(std::unique_ptr<MetricsSink> sink) {
  DLTRAIN_CHECK(sink != nullptr, "train::MetricsWriter::add_sink: null sink");
  sinks_.push_back(std::move(sink));
}

void MetricsWriter::maybe_flush() {
  const double now = wall_time_now();
  if (now - last_flush_ >= options_.flush_seconds) flush();
}

void MetricsWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  if (sinks_.empty()) return;
  const double t = wall_time_now();
  for (auto& s : sinks_) s->scalar(tag, value, step, t);
  maybe_flush();
}

void MetricsWriter::add_scalars(const std::map<std::string, double>& values, int64_t step) {
  if (sinks_.empty()) return;
  const double t = wall_time_now();
  for (auto& s : sinks_)
    for (const auto& [tag, v] : values) s->scalar(tag, v, step, t);
  maybe_flush();
}

void MetricsWriter::add_histogram(const std::string& tag, const Tensor& values, int64_t step) {
  if (sinks_.empty()) return;
  DLTRAIN_CHECK(values.defined(), "train::MetricsWriter::add_histogram('", tag,
                "'): the tensor is undefined (a gradient before the first backward?)");
  add_histogram(tag, values.detach().to_vector<double>(), step);
}

void MetricsWriter::add_histogram(const std::string& tag, const std::vector<double>& values,
                                  int64_t step) {
  if (sinks_.empty()) return;
  const Histogram h = make_histogram(values, options_.histogram_bins);
  const double t = wall_time_now();
  for (auto& s : sinks_) s->histogram(tag, h, step, t);
  maybe_flush();
}

void MetricsWriter::add_image(const std::string& tag, const Tensor& chw, int64_t step) {
  if (sinks_.empty()) return;
  add_image(tag, image_from_tensor(chw), step);
}

void MetricsWriter::add_image(const std::string& tag, const Image& image, int64_t step) {
  if (sinks_.empty()) return;
  const double t = wall_time_now();
  for (auto& s : sinks_) s->image(tag, image, step, t);
  maybe_flush();
}

void MetricsWriter::add_text(const std::string& tag, const std::string& text, int64_t step) {
  if (sinks_.empty()) return;
  const double t = wall_time_now();
  for (auto& s : sinks_) s->text(tag, text, step, t);
  maybe_flush();
}

void MetricsWriter::add_hparams(const std::map<std::string, HParamValue>& hparams,
                                const std::map<std::string, double>& metrics) {
  if (sinks_.empty()) return;
  const double t = wall_time_now();
  for (auto& s : sinks_) s->hparams(hparams, metrics, t);
  maybe_flush();
}

void MetricsWriter::flush() {
  for (auto& s : sinks_) s->flush();
  last_flush_ = wall_time_now();
}

std::vector<std::string> MetricsWriter::paths() const {
  std::vector<std::string> p;
  for (const auto& s : sinks_) p.push_back(s->path());
  return p;
}

}  // namespace dltrain::train
