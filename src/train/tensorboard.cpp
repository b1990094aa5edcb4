// The TensorBoard sink: Event protobufs (src/train/proto/tensorboard.proto, lite runtime) in
// TFRecord framing, CRC32C from ISA-L. Built only with DLTRAIN_WITH_PROTOBUF (else
// tensorboard_stub.cpp).
//
// File layout (what TensorFlow's EventsWriter writes and TensorBoard's reader checks): records
// of [u64 length][u32 masked crc32c(length bytes)][payload][u32 masked crc32c(payload)], all
// little-endian; the first record is an Event with file_version "brain.Event:2". Each add_*
// call appends one Event with one Summary.Value. Text and hparams travel as plugin data
// ("text": a DT_STRING tensor; "hparams": HParamsPluginData in the metadata, with an empty
// tensor value) exactly as TensorBoard's own summary ops write them.
#include <isa-l/crc.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>

#include "dltrain/core/error.hpp"
#include "dltrain/train/metrics.hpp"
#include "src/train/crc32c.hpp"
#include "src/train/file_util.hpp"
#include "tensorboard.pb.h"

namespace dltrain::train {

uint32_t crc32c(const void* data, size_t size) {
  // ISA-L's crc32_iscsi neither pre- nor post-inverts; standard CRC32C does both. Feed it in
  // chunks because its length is an int.
  uint32_t crc = 0xFFFFFFFFu;
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  while (size > 0) {
    const size_t n = std::min<size_t>(size, 1u << 30);
    crc = crc32_iscsi(p, static_cast<int>(n), crc);
    p += n;
    size -= n;
  }
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

bool tensorboard_available() { return true; }

namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
}
uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string event_file_name() {
  static std::atomic<int> counter{0};
  char host[256] = "localhost";
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  host[sizeof host - 1] = '\0';
  return "events.out.tfevents." + std::to_string(static_cast<long long>(wall_time_now())) + "." +
         host + "." + std::to_string(static_cast<long long>(getpid())) + "." +
         std::to_string(counter++);
}

class TensorBoardSink final : public MetricsSink {
 public:
  explicit TensorBoardSink(const std::string& log_dir)
      : file_(make_path(log_dir), false, "TensorBoard event file") {
    tb::Event e;
    e.set_wall_time(wall_time_now());
    e.set_file_version("brain.Event:2");
    write_event(e);
    file_.flush();  // TensorBoard sees the run as soon as it starts
  }

  void scalar(const std::string& tag, double value, int64_t step, double wall_time) override {
    tb::Event e = event(step, wall_time);
    tb::Summary::Value* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
    write_event(e);
  }

  void histogram(const std::string& tag, const Histogram& h, int64_t step,
                 double wall_time) override {
    tb::Event e = event(step, wall_time);
    tb::Summary::Value* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    tb::HistogramProto* p = v->mutable_histo();
    p->set_min(h.min);
    p->set_max(h.max);
    p->set_num(h.num);
    p->set_sum(h.sum);
    p->set_sum_squares(h.sum_squares);
    for (double x : h.bucket_limit) p->add_bucket_limit(x);
    for (double x : h.bucket) p->add_bucket(x);
    write_event(e);
  }

  void image(const std::string& tag, const Image& img, int64_t step, double wall_time) override {
    tb::Event e = event(step, wall_time);
    tb::Summary::Value* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    tb::Summary::Image* im = v->mutable_image();
    im->set_height(static_cast<int32_t>(img.height));
    im->set_width(static_cast<int32_t>(img.width));
    im->set_colorspace(static_cast<int32_t>(img.channels));
    im->set_encoded_image_string(encode_png(img));
    write_event(e);
  }

  void text(const std::string& tag, const std::string& text, int64_t step,
            double wall_time) override {
    tb::Event e = event(step, wall_time);
    tb::Summary::Value* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
    tb::TensorProto* t = v->mutable_tensor();
    t->set_dtype(7);  // DT_STRING, a scalar
    t->mutable_tensor_shape();
    t->add_string_val(text);
    write_event(e);
  }

