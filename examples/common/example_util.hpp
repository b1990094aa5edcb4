// Helpers shared by the examples: the chronometer's statistics, wall-clock seconds and the
// --device flag's parsing (header-only, no state).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "dltrain/core/device.hpp"

namespace dltrain::examples {

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

/// min / median / mean / std of a list of step times (seconds), the chronometer's summary.
struct Stats {
  double min = 0, median = 0, mean = 0, std = 0;
};
inline Stats stats(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.median = v[v.size() / 2];
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.std += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(s.std / static_cast<double>(v.size()));
  return s;
}

/// "cpu", "cuda" (device 0) or "cuda:N"; throws std::invalid_argument otherwise.
inline Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) return Device::cuda(std::stoi(s.substr(5)));
  throw std::invalid_argument(s);
}

}  // namespace dltrain::examples
