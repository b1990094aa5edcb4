// export_onnx (include/dltrain/io/onnx.hpp): traces the forward with a detail::GraphTracer and
// maps each recorded op to ONNX operators of opset 17.
//
// Value names: graph inputs take the requested input names, parameters and buffers their
// state-dict names, every other tensor an op reads that the trace did not produce becomes an
// initializer "const_<n>" with its value, and op outputs are "<OpType>_<n>" (the outputs the
// forward returns are renamed to the requested output names). Values are identified by their
// TensorImpl, and an in-place op (relu_) gives its tensor a new name from then on.
//
// The mapping table `kMappings` is the list of op scope names export_onnx covers; the tracer
// rejects any other op that reads a graph value, at the op's entry (see graph_trace.hpp).
// Where ONNX has no operator of its own in opset 17 the op is written as a few standard ones:
// silu = x * Sigmoid(x), gelu with Erf (or Tanh for the approximate form), group_norm as
// InstanceNormalization on [N, G, -1] followed by the per-channel affine.
#include "dltrain/io/onnx.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <numbers>
#include <set>
#include <unordered_map>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/core/generator.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/shape.hpp"
#include "src/core/graph_trace.hpp"
#include "src/io/onnx_model.hpp"

namespace dltrain::io {

namespace {

using detail::OnnxInitializer;
using detail::OnnxModel;
using detail::OnnxNode;
using dltrain::detail::GraphAttr;
using dltrain::detail::TracedOp;

// --- attribute access ---------------------------------------------------------------------

const GraphAttr* find_attr(const TracedOp& op, const char* name) {
  for (const auto& a : op.attrs)
    if (a.name == name) return &a;
  return nullptr;
}
int64_t attr_i(const TracedOp& op, const char* name) {
  const GraphAttr* a = find_attr(op, name);
  DLTRAIN_CHECK(a && std::holds_alternative<int64_t>(a->value), "export_onnx: internal error: op ",
                op.op, " recorded no integer attribute ", name);
  return std::get<int64_t>(a->value);
}
double attr_f(const TracedOp& op, const char* name) {
  const GraphAttr* a = find_attr(op, name);
  DLTRAIN_CHECK(a && std::holds_alternative<double>(a->value), "export_onnx: internal error: op ",
                op.op, " recorded no real attribute ", name);
  return std::get<double>(a->value);
}
std::vector<int64_t> attr_ints(const TracedOp& op, const char* name) {
  const GraphAttr* a = find_attr(op, name);
  DLTRAIN_CHECK(a && std::holds_alternative<std::vector<int64_t>>(a->value),
                "export_onnx: internal error: op ", op.op, " recorded no list attribute ", name);
  return std::get<std::vector<int64_t>>(a->value);
}
std::string attr_s(const TracedOp& op, const char* name) {
  const GraphAttr* a = find_attr(op, name);
  DLTRAIN_CHECK(a && std::holds_alternative<std::string>(a->value),
                "export_onnx: internal error: op ", op.op, " recorded no string attribute ", name);
  return std::get<std::string>(a->value);
}

// --- the graph under construction ------------------------------------------------------------

class Builder {
 public:
  explicit Builder(OnnxModel& m) : m_(m) {}

  /// The shape of `t`'s counterpart in the second trace, whose dynamic sizes were multiplied:
  /// the dims where it differs vary with the inputs.
  void set_other_shape(const Tensor& t, const Shape& other) {
    if (t.defined()) other_[t.impl().get()] = other;
  }
  /// Whether dim d (>= 0) of `t` varies with the dynamic axes.
  bool varies(const Tensor& t, int64_t d) const {
    auto it = t.defined() ? other_.find(t.impl().get()) : other_.end();
    return it != other_.end() && it->second[static_cast<size_t>(d)] != t.size(d);
  }
  /// Dim d's size in the exported trace and in the second one.
  std::pair<int64_t, int64_t> sizes(const Tensor& t, int64_t d) const {
    auto it = other_.find(t.impl().get());
    return {t.size(d), it == other_.end() ? t.size(d) : it->second[static_cast<size_t>(d)]};
  }

  /// Names a tensor: a graph input or parameter/buffer by the name given here.
  void name_known(const Tensor& t, const std::string& name, bool initializer) {
    names_[t.impl().get()] = name;
    if (initializer) pending_[t.impl().get()] = {name, t};
  }

  /// The graph value of `t`; "" for an undefined tensor (an absent optional input).
  std::string value(const Tensor& t) {
    if (!t.defined()) return "";
    const TensorImpl* k = t.impl().get();
    if (auto p = pending_.find(k); p != pending_.end()) {  // first use of a parameter/buffer
      add_initializer(p->second.first, p->second.second);
      pending_.erase(p);
    }
    if (auto it = names_.find(k); it != names_.end()) return it->second;
    const std::string name = "const_" + std::to_string(consts_++);
    add_initializer(name, t);
    names_[k] = name;
    keep_.push_back(t);  // names_ is keyed by address: no other tensor may take this one's
    return name;
  }

  /// Appends a node and returns its first output's name (fresh names "<op_type>_<n>").
  std::string node(const std::string& op_type, std::vector<std::string> inputs,
                   std::vector<GraphAttr> attrs = {}, int n_outputs = 1) {
    return node_outputs(op_type, std::move(inputs), std::move(attrs), n_outputs)[0];
  }

  /// Appends a node of `n` outputs and returns their names. In a bf16 op (set_bf16), an
  /// operator that opset 17 defines for f16/f32/f64 only reads its inputs cast to f32 and its
  /// outputs are cast back: the f32 computation rounded once, as dltrain's bf16 kernels do.
  std::vector<std::string> node_outputs(const std::string& op_type, std::vector<std::string> inputs,
                                        std::vector<GraphAttr> attrs, int n) {
    static const std::set<std::string, std::less<>> no_bf16 = {"Conv",
                                                               "ConvTranspose",
                                                               "MaxPool",
                                                               "AveragePool",
                                                               "GlobalAveragePool",
                                                               "InstanceNormalization",
                                                               "Elu",
                                                               "Softplus",
                                                               "HardSwish",
                                                               "Sin",
                                                               "Cos",
                                                               "LSTM",
                                                               "GRU"};
    const bool widen = bf16_ && no_bf16.count(op_type) > 0;
    if (widen)
      for (auto& i : inputs)
        if (!i.empty()) i = cast(i, DType::bf16, DType::f32);
    OnnxNode nd;
    nd.op_type = op_type;
    nd.name = op_type + "_" + std::to_string(nodes_++);
    nd.inputs = std::move(inputs);
    for (int i = 0; i < n; ++i)
      nd.outputs.push_back(n == 1 ? nd.name : nd.name + "_" + std::to_string(i));
    nd.attrs = std::move(attrs);
    m_.nodes.push_back(std::move(nd));
    std::vector<std::string> outs = m_.nodes.back().outputs;
    if (widen)
      for (auto& o : outs) o = cast(o, DType::f32, DType::bf16);
    return outs;
  }

  /// Whether the op being mapped computes in bf16 (see node_outputs).
  void set_bf16(bool on) { bf16_ = on; }

  /// `t` is the value `name` from now on (an op's output).
  void bind(const Tensor& t, const std::string& name) {
    pending_.erase(t.impl().get());
    names_[t.impl().get()] = name;
  }

  /// A constant initializer from host values.
  std::string const_i64(const std::vector<int64_t>& v) {
    return value(from_vector<int64_t>(v, {static_cast<int64_t>(v.size())}));
  }
  std::string const_f32(const std::vector<float>& v) {
    return value(from_vector<float>(v, {static_cast<int64_t>(v.size())}));
  }
  /// A 0-d constant of dtype `dt`.
  std::string scalar(double v, DType dt) { return value(full({}, v, TensorOptions(dt))); }

  /// `name` (of dtype `from`) as dtype `to` (a Cast node when they differ).
  std::string cast(const std::string& name, DType from, DType to) {
    if (from == to || name.empty()) return name;
    return node("Cast", {name}, {{"to", static_cast<int64_t>(onnx_type(to))}});
  }

  static int onnx_type(DType t) {
    switch (t) {
      case DType::f32:
        return 1;
      case DType::u8:
        return 2;
      case DType::i32:
        return 6;
      case DType::i64:
        return 7;
      case DType::b8:
        return 9;
      case DType::f16:
        return 10;
      case DType::f64:
        return 11;
      case DType::bf16:
        return 16;
    }
    return 0;
  }

  /// Renames value `from` to `to` everywhere (the requested output names).
  void rename(const std::string& from, const std::string& to) {
    for (auto& n : m_.nodes) {
      for (auto& i : n.inputs)
        if (i == from) i = to;
      for (auto& o : n.outputs)
        if (o == from) o = to;
    }
    for (auto& [k, v] : names_)
      if (v == from) v = to;
  }

  bool is_initializer_or_input(const std::string& name) const {
    for (const auto& i : m_.initializers)
      if (i.name == name) return true;
    for (const auto& i : m_.inputs)
      if (i.name == name) return true;
    return false;
  }

 private:
  void add_initializer(const std::string& name, const Tensor& t) {
    Tensor v = t.detach().to(Device::cpu()).contiguous();
    if (v.impl() == t.impl()) v = v.clone();  // a snapshot, not the live parameter
    m_.initializers.push_back(OnnxInitializer{name, v});
  }

