// The graph tracer behind detail::OpScope's graph hook (see graph_trace.hpp).
//
// Tensors are identified by their TensorImpl: the tracer keeps a handle on every tensor it has
// seen as a graph value, so no address is reused while it records. An in-place op records its
// output as the same TensorImpl with a new value, which the exporter renames.
#include "src/core/graph_trace.hpp"

#include <algorithm>

#include "dltrain/core/error.hpp"

namespace dltrain::detail {

namespace {
constinit thread_local GraphTracer* t_tracer = nullptr;
}  // namespace

GraphTracer* graph_tracer_here() { return t_tracer; }

GraphTracer::GraphTracer(std::function<bool(std::string_view)> supported,
                         std::function<void(const TracedOp&)> check,
                         const std::vector<Tensor>& known,
                         std::function<bool(std::string_view)> composite)
    : supported_(std::move(supported)), check_(std::move(check)), composite_(std::move(composite)) {
  DLTRAIN_CHECK(t_tracer == nullptr,
                "graph trace: this thread is already tracing a forward pass (an export_onnx "
                "called from inside another one's forward); export the models one after the "
                "other");
  for (const Tensor& t : known)
    if (t.defined()) {
      known_.push_back(t.impl().get());
      keep_.push_back(t);
    }
  std::sort(known_.begin(), known_.end());
  t_tracer = this;
  g_graph_tracers.fetch_add(1, std::memory_order_relaxed);
}

GraphTracer::~GraphTracer() {
  t_tracer = nullptr;
  g_graph_tracers.fetch_sub(1, std::memory_order_relaxed);
}

bool GraphTracer::is_known(const Tensor& t) const {
  return t.defined() && std::binary_search(known_.begin(), known_.end(), t.impl().get());
}

uint8_t GraphTracer::enter(std::string_view name, std::initializer_list<const Tensor*> inputs,
                           bool inputs_listed) {
  if (depth_ > 0) {
    ++depth_;
    return 1;
  }
  // A composite at the top: not involved, so that the ops it calls are the outermost ones.
  if (composite_ && composite_(name)) return 0;
  if (!supported_(name)) {
    // An op computed from constants only gives a constant (the exporter stores its value);
    // one that reads a graph value, or whose inputs the scope does not list, cannot be
    // exported.
    bool reads_graph = !inputs_listed;
    for (const Tensor* t : inputs) reads_graph = reads_graph || (t && is_known(*t));
    if (reads_graph)
      DLTRAIN_FAIL("export_onnx: the op '", name,
                   "' has no ONNX mapping in this version of dltrain (docs/models.md lists the "
                   "ops export_onnx covers); compute it outside the exported forward, replace it "
                   "with covered ops, or ask for its mapping (issue 32)");
    ++depth_;
    return 1;  // nested: its inner ops are not recorded, its output is a constant
  }
  ++depth_;
  top_name_.assign(name);
  top_recorded_ = false;
  return 2;
}

void GraphTracer::exit(uint8_t how) {
  --depth_;
  if (how == 2 && !top_recorded_ && failure_.empty())
    failure_ = "export_onnx: internal error: the op '" + top_name_ +
               "' ran without recording itself (a return path before its graph_record call)";
}

void GraphTracer::record(std::vector<Tensor> inputs, std::vector<GraphAttr> attrs,
                         std::vector<Tensor> outputs) {
  top_recorded_ = true;
  for (const Tensor& t : outputs)
    if (t.defined() && !is_known(t)) {
      known_.insert(std::upper_bound(known_.begin(), known_.end(), t.impl().get()), t.impl().get());
      keep_.push_back(t);
    }
  // Inputs the op read but the graph does not know are constants: keep them alive too, so that
  // their addresses stay theirs until the exporter has read them.
  for (const Tensor& t : inputs)
    if (t.defined() && !is_known(t)) keep_.push_back(t);
  ops_.push_back({top_name_, std::move(inputs), std::move(attrs), std::move(outputs)});
  if (check_) check_(ops_.back());
}

uint8_t graph_scope_enter(std::string_view name, std::initializer_list<const Tensor*> inputs,
                          bool inputs_listed) {
  GraphTracer* t = t_tracer;
  return t ? t->enter(name, inputs, inputs_listed) : 0;
}

void graph_scope_exit(uint8_t how) {
  if (GraphTracer* t = t_tracer) t->exit(how);
}

}  // namespace dltrain::detail
