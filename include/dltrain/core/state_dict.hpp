// StateDict: named tensors in insertion order.
//
// The one currency of saved state: a module's parameters and buffers, an
// optimizer's per-parameter buffers and hyper-parameters, a scheduler's
// position. Everything is a tensor (scalars are 0-d tensors), so one writer
// (HDF5 checkpoints, safetensors) stores all of it. Names are unique; insert()
// of an existing name replaces its tensor in place, keeping the order.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dltrain/core/tensor.hpp"

namespace dltrain {

/// Ordered (name, tensor) pairs with unique names.
class StateDict {
 public:
  using Item = std::pair<std::string, Tensor>;

  /// Adds `t` under `name`, or replaces the tensor already there.
  void insert(const std::string& name, const Tensor& t);
  /// Adds a 0-d tensor holding `value` (f64, or i64 when `integer`).
  void insert_scalar(const std::string& name, double value, bool integer = false);
  bool contains(const std::string& name) const;
  /// The tensor named `name`; throws dltrain::Error naming the missing key (and `context`).
  const Tensor& at(const std::string& name, const char* context = "StateDict") const;
  /// The value of the one-element tensor named `name`.
  double scalar(const std::string& name, const char* context = "StateDict") const;
  /// Removes `name` if present; returns whether it was.
  bool erase(const std::string& name);
  /// Names in order.
  std::vector<std::string> keys() const;
  /// Items whose names start with `prefix`, with the prefix removed.
  StateDict sub(const std::string& prefix) const;
  /// Adds every item of `other` with `prefix` in front of its name.
  void merge(const StateDict& other, const std::string& prefix = "");

  int64_t size() const { return static_cast<int64_t>(items_.size()); }
  bool empty() const { return items_.empty(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }
  const std::vector<Item>& items() const { return items_; }

 private:
  std::vector<Item> items_;
};

}  // namespace dltrain
