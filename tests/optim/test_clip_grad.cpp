// clip_grad_norm_ and clip_grad_value_ against PyTorch (tests/reference/optim_reference.txt):
// 2-, 1-, 3- and inf-norms, the no-clip case, tensors without gradient, non-finite norms.
#include <limits>

#include "optim_test_util.hpp"

using namespace dltrain;
using namespace dltrain::optim;
using Catch::Contains;
using optim_test::R;

namespace {

struct Params {
  Tensor p1, p2, p3;
  std::vector<Tensor> all() const { return {p1, p2, p3}; }
};

Params with_grads(DType dt = DType::f64) {
  Params p{zeros({3, 4}, dt), zeros({5}, dt), zeros({2}, dt)};
  p.p1.set_grad(R("clip.g1").to(dt).clone());
  p.p2.set_grad(R("clip.g2").to(dt).clone());
  return p;  // p3 has no gradient
}

}  // namespace

TEST_CASE("clip_grad_norm_ matches PyTorch for 2-, 1-, 3- and inf-norms",
          "[optim][clip][reference]") {
  for (const char* tag : {"l2", "inf", "l1", "l3", "noclip"}) {
    SECTION(tag) {
      const std::string pre = std::string("clip.") + tag + ".";
      const double max_norm = R(pre + "max_norm").item<double>();
      double norm_type = R(pre + "norm_type").item<double>();
      if (norm_type < 0) norm_type = std::numeric_limits<double>::infinity();
      Params p = with_grads();
      const Tensor total = clip_grad_norm_(p.all(), max_norm, norm_type);
      CHECK(total.dim() == 0);
      CHECK(total.dtype() == DType::f64);
      optim_test::require_close(total, R(pre + "total"), 1e-12, 0.0, pre + "total");
      optim_test::require_close(p.p1.grad(), R(pre + "g1"), 1e-12, 1e-15, pre + "g1");
      optim_test::require_close(p.p2.grad(), R(pre + "g2"), 1e-12, 1e-15, pre + "g2");
      CHECK_FALSE(p.p3.grad().defined());  // skipped
    }
  }
}

TEST_CASE("clip_grad_norm_ on f32 gradients returns an f32 norm", "[optim][clip]") {
  Params p = with_grads(DType::f32);
  const Tensor total = clip_grad_norm_(p.all(), 1.0);
  CHECK(total.dtype() == DType::f32);
  optim_test::require_close(total, R("clip.l2.total"), 1e-6, 0.0, "f32 total");
  optim_test::require_close(p.p1.grad(), R("clip.l2.g1"), 1e-5, 1e-6, "f32 g1");
}

TEST_CASE("clip_grad_value_ matches PyTorch", "[optim][clip][reference]") {
  Params p = with_grads();
  clip_grad_value_({p.p1, p.p3}, 0.5);
  optim_test::require_close(p.p1.grad(), R("clip.value.g1"), 0.0, 0.0, "clip.value.g1");
  CHECK_FALSE(p.p3.grad().defined());
  // a non-dense gradient goes through the strided path
  Tensor q = zeros({4, 3}, DType::f64);
  q.set_grad(R("clip.g1").clone().t());
  clip_grad_value_({q}, 0.5);
  optim_test::require_close(q.grad().t(), R("clip.value.g1"), 0.0, 0.0, "transposed grad");
  REQUIRE_THROWS_WITH(clip_grad_value_({q}, -1.0), Contains("clip_value"));
}

TEST_CASE("clip_grad_norm_ edge cases", "[optim][clip][errors]") {
  SECTION("no gradients at all: total 0") {
    Tensor a = zeros({3});
    CHECK(clip_grad_norm_({a}, 1.0).item<double>() == 0.0);
  }
  SECTION("non-finite norm raises with error_if_nonfinite, else poisons like PyTorch") {
    Tensor a = zeros({3}, DType::f64);
    a.set_grad(tensor({1.0, std::numeric_limits<double>::infinity(), 2.0}, DType::f64));
    REQUIRE_THROWS_WITH(clip_grad_norm_({a}, 1.0, 2.0, true), Contains("non-finite"));
    CHECK(a.grad().to_vector<double>()[0] == 1.0);  // untouched
    const Tensor total = clip_grad_norm_({a}, 1.0);
    CHECK(std::isinf(total.item<double>()));
    CHECK(a.grad().to_vector<double>()[0] == 0.0);  // scaled by max_norm / inf
  }
  SECTION("bad norm_type") {
    Tensor a = zeros({3}, DType::f64);
    a.set_grad(ones({3}, DType::f64));
    REQUIRE_THROWS_WITH(clip_grad_norm_({a}, 1.0, 0.0), Contains("norm_type"));
    REQUIRE_THROWS_WITH(clip_grad_norm_({a}, 1.0, -2.0), Contains("norm_type"));
  }
  SECTION("large gradient over many chunks") {
    const int64_t n = 200003;
    Tensor a = zeros({n}, DType::f64);
    a.set_grad(full({n}, 0.5, DType::f64));
    const double want = 0.5 * std::sqrt(static_cast<double>(n));
    CHECK(clip_grad_norm_({a}, 1e9).item<double>() == Approx(want).epsilon(1e-13));
    clip_grad_norm_({a}, 1.0);
    CHECK(a.grad().to_vector<double>()[n - 1] == Approx(0.5 / (want + 1e-6)).epsilon(1e-13));
  }
}
