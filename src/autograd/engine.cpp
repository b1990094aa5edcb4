// Graph nodes, recording, and the backward engine.
//
// backward() first counts, for every node reachable from the roots, how many
// edges point at it; then it runs nodes whose count has dropped to zero,
// latest-created first (a reverse topological order), summing the gradients
// that arrive for each output. A node's saved tensors are released right after
// it runs unless retain_graph. AccumulateGrad nodes add into the leaf's grad
// and then fire the leaf's hooks: at that moment the gradient is final for this
// backward pass, which is what DDP needs to launch a bucket's allreduce.
//
// With create_graph, grad mode stays on while the nodes run, so the backward formulas
// record the graph of the gradients; a node whose formula is not written for that
// (HigherOrder::Unsupported) runs without recording, and its gradients are attached to an
// error node that names it, which raises only if a later backward reaches it. grad() runs
// the same loop, restricted to the nodes that lead to the requested inputs, and hands the
// gradients arriving there back instead of accumulating them.
#include <algorithm>
#include <atomic>
#include <queue>
#include <unordered_map>

#include "dltrain/autograd/node.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/reduction.hpp"
#include "src/amp/dispatch.hpp"
#include "src/autograd/internal.hpp"
#include "src/core/trace.hpp"

namespace dltrain::autograd {

namespace {
std::atomic<uint64_t> g_seq{0};
thread_local bool t_grad_enabled = true;
// Callbacks queued during the backward pass running on this thread (null outside one).
thread_local std::vector<std::function<void()>>* t_callbacks = nullptr;
// The node whose backward function is running on this thread (SavedOutput::get needs it).
thread_local Node* t_running = nullptr;

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

uint64_t next_sequence_nr() { return g_seq.load(); }

bool grad_mode_enabled() { return t_grad_enabled; }
void set_grad_mode(bool enabled) { t_grad_enabled = enabled; }

Node::Node(std::string name, std::vector<Edge> next, uint32_t num_outputs)
    : name_(std::move(name)), next_(std::move(next)), num_outputs_(num_outputs), seq_(g_seq++) {}

FunctionNode::FunctionNode(std::string name, std::vector<Edge> next, uint32_t num_outputs,
                           BackwardFn fn, HigherOrder higher)
    : Node(std::move(name), std::move(next), num_outputs), fn_(std::move(fn)), higher_(higher) {}

std::vector<Tensor> FunctionNode::apply(const std::vector<Tensor>& grad_outputs) {
  DLTRAIN_CHECK(!released_, "backward through '", name(),
                "' a second time: its saved tensors were freed after the first backward; pass "
                "retain_graph=true to the first backward() if you need to run it twice");
  check_saved_versions();
  return fn_(grad_outputs);
}

void FunctionNode::check_saved_versions() const {
  for (const SavedVersion& s : saved_versions_) {
    const uint64_t now = s.counter->count.load(std::memory_order_relaxed);
    if (now == s.version) continue;
    const char* writer = s.counter->writer.load(std::memory_order_relaxed);
    DLTRAIN_FAIL("backward of '", name(), "': ", s.is_output ? "output " : "input ", s.index,
                 " of '", name(),
                 "', which it saved to compute its gradient, was modified in place",
                 writer ? std::string(" by '") + writer + "'" : std::string(), " after '", name(),
                 "' ran (version ", s.version, ", now ", now,
                 "; views of one tensor share it), so the gradient would be computed from the "
                 "wrong values. Clone the tensor before changing it (t.clone()), use the out-of-"
                 "place op (add instead of add_), or make the change before '",
                 name(), "' uses the tensor");
  }
}

void FunctionNode::release() {
  fn_ = nullptr;
  adjoint_ = nullptr;
  released_ = true;
}

AccumulateGrad::AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf)
    : Node("AccumulateGrad", {}, 1), leaf_(leaf) {}

std::vector<Tensor> AccumulateGrad::apply(const std::vector<Tensor>& grad_outputs) {
  const Tensor& g = grad_outputs[0];
  std::shared_ptr<TensorImpl> leaf = leaf_.lock();
  if (!g.defined() || !leaf) return {};
  if (grad_mode_enabled()) {
    // create_graph: the gradient keeps its graph, so accumulate out of place.
    Tensor own =
        leaf->grad ? add(Tensor(leaf->grad), g) : g.clone(Tensor(leaf).suggest_memory_format());
    leaf->grad = own.impl();
  } else if (leaf->grad) {
    Tensor acc(leaf->grad);
    add_(acc, g);
  } else {
    // Own the gradient (it may alias a saved or user tensor), in the leaf's layout.
    Tensor own = g.clone(Tensor(leaf).suggest_memory_format());
    leaf->grad = own.impl();
  }
  Tensor final_grad(leaf->grad);
  for (auto& h : leaf->hooks) h(final_grad);
  return {};
}

Tensor SavedOutput::get() const {
  if (!t_grad_enabled || t_running == nullptr || !data_.defined()) return data_;
  // A create_graph backward is running the node that saved this output: hand the output
  // back as that node's output, sharing storage, so the formula's graph leads to the node.
  Tensor t = data_.detach();
  const auto& impl = t.impl();
  impl->requires_grad = true;
  impl->grad_fn = t_running->shared_from_this();
  impl->output_nr = output_nr_;
  return t;
}

SavedInput::SavedInput(const Tensor& input, const Tensor& values) {
  if (!input.defined()) return;
  const bool alias = input.requires_grad() && input.grad_fn() && values.defined() &&
                     values.dtype() == input.dtype() && values.shape() == input.shape();
  if (!input.requires_grad()) {
    data_ = values.defined() ? values.detach() : input.detach();
  } else if (alias) {
    data_ = values.detach();
    grad_fn_ = input.grad_fn();
    output_nr_ = input.impl()->output_nr;
  } else {
    input_ = input;
    data_ = input.detach();
  }
}

Tensor SavedInput::get() const {
  if (!t_grad_enabled) return data_;
  if (input_.defined()) return input_;
  if (!grad_fn_) return data_;
  Tensor t = data_.detach();
  const auto& impl = t.impl();
  impl->requires_grad = true;
  impl->grad_fn = grad_fn_;
  impl->output_nr = output_nr_;
  return t;
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

namespace {
// Makes `node` the grad_fn of `outputs` (floating ones), recording their shapes.
void attach(const std::shared_ptr<Node>& node, const std::vector<Tensor>& outputs) {
  for (uint32_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].defined()) {
      node->output_shapes.emplace_back();
      node->output_options.emplace_back();
      node->output_missing.push_back(true);
      continue;
    }
    const auto& o = outputs[i].impl();
    node->output_shapes.push_back(o->shape);
    node->output_options.push_back(outputs[i].options());
    node->output_missing.push_back(false);
    if (!is_floating(o->dtype)) continue;  // indices never carry gradients
    o->requires_grad = true;
    o->grad_fn = node;
    o->output_nr = i;
  }
}
}  // namespace