  OnnxModel& m_;
  bool bf16_ = false;
  std::unordered_map<const TensorImpl*, Shape> other_;
  std::unordered_map<const TensorImpl*, std::string> names_;
  std::unordered_map<const TensorImpl*, std::pair<std::string, Tensor>> pending_;
  std::vector<Tensor> keep_;
  int64_t consts_ = 0, nodes_ = 0;
};

// --- the op mappings ---------------------------------------------------------------------

using Mapping = void (*)(Builder&, const TracedOp&);

const Tensor& in(const TracedOp& op, size_t i) { return op.inputs.at(i); }
const Tensor& out(const TracedOp& op, size_t i = 0) { return op.outputs.at(i); }

// Size d of `t` where the mapping writes it into the graph as a constant: refused when the dim
// varies with the dynamic axes.
int64_t fixed_size(const Builder& b, const TracedOp& op, const Tensor& t, int64_t d,
                   const char* what) {
  d = wrap_dim(d, t.dim(), op.op.c_str());
  DLTRAIN_CHECK(!b.varies(t, d), "export_onnx: ", op.op, " would hold the size of ", what, " (dim ",
                d, " of shape ", shape_str(t.shape()),
                ") as a constant, but that dim varies with the dynamic axes; keep it fixed "
                "(leave it out of dynamic_axes) or compute this step outside the exported forward");
  return t.size(d);
}

std::vector<int64_t> pads_of(const std::vector<int64_t>& hw) {
  return {hw[0], hw[1], hw[0], hw[1]};
}

// The inputs of an elementwise op, cast to the output's dtype (ONNX wants equal types where
// dltrain promotes).
std::vector<std::string> promoted(Builder& b, const TracedOp& op) {
  std::vector<std::string> v;
  for (const Tensor& t : op.inputs) v.push_back(b.cast(b.value(t), t.dtype(), out(op).dtype()));
  return v;
}

void unary(Builder& b, const TracedOp& op, const char* type) {
  b.bind(out(op), b.node(type, {b.value(in(op, 0))}));
}

void map_add_sub(Builder& b, const TracedOp& op) {
  auto v = promoted(b, op);
  const double alpha = attr_f(op, "alpha");
  if (alpha != 1.0) v[1] = b.node("Mul", {v[1], b.scalar(alpha, out(op).dtype())});
  b.bind(out(op), b.node(op.op == "add" ? "Add" : "Sub", v));
}

void map_binary(Builder& b, const TracedOp& op) {
  b.bind(out(op), b.node(op.op == "mul" ? "Mul" : "Div", promoted(b, op)));
}

void map_conv(Builder& b, const TracedOp& op) {
  const Tensor& w = in(op, 1);
  b.bind(out(op), b.node("Conv", {b.value(in(op, 0)), b.value(w), b.value(in(op, 2))},
                         {{"kernel_shape", std::vector<int64_t>{w.size(2), w.size(3)}},
                          {"strides", attr_ints(op, "stride")},
                          {"pads", pads_of(attr_ints(op, "padding"))},
                          {"dilations", attr_ints(op, "dilation")},
                          {"group", attr_i(op, "groups")}}));
}

void map_conv_transpose(Builder& b, const TracedOp& op) {
  const Tensor& w = in(op, 1);
  b.bind(out(op), b.node("ConvTranspose", {b.value(in(op, 0)), b.value(w), b.value(in(op, 2))},
                         {{"kernel_shape", std::vector<int64_t>{w.size(2), w.size(3)}},
                          {"strides", attr_ints(op, "stride")},
                          {"pads", pads_of(attr_ints(op, "padding"))},
                          {"output_padding", attr_ints(op, "output_padding")},
                          {"dilations", attr_ints(op, "dilation")},
                          {"group", attr_i(op, "groups")}}));
}

void map_linear(Builder& b, const TracedOp& op) {
  const Tensor &x = in(op, 0), &w = in(op, 1), &bias = in(op, 2);
  if (x.dim() == 2) {
    b.bind(out(op), b.node("Gemm", {b.value(x), b.value(w), b.value(bias)}, {{"transB", 1}}));
    return;
  }
  std::string y = b.node("MatMul", {b.value(x), b.node("Transpose", {b.value(w)},
                                                       {{"perm", std::vector<int64_t>{1, 0}}})});
  if (bias.defined()) y = b.node("Add", {y, b.value(bias)});
  b.bind(out(op), y);
}

void map_matmul(Builder& b, const TracedOp& op) {
  b.bind(out(op), b.node("MatMul", {b.value(in(op, 0)), b.value(in(op, 1))}));
}

void map_batch_norm(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const int64_t C = fixed_size(b, op, x, 1, "the channels");
  const TensorOptions o(x.dtype());
  const std::string w = in(op, 1).defined() ? b.value(in(op, 1)) : b.value(ones({C}, o));
  const std::string bias = in(op, 2).defined() ? b.value(in(op, 2)) : b.value(zeros({C}, o));
  b.bind(out(op),
         b.node("BatchNormalization", {b.value(x), w, bias, b.value(in(op, 3)), b.value(in(op, 4))},
                {{"epsilon", attr_f(op, "eps")}}));
}

void map_layer_norm(Builder& b, const TracedOp& op) {
  const Shape ns = attr_ints(op, "normalized_shape");
  const std::string w =
      in(op, 1).defined() ? b.value(in(op, 1)) : b.value(ones(ns, in(op, 0).dtype()));
  b.bind(out(op),
         b.node("LayerNormalization", {b.value(in(op, 0)), w, b.value(in(op, 2))},
                {{"axis", -static_cast<int64_t>(ns.size())}, {"epsilon", attr_f(op, "eps")}}));
}

// GroupNormalization is opset 18: InstanceNormalization over [N, G, -1] gives each (n, group)
// its mean and variance; then the per-channel scale and shift.
void map_group_norm(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const int64_t G = attr_i(op, "num_groups"), C = fixed_size(b, op, x, 1, "the channels");
  const TensorOptions o(x.dtype());
  const std::string xv = b.value(x);
  std::string y = b.node("Reshape", {xv, b.const_i64({0, G, -1})});  // 0: x's dim 0
  y = b.node("InstanceNormalization", {y, b.value(ones({G}, o)), b.value(zeros({G}, o))},
             {{"epsilon", attr_f(op, "eps")}});
  y = b.node("Reshape", {y, b.node("Shape", {xv})});
  Shape per_channel(static_cast<size_t>(x.dim() - 1), 1);
  per_channel[0] = C;
  if (in(op, 1).defined())
    y = b.node("Mul", {y, b.node("Reshape", {b.value(in(op, 1)), b.const_i64(per_channel)})});
  if (in(op, 2).defined())
    y = b.node("Add", {y, b.node("Reshape", {b.value(in(op, 2)), b.const_i64(per_channel)})});
  b.bind(out(op), y);
}

void map_leaky_relu(Builder& b, const TracedOp& op) {
  b.bind(out(op),
         b.node("LeakyRelu", {b.value(in(op, 0))}, {{"alpha", attr_f(op, "negative_slope")}}));
}

void map_silu(Builder& b, const TracedOp& op) {
  const std::string x = b.value(in(op, 0));
  b.bind(out(op), b.node("Mul", {x, b.node("Sigmoid", {x})}));
}

void map_gelu(Builder& b, const TracedOp& op) {
  const DType dt = in(op, 0).dtype();
  const std::string x = b.value(in(op, 0));
  std::string inner;
  if (attr_i(op, "approximate")) {  // tanh(sqrt(2/pi) (x + 0.044715 x^3))
    const std::string x3 = b.node("Mul", {b.node("Mul", {x, x}), x});
    const std::string s = b.node("Add", {x, b.node("Mul", {x3, b.scalar(0.044715, dt)})});
    inner = b.node("Tanh", {b.node("Mul", {s, b.scalar(std::sqrt(2.0 / std::numbers::pi), dt)})});
  } else {  // erf(x / sqrt(2))
    inner = b.node("Erf", {b.node("Div", {x, b.scalar(std::numbers::sqrt2, dt)})});
  }
  const std::string half_x = b.node("Mul", {x, b.scalar(0.5, dt)});
  b.bind(out(op), b.node("Mul", {half_x, b.node("Add", {inner, b.scalar(1.0, dt)})}));
}

void map_max_pool(Builder& b, const TracedOp& op) {
  b.bind(out(op), b.node("MaxPool", {b.value(in(op, 0))},
                         {{"kernel_shape", attr_ints(op, "kernel")},
                          {"strides", attr_ints(op, "stride")},
                          {"pads", pads_of(attr_ints(op, "padding"))},
                          {"dilations", attr_ints(op, "dilation")},
                          {"ceil_mode", attr_i(op, "ceil_mode")}}));
}

void map_avg_pool(Builder& b, const TracedOp& op) {
  b.bind(out(op), b.node("AveragePool", {b.value(in(op, 0))},
                         {{"kernel_shape", attr_ints(op, "kernel")},
                          {"strides", attr_ints(op, "stride")},
                          {"pads", pads_of(attr_ints(op, "padding"))},
                          {"ceil_mode", attr_i(op, "ceil_mode")},
                          {"count_include_pad", attr_i(op, "count_include_pad")}}));
}

void map_adaptive_avg_pool(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const int64_t Ho = out(op).size(-2), Wo = out(op).size(-1);
  if (Ho == 1 && Wo == 1) {
    b.bind(out(op), b.node("GlobalAveragePool", {b.value(x)}));
    return;
  }
  const int64_t H = fixed_size(b, op, x, -2, "the height"),
                W = fixed_size(b, op, x, -1, "the width");
  const std::vector<int64_t> k{H / Ho, W / Wo};
  b.bind(out(op), b.node("AveragePool", {b.value(x)}, {{"kernel_shape", k}, {"strides", k}}));
}

void map_softmax(Builder& b, const TracedOp& op) {
  const int64_t axis = wrap_dim(attr_i(op, "dim"), in(op, 0).dim(), "softmax");
  b.bind(out(op), b.node(op.op == "softmax" ? "Softmax" : "LogSoftmax", {b.value(in(op, 0))},
                         {{"axis", axis}}));
}

void map_dropout(Builder& b, const TracedOp& op) {
  b.bind(out(op), b.node("Identity", {b.value(in(op, 0))}));
}

// view, reshape, squeeze, unsqueeze, flatten: a Reshape to the output's shape. An output dim
// that varies with the dynamic axes is copied from the input dim at the same index (0 in ONNX's
// shape) or read from the input's Shape where a dim of the input varies the same way; one
// that follows no input dim (a product of several, such as a batch folded in by view(-1)) is
// inferred (-1), which one dim may be.
void map_reshape(Builder& b, const TracedOp& op) {
  const Tensor &x = in(op, 0), &y = out(op);
  if (op.op == "flatten" && x.dim() >= 2 && y.dim() == 2 &&
      wrap_dim(attr_i(op, "start_dim"), x.dim(), "flatten") == 1 &&
      wrap_dim(attr_i(op, "end_dim"), x.dim(), "flatten") == x.dim() - 1) {
    b.bind(y, b.node("Flatten", {b.value(x)}, {{"axis", 1}}));
    return;
  }
  const std::string xv = b.value(x);
  std::vector<int64_t> shape(y.shape().begin(), y.shape().end());
  std::vector<std::string> read(shape.size());  // a dim taken from Shape(x)
  int64_t inferred = -1;
  for (int64_t i = 0; i < y.dim(); ++i) {
    if (!b.varies(y, i)) continue;
    if (i < x.dim() && b.varies(x, i) && b.sizes(x, i) == b.sizes(y, i)) {
      shape[i] = 0;
      continue;
    }
    int64_t j = 0;
    while (j < x.dim() && !(b.varies(x, j) && b.sizes(x, j) == b.sizes(y, i))) ++j;
    if (j < x.dim()) {
      read[i] = b.node("Gather", {b.node("Shape", {xv}), b.const_i64({j})}, {{"axis", 0}});
      continue;
    }
    DLTRAIN_CHECK(inferred < 0, "export_onnx: ", op.op, " from shape ", shape_str(x.shape()),
                  " to ", shape_str(y.shape()), " gives dims ", inferred, " and ", i,
                  " sizes that vary with the dynamic axes but follow no single input dim; ONNX's "
                  "Reshape can infer only one. Reshape in two steps, or keep those dims fixed");
    inferred = i;
    shape[i] = -1;
  }
  std::string target;
  if (std::all_of(read.begin(), read.end(), [](const std::string& r) { return r.empty(); })) {
    target = b.const_i64(shape);
  } else {
    std::vector<std::string> parts;
    for (size_t i = 0; i < shape.size(); ++i)
      parts.push_back(read[i].empty() ? b.const_i64({shape[i]}) : read[i]);
    target = b.node("Concat", parts, {{"axis", 0}});
  }
  b.bind(y, b.node("Reshape", {xv, target}));
}

void map_permute(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const int64_t n = x.dim();
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  if (op.op == "permute") {
    const auto dims = attr_ints(op, "dims");
    for (int64_t i = 0; i < n; ++i) perm[i] = wrap_dim(dims[i], n, "permute");
  } else if (op.op == "transpose") {
    if (n > 0)
      std::swap(perm[wrap_dim(attr_i(op, "dim0"), n, "transpose")],
                perm[wrap_dim(attr_i(op, "dim1"), n, "transpose")]);
  } else if (n == 2) {  // t()
    perm = {1, 0};
  }
  b.bind(out(op), b.node("Transpose", {b.value(x)}, {{"perm", perm}}));
}

// Expand to the output's shape, with 1 wherever the input already has that size (so that a
// dim that varies with the dynamic axes carries through); expanding a dim of size 1 to a
// varying size would hold the traced size and is refused.
void map_expand(Builder& b, const TracedOp& op) {
  const Tensor &x = in(op, 0), &y = out(op);
  std::vector<int64_t> shape(y.shape().begin(), y.shape().end());
  const int64_t lead = y.dim() - x.dim();
  for (int64_t i = 0; i < y.dim(); ++i)
    DLTRAIN_CHECK(!b.varies(y, i) || (i >= lead && b.varies(x, i - lead)), "export_onnx: expand ",
                  "from shape ", shape_str(x.shape()), " to ", shape_str(y.shape()),
                  " broadcasts to a size that varies with the dynamic axes (dim ", i,
                  "), which the graph would hold as the traced size; broadcast through an "
                  "elementwise op with a tensor of that shape instead");
  for (int64_t i = 0; i < x.dim(); ++i)
    if (x.size(i) == y.size(lead + i)) shape[lead + i] = 1;
  b.bind(y, b.node("Expand", {b.value(x), b.const_i64(shape)}));
}

void map_cat(Builder& b, const TracedOp& op) {
  std::vector<std::string> v;
  for (const Tensor& t : op.inputs) v.push_back(b.cast(b.value(t), t.dtype(), out(op).dtype()));
  const int64_t axis = wrap_dim(attr_i(op, "dim"), out(op).dim(), "cat");
  b.bind(out(op), b.node("Concat", v, {{"axis", axis}}));
}

// clone, contiguous, to (dtype or device): the same values, or a Cast.
void map_copy(Builder& b, const TracedOp& op) {
  const Tensor &x = in(op, 0), &y = out(op);
  if (x.dtype() != y.dtype())
    b.bind(y, b.cast(b.value(x), x.dtype(), y.dtype()));
  else
    b.bind(y, b.node("Identity", {b.value(x)}));
}

void map_interpolate(Builder& b, const TracedOp& op) {
  const Tensor &x = in(op, 0), &y = out(op);
  const bool nearest = attr_s(op, "mode") == "nearest";
  if (attr_f(op, "scale_h") <= 0 || attr_f(op, "scale_w") <= 0)  // the scales come from sizes
    for (int64_t d : {2, 3}) {
      fixed_size(b, op, x, d, "the input's spatial dims (interpolate to a size)");
      fixed_size(b, op, y, d, "the output's spatial dims (interpolate to a size)");
    }
  // PyTorch's source coordinates use the scale factor as given, or in/out for a size.
  const double sh = attr_f(op, "scale_h") > 0 ? attr_f(op, "scale_h")
                                              : static_cast<double>(y.size(2)) / x.size(2);
  const double sw = attr_f(op, "scale_w") > 0 ? attr_f(op, "scale_w")
                                              : static_cast<double>(y.size(3)) / x.size(3);
  std::vector<GraphAttr> attrs;
  if (nearest) {
    attrs = {{"mode", "nearest"},
             {"coordinate_transformation_mode", "asymmetric"},
             {"nearest_mode", "floor"}};
  } else {
    attrs = {{"mode", "linear"},
             {"coordinate_transformation_mode",
              attr_i(op, "align_corners") ? "align_corners" : "pytorch_half_pixel"}};
  }
  const std::string scales =
      b.const_f32({1.0f, 1.0f, static_cast<float>(sh), static_cast<float>(sw)});
  b.bind(y, b.node("Resize", {b.value(x), "", scales}, attrs));
}

void map_reduce(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  std::vector<int64_t> axes;
  for (int64_t d : attr_ints(op, "dims")) axes.push_back(wrap_dim(d, x.dim(), op.op.c_str()));
  const int64_t keep = attr_i(op, "keepdim");
  const std::string xv = b.cast(b.value(x), x.dtype(), out(op).dtype());
  if (op.op == "sum") {  // opset 13: axes is an input
    std::vector<std::string> ins{xv};
    if (!axes.empty()) ins.push_back(b.const_i64(axes));
    b.bind(out(op), b.node("ReduceSum", ins, {{"keepdims", keep}}));
  } else {  // ReduceMean keeps axes as an attribute until opset 18
    std::vector<GraphAttr> attrs{{"keepdims", keep}};
    if (!axes.empty()) attrs.emplace_back("axes", axes);
    b.bind(out(op), b.node("ReduceMean", {xv}, attrs));
  }
}

// Comparisons: both sides in their promoted dtype (ONNX wants equal types), a bool output.
void map_compare(Builder& b, const TracedOp& op) {
  const DType dt = promote_types(in(op, 0).dtype(), in(op, 1).dtype());
  const std::string x = b.cast(b.value(in(op, 0)), in(op, 0).dtype(), dt);
  const std::string y = b.cast(b.value(in(op, 1)), in(op, 1).dtype(), dt);
  static const std::map<std::string, const char*, std::less<>> types = {
      {"eq", "Equal"},       {"ne", "Equal"},   {"lt", "Less"},
      {"le", "LessOrEqual"}, {"gt", "Greater"}, {"ge", "GreaterOrEqual"}};
  std::string r = b.node(types.at(op.op), {x, y});
  if (op.op == "ne") r = b.node("Not", {r});
  b.bind(out(op), r);
}

// A bool condition (a u8 mask is compared with 0, as dltrain's where does).
std::string condition(Builder& b, const Tensor& c) {
  const std::string v = b.value(c);
  if (c.dtype() == DType::b8) return v;
  return b.node("Not", {b.node("Equal", {v, b.scalar(0, c.dtype())})});
}

void map_where(Builder& b, const TracedOp& op) {
  const DType dt = out(op).dtype();
  b.bind(out(op), b.node("Where", {condition(b, in(op, 0)),
                                   b.cast(b.value(in(op, 1)), in(op, 1).dtype(), dt),
                                   b.cast(b.value(in(op, 2)), in(op, 2).dtype(), dt)}));
}

void map_masked_fill(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  b.bind(out(op), b.node("Where", {condition(b, in(op, 1)),
                                   b.scalar(attr_f(op, "value"), x.dtype()), b.value(x)}));
}

void map_extremum(Builder& b, const TracedOp& op) {
  b.bind(out(op), b.node(op.op == "maximum" ? "Max" : "Min", promoted(b, op)));
}

// pow(x, e) with a scalar exponent, or pow(x, y) elementwise.
void map_pow(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  if (op.inputs.size() == 2) {
    b.bind(out(op), b.node("Pow", promoted(b, op)));
    return;
  }
  b.bind(out(op), b.node("Pow", {b.value(x), b.scalar(attr_f(op, "exponent"), x.dtype())}));
}

// Clip's bounds are optional inputs: an infinite bound is left out. Tensor bounds (clamp(x,
// lo, hi) with tensors) are Max and Min, as dltrain computes them (where(x < lo, lo, x), ...).
void map_clamp(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  if (op.inputs.size() == 3) {
    const DType dt = out(op).dtype();
    std::string y = b.cast(b.value(x), x.dtype(), dt);
    if (in(op, 1).defined())
      y = b.node("Max", {y, b.cast(b.value(in(op, 1)), in(op, 1).dtype(), dt)});
    if (in(op, 2).defined())
      y = b.node("Min", {y, b.cast(b.value(in(op, 2)), in(op, 2).dtype(), dt)});
    b.bind(out(op), y);
    return;
  }
  const double lo = attr_f(op, "min"), hi = attr_f(op, "max");
  b.bind(out(op), b.node("Clip", {b.value(x), std::isinf(lo) ? "" : b.scalar(lo, x.dtype()),
                                  std::isinf(hi) ? "" : b.scalar(hi, x.dtype())}));
}

// ONNX's Softplus is log(1 + e^x) with neither beta nor threshold: softplus(beta x) / beta.
// dltrain (and PyTorch) return x itself where beta x > threshold, where the smooth form differs
// by log(1 + e^-(beta x)) / beta < e^-threshold / beta (2e-9 at the default 20), below f32's
// resolution of x there; PyTorch's exporter drops the threshold the same way.
void map_softplus(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const double beta = attr_f(op, "beta");
  std::string v = b.value(x);
  if (beta == 1.0) {
    b.bind(out(op), b.node("Softplus", {v}));
    return;
  }
  v = b.node("Softplus", {b.node("Mul", {v, b.scalar(beta, x.dtype())})});
  b.bind(out(op), b.node("Div", {v, b.scalar(beta, x.dtype())}));
}

void map_elu(Builder& b, const TracedOp& op) {
  b.bind(out(op), b.node("Elu", {b.value(in(op, 0))}, {{"alpha", attr_f(op, "alpha")}}));
}

// x tanh(softplus(x)) (ONNX's Mish is opset 18).
void map_mish(Builder& b, const TracedOp& op) {
  const std::string x = b.value(in(op, 0));
  b.bind(out(op), b.node("Mul", {x, b.node("Tanh", {b.node("Softplus", {x})})}));
}

void map_rsqrt(Builder& b, const TracedOp& op) {
  b.bind(out(op), b.node("Reciprocal", {b.node("Sqrt", {b.value(in(op, 0))})}));
}

// slice and narrow: one axis of Slice (opset 13: starts, ends, axes, steps are inputs).
void map_slice(Builder& b, const TracedOp& op) {
  b.bind(out(op),
         b.node("Slice", {b.value(in(op, 0)), b.const_i64({attr_i(op, "start")}),
                          b.const_i64({attr_i(op, "end")}), b.const_i64({attr_i(op, "dim")}),
                          b.const_i64({attr_i(op, "step")})}));
}

// select(d, i): Gather with a 0-d index drops the axis, as select does.
void map_select(Builder& b, const TracedOp& op) {
  const std::string index =
      b.value(full({}, static_cast<double>(attr_i(op, "index")), TensorOptions(DType::i64)));
  b.bind(out(op), b.node("Gather", {b.value(in(op, 0)), index}, {{"axis", attr_i(op, "dim")}}));
}

// split and chunk: one Split with the sizes (an input since opset 13).
void map_split(Builder& b, const TracedOp& op) {
  const std::vector<int64_t> sizes = attr_ints(op, "sizes");
  const auto names = b.node_outputs("Split", {b.value(in(op, 0)), b.const_i64(sizes)},
                                    {{"axis", attr_i(op, "dim")}}, static_cast<int>(sizes.size()));
  for (size_t i = 0; i < op.outputs.size(); ++i) b.bind(op.outputs[i], names.at(i));
}

void map_stack(Builder& b, const TracedOp& op) {
  const int64_t dim = attr_i(op, "dim");
  const std::string axes = b.const_i64({dim});
  std::vector<std::string> parts;
  for (const Tensor& t : op.inputs)
    parts.push_back(b.node("Unsqueeze", {b.cast(b.value(t), t.dtype(), out(op).dtype()), axes}));
  b.bind(out(op), b.node("Concat", parts, {{"axis", dim}}));
}

// flip: a Slice running backwards over each flipped axis.
void map_flip(Builder& b, const TracedOp& op) {
  const std::vector<int64_t> axes = attr_ints(op, "dims");
  const auto k = axes.size();
  b.bind(out(op),
         b.node("Slice", {b.value(in(op, 0)), b.const_i64(std::vector<int64_t>(k, -1)),
                          b.const_i64(std::vector<int64_t>(k, std::numeric_limits<int64_t>::min())),
                          b.const_i64(axes), b.const_i64(std::vector<int64_t>(k, -1))}));
}

// pad: F.pad's (before, after) pairs from the last dim, as ONNX's begins-then-ends over all.
void map_pad(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const std::vector<int64_t> p = attr_ints(op, "pad");
  const auto n = static_cast<size_t>(x.dim());
  std::vector<int64_t> pads(2 * n, 0);
  for (size_t k = 0; 2 * k + 1 < p.size(); ++k) {
    pads[n - 1 - k] = p[2 * k];
    pads[2 * n - 1 - k] = p[2 * k + 1];
  }
  const std::string mode = attr_s(op, "mode");
  std::vector<std::string> ins{b.value(x), b.const_i64(pads)};
  if (mode == "constant") ins.push_back(b.scalar(attr_f(op, "value"), x.dtype()));
  b.bind(out(op), b.node("Pad", ins, {{"mode", mode}}));
}

// pixel_shuffle is DepthToSpace in CRD order; pixel_unshuffle (channel c r^2 + i r + j) is not
// SpaceToDepth's order, so it is written out as Reshape, Transpose, Reshape.
void map_pixel_shuffle(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const int64_t r = attr_i(op, "factor");
  if (op.op == "pixel_shuffle") {
    b.bind(out(op), b.node("DepthToSpace", {b.value(x)}, {{"blocksize", r}, {"mode", "CRD"}}));
    return;
  }
  const int64_t C = fixed_size(b, op, x, 1, "the channels");
  const int64_t H = fixed_size(b, op, x, 2, "the height"), W = fixed_size(b, op, x, 3, "the width");
  // 0: the batch, copied from the input
  std::string y = b.node("Reshape", {b.value(x), b.const_i64({0, C, H / r, r, W / r, r})});
  y = b.node("Transpose", {y}, {{"perm", std::vector<int64_t>{0, 1, 3, 5, 2, 4}}});
  b.bind(out(op), b.node("Reshape", {y, b.const_i64({0, C * r * r, H / r, W / r})}));
}

void map_embedding(Builder& b, const TracedOp& op) {
  b.bind(out(op), b.node("Gather", {b.value(in(op, 0)), b.value(in(op, 1))}, {{"axis", 0}}));
}

// index_select keeps the axis for a 0-d index (one row); Gather would drop it.
void map_index_select(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const Tensor& index = in(op, 1);
  std::string iv = b.value(index);
  if (index.dim() == 0) iv = b.node("Reshape", {iv, b.const_i64({1})});
  b.bind(out(op), b.node("Gather", {b.value(x), iv},
                         {{"axis", wrap_dim(attr_i(op, "dim"), x.dim(), "index_select")}}));
}

void map_conv1d(Builder& b, const TracedOp& op) {
  const Tensor& w = in(op, 1);
  const int64_t p = attr_i(op, "padding");
  b.bind(out(op), b.node("Conv", {b.value(in(op, 0)), b.value(w), b.value(in(op, 2))},
                         {{"kernel_shape", std::vector<int64_t>{w.size(2)}},
                          {"strides", std::vector<int64_t>{attr_i(op, "stride")}},
                          {"pads", std::vector<int64_t>{p, p}},
                          {"dilations", std::vector<int64_t>{attr_i(op, "dilation")}},
                          {"group", attr_i(op, "groups")}}));
}

// The reduced axes (all when `dims` is empty), wrapped.
std::vector<int64_t> reduced_axes(const Tensor& x, const std::vector<int64_t>& dims,
                                  const char* op) {
  std::vector<int64_t> axes;
  if (dims.empty())
    for (int64_t d = 0; d < x.dim(); ++d) axes.push_back(d);
  for (int64_t d : dims) axes.push_back(wrap_dim(d, x.dim(), op));
  return axes;
}

// var: mean, centred squares summed, divided by (count - correction), as dltrain computes it.
void map_var(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const auto axes = reduced_axes(x, attr_ints(op, "dims"), "var");
  int64_t count = 1;
  for (int64_t d : axes) count *= fixed_size(b, op, x, d, "a reduced dim (the divisor)");
  const DType dt = out(op).dtype();
  const std::string xv = b.cast(b.value(x), x.dtype(), dt);
  const std::string m = b.node("ReduceMean", {xv}, {{"axes", axes}, {"keepdims", 1}});
  const std::string c = b.node("Sub", {xv, m});
  const std::string ss = b.node("ReduceSum", {b.node("Mul", {c, c}), b.const_i64(axes)},
                                {{"keepdims", attr_i(op, "keepdim")}});
  const double denom = static_cast<double>(count - attr_i(op, "correction"));
  b.bind(out(op), b.node("Div", {ss, b.scalar(denom > 0 ? denom : NAN, dt)}));
}

// max/min over a dim (values and first indices), over everything, and argmax/argmin.
void map_extreme(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const bool is_max = op.op == "max" || op.op == "argmax";
  const std::string xv = b.value(x);
  if (op.outputs.size() == 1) {  // over all elements: a 0-d result
    b.bind(out(op), b.node(is_max ? "ReduceMax" : "ReduceMin", {xv}, {{"keepdims", 0}}));
    return;
  }
  const int64_t d = attr_i(op, "dim"), keep = attr_i(op, "keepdim");
  b.bind(out(op, 0), b.node(is_max ? "ReduceMax" : "ReduceMin", {xv},
                            {{"axes", std::vector<int64_t>{d}}, {"keepdims", keep}}));
  b.bind(out(op, 1), b.node(is_max ? "ArgMax" : "ArgMin", {xv},
                            {{"axis", d}, {"keepdims", keep}, {"select_last_index", 0}}));
}

void map_cumsum(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const std::string xv = b.cast(b.value(x), x.dtype(), out(op).dtype());
  if (x.dim() == 0) {  // one element: itself
    b.bind(out(op), b.node("Identity", {xv}));
    return;
  }
  const int64_t d = wrap_dim(attr_i(op, "dim"), x.dim(), "cumsum");
  b.bind(out(op), b.node("CumSum", {xv, b.scalar(static_cast<double>(d), DType::i64)}));
}

void map_prod(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const std::string xv = b.cast(b.value(x), x.dtype(), out(op).dtype());
  if (find_attr(op, "dim") == nullptr || x.dim() == 0) {  // all elements
    b.bind(out(op), b.node("ReduceProd", {xv}, {{"keepdims", 0}}));
    return;
  }
  const int64_t d = wrap_dim(attr_i(op, "dim"), x.dim(), "prod");
  b.bind(out(op), b.node("ReduceProd", {xv},
                         {{"axes", std::vector<int64_t>{d}}, {"keepdims", attr_i(op, "keepdim")}}));
}

void map_logsumexp(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const auto axes = reduced_axes(x, attr_ints(op, "dims"), "logsumexp");
  b.bind(out(op), b.node("ReduceLogSumExp", {b.value(x)},
                         {{"axes", axes}, {"keepdims", attr_i(op, "keepdim")}}));
}

// norm: ReduceL1 / ReduceL2, the max of |x| for p = inf, (sum |x|^p)^(1/p) otherwise.
void map_norm(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const double p = attr_f(op, "p");
  const auto axes = reduced_axes(x, attr_ints(op, "dims"), "norm");
  const std::vector<GraphAttr> attrs{{"axes", axes}, {"keepdims", attr_i(op, "keepdim")}};
  const std::string xv = b.value(x);
  std::string r;
  if (p == 1.0) {
    r = b.node("ReduceL1", {xv}, attrs);
  } else if (p == 2.0) {
    r = b.node("ReduceL2", {xv}, attrs);
  } else if (std::isinf(p)) {
    r = b.node("ReduceMax", {b.node("Abs", {xv})}, attrs);
  } else {
    const std::string s =
        b.node("ReduceSum",
               {b.node("Pow", {b.node("Abs", {xv}), b.scalar(p, x.dtype())}), b.const_i64(axes)},
               {{"keepdims", attr_i(op, "keepdim")}});
    r = b.node("Pow", {s, b.scalar(1.0 / p, x.dtype())});
  }
  b.bind(out(op), r);
}

void map_gather(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  b.bind(out(op), b.node("GatherElements", {b.value(x), b.value(in(op, 1))},
                         {{"axis", wrap_dim(attr_i(op, "dim"), x.dim(), "gather")}}));
}

void map_scatter_add(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const DType dt = out(op).dtype();
  b.bind(out(op), b.node("ScatterElements",
                         {b.cast(b.value(x), x.dtype(), dt), b.value(in(op, 1)),
                          b.cast(b.value(in(op, 2)), in(op, 2).dtype(), dt)},
                         {{"axis", wrap_dim(attr_i(op, "dim"), x.dim(), "scatter_add")},
                          {"reduction", "add"}}));
}

// index_add(x, dim, index, src, alpha): ScatterElements with reduction add, the 1-d index
// reshaped to lie along `dim` and expanded to src's shape at run time (so that it holds for
// any size of src's other dims).
void map_index_add(Builder& b, const TracedOp& op) {
  const Tensor &x = in(op, 0), &index = in(op, 1), &src = in(op, 2);
  const int64_t d = wrap_dim(attr_i(op, "dim"), x.dim(), "index_add");
  const double alpha = attr_f(op, "alpha");
  std::string sv = b.value(src);
  if (alpha != 1.0) sv = b.node("Mul", {sv, b.scalar(alpha, src.dtype())});
  std::vector<int64_t> along(static_cast<size_t>(src.dim()), 1);
  along[static_cast<size_t>(d)] = -1;
  std::string iv = b.cast(b.value(index), index.dtype(), DType::i64);
  iv = b.node("Reshape", {iv, b.const_i64(along)});
  iv = b.node("Expand", {iv, b.node("Shape", {sv})});
  b.bind(out(op),
         b.node("ScatterElements", {b.value(x), iv, sv}, {{"axis", d}, {"reduction", "add"}}));
}

// repeat: Tile, after Unsqueeze of the leading size-1 dims that extra repeat counts add.
void map_repeat(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const std::vector<int64_t> reps = attr_ints(op, "repeats");
  std::string xv = b.value(x);
  const auto lead = static_cast<int64_t>(reps.size()) - x.dim();
  if (lead > 0) {
    std::vector<int64_t> axes(static_cast<size_t>(lead));
    for (int64_t i = 0; i < lead; ++i) axes[static_cast<size_t>(i)] = i;
    xv = b.node("Unsqueeze", {xv, b.const_i64(axes)});
  }
  b.bind(out(op), b.node("Tile", {xv, b.const_i64(reps)}));
}

// roll: per rolled dim, the last s elements then the first n - s (Slice, Concat), s = shift
// mod n with n the dim's (fixed) size; without dims, the flattened tensor rolled and reshaped.
void map_roll(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const std::vector<int64_t> shifts = attr_ints(op, "shifts");
  std::vector<int64_t> dims = attr_ints(op, "dims");
  const std::string xv = b.value(x);
  std::string y = xv;
  std::vector<int64_t> sizes;
  if (dims.empty()) {
    int64_t n = 1;
    for (int64_t d = 0; d < x.dim(); ++d)
      n *= fixed_size(b, op, x, d, "a dim of the flattened input");
    y = b.node("Reshape", {xv, b.const_i64({-1})});
    dims = {0};
    sizes = {n};
  } else {
    for (int64_t d : dims) sizes.push_back(fixed_size(b, op, x, d, "a rolled dim"));
  }
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t n = sizes[i];
    if (n == 0) continue;
    const int64_t sh = ((shifts[i] % n) + n) % n;
    if (sh == 0) continue;
    const std::string axis = b.const_i64({dims[i]});
    const std::string tail = b.node("Slice", {y, b.const_i64({n - sh}), b.const_i64({n}), axis});
    const std::string head = b.node("Slice", {y, b.const_i64({0}), b.const_i64({n - sh}), axis});
    y = b.node("Concat", {tail, head}, {{"axis", dims[i]}});
  }
  if (attr_ints(op, "dims").empty()) y = b.node("Reshape", {y, b.node("Shape", {xv})});
  b.bind(out(op), b.node("Identity", {y}));
}

// sort, argsort and topk: TopK, whose ties come out lower index first (ONNX's rule since opset
// 11), as dltrain's stable sort and topk order them. sort's k is the dim's size, read with
// Shape at run time.
void map_topk(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const std::string xv = b.value(x);
  if (x.dim() == 0) {  // one element: itself, index 0
    if (op.op == "argsort") {
      b.bind(out(op), b.scalar(0, DType::i64));
      return;
    }
    b.bind(out(op, 0), b.node("Identity", {xv}));
    b.bind(out(op, 1), b.scalar(0, DType::i64));
    return;
  }
  const int64_t d = wrap_dim(attr_i(op, "dim"), x.dim(), op.op.c_str());
  std::string k;
  int64_t largest = 0;
  if (op.op == "topk") {
    k = b.const_i64({attr_i(op, "k")});
    largest = attr_i(op, "largest");
  } else {
    k = b.node("Gather", {b.node("Shape", {xv}), b.const_i64({d})}, {{"axis", 0}});
    largest = attr_i(op, "descending");
  }
  const auto outs =
      b.node_outputs("TopK", {xv, k}, {{"axis", d}, {"largest", largest}, {"sorted", 1}}, 2);
  if (op.op == "argsort") {
    b.bind(out(op), outs[1]);
    return;
  }
  b.bind(out(op, 0), outs[0]);
  b.bind(out(op, 1), outs[1]);
}

// zeros_like, ones_like, full_like: the value broadcast to the input's shape at run time.
void map_full_like(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  b.bind(out(op), b.node("Expand", {b.scalar(attr_f(op, "value"), out(op).dtype()),
                                    b.node("Shape", {b.value(x)})}));
}

// instance_norm with the input's statistics is InstanceNormalization (scale and bias are
// required there: ones and zeros without affine parameters); with running statistics it is
// BatchNormalization.
void map_instance_norm(Builder& b, const TracedOp& op) {
  const Tensor& x = in(op, 0);
  const int64_t C = fixed_size(b, op, x, 1, "the channels");
  const TensorOptions o(x.dtype());
  const std::string scale = in(op, 3).defined() ? b.value(in(op, 3)) : b.value(ones({C}, o));
  const std::string bias = in(op, 4).defined() ? b.value(in(op, 4)) : b.value(zeros({C}, o));
  const double eps = attr_f(op, "eps");
  if (attr_i(op, "use_input_stats")) {
    b.bind(out(op), b.node("InstanceNormalization", {b.value(x), scale, bias}, {{"epsilon", eps}}));
    return;
  }
  b.bind(out(op), b.node("BatchNormalization",
                         {b.value(x), scale, bias, b.value(in(op, 1)), b.value(in(op, 2))},
                         {{"epsilon", eps}}));
}

// nn::LSTM and nn::GRU as ONNX's LSTM and GRU operators, one node per layer (ONNX's take one
// layer, forward or bidirectional). The traced op's inputs: x, h0 (and c0 for LSTM), each
// undefined when not given, then w_ih, w_hh, b_ih, b_hh per layer and direction. ONNX's gate
// order is i, o, f, c for LSTM (PyTorch: i, f, g, o) and z, r, h for GRU (PyTorch: r, z, n), so
// W, R and B are built in the graph from the parameters (initializers under their state-dict
// names) by Slice and Concat, which ONNX Runtime folds once at load. PyTorch's GRU applies the
// reset gate after the hidden projection: linear_before_reset = 1. Y [T, D, N, H] becomes the
// next layer's [T, N, D*H] by Transpose and Reshape; the final states of the layers are
// concatenated in PyTorch's [L*D, N, H] order. No zero state is built: ONNX's initial state
// defaults to zeros, so the graph fits any batch size and sequence length.
void map_rnn(Builder& b, const TracedOp& op) {
  const bool lstm = op.op == "lstm";
  const size_t head = lstm ? 3 : 2;
  const Tensor& x = in(op, 0);
  const int64_t H = attr_i(op, "hidden_size"), L = attr_i(op, "num_layers");
  const int64_t D = attr_i(op, "bidirectional") ? 2 : 1;
  const bool batched = x.dim() == 3, batch_first = attr_i(op, "batch_first") != 0;
  // PyTorch's gate blocks in ONNX's order.
  const std::vector<int64_t> order =
      lstm ? std::vector<int64_t>{0, 3, 1, 2} : std::vector<int64_t>{1, 0, 2};
  const std::string axis0 = b.const_i64({0}), axis1 = b.const_i64({1});
  auto reordered = [&](const Tensor& w) {
    const std::string v = b.value(w);
    std::vector<std::string> blocks;
    for (int64_t g : order)
      blocks.push_back(
          b.node("Slice", {v, b.const_i64({g * H}), b.const_i64({(g + 1) * H}), axis0}));
    return b.node("Concat", blocks, {{"axis", 0}});
  };
  auto per_direction = [&](std::vector<std::string> v) {  // [D, ...] from D tensors
    for (auto& s : v) s = b.node("Unsqueeze", {s, axis0});
    return v.size() == 1 ? v[0] : b.node("Concat", v, {{"axis", 0}});
  };
  auto state = [&](const Tensor& s) {  // [L*D, N, H] (or [L*D, H] unbatched), or ""
    if (!s.defined()) return std::string();
    const std::string v = b.value(s);
    return batched ? v : b.node("Unsqueeze", {v, axis1});
  };

  std::string y = b.value(x);
  if (!batched)
    y = b.node("Unsqueeze", {y, axis1});  // [T, 1, in]
  else if (batch_first)
    y = b.node("Transpose", {y}, {{"perm", std::vector<int64_t>{1, 0, 2}}});
  const std::string h0 = state(in(op, 1)), c0 = lstm ? state(in(op, 2)) : std::string();
  std::vector<std::string> hn, cn;
  for (int64_t k = 0; k < L; ++k) {
    std::vector<std::string> W, R, B;
    for (int64_t d = 0; d < D; ++d) {
      const size_t w = head + 4 * static_cast<size_t>(k * D + d);
      W.push_back(reordered(in(op, w)));
      R.push_back(reordered(in(op, w + 1)));
      if (in(op, w + 2).defined())
        B.push_back(
            b.node("Concat", {reordered(in(op, w + 2)), reordered(in(op, w + 3))}, {{"axis", 0}}));
    }
    auto layer_state = [&](const std::string& s) {  // rows k*D .. k*D + D - 1
      return s.empty()
                 ? s
                 : b.node("Slice", {s, b.const_i64({k * D}), b.const_i64({(k + 1) * D}), axis0});
    };
    std::vector<std::string> ins{
        y,  per_direction(W), per_direction(R), B.empty() ? "" : per_direction(B),
        "", layer_state(h0)};
    if (lstm) ins.push_back(layer_state(c0));
    while (ins.back().empty()) ins.pop_back();
    std::vector<GraphAttr> attrs{{"hidden_size", H},
                                 {"direction", D == 2 ? "bidirectional" : "forward"}};
    if (!lstm) attrs.emplace_back("linear_before_reset", int64_t{1});
    const auto outs = b.node_outputs(lstm ? "LSTM" : "GRU", ins, attrs, lstm ? 3 : 2);
    y = b.node("Transpose", {outs[0]}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
    y = b.node("Reshape", {y, b.const_i64({0, 0, -1})});  // [T, N, D*H]
    hn.push_back(outs[1]);
    if (lstm) cn.push_back(outs[2]);
  }
  auto final_state = [&](const std::vector<std::string>& v) {
    const std::string s = v.size() == 1 ? v[0] : b.node("Concat", v, {{"axis", 0}});
    return batched ? s : b.node("Squeeze", {s, axis1});
  };
  if (!batched)
    y = b.node("Squeeze", {y, axis1});
  else if (batch_first)
    y = b.node("Transpose", {y}, {{"perm", std::vector<int64_t>{1, 0, 2}}});
  b.bind(out(op, 0), y);
  b.bind(out(op, 1), final_state(hn));
  if (lstm) b.bind(out(op, 2), final_state(cn));
}

// What the mappings cannot express, checked as each op is recorded (inside the op, so that a
// module called as m(x) adds its path to the error).
void check_traced(const TracedOp& op) {
  if (op.op == "batch_norm") {
    DLTRAIN_CHECK(!attr_i(op, "training") && in(op, 3).defined() && in(op, 4).defined(),
                  "export_onnx: batch_norm with batch statistics (training mode, or a BatchNorm "
                  "without running statistics, track_running_stats = false) cannot be exported: "
                  "ONNX's BatchNormalization normalises with running statistics; export the "
                  "model in eval mode with running statistics");
  } else if (op.op == "dropout") {
    DLTRAIN_CHECK(!attr_i(op, "training") || attr_f(op, "p") == 0.0,
                  "export_onnx: dropout in training mode (p = ", attr_f(op, "p"),
                  ") cannot be exported; call it with training = is_training(), as nn::Dropout "
                  "does, so that the exported eval-mode forward skips it");
  }
  if ((op.op == "max_pool2d" || op.op == "avg_pool2d" || op.op == "adaptive_avg_pool2d") &&
      in(op, 0).dim() != 4) {
    // ONNX's pools read [C, H, W] as a batch of 1-d signals.
    DLTRAIN_FAIL("export_onnx: ", op.op, " on a ", in(op, 0).dim(), "-d input (shape ",
                 shape_str(in(op, 0).shape()),
                 ") cannot be exported: ONNX pools [N, C, H, W]; add the batch dim with "
                 "unsqueeze(0) before the pool");
  }
  if (op.op == "norm" && attr_f(op, "p") == 0.0)
    DLTRAIN_FAIL(
        "export_onnx: norm with p = 0 (the count of non-zeros) has no ONNX mapping; "
        "compute it outside the exported forward");
  if ((op.op == "pixel_shuffle" || op.op == "pixel_unshuffle") && in(op, 0).dim() != 4) {
    DLTRAIN_FAIL("export_onnx: ", op.op, " on a ", in(op, 0).dim(), "-d input (shape ",
                 shape_str(in(op, 0).shape()),
                 ") cannot be exported: ONNX's DepthToSpace takes [N, C, H, W]; fold the extra "
                 "dims into the batch with reshape before it");
  }
  if (op.op == "adaptive_avg_pool2d") {
    const int64_t H = in(op, 0).size(-2), W = in(op, 0).size(-1);
    const int64_t Ho = out(op).size(-2), Wo = out(op).size(-1);
    DLTRAIN_CHECK((Ho == 1 && Wo == 1) || (H % Ho == 0 && W % Wo == 0),
                  "export_onnx: adaptive_avg_pool2d from ", H, "x", W, " to ", Ho, "x", Wo,
                  " has windows of different sizes, which no ONNX operator computes; export "
                  "with an input size that is a multiple of the output size");
  }
}

const std::map<std::string, Mapping, std::less<>>& mappings() {
  static const std::map<std::string, Mapping, std::less<>> m = {
      {"conv2d", map_conv},
      {"conv_transpose2d", map_conv_transpose},
      {"linear", map_linear},
      {"mm", map_matmul},
      {"bmm", map_matmul},
      {"matmul", map_matmul},
      {"batch_norm", map_batch_norm},
      {"layer_norm", map_layer_norm},
      {"group_norm", map_group_norm},
      {"add", map_add_sub},
      {"sub", map_add_sub},
      {"mul", map_binary},
      {"div", map_binary},
      {"neg", [](Builder& b, const TracedOp& op) { unary(b, op, "Neg"); }},
      {"exp", [](Builder& b, const TracedOp& op) { unary(b, op, "Exp"); }},
      {"log", [](Builder& b, const TracedOp& op) { unary(b, op, "Log"); }},
      {"sqrt", [](Builder& b, const TracedOp& op) { unary(b, op, "Sqrt"); }},
      {"abs", [](Builder& b, const TracedOp& op) { unary(b, op, "Abs"); }},
      {"relu", [](Builder& b, const TracedOp& op) { unary(b, op, "Relu"); }},
      {"relu_", [](Builder& b, const TracedOp& op) { unary(b, op, "Relu"); }},
      {"sigmoid", [](Builder& b, const TracedOp& op) { unary(b, op, "Sigmoid"); }},
      {"tanh", [](Builder& b, const TracedOp& op) { unary(b, op, "Tanh"); }},
      {"leaky_relu", map_leaky_relu},
      {"silu", map_silu},
      {"gelu", map_gelu},
      {"max_pool2d", map_max_pool},
      {"avg_pool2d", map_avg_pool},
      {"adaptive_avg_pool2d", map_adaptive_avg_pool},
      {"softmax", map_softmax},
      {"log_softmax", map_softmax},
      {"dropout", map_dropout},
      {"view", map_reshape},
      {"reshape", map_reshape},
      {"squeeze", map_reshape},
      {"unsqueeze", map_reshape},
      {"flatten", map_reshape},
      {"permute", map_permute},
      {"transpose", map_permute},
      {"t", map_permute},
      {"expand", map_expand},
      {"cat", map_cat},
      {"clone", map_copy},
      {"contiguous", map_copy},
      {"to", map_copy},
      {"interpolate", map_interpolate},
      {"sum", map_reduce},
      {"mean", map_reduce},
      {"sin", [](Builder& b, const TracedOp& op) { unary(b, op, "Sin"); }},
      {"cos", [](Builder& b, const TracedOp& op) { unary(b, op, "Cos"); }},
      {"sign", [](Builder& b, const TracedOp& op) { unary(b, op, "Sign"); }},
      {"hardswish", [](Builder& b, const TracedOp& op) { unary(b, op, "HardSwish"); }},
      {"rsqrt", map_rsqrt},
      {"softplus", map_softplus},
      {"elu", map_elu},
      {"mish", map_mish},
      {"pow", map_pow},
      {"clamp", map_clamp},
      {"maximum", map_extremum},
      {"minimum", map_extremum},
      {"eq", map_compare},
      {"ne", map_compare},
      {"lt", map_compare},
      {"le", map_compare},
      {"gt", map_compare},
      {"ge", map_compare},
      {"where", map_where},
      {"masked_fill", map_masked_fill},
      {"slice", map_slice},
      {"narrow", map_slice},
      {"select", map_select},
      {"split", map_split},
      {"chunk", map_split},
      {"stack", map_stack},
      {"flip", map_flip},
      {"pad", map_pad},
      {"pixel_shuffle", map_pixel_shuffle},
      {"pixel_unshuffle", map_pixel_shuffle},
      {"embedding", map_embedding},
      {"index_select", map_index_select},
      {"conv1d", map_conv1d},
      {"var", map_var},
      {"max", map_extreme},
      {"min", map_extreme},
      {"argmax", map_extreme},
      {"argmin", map_extreme},
      {"cumsum", map_cumsum},
      {"prod", map_prod},
      {"logsumexp", map_logsumexp},
      {"norm", map_norm},
      {"gather", map_gather},
      {"scatter_add", map_scatter_add},
      {"instance_norm", map_instance_norm},
      {"index_add", map_index_add},
      {"repeat", map_repeat},
      {"roll", map_roll},
      {"sort", map_topk},
      {"argsort", map_topk},
      {"topk", map_topk},
      {"full_like", map_full_like},
      {"lstm", map_rnn},
      {"gru", map_rnn},
  };
  return m;
}

// --- export --------------------------------------------------------------------------------

std::vector<std::string> names_or(const std::vector<std::string>& given, size_t n, const char* base,
                                  const char* what) {
  if (!given.empty()) {
    DLTRAIN_CHECK(given.size() == n, "export_onnx: ", given.size(), " ", what, " names given for ",
                  n, " ", what, "s; give one name per ", what, " or none");
    return given;
  }
  if (n == 1) return {base};
  std::vector<std::string> v;
  for (size_t i = 0; i < n; ++i) v.push_back(std::string(base) + "_" + std::to_string(i));
  return v;
}

// Restores every module's training flag (export_onnx runs the forward in eval mode).
class EvalScope {
 public:
  explicit EvalScope(nn::Module* m) {
    if (!m) return;
    for (const auto& nm : m->named_modules())
      modes_.emplace_back(nm.second, nm.second->is_training());
    m->eval();
  }
  ~EvalScope() {
    for (auto& [module, training] : modes_) module->train(training);  // pre-order: parents first
  }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  std::vector<std::pair<std::shared_ptr<nn::Module>, bool>> modes_;
};

struct Trace {
  std::vector<TracedOp> ops;
  std::vector<Tensor> outputs;
};

// One traced forward (eval mode and no gradients are the caller's).
Trace run_trace(const OnnxForward& forward, const std::vector<Tensor>& inputs,
                const std::vector<Tensor>& weights) {
  std::vector<Tensor> known = inputs;
  known.insert(known.end(), weights.begin(), weights.end());
  Trace t;
  // Exported through the ops they call: attention is matmul, scale, mask, softmax and matmul
  // (ONNX's Attention operator is opset 23).
  auto composite = [](std::string_view name) { return name == "scaled_dot_product_attention"; };
  dltrain::detail::GraphTracer tracer(
      [](std::string_view name) { return mappings().count(name) > 0; }, check_traced, known,
      composite);
  t.outputs = forward(inputs);
  DLTRAIN_CHECK(tracer.failure().empty(), tracer.failure());
  t.ops = tracer.ops();
  return t;
}

// Each input's dynamic axes, dim -> symbolic name: dim 0 "batch" with dynamic_batch, then the
// dims dynamic_axes names for it. A name is one size (the examples must agree on it).
using Axes = std::vector<std::map<int64_t, std::string>>;
Axes input_axes(const OnnxExportOptions& opt, const std::vector<Tensor>& inputs,
                const std::vector<std::string>& names) {
  Axes axes(inputs.size());
  for (size_t i = 0; i < inputs.size() && opt.dynamic_batch; ++i) axes[i][0] = "batch";
  for (const auto& [name, dims] : opt.dynamic_axes) {
    auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) continue;  // an output's name (checked after the trace)
    const auto i = static_cast<size_t>(it - names.begin());
    const Tensor& x = inputs[i];
    for (const auto& [d, sym] : dims) {
      const int64_t w = d < 0 ? d + x.dim() : d;
      DLTRAIN_CHECK(w >= 0 && w < x.dim(), "export_onnx: dynamic_axes names dim ", d, " of input '",
                    name, "', whose example has shape ", shape_str(x.shape()));
      DLTRAIN_CHECK(!sym.empty(), "export_onnx: dynamic_axes gives dim ", d, " of input '", name,
                    "' an empty name; name it (\"batch\", \"sequence\", ...)");
      DLTRAIN_CHECK(x.size(w) >= 1, "export_onnx: dim ", d, " of input '", name,
                    "' is dynamic but has size 0 in the example; give an example of size >= 1");
      axes[i][w] = sym;
    }
  }
  std::map<std::string, std::pair<int64_t, std::string>> size_of;  // name -> size, where
  for (size_t i = 0; i < inputs.size(); ++i)
    for (const auto& [d, sym] : axes[i]) {
      const std::string where = "dim " + std::to_string(d) + " of input '" + names[i] + "'";
      auto [it, fresh] = size_of.try_emplace(sym, inputs[i].size(d), where);
      DLTRAIN_CHECK(it->second.first == inputs[i].size(d), "export_onnx: the dynamic axis '", sym,
                    "' has size ", it->second.first, " at ", it->second.second, " but ",
                    inputs[i].size(d), " at ", where, "; give example inputs that agree on it");
    }
  return axes;
}

// How each dynamic axis grows in the second trace: name -> (example size, factor), the factors
// 2, 3, 4, ... in the order the names first appear. A whole multiple keeps every divisibility
// of the example (a U-Net's pooled and upsampled sizes still meet), and distinct factors give
// every axis its own (size, size in the second trace) pair, by which the dims of the graph
// that follow it are recognised: a dim of (n, k n) follows the axis of size n and factor k.
struct Growth {
  int64_t size, factor;
};
std::map<std::string, Growth> axis_growth(const std::vector<Tensor>& inputs, const Axes& axes) {
  std::map<std::string, Growth> g;
  int64_t next = 2;
  for (size_t i = 0; i < inputs.size(); ++i)
    for (const auto& [d, sym] : axes[i])
      if (g.try_emplace(sym, Growth{inputs[i].size(d), next}).second) ++next;
  return g;
}

// The example inputs with other values and every dynamic axis grown by its factor (the example
// repeated along it), for the second trace. Integer inputs (indices) keep their values.
std::vector<Tensor> other_inputs(const std::vector<Tensor>& inputs, const Axes& axes,
                                 const std::map<std::string, Growth>& growth) {
  Generator gen(0x0dd5eed);  // its own stream: the caller's random state is not touched
  std::vector<Tensor> v;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor x = inputs[i].detach();
    for (const auto& [d, sym] : axes[i])
      x = cat(std::vector<Tensor>(static_cast<size_t>(growth.at(sym).factor), x), d);
    if (is_floating(x.dtype()))
      x = add(mul(x, -0.5),
              randn(x.shape(), TensorOptions(x.dtype()).with_device(x.device()), &gen));
    else
      x = x.clone();
    v.push_back(x);
  }
  return v;
}