  void hparams(const std::map<std::string, HParamValue>& hp,
               const std::map<std::string, double>& metrics, double wall_time) override {
    // The experiment (which hparams and metrics exist), this session's values, and its end.
    tb::HParamsPluginData exp;
    tb::Experiment* x = exp.mutable_experiment();
    x->set_time_created_secs(wall_time);
    for (const auto& [name, value] : hp) {
      tb::HParamInfo* info = x->add_hparam_infos();
      info->set_name(name);
      info->set_type(std::holds_alternative<std::string>(value) ? 1
                     : std::holds_alternative<bool>(value)      ? 2
                                                                : 3);
    }
    for (const auto& m : metrics) x->add_metric_infos()->mutable_name()->set_tag(m.first);

    tb::HParamsPluginData start;
    tb::SessionStartInfo* s = start.mutable_session_start_info();
    s->set_start_time_secs(wall_time);
    for (const auto& [name, value] : hp) {
      tb::StructValue& sv = (*s->mutable_hparams())[name];
      if (auto* d = std::get_if<double>(&value)) sv.set_number_value(*d);
      if (auto* str = std::get_if<std::string>(&value)) sv.set_string_value(*str);
      if (auto* b = std::get_if<bool>(&value)) sv.set_bool_value(*b);
    }

    tb::HParamsPluginData end;
    end.mutable_session_end_info()->set_status(1);  // STATUS_SUCCESS
    end.mutable_session_end_info()->set_end_time_secs(wall_time);

    write_plugin_event("_hparams_/experiment", exp, wall_time);
    write_plugin_event("_hparams_/session_start_info", start, wall_time);
    write_plugin_event("_hparams_/session_end_info", end, wall_time);
  }

  void flush() override { file_.flush(); }
  std::string path() const override { return file_.path(); }

 private:
  static std::string make_path(const std::string& log_dir) {
    DLTRAIN_CHECK(!log_dir.empty(), "train: empty TensorBoard log directory; pass a directory ",
                  "such as runs/experiment1");
    create_directories_for(log_dir, "TensorBoard logs");
    return (std::filesystem::path(log_dir) / event_file_name()).string();
  }
  static tb::Event event(int64_t step, double wall_time) {
    tb::Event e;
    e.set_wall_time(wall_time);
    e.set_step(step);
    return e;
  }
  void write_plugin_event(const char* tag, const tb::HParamsPluginData& data, double wall_time) {
    tb::Event e = event(0, wall_time);
    tb::Summary::Value* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    tb::SummaryMetadata::PluginData* pd = v->mutable_metadata()->mutable_plugin_data();
    pd->set_plugin_name("hparams");
    pd->set_content(data.SerializeAsString());
    // TensorBoard's NULL_TENSOR: DT_FLOAT of shape (0,); the plugin reads the metadata only.
    v->mutable_tensor()->set_dtype(1);
    v->mutable_tensor()->mutable_tensor_shape()->add_dim()->set_size(0);
    write_event(e);
  }
  void write_event(const tb::Event& e) {
    const std::string payload = e.SerializeAsString();
    std::string header;
    put_le(header, payload.size(), 8);
    std::string rec = header;
    put_le(rec, masked_crc32c(header.data(), header.size()), 4);
    rec += payload;
    put_le(rec, masked_crc32c(payload.data(), payload.size()), 4);
    file_.write(rec);
  }

  OutputFile file_;
};

}  // namespace

std::unique_ptr<MetricsSink> make_tensorboard_sink(const std::string& log_dir) {
  return std::make_unique<TensorBoardSink>(log_dir);
}

std::vector<std::string> read_event_records(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  DLTRAIN_CHECK(f, "train::read_event_records: cannot open '", path, "': ", std::strerror(errno));
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, n);
  std::fclose(f);
  std::vector<std::string> records;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  size_t off = 0;
  while (off < data.size()) {
    DLTRAIN_CHECK(data.size() - off >= 12, "train::read_event_records: '", path, "' record ",
                  records.size(), " at byte ", off, " is truncated (", data.size() - off,
                  " bytes left, a header needs 12)");
    const uint64_t len = get_le(p + off, 8);
    DLTRAIN_CHECK(get_le(p + off + 8, 4) == masked_crc32c(p + off, 8),
                  "train::read_event_records: '", path, "' record ", records.size(), " at byte ",
                  off, ": the length's CRC32C does not match (corrupt file)");
    DLTRAIN_CHECK(len <= data.size() - off - 12 && data.size() - off - 12 - len >= 4,
                  "train::read_event_records: '", path, "' record ", records.size(), " at byte ",
                  off, " claims ", len, " bytes but the file ends first (truncated)");
    const unsigned char* payload = p + off + 12;
    DLTRAIN_CHECK(get_le(payload + len, 4) == masked_crc32c(payload, len),
                  "train::read_event_records: '", path, "' record ", records.size(), " at byte ",
                  off, ": the payload's CRC32C does not match (corrupt file)");
    records.emplace_back(reinterpret_cast<const char*>(payload), len);
    off += 12 + len + 4;
  }
  return records;
}

}  // namespace dltrain::train
