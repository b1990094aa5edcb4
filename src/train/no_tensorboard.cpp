// The TensorBoard sink in a build without protobuf or ISA-L (DLTRAIN_WITH_PROTOBUF off): every
// entry point raises dltrain::Error naming the packages to install (the link-time split that the
// CUDA and NCCL stubs use too). CSV and JSON lines do not depend on it.
#include "dltrain/core/error.hpp"
#include "dltrain/train/metrics.hpp"
#include "src/train/crc32c.hpp"

namespace dltrain::train {

namespace {
[[noreturn]] void unavailable(const char* what) {
  DLTRAIN_FAIL("train::", what, ": this dltrain was built without TensorBoard support, which ",
               "needs protobuf and ISA-L (CRC32C); install libprotobuf-dev protobuf-compiler ",
               "libisal-dev (Debian) and reconfigure with -DDLTRAIN_PROTOBUF=ON, or log to CSV / ",
               "JSON lines instead (--metrics FILE.csv)");
}
}  // namespace

bool tensorboard_available() { return false; }
std::unique_ptr<MetricsSink> make_tensorboard_sink(const std::string&) {
  unavailable("make_tensorboard_sink");
}
std::vector<std::string> read_event_records(const std::string&) {
  unavailable("read_event_records");
}
uint32_t crc32c(const void*, size_t) { unavailable("crc32c"); }
uint32_t masked_crc32c(const void*, size_t) { unavailable("masked_crc32c"); }

}  // namespace dltrain::train