namespace {

// The inputs and outputs whose memory `backward` keeps (a captured handle, view or detach()ed
// copy: anything over the same storage), each with its version now. Found by copying the
// closure once while detail::t_copy_probe collects the tensors it holds.
std::vector<SavedVersion> saved_versions(const BackwardFn& backward,
                                         const std::vector<Tensor>& inputs,
                                         const std::vector<Tensor>& outputs) {
  std::vector<const TensorImpl*> held;
  {
    struct Probe {
      std::vector<const TensorImpl*>* prev;
      explicit Probe(std::vector<const TensorImpl*>* p) : prev(detail::t_copy_probe) {
        detail::t_copy_probe = p;
      }
      ~Probe() { detail::t_copy_probe = prev; }
    } probe(&held);
    const BackwardFn copy = backward;
  }
  std::vector<SavedVersion> out;
  if (held.empty()) return out;
  std::vector<const VersionCounter*> kept;
  kept.reserve(held.size());
  for (const TensorImpl* impl : held)
    if (impl != nullptr && impl->storage.version_counter() != nullptr)
      kept.push_back(impl->storage.version_counter());
  auto add = [&](const std::vector<Tensor>& ts, bool is_output) {
    for (size_t i = 0; i < ts.size(); ++i) {
      if (!ts[i].defined()) continue;
      const VersionCounter* c = ts[i].impl()->storage.version_counter();
      if (c == nullptr || std::find(kept.begin(), kept.end(), c) == kept.end()) continue;
      out.push_back(
          {c, c->count.load(std::memory_order_relaxed), is_output, static_cast<uint32_t>(i)});
    }
  };
  add(inputs, false);
  add(outputs, true);
  return out;
}

}  // namespace

void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            BackwardFn backward, HigherOrder higher) {
  if (!any_requires_grad(inputs)) return;
  std::vector<Edge> next;
  next.reserve(inputs.size());
  for (const Tensor& t : inputs) next.push_back(gradient_edge(t));
  std::vector<SavedVersion> saved = saved_versions(backward, inputs, outputs);
  auto node = std::make_shared<FunctionNode>(
      name, std::move(next), static_cast<uint32_t>(outputs.size()), std::move(backward), higher);
  node->set_saved_versions(std::move(saved));
  attach(node, outputs);
}

