// Containers: Sequential (a chain of single-tensor modules), ModuleList and
// ModuleDict (registries the owner iterates itself). Children are named
// "0", "1", ... in Sequential/ModuleList (as PyTorch, so state-dict keys such
// as "downsample.1.running_mean" line up) and by key in ModuleDict.
#pragma once

#include <initializer_list>
#include <map>

#include "dltrain/nn/module.hpp"

namespace dltrain::nn {

/// Runs its children in order, each on the previous one's output.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  /// Appends a module named by its position; returns *this for chaining.
  Sequential& push_back(std::shared_ptr<Module> m);
  /// Appends a module under an explicit name.
  Sequential& push_back(const std::string& name, std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;
  int64_t size() const { return static_cast<int64_t>(children_ref().size()); }
  /// The i-th module (negative counts from the end); throws when out of range.
  std::shared_ptr<Module> operator[](int64_t i) const;
};

/// An indexable list of modules; forward is the owner's business.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  ModuleList(std::initializer_list<std::shared_ptr<Module>> modules);
  ModuleList& push_back(std::shared_ptr<Module> m);
  int64_t size() const { return static_cast<int64_t>(children_ref().size()); }
  std::shared_ptr<Module> operator[](int64_t i) const;
  /// The modules in order.
  std::vector<std::shared_ptr<Module>> modules() const;
};

/// Modules by name, in insertion order.
class ModuleDict : public Module {
 public:
  ModuleDict() : Module("ModuleDict") {}
  ModuleDict& insert(const std::string& key, std::shared_ptr<Module> m);
  bool contains(const std::string& key) const;
  /// The module under `key`; throws naming the keys present when absent.
  std::shared_ptr<Module> operator[](const std::string& key) const { return child(key); }
  int64_t size() const { return static_cast<int64_t>(children_ref().size()); }
  std::vector<std::string> keys() const;
};

}  // namespace dltrain::nn
