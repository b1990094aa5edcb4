// Shared helpers of the optim tests: the golden file written by
// tests/reference/make_optim_reference.py, and exact / tolerant tensor comparisons.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>

#include "dltrain/optim/adam.hpp"
#include "dltrain/optim/clip_grad.hpp"
#include "dltrain/optim/scheduler.hpp"
#include "dltrain/optim/sgd.hpp"
#include "reference_file.hpp"

namespace optim_test {

inline const std::map<std::string, dltrain::Tensor>& ref() {
  static const auto r =
      dltrain::testing::read_reference(DLTRAIN_REFERENCE_DIR "/optim_reference.txt");
  return r;
}

inline bool has_ref(const std::string& name) { return ref().count(name) != 0; }

inline dltrain::Tensor R(const std::string& name) {
  auto it = ref().find(name);
  DLTRAIN_CHECK(it != ref().end(), "no reference tensor '", name, "'");
  return it->second;
}

/// |got - want| <= rtol * |want| + atol elementwise, reporting the worst element.
inline void require_close(const dltrain::Tensor& got, const dltrain::Tensor& want, double rtol,
                          double atol, const std::string& what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  const auto g = got.to(dltrain::DType::f64).to_vector<double>();
  const auto w = want.to(dltrain::DType::f64).to_vector<double>();
  double worst = 0.0;
  size_t at = 0;
  for (size_t k = 0; k < g.size(); ++k) {
    const double excess = std::fabs(g[k] - w[k]) - (rtol * std::fabs(w[k]) + atol);
    if (k == 0 || excess > worst) {
      worst = excess;
      at = k;
    }
  }
  INFO("element " << at << ": got " << (g.empty() ? 0.0 : g[at]) << " want "
                  << (w.empty() ? 0.0 : w[at]));
  REQUIRE((g.empty() || worst <= 0.0));
}

/// Bitwise equality of values (and shapes).
inline void require_equal(const dltrain::Tensor& a, const dltrain::Tensor& b,
                          const std::string& what) {
  INFO(what);
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.to_vector<double>() == b.to_vector<double>());
}

}  // namespace optim_test