// Where each tensor an op reads comes from, in one trace: "input 0", "weight fc.bias",
// "output 1 of op 7", or "" (a constant).
class Sources {
 public:
  Sources(const Trace& t, const std::vector<Tensor>& inputs, const nn::NamedTensors& weights) {
    for (size_t i = 0; i < inputs.size(); ++i) add(inputs[i], "input " + std::to_string(i));
    for (const auto& w : weights) add(w.second, "weight " + w.first);
    for (size_t k = 0; k < t.ops.size(); ++k) {
      for (const Tensor& x : t.ops[k].inputs) desc_.push_back(of(x));
      for (size_t n = 0; n < t.ops[k].outputs.size(); ++n)
        add(t.ops[k].outputs[n], "output " + std::to_string(n) + " of op " + std::to_string(k) +
                                     " (" + t.ops[k].op + ")");
    }
  }
  /// The sources of every op input, in trace order.
  const std::vector<std::string>& inputs_desc() const { return desc_; }

 private:
  void add(const Tensor& t, std::string what) {
    if (t.defined()) where_[t.impl().get()] = std::move(what);
  }
  std::string of(const Tensor& t) const {
    if (!t.defined()) return "absent";
    auto it = where_.find(t.impl().get());
    return it == where_.end() ? "" : it->second;
  }
  std::unordered_map<const TensorImpl*, std::string> where_;
  std::vector<std::string> desc_;
};

