// Graph nodes, recording, and the backward engine.
//
// backward() first counts, for every node reachable from the roots, how many
// edges point at it; then it runs nodes whose count has dropped to zero,
// latest-created first (a reverse topological order), summing the gradients
// that arrive for each output. A node's saved tensors are released right after
// it runs unless retain_graph. AccumulateGrad nodes add into the leaf's grad
// and then fire the leaf's hooks: at that moment the gradient is final for this
// backward pass, which is what DDP needs to launch a bucket's allreduce.
#include <algorithm>
#include <atomic>
#include <queue>
#include <unordered_map>

#include "dltrain/autograd/node.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/reduction.hpp"
#include "src/amp/dispatch.hpp"
#include "src/core/trace.hpp"

namespace dltrain::autograd {

namespace {
std::atomic<uint64_t> g_seq{0};
thread_local bool t_grad_enabled = true;
// Callbacks queued during the backward pass running on this thread (null outside one).
thread_local std::vector<std::function<void()>>* t_callbacks = nullptr;

// Installs a callback list for one backward() call and restores the outer one after
// (a backward run from inside a hook has its own list).
class CallbackScope {
 public:
  CallbackScope() : prev_(t_callbacks) { t_callbacks = &list_; }
  ~CallbackScope() { t_callbacks = prev_; }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;
  // Runs the callbacks in order, including any that a callback queues.
  void run() {
    for (size_t i = 0; i < list_.size(); ++i) {
      auto fn = std::move(list_[i]);
      fn();
    }
    list_.clear();
  }

 private:
  std::vector<std::function<void()>> list_;
  std::vector<std::function<void()>>* prev_;
};
}  // namespace

void queue_callback(std::function<void()> fn) {
  DLTRAIN_CHECK(t_callbacks != nullptr,
                "autograd::queue_callback: no backward pass is running "
                "on this thread; call it from a gradient hook or a backward function");
  t_callbacks->push_back(std::move(fn));
}

bool grad_mode_enabled() { return t_grad_enabled; }
void set_grad_mode(bool enabled) { t_grad_enabled = enabled; }

Node::Node(std::string name, std::vector<Edge> next, uint32_t num_outputs)
    : name_(std::move(name)), next_(std::move(next)), num_outputs_(num_outputs), seq_(g_seq++) {}

FunctionNode::FunctionNode(std::string name, std::vector<Edge> next, uint32_t num_outputs,
                           BackwardFn fn)
    : Node(std::move(name), std::move(next), num_outputs), fn_(std::move(fn)) {}

std::vector<Tensor> FunctionNode::apply(const std::vector<Tensor>& grad_outputs) {
  DLTRAIN_CHECK(!released_, "backward through '", name(),
                "' a second time: its saved tensors were freed after the first backward; pass "
                "retain_graph=true to the first backward() if you need to run it twice");
  return fn_(grad_outputs);
}

void FunctionNode::release() {
  fn_ = nullptr;
  released_ = true;
}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf)
    : Node("AccumulateGrad", {}, 1), leaf_(std::move(leaf)) {}

std::vector<Tensor> AccumulateGrad::apply(const std::vector<Tensor>& grad_outputs) {
  const Tensor& g = grad_outputs[0];
  if (!g.defined()) return {};
  if (leaf_->grad) {
    Tensor acc(leaf_->grad);
    add_(acc, g);
  } else {
    // Own the gradient (it may alias a saved or user tensor), in the leaf's layout.
    Tensor own = g.clone(Tensor(leaf_).suggest_memory_format());
    leaf_->grad = own.impl();
  }
  Tensor final_grad(leaf_->grad);
  for (auto& h : leaf_->hooks) h(final_grad);
  return {};
}

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  const auto& impl = t.impl();
  if (impl->grad_fn) return {impl->grad_fn, impl->output_nr};
  std::shared_ptr<Node> acc = impl->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(impl);
    impl->grad_accumulator = acc;
  }
  return {acc, 0};
}

