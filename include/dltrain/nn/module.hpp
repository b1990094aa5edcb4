// nn::Module: the base of every layer and model.
//
// A Module owns named parameters (trainable leaves), named buffers (state
// that is saved but not trained, such as BatchNorm running statistics) and
// named child modules, each kept in registration order. Dotted names
// ("layer1.0.conv1.weight") come from walking children depth-first, own
// entries first, exactly as PyTorch, so state dicts line up with torchvision.
//
// Invariants: names are unique within a module and contain no '.'; the
// Tensor handles a subclass keeps in its fields (weight, bias) and the
// registry share one TensorImpl, so to(), load_state_dict() and optimizers
// that update tensors in place are seen by both. Modules are not copyable
// (share them with std::shared_ptr).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dltrain/core/device.hpp"
#include "dltrain/core/dtype.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/core/state_dict.hpp"
#include "dltrain/core/tensor.hpp"

namespace dltrain::nn {

class Module;

/// (dotted name, tensor) pairs in registration order.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
/// (dotted name, module) pairs in registration order.
using NamedModules = std::vector<std::pair<std::string, std::shared_ptr<Module>>>;

/// What load_state_dict(strict = false) could not match.
struct LoadResult {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

/// A dltrain::Error raised inside a module called as m(x), with where it happened: what()
/// reads "in enc2.block.1 (Conv2d): conv2d: expected ...", the path being the module's
/// state-dict prefix under the outermost module called as m(x) (its type alone for that one).
/// Modules called with ->forward(x) add nothing; out-of-memory errors pass unchanged.
class ModuleError : public Error {
 public:
  ModuleError(std::string path, const std::string& message)
      : Error("in " + path + ": " + message), path_(std::move(path)) {}
  /// "enc2.block.1 (Conv2d)", or "UNet" for the outermost module.
  const std::string& module_path() const { return path_; }

 private:
  std::string path_;
};

/// Base class of layers and models. Subclasses register their tensors and children in
/// their constructor and override forward().
class Module : public std::enable_shared_from_this<Module> {
 public:
  /// `type_name` is what printing shows ("Conv2d", "ResNet", ...).
  explicit Module(std::string type_name = "Module");
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// The single-tensor forward pass. Modules with other signatures (losses) define
  /// their own; calling this one on them raises dltrain::Error.
  virtual Tensor forward(const Tensor& x);
  /// forward(x), with a dltrain::Error raised inside it rethrown as a ModuleError naming this
  /// module's path (call children as (*child)(x) to get it).
  Tensor operator()(const Tensor& x);

  const std::string& type_name() const { return type_name_; }

  // --- registration (call from constructors) -----------------------------------
  /// Adds a trainable parameter (a leaf; requires_grad set unless `requires_grad` is false)
  /// and returns the handle to keep in a field. Throws on a duplicate or dotted name.
  Tensor register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  /// Adds a buffer (saved in state_dict when `persistent`, moved by to(), never trained).
  Tensor register_buffer(const std::string& name, Tensor t, bool persistent = true);
  /// Adds a child module and returns it.
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }
  /// Replaces the child registered as `name` (e.g. a new classifier head).
  void replace_module(const std::string& name, std::shared_ptr<Module> m);

  // --- queries -----------------------------------------------------------------
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensors named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  /// Direct children in registration order.
  NamedModules named_children() const;
  /// This module (name "") and all descendants, depth-first, pre-order.
  NamedModules named_modules() const;
  /// The child registered as `name`; throws naming the available children when absent.
  std::shared_ptr<Module> child(const std::string& name) const;
  /// Number of parameter elements (only those requiring grad when `trainable_only`).
  int64_t num_parameters(bool trainable_only = false) const;

  // --- modes and conversion ----------------------------------------------------
  /// Training mode for this module and all descendants (Dropout, BatchNorm use it).
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  /// Moves parameters and buffers (and existing gradients) to `device`, in place.
  void to(Device device);
  /// Converts floating parameters and buffers to `dtype`, in place (integer buffers such as
  /// num_batches_tracked keep theirs).
  void to(DType dtype);
  /// Lays out 4-d parameters and buffers as `fmt` (ChannelsLast for conv weights).
  void to(MemoryFormat fmt);
  /// Calls fn on this module and every descendant, pre-order.
  void apply(const std::function<void(Module&)>& fn);

  // --- state -------------------------------------------------------------------
  /// Parameters and persistent buffers under their dotted names. The tensors share storage
  /// with the module (detached from autograd); clone them to snapshot.
  StateDict state_dict() const;
  /// Copies values from `sd` into the module's tensors (dtype converted, shapes must match).
  /// strict: any missing or unexpected key is an error listing all of them. A shape mismatch
  /// is always an error. Returns what did not match (empty when strict).
  LoadResult load_state_dict(const StateDict& sd, bool strict = true);
  /// Clears (set_to_none) or zeroes the gradients of all parameters.
  void zero_grad(bool set_to_none = true);

  // --- printing ----------------------------------------------------------------
  /// One-line description of this module's own configuration ("3, 64, kernel_size=(7, 7)").
  virtual std::string extra_repr() const { return ""; }
  /// PyTorch-style tree: "ResNet(\n  (conv1): Conv2d(3, 64, ...)\n ...)".
  std::string str() const;

 protected:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  /// Direct children without copying (containers iterate these).
  const NamedModules& children_ref() const { return children_; }

 private:
  void collect(const std::string& prefix, bool recurse, bool params, bool only_persistent,
               NamedTensors& out) const;
  void collect_modules(const std::string& prefix, NamedModules& out) const;
  void for_each_tensor(const std::function<void(Tensor&, bool is_param)>& fn);
  void check_new_name(const std::string& name, const char* what) const;
  std::string str_indented(int indent) const;

  struct Buffer {
    std::string name;
    Tensor tensor;
    bool persistent;
  };

  std::string type_name_;
  bool training_ = true;
  NamedTensors params_;
  std::vector<Buffer> buffers_;
  NamedModules children_;
};

std::ostream& operator<<(std::ostream& os, const Module& m);

}  // namespace dltrain::nn