std::string shape_text(const Tensor& t) { return t.defined() ? shape_str(t.shape()) : "none"; }

// Equal shapes; with dynamic axes, equal ranks (the dims that differ are the ones that vary).
bool same_shape(const Tensor& a, const Tensor& b, bool dynamic) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  return dynamic ? a.dim() == b.dim() : a.shape() == b.shape();
}

bool same_attrs(const TracedOp& a, const TracedOp& b) {
  if (a.attrs.size() != b.attrs.size()) return false;
  for (size_t i = 0; i < a.attrs.size(); ++i)
    if (a.attrs[i].name != b.attrs[i].name || a.attrs[i].value != b.attrs[i].value) return false;
  return true;
}

// The forward's graph must not depend on the input's values (nor on the dynamic sizes, but for
// the dims that follow them): the second trace, on other values (and every dynamic size
// multiplied by its factor), must run the same ops with the same attributes on the same
// sources, with the same constants. Records in `bld` the second trace's shape of every tensor
// of the first.
void compare_traces(const Trace& a, const Trace& b, const std::vector<Tensor>& in_a,
                    const std::vector<Tensor>& in_b, const nn::NamedTensors& weights,
                    const std::string& sizes_text, Builder& bld) {
  const bool dynamic = !sizes_text.empty();
  const std::string inputs_text =
      dynamic ? "two inputs with other values and the dynamic sizes " + sizes_text
              : "two inputs with other values";
  const char* fix =
      ": the exported graph would be wrong for some inputs. Make the forward's ops independent "
      "of the input's values (no branch on item() or on values read from the tensor)";
  const char* batch_fix =
      !dynamic ? ""
               : ", and of the dynamic sizes (an op's attribute or a tensor computed from "
                 "x.size(d), a slice or split of a dynamic dim, are fixed to the example's "
                 "size), or export with that dim fixed";
  for (size_t i = 0; i < in_a.size(); ++i) bld.set_other_shape(in_a[i], in_b[i].shape());
  const size_t n = std::min(a.ops.size(), b.ops.size());
  const Sources sa(a, in_a, weights), sb(b, in_b, weights);
  size_t j = 0;  // index into the flat input-source lists
  for (size_t k = 0; k < n; ++k) {
    const TracedOp &x = a.ops[k], &y = b.ops[k];
    DLTRAIN_CHECK(x.op == y.op && x.inputs.size() == y.inputs.size() && same_attrs(x, y),
                  "export_onnx: the forward ran different ops for ", inputs_text, " (op ", k, ": '",
                  x.op, "' then '", y.op, "', or other attributes)", fix, batch_fix);
    for (size_t i = 0; i < x.inputs.size(); ++i, ++j) {
      const std::string& wa = sa.inputs_desc()[j];
      const std::string& wb = sb.inputs_desc()[j];
      DLTRAIN_CHECK(wa == wb, "export_onnx: op ", k, " ('", x.op, "') read ",
                    wa.empty() ? "a constant" : wa, " for one input and ",
                    wb.empty() ? "a constant" : wb, " for the other, for ", inputs_text, fix,
                    batch_fix);
      const Tensor &ta = x.inputs[i], &tb = y.inputs[i];
      DLTRAIN_CHECK(same_shape(ta, tb, dynamic), "export_onnx: input ", i, " of op ", k, " ('",
                    x.op, "') has shape ", shape_text(ta), " and ", shape_text(tb), " for ",
                    inputs_text, fix, batch_fix);
      if (ta.defined()) bld.set_other_shape(ta, tb.shape());
      if (wa.empty() && ta.defined()) {  // a constant: the same values both times
        const Tensor ca = ta.detach().to(Device::cpu()).contiguous();
        const Tensor cb = tb.detach().to(Device::cpu()).contiguous();
        DLTRAIN_CHECK(ca.dtype() == cb.dtype() && ca.shape() == cb.shape() &&
                          std::memcmp(ca.data_ptr(), cb.data_ptr(),
                                      static_cast<size_t>(ca.numel()) * ca.element_size()) == 0,
                      "export_onnx: input ", i, " of op ", k, " ('", x.op,
                      "') is a constant built in the forward whose value or shape differs for ",
                      inputs_text, " (it was computed from the input outside the traced ops)", fix,
                      batch_fix);
      }
    }
    for (size_t o = 0; o < std::min(x.outputs.size(), y.outputs.size()); ++o) {
      DLTRAIN_CHECK(same_shape(x.outputs[o], y.outputs[o], dynamic), "export_onnx: op ", k, " ('",
                    x.op, "') gives shape ", shape_text(x.outputs[o]), " and ",
                    shape_text(y.outputs[o]), " for ", inputs_text, fix, batch_fix);
      if (x.outputs[o].defined()) bld.set_other_shape(x.outputs[o], y.outputs[o].shape());
    }
  }
  DLTRAIN_CHECK(a.ops.size() == b.ops.size(), "export_onnx: the forward ran ", a.ops.size(),
                " ops for one input and ", b.ops.size(), " for the other, for ", inputs_text, fix,
                batch_fix);
}

