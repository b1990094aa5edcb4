// nn::Module (dltrain/nn/module.hpp): parameter/buffer/child registration, the recursive
// views (named_parameters, state_dict), dtype/device/memory-format conversion in place, and
// the error context that names the failing submodule.
#include "dltrain/nn/module.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "dltrain/autograd/node.hpp"
#include "dltrain/nn/hooks.hpp"

namespace dltrain::nn {

namespace {

// Points every handle of `t` at `src`'s data (PyTorch's set_data): the fields a layer keeps
// and the registry share the TensorImpl, so both see the new device/dtype/layout.
void set_data(const Tensor& t, const Tensor& src) {
  auto& dst = *t.impl();
  const auto& s = *src.impl();
  dst.storage = s.storage;
  dst.shape = s.shape;
  dst.strides = s.strides;
  dst.offset = s.offset;
  dst.dtype = s.dtype;
}

void convert_in_place(const Tensor& t, const std::function<Tensor(const Tensor&)>& f) {
  autograd::NoGradGuard ng;
  set_data(t, f(t.detach()));
  Tensor g = t.grad();
  if (g.defined()) set_data(g, f(g));
}

}  // namespace

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}

Tensor Module::forward(const Tensor&) {
  DLTRAIN_FAIL(type_name_, "::forward(x): this module does not take a single tensor; call its ",
               "own forward(...) overload (losses take (input, target))");
}

void Module::check_new_name(const std::string& name, const char* what) const {
  DLTRAIN_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name_, ": ", what,
                " name '", name, "' must be non-empty and contain no '.'");
  auto taken = [&](const std::string& n) {
    for (const auto& p : params_)
      if (p.first == n) return true;
    for (const auto& b : buffers_)
      if (b.name == n) return true;
    for (const auto& c : children_)
      if (c.first == n) return true;
    return false;
  };
  DLTRAIN_CHECK(!taken(name), type_name_, ": cannot register ", what, " '", name,
                "': the name is already used by a parameter, buffer or submodule");
}

Tensor Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name, "parameter");
  DLTRAIN_CHECK(t.defined(), type_name_, ": parameter '", name, "' is undefined");
  if (!t.is_leaf()) t = t.detach();
  if (requires_grad) t.requires_grad_(true);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t, bool persistent) {
  check_new_name(name, "buffer");
  DLTRAIN_CHECK(t.defined(), type_name_, ": buffer '", name, "' is undefined");
  buffers_.push_back({name, t.detach(), persistent});
  return buffers_.back().tensor;
}

namespace {

// The modules called through operator() on this thread, outermost first.
thread_local std::vector<const Module*> t_call_stack;

// The dotted path of `target` among the descendants of `root` ("" when it is root), or
// nullopt when it is not one of them.
std::optional<std::string> path_below(const Module& root, const Module* target) {
  if (&root == target) return std::string();
  for (const auto& [name, child] : root.named_children()) {
    if (auto p = path_below(*child, target)) return p->empty() ? name : name + "." + *p;
  }
  return std::nullopt;
}

// "enc2.block.1 (Conv2d)" for `m` under the outermost module called on this thread, or the
// type name alone for that module (or one not below it).
std::string location(const Module& m) {
  if (!t_call_stack.empty() && t_call_stack.front() != &m) {
    if (auto p = path_below(*t_call_stack.front(), &m); p && !p->empty())
      return *p + " (" + m.type_name() + ")";
  }
  return m.type_name();
}

}  // namespace

namespace {

// Forward hooks (nn/hooks.hpp): per module, in registration order, with their handles.
struct HookRegistry {
  std::mutex mutex;
  std::unordered_map<const Module*, std::vector<std::pair<uint64_t, ForwardHooks>>> hooks;
  uint64_t next = 1;
};
HookRegistry& hook_registry() {
  static HookRegistry r;
  return r;
}
std::atomic<int64_t> g_hook_count{0};

// The hooks of `m` (a copy: a hook may register or remove hooks).
std::vector<std::pair<uint64_t, ForwardHooks>> hooks_of(const Module* m) {
  HookRegistry& r = hook_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.hooks.find(m);
  return it == r.hooks.end() ? std::vector<std::pair<uint64_t, ForwardHooks>>{} : it->second;
}

}  // namespace

uint64_t register_forward_hooks(Module& module, ForwardHooks hooks) {
  HookRegistry& r = hook_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const uint64_t h = r.next++;
  r.hooks[&module].emplace_back(h, std::move(hooks));
  g_hook_count.fetch_add(1, std::memory_order_relaxed);
  return h;
}

