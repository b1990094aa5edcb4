// ONNX export: a model's eval-mode forward written as an ONNX file that ONNX Runtime, TensorRT
// and the other ONNX tools run without dltrain.
//
// export_onnx runs the forward once on example inputs in eval mode, with gradients off and a
// graph tracer installed on the calling thread (src/core/graph_trace.hpp): every op the call
// executes is recorded with its attributes, inputs and outputs, then mapped to ONNX operators
// (opset 17, IR version 8) and written as an ONNX ModelProto. Parameters and buffers become
// initializers named with their state-dict names ("layer1.0.conv1.weight"); other tensors an
// op reads that the forward did not compute from its inputs or weights (scalars, masks built
// in forward) become initializers named "const_<n>" holding their values at export time.
// BatchNorm uses its running statistics and dropout is the identity (eval mode); the
// module's training flags are restored afterwards.
//
// The graph is what the call executed, so control flow in the forward that depends on the
// input's values would be baked in as taken: export_onnx traces the forward a second time on
// other values and refuses the export, naming the first op that differs, when the two graphs
// differ (OnnxExportOptions::check_graph). Shapes are those of the example inputs, except the
// dynamic axes (dynamic_batch: dim 0 of every input; dynamic_axes: any input dims, by name):
// the second trace then also multiplies every dynamic size (by 2, 3, ... per name: a whole
// multiple keeps a U-Net's sizes divisible), and the dims of every tensor that change with it
// are the graph's variable dims. Reshapes take such dims from their input
// (copied, read with Shape, or inferred), outputs name them after the input axis whose size
// they follow, and an op whose ONNX form would hold a variable size as a constant (a variance
// over a dynamic dim, an adaptive pool or an interpolation to a fixed size of one, ...) stops
// the export with an error naming it.
//
// Errors (dltrain::Error): an op with no ONNX mapping (its name; inside a module called as
// m(x), the module's path too), a path that cannot be written, a build without protobuf
// (the message names the packages).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dltrain/core/tensor.hpp"
#include "dltrain/nn/module.hpp"

namespace dltrain::io {

struct OnnxExportOptions {
  /// Names of the graph inputs; default "input" (one input) or "input_0", "input_1", ...
  std::vector<std::string> input_names = {};
  /// Names of the graph outputs; default "output" (one output) or "output_0", ...
  std::vector<std::string> output_names = {};
  /// Dim 0 of every input becomes the symbolic dimension "batch" (and so does every output dim
  /// that follows it).
  bool dynamic_batch = false;
  /// Further variable dims of the graph inputs, by input name: dim -> symbolic name, e.g.
  /// {{"tokens", {{1, "sequence"}}}} or, for a graph network, {{"x", {{0, "nodes"}}},
  /// {"edge_index", {{1, "edges"}}}, {"edge_attr", {{0, "edges"}}}}. A name used for several
  /// dims is one size (the example inputs must agree on it). An output name may be given too,
  /// to name its variable dims (otherwise they take the name of the input axis they follow, or
  /// "<output>_dim<d>"). The second trace runs on inputs whose k-th name is k + 1 times larger
  /// (2x, 3x, ...): its memory and time grow with the product of those factors.
  std::map<std::string, std::map<int64_t, std::string>> dynamic_axes = {};
  /// Trace the forward a second time, on inputs with other values, and refuse the export when
  /// the two graphs differ: a forward that branches on its input's values, or (with dynamic
  /// axes, which always take the second trace) one whose ops or constants depend on a dynamic
  /// size. Costs one more forward pass.
  bool check_graph = true;
  /// The ONNX opset; only 17 (ONNX 1.12, ONNX Runtime 1.13 and later) for now.
  int64_t opset = 17;
  /// The graph's name in the file.
  std::string graph_name = "dltrain";
};

/// A forward pass with any number of tensor inputs and outputs.
using OnnxForward = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

/// Exports `model`'s single-input forward, called as model(example_inputs[0]) (one input).
void export_onnx(nn::Module& model, const std::vector<Tensor>& example_inputs,
                 const std::string& path, const OnnxExportOptions& options = {});

/// Exports `forward` (which calls `model`, or parts of it): `model` gives the initializers'
/// names and is put in eval mode for the call.
void export_onnx(nn::Module& model, const OnnxForward& forward,
                 const std::vector<Tensor>& example_inputs, const std::string& path,
                 const OnnxExportOptions& options = {});

/// Exports a plain function; the tensors it reads besides its inputs become "const_<n>".
void export_onnx(const OnnxForward& forward, const std::vector<Tensor>& example_inputs,
                 const std::string& path, const OnnxExportOptions& options = {});

/// True when this build can write ONNX files (built with protobuf and ONNX's onnx.proto).
bool onnx_supported();

}  // namespace dltrain::io