namespace {

// Runs a node's backward function. Under create_graph a node whose formula is not written
// for higher orders runs without recording, and its gradients get an error node whose
// edges are those the true derivative would have (the output gradients and the op's
// inputs), so a second backward that reaches it fails with the op's name instead of
// silently treating the gradient as a constant.
std::vector<Tensor> run_node(Node& n, const std::vector<Tensor>& grad_outputs, bool create_graph) {
  struct Running {
    Node* prev;
    explicit Running(Node* n) : prev(t_running) { t_running = n; }
    ~Running() { t_running = prev; }
  } running(&n);
  if (!create_graph) return n.apply(grad_outputs);  // the ordinary path: nothing else
  auto* fn = dynamic_cast<FunctionNode*>(&n);
  if (fn && fn->adjoint()) {
    // A linear backward: the kernel computes it, its adjoint is its derivative.
    std::vector<Tensor> in_grads;
    {
      NoGradGuard no_grad;
      in_grads = n.apply(grad_outputs);
    }
    if (!any_requires_grad(grad_outputs)) return in_grads;
    for (Tensor& g : in_grads)
      if (g.defined()) g = g.detach();
    record((n.name() + "_backward").c_str(), grad_outputs, in_grads, fn->adjoint(),
           HigherOrder::Supported);
    return in_grads;
  }
  if (n.supports_higher_order()) return n.apply(grad_outputs);
  std::vector<Tensor> in_grads;
  {
    NoGradGuard no_grad;
    in_grads = n.apply(grad_outputs);
  }
  std::vector<Edge> next;
  bool any_edge = false;
  for (const Tensor& g : grad_outputs) {
    next.push_back(gradient_edge(g));
    any_edge = any_edge || next.back().node;
  }
  for (const Edge& e : n.next_edges()) {
    next.push_back(e);
    any_edge = any_edge || e.node;
  }
  if (!any_edge) return in_grads;
  std::string op = n.name();
  auto err = std::make_shared<FunctionNode>(
      op + "_backward", std::move(next), static_cast<uint32_t>(in_grads.size()),
      [op](const std::vector<Tensor>&) -> std::vector<Tensor> {
        throw Error(std::string("double backward through '") + op +
                    "' is not implemented: its gradient formula is not differentiable in "
                    "dltrain yet (see docs/design.md, 'Higher-order gradients', for the ops "
                    "that are); compute this part of the model with supported ops, or detach() "
                    "it from the graph that create_graph differentiates");
      });
  for (Tensor& g : in_grads)
    if (g.defined()) g = g.detach();
  attach(err, in_grads);
  return in_grads;
}

// One backward pass. With `captures` (grad()), only the nodes that lead to a captured edge
// run, no AccumulateGrad runs, and the gradient arriving at each captured edge is stored
// into `captured` instead.
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                  bool retain_graph, bool create_graph, const std::vector<Edge>* captures,
                  std::vector<Tensor>* captured) {
  DLTRAIN_CHECK(roots.size() == grads.size(), "backward: ", roots.size(), " roots but ",
                grads.size(), " gradients; pass one gradient (or an undefined Tensor) per root");
  dltrain::detail::OpScope scope(dltrain::detail::TraceKind::Backward, "autograd::backward", "");
  // Backward formulas record a graph only for create_graph (higher-order gradients).
  const bool prev_mode = t_grad_enabled;
  struct ModeRestore {
    bool prev;
    ~ModeRestore() { t_grad_enabled = prev; }
  } restore{prev_mode};
  t_grad_enabled = create_graph;
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

  // grad(): which nodes lead to a captured edge. Edges always point at older nodes, so one
  // pass in creation order sees every node's successors before the node.
  std::unordered_map<Node*, bool> needed;
  std::unordered_map<Node*, std::vector<size_t>> capture_at;
  if (captures) {
    for (size_t k = 0; k < captures->size(); ++k)
      if ((*captures)[k].node) capture_at[(*captures)[k].node.get()].push_back(k);
    std::vector<Node*> order;
    order.reserve(keep.size());
    for (auto& [n, node] : keep) order.push_back(n);
    std::sort(order.begin(), order.end(),
              [](Node* a, Node* b) { return a->sequence_nr() < b->sequence_nr(); });
    for (Node* n : order) {
      bool need = false;
      for (const Edge& e : n->next_edges())
        if (e.node && (needed[e.node.get()] || capture_at.count(e.node.get()))) need = true;
      needed[n] = need;
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
    if (captures) {
      auto it = capture_at.find(n);
      if (it != capture_at.end())
        for (size_t k : it->second) {
          const uint32_t nr = (*captures)[k].input_nr;
          if (nr < p.grads.size() && p.grads[nr].defined()) (*captured)[k] = p.grads[nr];
        }
    }
    const bool run = captures ? needed[n] : true;
    bool any = false;
    for (auto& g : p.grads) any = any || g.defined();
    std::vector<Tensor> in_grads;
    if (any && run) {
      for (uint32_t i = 0; i < p.grads.size(); ++i) {
        if (!p.grads[i].defined() && i < n->output_shapes.size() &&
            !(i < n->output_missing.size() && n->output_missing[i]))
          p.grads[i] = zeros(n->output_shapes[i], n->output_options[i]);
      }
      // AccumulateGrad (no next edges) keeps its name; a function node is "<op>_backward".
      dltrain::detail::OpScope scope(dltrain::detail::TraceKind::Backward, n->name(),
                                     n->next_edges().empty() ? "" : "_backward");
      in_grads = run_node(*n, p.grads, create_graph);
    }
    if (!retain_graph && run) n->release();
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

}  // namespace

std::vector<Tensor> grad_by_recompute(
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& reference,
    const std::vector<Tensor>& inputs, const std::vector<Tensor>& grad_outputs) {
  EnableGradGuard enable;
  // Differentiate with respect to fresh aliases of the inputs (identity nodes created now),
  // not the inputs themselves: the inner grad() then stops at the aliases and never runs
  // the inputs' own history, even when one input was computed from another.
  std::vector<Tensor> aliases(inputs.size()), wrt;
  std::vector<size_t> where;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (!x.defined()) continue;
    Tensor a = x.detach();
    if (x.requires_grad() && is_floating(x.dtype())) {
      record(
          "alias", {x}, {a}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; },
          HigherOrder::Supported);
      wrt.push_back(a);
      where.push_back(i);
    }
    aliases[i] = a;
  }
  std::vector<Tensor> result(inputs.size());
  if (wrt.empty()) return result;
  std::vector<Tensor> outs = reference(aliases);
  std::vector<Tensor> roots, seeds;
  for (size_t k = 0; k < outs.size() && k < grad_outputs.size(); ++k) {
    if (!outs[k].defined() || !outs[k].requires_grad() || !grad_outputs[k].defined()) continue;
    roots.push_back(outs[k]);
    seeds.push_back(grad_outputs[k]);
  }
  if (roots.empty()) return result;
  std::vector<Tensor> gs = grad(roots, wrt, seeds, true, true, true);
  for (size_t j = 0; j < wrt.size(); ++j) result[where[j]] = gs[j];
  return result;
}

