// The keys of an optimizer state dict (optim/optimizer.hpp), for code that renumbers or reshapes
// its entries without an optimizer of the same shape at hand (the pipeline's and the tensor-
// parallel model's gathered checkpoints): "state.<i>.<name>" for parameter i's state,
// "param_groups.<k>.params" (the group's flat indices) and "param_groups.<k>.<field>", "type".
#pragma once

#include <cstdint>
#include <string>

#include "dltrain/core/state_dict.hpp"

namespace dltrain::optim::detail {

inline const std::string kStatePrefix = "state.", kGroupPrefix = "param_groups.";

/// "param_groups.<k>.<field>".
inline std::string group_key(size_t k, const std::string& field) {
  return kGroupPrefix + std::to_string(k) + "." + field;
}

/// The number of parameter groups of an optimizer state dict.
inline size_t count_groups(const StateDict& d) {
  size_t k = 0;
  while (d.contains(group_key(k, "params"))) ++k;
  return k;
}

/// Splits "state.<i>.<rest>" into i and rest; false for any other key.
inline bool parse_state_key(const std::string& key, int64_t& index, std::string& rest) {
  if (key.rfind(kStatePrefix, 0) != 0) return false;
  const size_t dot = key.find('.', kStatePrefix.size());
  if (dot == std::string::npos || dot == kStatePrefix.size()) return false;
  const std::string num = key.substr(kStatePrefix.size(), dot - kStatePrefix.size());
  if (num.find_first_not_of("0123456789") != std::string::npos) return false;
  index = std::stoll(num);
  rest = key.substr(dot + 1);
  return true;
}

/// "param_groups.<k>.params".
inline bool is_group_params(const std::string& key) {
  return key.rfind(kGroupPrefix, 0) == 0 && key.size() > 7 &&
         key.compare(key.size() - 7, 7, ".params") == 0;
}

}  // namespace dltrain::optim::detail
