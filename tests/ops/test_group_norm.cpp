// group_norm / nn::GroupNorm and instance_norm / nn::InstanceNorm2d: PyTorch's values,
// gradients and running-statistics updates (research_reference.txt) in f64 and f32, NCHW and
// channels-last; f64 gradchecks; 16-bit inputs; the modules in training and eval; errors.
#include <catch2/catch.hpp>

#include "gradcheck.hpp"
#include "reference_file.hpp"

using namespace dltrain;
using Catch::Contains;
using dltrain::testing::gradcheck;
using dltrain::testing::leaf;
using V = std::vector<Tensor>;

namespace {

const char* const kResearchReference = DLTRAIN_REFERENCE_DIR "/research_reference.txt";
Tensor R(const std::string& name) {
  return dltrain::testing::reference_tensor(kResearchReference, name);
}
Tensor fresh(const std::string& name, DType dt, MemoryFormat fmt = MemoryFormat::Contiguous) {
  Tensor t = R(name).to(dt).clone().contiguous(fmt).detach();
  t.requires_grad_();
  return t;
}

}  // namespace

TEST_CASE("group_norm and instance_norm match PyTorch", "[ops][norm][group_norm]") {
  for (DType dt : {DType::f64, DType::f32})
    for (MemoryFormat fmt : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
      INFO("dtype " << dt << " channels-last " << (fmt == MemoryFormat::ChannelsLast));
      const double tol = dt == DType::f64 ? 1e-10 : 1e-4;
      Tensor x = fresh("group_norm.x", dt, fmt), w = fresh("group_norm.w", dt),
             b = fresh("group_norm.b", dt);
      Tensor y = group_norm(x, 3, w, b);
      CHECK(y.suggest_memory_format() == fmt);
      CHECK(allclose(y.to(DType::f64), R("group_norm.y"), tol, tol));
      y.backward(R("group_norm.gy").to(dt));
      CHECK(allclose(x.grad().to(DType::f64), R("group_norm.gx"), tol, tol));
      CHECK(allclose(w.grad().to(DType::f64), R("group_norm.gw"), tol, tol));
      CHECK(allclose(b.grad().to(DType::f64), R("group_norm.gb"), tol, tol));

      Tensor xi = fresh("instance_norm.x", dt, fmt), wi = fresh("instance_norm.w", dt),
             bi = fresh("instance_norm.b", dt);
      Tensor rm = R("instance_norm.running_mean_in").to(dt).clone();
      Tensor rv = R("instance_norm.running_var_in").to(dt).clone();
      Tensor yi = instance_norm(xi, rm, rv, wi, bi, true, 0.2);
      CHECK(allclose(yi.to(DType::f64), R("instance_norm.y"), tol, tol));
      CHECK(allclose(rm.to(DType::f64), R("instance_norm.running_mean_out"), tol, tol));
      CHECK(allclose(rv.to(DType::f64), R("instance_norm.running_var_out"), tol, tol));
      yi.backward(R("instance_norm.gy").to(dt));
      CHECK(allclose(xi.grad().to(DType::f64), R("instance_norm.gx"), tol, tol));
      CHECK(allclose(wi.grad().to(DType::f64), R("instance_norm.gw"), tol, tol));
      CHECK(allclose(bi.grad().to(DType::f64), R("instance_norm.gb"), tol, tol));
      Tensor ye = instance_norm(R("instance_norm_eval.x").to(dt), rm, rv, {}, {}, false);
      CHECK(allclose(ye.to(DType::f64), R("instance_norm_eval.y"), tol, tol));
    }
}

TEST_CASE("group_norm and instance_norm gradients", "[ops][norm][group_norm][grad]") {
  gradcheck([](const V& v) { return group_norm(v[0], 2, v[1], v[2]); },
            {leaf({2, 4, 3, 2}, 1), leaf({4}, 2), leaf({4}, 3)});
  gradcheck([](const V& v) { return group_norm(v[0], 1); }, {leaf({3, 2, 5}, 4)});
  gradcheck([](const V& v) { return instance_norm(v[0], {}, {}, v[1], v[2]); },
            {leaf({2, 3, 2, 3}, 5), leaf({3}, 6), leaf({3}, 7)});
  Tensor c = randn({2, 4, 3, 3}, DType::f64).contiguous(MemoryFormat::ChannelsLast);
  c.requires_grad_();
  gradcheck([](const V& v) { return group_norm(v[0], 4); }, {c});
  CHECK(c.grad().suggest_memory_format() == MemoryFormat::ChannelsLast);
}

TEST_CASE("GroupNorm and InstanceNorm2d modules", "[ops][norm][group_norm][nn]") {
  nn::GroupNorm gn(2, 6);
  CHECK(gn.weight.shape() == Shape{6});
  CHECK(gn.extra_repr() == "2, 6, eps=1e-05, affine=True");
  Tensor x = randn({3, 6, 4, 4});
  CHECK(allclose(gn.forward(x), group_norm(x, 2), 1e-6, 1e-6));
  // f16 input: statistics in f32, output f16.
  Tensor h = gn.forward(x.to(DType::f16));
  CHECK(h.dtype() == DType::f16);
  CHECK(allclose(h.to(DType::f32), group_norm(x, 2), 1e-2, 1e-2));

  nn::InstanceNorm2d in(6);
  CHECK(in.named_parameters().empty());
  CHECK(in.named_buffers().empty());
  CHECK(in.extra_repr() == "6, eps=1e-05, momentum=0.1, affine=False, track_running_stats=False");
  CHECK(allclose(in.forward(x), group_norm(x, 6), 1e-6, 1e-6));

  nn::InstanceNorm2d tracked(6, {.affine = true, .track_running_stats = true});
  CHECK(tracked.named_buffers().size() == 3);
  tracked.forward(x);
  CHECK(tracked.num_batches_tracked.item<int64_t>() == 1);
  CHECK_FALSE(allclose(tracked.running_mean, zeros({6})));
  tracked.eval();
  const Tensor rm = tracked.running_mean.view({1, 6, 1, 1}),
               rv = tracked.running_var.view({1, 6, 1, 1});
  CHECK(allclose(tracked.forward(x), div(sub(x, rm), sqrt(add(rv, 1e-5))), 1e-5, 1e-5));
  CHECK(tracked.num_batches_tracked.item<int64_t>() == 1);
}

TEST_CASE("group_norm errors", "[ops][norm][group_norm][errors]") {
  CHECK_THROWS_WITH(group_norm(randn({2, 6, 3}), 4), Contains("not divisible by num_groups (4)"));
  CHECK_THROWS_WITH(group_norm(randn({2, 6, 3}), 3, randn({5})), Contains("weight must be [6]"));
  CHECK_THROWS_WITH(instance_norm(randn({2, 6})), Contains("expected an input [N, C, *]"));
  CHECK_THROWS_WITH(instance_norm(randn({2, 6, 3}), {}, {}, {}, {}, false),
                    Contains("needs running statistics"));
  CHECK_THROWS_WITH(nn::GroupNorm(4, 6), Contains("must be divisible by num_groups"));
  CHECK_THROWS_WITH(nn::InstanceNorm2d(3).forward(randn({2, 4, 3, 3})),
                    Contains("expected an input [N, 3, H, W]"));
}
