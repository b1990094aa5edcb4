// train::resume_data_position with a OneCycleLR: the cycle's rest stretched to the new number
// of steps (OneCycleLR::rescale_remaining), its learning rates scaled by the rule, and the
// learning rate continuous across the resume; and rescale_remaining's own contract.
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>

#include "dltrain/core/error.hpp"
#include "dltrain/core/tensor.hpp"
#include "dltrain/optim/optimizer.hpp"
#include "dltrain/optim/scheduler.hpp"
#include "dltrain/optim/sgd.hpp"
#include "dltrain/train/resume.hpp"

using namespace dltrain;
using Catch::Contains;

namespace {

std::unique_ptr<optim::SGD> make_sgd() {
  return std::make_unique<optim::SGD>(std::vector<Tensor>{zeros({2}, DType::f64)},
                                      optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
}

}  // namespace

TEST_CASE("OneCycleLR::rescale_remaining keeps the fraction done and the learning rate") {
  auto opt = make_sgd();
  optim::OneCycleLR s(*opt, 1.0, 100);
  for (int i = 0; i < 40; ++i) s.step();
  const double lr_before = s.get_last_lr()[0];
  s.rescale_remaining(2.0);  // 60 steps left -> 120
  CHECK(s.total_steps() - s.last_epoch() == 120);
  CHECK(s.total_steps() == 200);
  CHECK(s.last_epoch() == 80);
  // The next step's rate is the one 0.5 step further on the original cycle: close to before.
  s.step();
  CHECK(std::abs(s.get_last_lr()[0] - lr_before) < 0.02);
  for (int i = 0; i < 118; ++i) s.step();  // to the cycle's last step, 199: the floor
  CHECK(s.get_last_lr()[0] == Approx(1.0 / 25 / 1e4).epsilon(1e-9));
  s.step();  // PyTorch allows one step more
  CHECK_THROWS_WITH(s.step(), Contains("total steps is 200"));

  optim::OneCycleLR shrink(*opt, 1.0, 100);
  for (int i = 0; i < 50; ++i) shrink.step();
  shrink.rescale_remaining(0.5);
  CHECK(shrink.total_steps() - shrink.last_epoch() == 25);
  CHECK_THROWS_WITH(shrink.rescale_remaining(0.0), Contains("positive and finite"));
  CHECK_THROWS_WITH(shrink.rescale_remaining(NAN), Contains("positive and finite"));
}

TEST_CASE("resume_data_position stretches a OneCycleLR and scales its rates") {
  auto opt = make_sgd();
  optim::OneCycleLR s(*opt, 1.0, 100);
  for (int i = 0; i < 20; ++i) s.step();  // in the warm-up, before the peak at step 29
  const double lr_saved = s.get_last_lr()[0];
  // Saved with global batch 128 after 20 steps; resumed with 64 and the linear rule.
  io::TrainingProgress p{.epoch = 0,
                         .step = 20,
                         .batch_in_epoch = 20,
                         .samples_in_epoch = 20 * 128,
                         .global_batch = 128};
  auto r = train::resume_data_position(p, 64, opt.get(), &s,
                                       {.lr_scaling = train::LRScaling::Linear, .print = false});
  CHECK(r.samples_in_epoch == 2560);
  CHECK(r.lr_factor == 0.5);
  CHECK(s.total_steps() - s.last_epoch() == 160);
  CHECK_THAT(r.message, Contains("OneCycleLR's remaining 80 steps -> 160"));
  // The cycle continues from the scaled rate, its peak halved too.
  s.step();
  CHECK(std::abs(s.get_last_lr()[0] - 0.5 * lr_saved) < 0.01);
  double peak = 0;
  for (int i = 0; i < 159; ++i) {
    s.step();
    peak = std::max(peak, s.get_last_lr()[0]);
  }
  CHECK(peak == Approx(0.5).epsilon(1e-6));

  // Without the option the cycle keeps its steps; with the same global batch nothing changes.
  auto opt2 = make_sgd();
  optim::OneCycleLR s2(*opt2, 1.0, 100);
  for (int i = 0; i < 20; ++i) s2.step();
  (void)train::resume_data_position(p, 64, opt2.get(), &s2,
                                    {.print = false, .rescale_one_cycle = false});
  CHECK(s2.total_steps() == 100);
  (void)train::resume_data_position(p, 128, opt2.get(), &s2, {.print = false});
  CHECK(s2.total_steps() == 100);
  CHECK(s2.last_epoch() == 20);
}