void remove_forward_hooks(uint64_t handle) {
  HookRegistry& r = hook_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto it = r.hooks.begin(); it != r.hooks.end(); ++it) {
    auto& v = it->second;
    for (auto h = v.begin(); h != v.end(); ++h) {
      if (h->first != handle) continue;
      v.erase(h);
      if (v.empty()) r.hooks.erase(it);
      g_hook_count.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
  }
}

Tensor Module::operator()(const Tensor& x) {
  t_call_stack.push_back(this);
  struct Pop {
    ~Pop() { t_call_stack.pop_back(); }
  } pop;
  try {
    if (g_hook_count.load(std::memory_order_relaxed) == 0) return forward(x);
    const auto hooks = hooks_of(this);
    for (const auto& [h, fn] : hooks)
      if (fn.pre) fn.pre(*this);
    Tensor out = forward(x);
    for (const auto& [h, fn] : hooks)
      if (fn.post) out = fn.post(*this, out);
    return out;
  } catch (const ModuleError&) {
    throw;  // an inner module said where already
  } catch (const OutOfMemoryError&) {
    throw;  // callers that retry with less memory catch this type
  } catch (const Error& e) {
    throw ModuleError(location(*this), e.what());
  }
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(name, "submodule");
  DLTRAIN_CHECK(m != nullptr, type_name_, ": submodule '", name, "' is null");
  DLTRAIN_CHECK(m.get() != this, type_name_, ": a module cannot be its own child");
  children_.emplace_back(name, std::move(m));
}

void Module::replace_module(const std::string& name, std::shared_ptr<Module> m) {
  DLTRAIN_CHECK(m != nullptr, type_name_, ": replacement for '", name, "' is null");
  for (auto& c : children_) {
    if (c.first == name) {
      c.second = std::move(m);
      return;
    }
  }
  DLTRAIN_FAIL(type_name_, ": no submodule '", name, "' to replace");
}

void Module::collect(const std::string& prefix, bool recurse, bool params, bool only_persistent,
                     NamedTensors& out) const {
  if (params) {
    for (const auto& p : params_) out.emplace_back(prefix + p.first, p.second);
  } else {
    for (const auto& b : buffers_) {
      if (!only_persistent || b.persistent) out.emplace_back(prefix + b.name, b.tensor);
    }
  }
  if (!recurse) return;
  for (const auto& c : children_)
    c.second->collect(prefix + c.first + ".", true, params, only_persistent, out);
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors out;
  collect("", recurse, true, false, out);
  // A parameter shared by two submodules (tied weights) is listed once, as PyTorch.
  NamedTensors unique;
  std::unordered_set<const TensorImpl*> seen;
  for (auto& p : out) {
    if (seen.insert(p.second.impl().get()).second) unique.push_back(std::move(p));
  }
  return unique;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& p : named_parameters(recurse)) out.push_back(p.second);
  return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  collect("", recurse, false, false, out);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& b : named_buffers(recurse)) out.push_back(b.second);
  return out;
}

NamedModules Module::named_children() const { return children_; }

void Module::collect_modules(const std::string& prefix, NamedModules& out) const {
  for (const auto& c : children_) {
    std::string name = prefix.empty() ? c.first : prefix + "." + c.first;
    out.emplace_back(name, c.second);
    c.second->collect_modules(name, out);
  }
}

NamedModules Module::named_modules() const {
  NamedModules out;
  // A module on the stack has no owner: hand out a non-owning pointer to it.
  auto self = std::const_pointer_cast<Module>(weak_from_this().lock());
  if (!self) self = std::shared_ptr<Module>(std::shared_ptr<Module>(), const_cast<Module*>(this));
  out.emplace_back("", std::move(self));
  collect_modules("", out);
  return out;
}

std::shared_ptr<Module> Module::child(const std::string& name) const {
  std::string names;
  for (const auto& c : children_) {
    if (c.first == name) return c.second;
    names += (names.empty() ? "" : ", ") + c.first;
  }
  DLTRAIN_FAIL(type_name_, ": no submodule named '", name,
               "' (children: ", names.empty() ? "none" : names, ")");
}

int64_t Module::num_parameters(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& p : named_parameters()) {
    if (!trainable_only || p.second.requires_grad()) n += p.second.numel();
  }
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& c : children_) c.second->train(on);
}

void Module::apply(const std::function<void(Module&)>& fn) {
  fn(*this);
  for (auto& c : children_) c.second->apply(fn);
}

void Module::for_each_tensor(const std::function<void(Tensor&, bool)>& fn) {
  for (auto& p : params_) fn(p.second, true);
  for (auto& b : buffers_) fn(b.tensor, false);
  for (auto& c : children_) c.second->for_each_tensor(fn);
}

