// JSON helpers shared by the train/ sources (private): numbers that are not finite become null
// (JSON has no NaN or infinity), and text that is not valid UTF-8 is replaced rather than
// throwing from inside a training loop.
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

namespace dltrain::train {

/// `v` as a JSON number, or null when it is NaN or infinite.
inline nlohmann::json json_number(double v) {
  if (!std::isfinite(v)) return nullptr;
  return v;
}

/// "nan", "inf" or "-inf" for a non-finite `v` (what a null stands for), "" otherwise.
inline const char* nonfinite_name(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return "";
}

/// Compact one-line text; invalid UTF-8 in strings is replaced by U+FFFD.
inline std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace dltrain::train
