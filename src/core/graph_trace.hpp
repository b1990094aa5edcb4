// Graph tracing hooks (internal header): how a forward pass run by io::export_onnx is recorded
// as a list of ops with their attributes, inputs and outputs.
//
// A detail::GraphTracer installed on a thread (RAII, by the exporter) sees every op scope that
// opens on that thread (detail::OpScope, trace.hpp). The outermost op scope of each public op
// call is the one recorded: an op that has a mapping (the tracer's `supported` predicate says
// so) hands its inputs and attributes to graph_record() at its entry point, which runs the op
// once more nested (inner scopes are not recorded) and appends one TracedOp with the outputs.
// An outermost op without a mapping that reads a traced value (a graph input, a parameter or
// buffer, an earlier op's output) raises dltrain::Error naming the op at its entry, so a
// module called as m(x) adds its path (nn::ModuleError).
//
// Cost with no tracer anywhere in the process: OpScope's constructor reads one relaxed atomic
// counter (g_graph_tracers) and takes a not-taken branch; graph_record's call sites test a bool
// member of their scope. Nothing is allocated. The tracer itself is a thread-local pointer so
// that other threads (data loaders, a model training beside the export) are not recorded; the
// global counter in front of it keeps the common case off the thread-local lookup, which in a
// shared library (-fPIC, general-dynamic TLS) is a call to __tls_get_addr.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "dltrain/core/tensor.hpp"

namespace dltrain::detail {

/// Number of GraphTracers installed on any thread (the fast-path gate).
inline std::atomic<int> g_graph_tracers{0};

/// One attribute of a traced op: an integer, a real, a list of integers or a string.
struct GraphAttr {
  std::string name;
  std::variant<int64_t, double, std::vector<int64_t>, std::string> value;
  GraphAttr(std::string n, int64_t v) : name(std::move(n)), value(v) {}
  GraphAttr(std::string n, int v) : name(std::move(n)), value(int64_t{v}) {}
  GraphAttr(std::string n, bool v) : name(std::move(n)), value(int64_t{v ? 1 : 0}) {}
  GraphAttr(std::string n, double v) : name(std::move(n)), value(v) {}
  GraphAttr(std::string n, std::vector<int64_t> v) : name(std::move(n)), value(std::move(v)) {}
  GraphAttr(std::string n, std::string v) : name(std::move(n)), value(std::move(v)) {}
  GraphAttr(std::string n, const char* v) : name(std::move(n)), value(std::string(v)) {}
};

/// One recorded op call: the name of its op scope ("conv2d", "add", "view", ...), its tensor
/// inputs (undefined for an absent optional input), attributes and outputs.
struct TracedOp {
  std::string op;
  std::vector<Tensor> inputs;
  std::vector<GraphAttr> attrs;
  std::vector<Tensor> outputs;
};

/// Records the ops that run on the thread that creates it, until it is destroyed.
class GraphTracer {
 public:
  /// `supported(op)`: whether an op scope name has a mapping (the exporter's table).
  /// `check(op)`: runs on each op as it is recorded, still inside the op (and so inside the
  /// module that called it): it throws for attributes the mapping cannot express.
  /// `known`: tensors that are graph values from the start (inputs, parameters, buffers).
  /// `composite(op)`: ops exported through their parts: their own scope is not recorded and the
  /// ops they call are (scaled_dot_product_attention: matmul, softmax, masked_fill, ...).
  /// Throws dltrain::Error when this thread already has a tracer.
  GraphTracer(std::function<bool(std::string_view)> supported,
              std::function<void(const TracedOp&)> check, const std::vector<Tensor>& known,
              std::function<bool(std::string_view)> composite = {});
  ~GraphTracer();
  GraphTracer(const GraphTracer&) = delete;
  GraphTracer& operator=(const GraphTracer&) = delete;

  const std::vector<TracedOp>& ops() const { return ops_; }
  /// A problem found where no exception could be thrown (an op scope that closed without
  /// recording); empty when none.
  const std::string& failure() const { return failure_; }
  /// True when `t` is a graph input, parameter/buffer or the output of a recorded op.
  bool is_known(const Tensor& t) const;

  // --- used by OpScope and graph_record (see the file comment) -----------------------------
  /// 0: not involved; 1: nested inside a recorded op (not recorded); 2: the outermost scope,
  /// whose op must call graph_record.
  uint8_t enter(std::string_view name, std::initializer_list<const Tensor*> inputs,
                bool inputs_listed);
  void exit(uint8_t how);
  void record(std::vector<Tensor> inputs, std::vector<GraphAttr> attrs,
              std::vector<Tensor> outputs);

 private:
  std::function<bool(std::string_view)> supported_;
  std::function<void(const TracedOp&)> check_;
  std::function<bool(std::string_view)> composite_;
  std::vector<TracedOp> ops_;
  std::vector<const TensorImpl*> known_;  // sorted
  std::vector<Tensor> keep_;              // keeps known tensors alive (no address reuse)
  std::string top_name_;                  // the outermost open scope's op name
  bool top_recorded_ = false;
  int depth_ = 0;
  std::string failure_;
};

/// This thread's tracer, or null.
GraphTracer* graph_tracer_here();

/// Called by OpScope (trace.hpp) when g_graph_tracers is non-zero.
uint8_t graph_scope_enter(std::string_view name, std::initializer_list<const Tensor*> inputs,
                          bool inputs_listed);
void graph_scope_exit(uint8_t how);

/// An (h, w) pair (Int2) as a list attribute.
template <class P>
std::vector<int64_t> graph_pair(const P& p) {
  return {p.h, p.w};
}

inline std::vector<Tensor> graph_outputs_of(const Tensor& t) { return {t}; }
inline std::vector<Tensor> graph_outputs_of(const std::pair<Tensor, Tensor>& p) {
  return {p.first, p.second};
}
inline std::vector<Tensor> graph_outputs_of(const std::vector<Tensor>& v) { return v; }

/// Runs `f` out of line: the call sites build their input and attribute lists inside `f`, so
/// that the op's own frame (its hot path) carries none of it.
template <class F>
[[gnu::noinline, gnu::cold]] auto graph_cold(F&& f) {
  return f();
}

/// At a mapped op's entry, when its scope says graph(): runs `body` (the same op call, now
/// nested) and records the op with `inputs`, `attrs` and the outputs body returns. Call it
/// inside graph_cold.
template <class F>
auto graph_record(std::vector<Tensor> inputs, std::vector<GraphAttr> attrs, F&& body) {
  auto out = body();
  graph_tracer_here()->record(std::move(inputs), std::move(attrs), graph_outputs_of(out));
  return out;
}

}  // namespace dltrain::detail
