// The ONNX writer in a build without protobuf or ONNX's onnx.proto (src/io/CMakeLists.txt
// compiles this file instead of onnx_write.cpp): io::export_onnx traces as usual, then raises
// dltrain::Error naming the packages.
#include "dltrain/core/error.hpp"
#include "src/io/onnx_model.hpp"

namespace dltrain::io::detail {

bool onnx_writer_available() { return false; }

void onnx_write(const OnnxModel&, const std::string&) {
  DLTRAIN_FAIL("export_onnx: this dltrain was built without ONNX support, which needs protobuf ",
               "and ONNX's onnx.proto; install libprotobuf-dev protobuf-compiler libonnx-dev ",
               "(Debian) and reconfigure with -DDLTRAIN_PROTOBUF=ON");
}

}  // namespace dltrain::io::detail