void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            BackwardFn backward) {
  if (!any_requires_grad(inputs)) return;
  std::vector<Edge> next;
  next.reserve(inputs.size());
  for (const Tensor& t : inputs) next.push_back(gradient_edge(t));
  auto node = std::make_shared<FunctionNode>(
      name, std::move(next), static_cast<uint32_t>(outputs.size()), std::move(backward));
  for (uint32_t i = 0; i < outputs.size(); ++i) {
    const auto& o = outputs[i].impl();
    node->output_shapes.push_back(o->shape);
    node->output_options.push_back(outputs[i].options());
    if (!is_floating(o->dtype)) continue;  // indices never carry gradients
    o->requires_grad = true;
    o->grad_fn = node;
    o->output_nr = i;
  }
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              bool retain_graph) {
  DLTRAIN_CHECK(roots.size() == grads.size(), "backward: ", roots.size(), " roots but ",
                grads.size(), " gradients; pass one gradient (or an undefined Tensor) per root");
  dltrain::detail::OpScope scope(dltrain::detail::TraceKind::Backward, "autograd::backward", "");
  NoGradGuard no_grad;  // backward formulas do not record (no double backward)
  CallbackScope callbacks;
  // Backward formulas run in the dtypes forward chose, never autocast again; and the weight
  // casts cached by autocast are dropped, as an optimizer step may follow.
  amp::detail::BackwardScope amp_scope;

  struct Pending {
    std::vector<Tensor> grads;
    int deps = 0;
  };
  std::unordered_map<Node*, Pending> state;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep;

  auto add_grad = [&](const Edge& e, const Tensor& g) {
    auto& p = state[e.node.get()];
    if (p.grads.empty()) p.grads.resize(e.node->num_outputs());
    Tensor& slot = p.grads[e.input_nr];
    slot = slot.defined() ? add(slot, g) : g;
  };

  std::vector<Edge> root_edges;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    DLTRAIN_CHECK(r.defined(), "backward: called on an undefined tensor");
    DLTRAIN_CHECK(r.requires_grad(),
                  "backward: the tensor does not require grad and has no grad_fn; "
                  "mark an input with requires_grad_() before computing it");
    Tensor g = grads[i];
    if (!g.defined()) {
      DLTRAIN_CHECK(r.numel() == 1, "backward: the output has shape ", shape_str(r.shape()),
                    "; a gradient can only be created implicitly for one-element outputs, so pass "
                    "backward(gradient) with a tensor of that shape, or reduce first (e.g. sum())");
      g = ones_like(r);
    } else {
      DLTRAIN_CHECK(g.shape() == r.shape(), "backward: gradient shape ", shape_str(g.shape()),
                    " does not match the output shape ", shape_str(r.shape()));
    }
    Edge e = gradient_edge(r);
    root_edges.push_back(e);
    add_grad(e, g);
  }

  // Count dependencies over the reachable graph.
  std::vector<Node*> stack;
  for (auto& e : root_edges) {
    if (keep.emplace(e.node.get(), e.node).second) stack.push_back(e.node.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) {
      if (!e.node) continue;
      state[e.node.get()].deps++;
      if (keep.emplace(e.node.get(), e.node).second) stack.push_back(e.node.get());
    }
  }

  auto cmp = [](Node* a, Node* b) { return a->sequence_nr() < b->sequence_nr(); };
  std::priority_queue<Node*, std::vector<Node*>, decltype(cmp)> ready(cmp);
  for (auto& [n, node] : keep)
    if (state[n].deps == 0) ready.push(n);

  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    Pending p = std::move(state[n]);
    if (p.grads.empty()) p.grads.resize(n->num_outputs());
    bool any = false;
    for (auto& g : p.grads) any = any || g.defined();
    std::vector<Tensor> in_grads;
    if (any) {
      for (uint32_t i = 0; i < p.grads.size(); ++i) {
        if (!p.grads[i].defined() && i < n->output_shapes.size())
          p.grads[i] = zeros(n->output_shapes[i], n->output_options[i]);
      }
      // AccumulateGrad (no next edges) keeps its name; a function node is "<op>_backward".
      dltrain::detail::OpScope scope(dltrain::detail::TraceKind::Backward, n->name(),
                                     n->next_edges().empty() ? "" : "_backward");
      in_grads = n->apply(p.grads);
    }
    if (!retain_graph) n->release();
    const auto& next = n->next_edges();
    for (size_t i = 0; i < next.size(); ++i) {
      const Edge& e = next[i];
      if (!e.node) continue;
      if (i < in_grads.size() && in_grads[i].defined()) add_grad(e, in_grads[i]);
      if (--state[e.node.get()].deps == 0) ready.push(e.node.get());
    }
  }
  callbacks.run();
}

}  // namespace dltrain::autograd
