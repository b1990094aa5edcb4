// The ONNX model export_onnx builds (internal header): nodes, initializers and graph inputs and
// outputs as plain structs, so that the op mapping (src/io/onnx.cpp) compiles without protobuf;
// src/io/onnx_write.cpp turns it into an onnx::ModelProto when the build has protobuf and
// ONNX's onnx.proto, and otherwise raises the error that names the packages.
#pragma once

#include <string>
#include <vector>

#include "dltrain/core/tensor.hpp"
#include "src/core/graph_trace.hpp"

namespace dltrain::io::detail {

struct OnnxNode {
  std::string op_type;
  std::string name;
  std::vector<std::string> inputs;  // "" for an absent optional input
  std::vector<std::string> outputs;
  std::vector<dltrain::detail::GraphAttr> attrs;  // a double is written as an ONNX FLOAT
};

/// A graph input or output: name, element type and shape; dim_names[d], when given and not
/// empty, makes dim d the symbolic dimension of that name.
struct OnnxValueInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::vector<std::string> dim_names = {};
};

/// A named tensor stored in the file (a parameter, buffer or constant), on the CPU.
struct OnnxInitializer {
  std::string name;
  Tensor value;
};

struct OnnxModel {
  std::string graph_name;
  int64_t opset = 17;
  std::vector<OnnxNode> nodes;
  std::vector<OnnxInitializer> initializers;
  std::vector<OnnxValueInfo> inputs, outputs;
};

/// True when onnx_write can write (the build has protobuf and onnx.proto).
bool onnx_writer_available();
/// Serialises `model` to `path` (written to path + ".tmp", then renamed). Throws dltrain::Error
/// when the file cannot be written, or naming the packages when the build has no ONNX writer.
void onnx_write(const OnnxModel& model, const std::string& path);

}  // namespace dltrain::io::detail
