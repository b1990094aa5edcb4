// Helpers shared by the GPU tests: the device, dtype naming, the CPU reference dtype, fresh
// leaves, and one element-wise comparison that reports the worst element.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "dltrain/dltrain.hpp"

namespace dltrain::test {

inline const Device kCuda = Device::cuda(0);

/// The dtype the CPU reference computes in: f32 for the 16-bit floats, else dt.
inline DType ref_dtype(DType dt) { return dt == DType::f16 || dt == DType::bf16 ? DType::f32 : dt; }

inline std::string dt_str(DType dt) {
  std::ostringstream os;
  os << dt;
  return os.str();
}

/// A fresh leaf that requires grad: t's values in dt on dev (t itself is left untouched).
inline Tensor leaf(const Tensor& t, DType dt, Device dev) {
  Tensor r = t.detach().to(dt).to(dev).detach();
  r.requires_grad_();
  return r;
}

/// Checks |got - want| <= atol + rtol * |want| + norm * max|want| element by element (NaN
/// matches NaN, equal infinities match; max|want| over the finite values) and reports the
/// worst element. Integer `want`: exact equality. `norm` bounds errors relative to the
/// largest value (results summed from rounded terms, GEMMs, convolutions).
inline void check_close(const Tensor& got, const Tensor& want, double rtol, double atol,
                        const std::string& what, double norm = 0) {
  INFO(what);
  REQUIRE(got.defined());
  REQUIRE(want.defined());
  REQUIRE(got.shape() == want.shape());
  if (!is_floating(want.dtype())) {
    REQUIRE(got.to_vector<int64_t>() == want.to_vector<int64_t>());
    return;
  }
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  double max_abs = 0;
  for (double v : w)
    if (std::isfinite(v)) max_abs = std::max(max_abs, std::abs(v));
  atol += norm * max_abs;
  double worst = 0;
  size_t at = 0;
  bool ok = true;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] == w[i] || (std::isnan(g[i]) && std::isnan(w[i]))) continue;
    const double excess = std::abs(g[i] - w[i]) - (atol + rtol * std::abs(w[i]));
    if (!(excess <= 0)) {
      if (ok || excess > worst || std::isnan(excess)) {
        worst = excess;
        at = i;
      }
      ok = false;
    }
  }
  std::ostringstream msg;
  if (!ok)
    msg << "element " << at << " of " << g.size() << ": got " << g[at] << " on CUDA, want " << w[at]
        << " (bound " << atol + rtol * std::abs(w[at]) << ")";
  INFO(msg.str());
  CHECK(ok);
}

/// Sets TF32 for f32 matmul and convolution (cuda::set_allow_tf32) for a scope and restores the
/// previous setting: off where CUDA and the CPU must agree to f32 rounding (TF32 rounds the
/// products' inputs to 10 mantissa bits), on where the TF32 path itself is tested.
class Tf32 {
 public:
  explicit Tf32(bool on) : prev_(cuda::allow_tf32()) { cuda::set_allow_tf32(on); }
  ~Tf32() { cuda::set_allow_tf32(prev_); }
  Tf32(const Tf32&) = delete;
  Tf32& operator=(const Tf32&) = delete;

 private:
  bool prev_;
};

}  // namespace dltrain::test