// The symbolic names of an output's dims: those that differ in the second trace vary, and are
// named as dynamic_axes names them for this output, else after the input axis whose sizes
// (n, k n) they have, else "<output>_dim<d>"; the others are fixed.
std::vector<std::string> output_dims(const OnnxExportOptions& opt, const std::string& name,
                                     const Tensor& y, const Tensor& y2,
                                     const std::map<std::string, Growth>& growth) {
  std::vector<std::string> dims(static_cast<size_t>(y.dim()));
  const auto given = opt.dynamic_axes.find(name);
  if (given != opt.dynamic_axes.end())
    for (const auto& [gd, sym] : given->second)
      DLTRAIN_CHECK(gd >= -y.dim() && gd < y.dim(), "export_onnx: dynamic_axes names dim ", gd,
                    " of output '", name, "', which has shape ", shape_str(y.shape()));
  for (int64_t d = 0; d < y.dim(); ++d) {
    const bool varies = y2.defined() && y2.size(d) != y.size(d);
    const std::string* named = nullptr;
    if (given != opt.dynamic_axes.end())
      for (const auto& [gd, sym] : given->second)
        if ((gd < 0 ? gd + y.dim() : gd) == d) named = &sym;
    if (named) {
      DLTRAIN_CHECK(varies, "export_onnx: dynamic_axes names dim ", d, " of output '", name, "' ('",
                    *named, "'), but its size (", y.size(d),
                    ") does not change with the inputs' dynamic axes");
      dims[static_cast<size_t>(d)] = *named;
      continue;
    }
    if (!varies) continue;
    std::string sym = name + "_dim" + std::to_string(d);
    for (const auto& [s, g] : growth)
      if (g.size == y.size(d) && g.size * g.factor == y2.size(d)) sym = s;
    dims[static_cast<size_t>(d)] = sym;
  }
  return dims;
}