void set_adjoint(const Tensor& output, BackwardFn adjoint) {
  if (!output.defined() || !output.grad_fn()) return;
  auto* fn = dynamic_cast<FunctionNode*>(output.grad_fn().get());
  DLTRAIN_CHECK(fn != nullptr, "set_adjoint: the output was not produced by a recorded op");
  fn->set_adjoint(std::move(adjoint));
}

Tensor linear_backward(const char* name, const Tensor& grad, const Tensor& value,
                       std::function<Tensor(const Tensor&)> adjoint) {
  if (!any_requires_grad({&grad})) return value;
  Tensor out = value.detach();
  record(
      name, {grad}, {out},
      [adjoint = std::move(adjoint)](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{adjoint(g[0])};
      },
      HigherOrder::Supported);
  return out;
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph,
              bool create_graph) {
  run_backward(roots, grads, retain_graph || create_graph, create_graph, nullptr, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, std::optional<bool> retain_graph,
                         bool create_graph, bool allow_unused) {
  DLTRAIN_CHECK(!outputs.empty(), "autograd::grad: no outputs given");
  DLTRAIN_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(),
                "autograd::grad: ", outputs.size(), " outputs but ", grad_outputs.size(),
                " grad_outputs; pass one per output (an undefined Tensor = ones) or none");
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    DLTRAIN_CHECK(x.defined(), "autograd::grad: input ", k, " is undefined");
    DLTRAIN_CHECK(x.requires_grad(), "autograd::grad: input ", k,
                  " does not require grad; differentiate with respect to a leaf marked with "
                  "requires_grad_() or a tensor computed from one");
    edges.push_back(gradient_edge(x));
  }
  std::vector<Tensor> seeds = grad_outputs;
  seeds.resize(outputs.size());
  std::vector<Tensor> result(inputs.size());
  run_backward(outputs, seeds, retain_graph.value_or(create_graph), create_graph, &edges, &result);
  for (size_t k = 0; k < inputs.size(); ++k)
    DLTRAIN_CHECK(result[k].defined() || allow_unused, "autograd::grad: input ", k, " (shape ",
                  shape_str(inputs[k].shape()),
                  ") was not used to compute the outputs (no gradient reached it); pass "
                  "allow_unused=true to get an undefined gradient for it instead");
  return result;
}

}  // namespace dltrain::autograd