void Module::to(Device device) {
  for_each_tensor([&](Tensor& t, bool) {
    if (t.device() != device) convert_in_place(t, [&](const Tensor& x) { return x.to(device); });
  });
}

void Module::to(DType dtype) {
  DLTRAIN_CHECK(is_floating(dtype), type_name_, ".to(", dtype,
                "): modules convert to floating dtypes only (f32, f64, f16, bf16)");
  for_each_tensor([&](Tensor& t, bool) {
    if (is_floating(t.dtype()) && t.dtype() != dtype) {
      convert_in_place(t, [&](const Tensor& x) { return x.to(dtype); });
    }
  });
}

void Module::to(MemoryFormat fmt) {
  DLTRAIN_CHECK(fmt != MemoryFormat::Preserve, type_name_,
                ".to(MemoryFormat::Preserve) does nothing; pass Contiguous or ChannelsLast");
  for_each_tensor([&](Tensor& t, bool) {
    // By suggest_memory_format, not is_contiguous: a weight with one input channel is dense in
    // both formats and is re-labelled (conv2d's output format follows its weight's).
    if (t.dim() == 4 && t.suggest_memory_format() != fmt) {
      convert_in_place(t, [&](const Tensor& x) { return x.contiguous(fmt); });
    }
  });
}

StateDict Module::state_dict() const {
  NamedTensors all;
  std::function<void(const Module&, const std::string&)> walk = [&](const Module& m,
                                                                    const std::string& prefix) {
    m.collect(prefix, false, true, false, all);
    m.collect(prefix, false, false, true, all);
    for (const auto& c : m.children_) walk(*c.second, prefix + c.first + ".");
  };
  walk(*this, "");
  StateDict sd;
  for (auto& [name, t] : all) sd.insert(name, t.detach());
  return sd;
}

LoadResult Module::load_state_dict(const StateDict& sd, bool strict) {
  StateDict own = state_dict();
  LoadResult r;
  std::vector<std::string> mismatched;
  for (const auto& [name, t] : own) {
    if (!sd.contains(name)) {
      r.missing_keys.push_back(name);
      continue;
    }
    const Tensor& src = sd.at(name);
    if (src.shape() != t.shape()) {
      mismatched.push_back(name + ": checkpoint " + shape_str(src.shape()) + ", model " +
                           shape_str(t.shape()));
    }
  }
  for (const auto& [name, t] : sd) {
    if (!own.contains(name)) r.unexpected_keys.push_back(name);
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 10; ++i) s += (i ? ", " : "") + v[i];
    if (v.size() > 10) s += ", ... (" + std::to_string(v.size()) + " in all)";
    return s;
  };
  std::string problems;
  if (!mismatched.empty()) problems += " size mismatch for " + list(mismatched) + ".";
  if (strict && !r.missing_keys.empty()) problems += " Missing keys: " + list(r.missing_keys) + ".";
  if (strict && !r.unexpected_keys.empty()) {
    problems += " Unexpected keys: " + list(r.unexpected_keys) + ".";
  }
  DLTRAIN_CHECK(problems.empty(), type_name_,
                ".load_state_dict: the state does not fit this model:", problems,
                " Check that it was saved from the same architecture (or pass strict = false "
                "to load the keys that match).");
  // Copy only after every check passed, so a failed load leaves the model untouched.
  autograd::NoGradGuard ng;
  for (const auto& [name, t] : own) {
    if (!sd.contains(name)) continue;
    Tensor dst = t;
    dst.copy_(sd.at(name));
  }
  return r;
}

void Module::zero_grad(bool set_to_none) {
  for (auto& p : parameters()) {
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.impl()->grad.reset();
    } else {
      // A gradient from backward(create_graph=true) carries a graph: cut it first (as
      // PyTorch's zero_grad does), which also frees the leaf <-> graph cycle.
      Tensor g = p.grad();
      if (g.requires_grad()) {
        g = g.detach();
        p.set_grad(g);
      }
      g.zero_();
    }
  }
}

std::string Module::str_indented(int indent) const {
  std::ostringstream os;
  os << type_name_ << "(";
  std::string extra = extra_repr();
  if (children_.empty()) {
    os << extra << ")";
    return os.str();
  }
  std::string pad(static_cast<size_t>(indent + 2), ' ');
  os << "\n";
  if (!extra.empty()) os << pad << extra << "\n";
  for (const auto& c : children_) {
    os << pad << "(" << c.first << "): " << c.second->str_indented(indent + 2) << "\n";
  }
  os << std::string(static_cast<size_t>(indent), ' ') << ")";
  return os.str();
}

std::string Module::str() const { return str_indented(0); }

std::ostream& operator<<(std::ostream& os, const Module& m) { return os << m.str(); }

}  // namespace dltrain::nn