void export_impl(nn::Module* model, const OnnxForward& forward, const std::vector<Tensor>& inputs,
                 const std::string& path, const OnnxExportOptions& opt) {
  DLTRAIN_CHECK(detail::onnx_writer_available(),
                "export_onnx: this dltrain was built without ONNX support, which needs protobuf "
                "and ONNX's onnx.proto; install libprotobuf-dev protobuf-compiler libonnx-dev "
                "(Debian) and reconfigure with -DDLTRAIN_PROTOBUF=ON");
  DLTRAIN_CHECK(opt.opset == 17, "export_onnx: opset ", opt.opset,
                " is not supported; this version writes opset 17 (OnnxExportOptions::opset)");
  DLTRAIN_CHECK(!inputs.empty(), "export_onnx: give at least one example input");
  DLTRAIN_CHECK(!path.empty(), "export_onnx: empty output path");
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  DLTRAIN_CHECK(parent.empty() || std::filesystem::is_directory(parent),
                "export_onnx: cannot write ", path, ": the folder ", parent.string(),
                " does not exist; create it first");
  for (size_t i = 0; i < inputs.size(); ++i) {
    DLTRAIN_CHECK(inputs[i].defined(), "export_onnx: example input ", i, " is undefined");
    for (size_t j = 0; j < i; ++j)
      DLTRAIN_CHECK(inputs[i].impl() != inputs[j].impl(), "export_onnx: example inputs ", j,
                    " and ", i, " are the same tensor; pass distinct tensors (clone one)");
    DLTRAIN_CHECK(!opt.dynamic_batch || inputs[i].dim() >= 1,
                  "export_onnx: dynamic_batch needs "
                  "inputs with a batch dim, but example input ",
                  i, " is 0-d");
  }
  const auto input_names = names_or(opt.input_names, inputs.size(), "input", "input");
  const Axes axes = input_axes(opt, inputs, input_names);
  const std::map<std::string, Growth> growth = axis_growth(inputs, axes);
  const bool dynamic = !growth.empty();

  OnnxModel m;
  m.graph_name = opt.graph_name;
  m.opset = opt.opset;
  Builder b(m);
  for (size_t i = 0; i < inputs.size(); ++i) {
    b.name_known(inputs[i], input_names[i], false);
    std::vector<std::string> dims(static_cast<size_t>(inputs[i].dim()));
    for (const auto& [d, sym] : axes[i]) dims[static_cast<size_t>(d)] = sym;
    m.inputs.push_back({input_names[i], inputs[i].dtype(), inputs[i].shape(), dims});
  }
  nn::NamedTensors weights;  // parameters, then buffers; a tensor registered twice: its first name
  std::vector<Tensor> weight_tensors;
  if (model) {
    std::set<const TensorImpl*> seen;
    for (const auto& named : {model->named_parameters(), model->named_buffers()})
      for (const auto& nt : named)
        if (nt.second.defined() && seen.insert(nt.second.impl().get()).second) {
          b.name_known(nt.second, nt.first, true);
          weights.push_back(nt);
          weight_tensors.push_back(nt.second);
        }
  }

  Trace trace, second;  // the second trace: other values, every dynamic size multiplied
  {
    EvalScope eval(model);
    autograd::NoGradGuard no_grad;
    trace = run_trace(forward, inputs, weight_tensors);
    if (opt.check_graph || dynamic) {
      std::string sizes_text;
      for (const auto& [sym, g] : growth) {
        if (!sizes_text.empty()) sizes_text += ", ";
        sizes_text +=
            sym + " " + std::to_string(g.size) + " and " + std::to_string(g.size * g.factor);
      }
      const std::vector<Tensor> other = other_inputs(inputs, axes, growth);
      second = run_trace(forward, other, weight_tensors);
      compare_traces(trace, second, inputs, other, weights, sizes_text, b);
    }
  }  // no tracer is left when the mapping runs ops of its own (constants' copies)
  const std::vector<TracedOp>& ops = trace.ops;
  const std::vector<Tensor>& outputs = trace.outputs;

  for (const TracedOp& op : ops) {
    auto it = mappings().find(op.op);
    DLTRAIN_CHECK(it != mappings().end(), "export_onnx: internal error: no mapping for ", op.op);
    b.set_bf16(std::any_of(op.outputs.begin(), op.outputs.end(), [](const Tensor& t) {
      return t.defined() && t.dtype() == DType::bf16;
    }));
    it->second(b, op);
  }
  b.set_bf16(false);

  DLTRAIN_CHECK(!outputs.empty(), "export_onnx: the forward returned no tensor");
  const auto output_names = names_or(opt.output_names, outputs.size(), "output", "output");
  for (const auto& [name, dims] : opt.dynamic_axes)
    DLTRAIN_CHECK(std::count(input_names.begin(), input_names.end(), name) +
                          std::count(output_names.begin(), output_names.end(), name) >
                      0,
                  "export_onnx: dynamic_axes names '", name,
                  "', which is neither an input nor an output name");
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& y = outputs[i];
    DLTRAIN_CHECK(y.defined(), "export_onnx: output ", i, " of the forward is undefined");
    std::string v = b.value(y);
    const bool named = std::find(output_names.begin(), output_names.begin() + i, v) !=
                       output_names.begin() + i;  // returned twice
    if (named || b.is_initializer_or_input(v)) {  // an Identity gives it its own name
      v = b.node("Identity", {v});
      b.bind(y, v);
    }
    b.rename(v, output_names[i]);
    m.outputs.push_back(
        {output_names[i], y.dtype(), y.shape(),
         output_dims(opt, output_names[i], y, dynamic ? second.outputs.at(i) : Tensor(), growth)});
  }
  detail::onnx_write(m, path);
}

}  // namespace

void export_onnx(nn::Module& model, const std::vector<Tensor>& example_inputs,
                 const std::string& path, const OnnxExportOptions& options) {
  DLTRAIN_CHECK(example_inputs.size() == 1, "export_onnx: model(x) takes one input but ",
                example_inputs.size(),
                " example inputs were given; pass a forward function for other signatures");
  export_impl(
      &model, [&model](const std::vector<Tensor>& x) { return std::vector<Tensor>{model(x[0])}; },
      example_inputs, path, options);
}

void export_onnx(nn::Module& model, const OnnxForward& forward,
                 const std::vector<Tensor>& example_inputs, const std::string& path,
                 const OnnxExportOptions& options) {
  export_impl(&model, forward, example_inputs, path, options);
}

void export_onnx(const OnnxForward& forward, const std::vector<Tensor>& example_inputs,
                 const std::string& path, const OnnxExportOptions& options) {
  export_impl(nullptr, forward, example_inputs, path, options);
}

bool onnx_supported() { return detail::onnx_writer_available(); }

}  // namespace dltrain::io
