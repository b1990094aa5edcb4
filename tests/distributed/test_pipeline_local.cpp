// Pipeline, RankLayout and sub-groups in a world of one (the local group): one stage holding
// the whole model, whose micro-batch gradients must add up to the full batch's; what must hold
// whatever the number of ranks. Multi-rank pipelines are tested under mpirun in tests/mpi.
#include <catch2/catch.hpp>

#include "dltrain/dltrain.hpp"

using namespace dltrain;
using namespace dltrain::distributed;

namespace {

std::shared_ptr<nn::Sequential> mlp(uint64_t seed) {
  manual_seed(seed);
  const TensorOptions f64(DType::f64);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(3, 5, true, f64))
      .push_back(std::make_shared<nn::Tanh>())
      .push_back(std::make_shared<nn::Linear>(5, 2, true, f64));
  return m;
}

}  // namespace

TEST_CASE("Pipeline of one stage: micro-batch gradients add up to the full batch's",
          "[distributed][pipeline]") {
  auto local = new_local_group(std::chrono::seconds(10));
  for (auto schedule : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB}) {
    auto ref = mlp(4);
    Pipeline pipe(mlp(4), {.group = local.get(), .micro_batches = 3, .schedule = schedule});
    CHECK(pipe.boundaries() == std::vector<int64_t>{0, 3});
    Generator gen(2);
    Tensor x = randn({7, 3}, DType::f64, &gen), y = randn({7, 2}, DType::f64, &gen);  // 2, 2, 3
    Tensor l = mse_loss((*ref)(x), y);
    l.backward();
    const double pl = pipe.forward_backward(
        x, y, [](const Tensor& o, const Tensor& t) { return mse_loss(o, t); });
    // Rounding only: ~7 terms of O(1) per gradient element, a few ulps each.
    CHECK(std::abs(pl - l.item<double>()) <= 1e-14);
    const auto want = ref->named_parameters();
    const auto got = pipe.stage_module().named_parameters();
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      CHECK(got[i].first == want[i].first);
      CHECK(max(abs(sub(got[i].second.grad(), want[i].second.grad()))).item<double>() <= 1e-14);
    }
    // One stage stores every micro-batch under either schedule (p - s = 1 for 1F1B).
    CHECK(pipe.peak_stored_activations() == (schedule == PipelineSchedule::GPipe ? 3 : 1));
    CHECK(pipe.full_state_dict().keys() == ref->state_dict().keys());
  }
}

TEST_CASE("sub-groups and RankLayout of a world of one", "[distributed][pipeline]") {
  auto local = new_local_group(std::chrono::seconds(10));
  auto g = new_group({0}, local.get());
  REQUIRE(g);
  CHECK(g->size() == 1);
  CHECK(local->split(-1, 0) == nullptr);
  CHECK_THROWS_WITH(new_group({1}, local.get()), Catch::Contains("is not a rank of the parent"));
  RankLayout layout({.parent = local.get(), .print = false});
  CHECK(layout.pipeline_size() == 1);
  CHECK(layout.data_size() == 1);
  CHECK(layout.pipeline_group().size() == 1);
  CHECK_THROWS_WITH(RankLayout({.pipeline = 2, .parent = local.get()}),
                    Catch::Contains("1 ranks cannot be divided"));
  CHECK_THROWS_WITH(local->send(zeros({1}), 0, 0), Catch::Contains("no peer"));
}
