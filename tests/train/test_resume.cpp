// train::resume_data_position with a OneCycleLR: the cycle's rest stretched to the new number
// of steps (OneCycleLR::rescale_remaining), its learning rates scaled by the rule, and the
// learning rate continuous across the resume; and rescale_remaining's own contract. Then the
// other schedulers counted in steps (MultiStepLR, StepLR, cosine, LinearLR, ConstantLR): with
// scheduler_unit = Batch, a run resumed with half the global batch has at every sample the
// learning rate the uninterrupted run had there.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

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

using MakeSched = std::function<std::unique_ptr<optim::LRScheduler>(optim::Optimizer&)>;

// Saved after 20 steps of global batch 128; the progress a checkpoint records.
const io::TrainingProgress kSaved{.epoch = 0,
                                  .step = 20,
                                  .batch_in_epoch = 20,
                                  .samples_in_epoch = 20 * 128,
                                  .global_batch = 128};

// The learning rate after each of `n` steps of an uninterrupted run: lrs[t] at last_epoch t.
std::vector<double> reference(const MakeSched& make, int n) {
  auto opt = make_sgd();
  auto s = make(*opt);
  std::vector<double> lrs{s->get_last_lr()[0]};
  for (int t = 1; t <= n; ++t) {
    s->step();
    lrs.push_back(s->get_last_lr()[0]);
  }
  return lrs;
}

// A run saved after 20 steps of 128 samples and resumed with `global_batch` per step, as
// train::CheckpointFile does (scheduler_unit Batch, learning rate kept): the rate after
// each of its next `n` steps, with the message.
std::vector<double> resumed(const MakeSched& make, int64_t global_batch, int n,
                            std::string* message = nullptr) {
  auto opt = make_sgd();
  auto s = make(*opt);
  for (int t = 0; t < 20; ++t) s->step();
  const auto r =
      train::resume_data_position(kSaved, global_batch, opt.get(), s.get(),
                                  {.print = false, .scheduler_unit = train::SchedulerUnit::Batch});
  if (message) *message = r.message;
  std::vector<double> lrs{s->get_last_lr()[0]};
  for (int j = 1; j <= n; ++j) {
    s->step();
    lrs.push_back(s->get_last_lr()[0]);
  }
  return lrs;
}

// With global batch 64 after the resume, new step j ends at the sample the reference's step
// 20 + j / 2 ended at: the rates there must agree (relative `tol`).
void check_same_per_sample(const MakeSched& make, int ref_steps, double tol) {
  const auto ref = reference(make, 20 + ref_steps);
  const auto got = resumed(make, 64, 2 * ref_steps);
  for (int j = 0; j <= 2 * ref_steps; j += 2) {
    INFO("new step " << j << " <-> reference step " << 20 + j / 2);
    CHECK(got[static_cast<size_t>(j)] == Approx(ref[static_cast<size_t>(20 + j / 2)]).epsilon(tol));
  }
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

TEST_CASE("resume with scheduler_unit Batch: each schedule's rate at each sample is unchanged") {
  SECTION("MultiStepLR: milestones ahead move, past ones stay") {
    const MakeSched make = [](optim::Optimizer& o) {
      return std::make_unique<optim::MultiStepLR>(o, std::vector<int64_t>{10, 30, 50}, 0.5);
    };
    check_same_per_sample(make, 60, 1e-15);
    std::string msg;
    (void)resumed(make, 64, 0, &msg);
    CHECK_THAT(msg, Contains("MultiStepLR's milestones 30, 50 -> 40, 80 (the same samples)"));
    // 128 -> 96: 4/3 the steps, rounded per milestone.
    (void)resumed(make, 96, 0, &msg);
    CHECK_THAT(msg, Contains("milestones 30, 50 -> 33, 60"));
  }
  SECTION("StepLR: the next decay and the period convert") {
    const MakeSched make = [](optim::Optimizer& o) {
      return std::make_unique<optim::StepLR>(o, 15, 0.5);
    };
    check_same_per_sample(make, 60, 1e-15);
    // 128 -> 96: decays due at reference steps 30, 45, 60 (13.3, 33.3, 53.3 new steps away)
    // come after 13, 33 and 53 new steps.
    std::string msg;
    const auto lrs = resumed(make, 96, 60, &msg);
    CHECK_THAT(msg, Contains("StepLR's step_size 15 -> 20, next decay in 10 steps -> 13"));
    for (int j = 0; j <= 60; ++j) {
      const int decays = 1 + (j >= 13) + (j >= 33) + (j >= 53);
      INFO("new step " << j);
      CHECK(lrs[static_cast<size_t>(j)] == Approx(0.1 * std::pow(0.5, decays)).epsilon(1e-15));
    }
  }
  SECTION("CosineAnnealingLR: T_max - last_epoch stretched, ends at eta_min") {
    const MakeSched make = [](optim::Optimizer& o) {
      return std::make_unique<optim::CosineAnnealingLR>(o, 100, 0.001);
    };
    check_same_per_sample(make, 80, 1e-9);
    std::string msg;
    const auto lrs = resumed(make, 64, 160, &msg);
    CHECK_THAT(msg, Contains("CosineAnnealingLR's remaining 80 steps -> 160"));
    CHECK(lrs[160] == Approx(0.001).epsilon(1e-9));
  }
  SECTION("LinearLR warmup under way, and ConstantLR's end") {
    const MakeSched linear = [](optim::Optimizer& o) {
      return std::make_unique<optim::LinearLR>(o, 0.1, 1.0, 50);
    };
    check_same_per_sample(linear, 40, 1e-12);
    const MakeSched constant = [](optim::Optimizer& o) {
      return std::make_unique<optim::ConstantLR>(o, 0.25, 30);
    };
    check_same_per_sample(constant, 20, 1e-15);
    std::string msg;
    (void)resumed(constant, 64, 0, &msg);
    CHECK_THAT(msg, Contains("ConstantLR's total_iters 30 -> 40"));
  }
  SECTION("the converted schedule is what the next checkpoint saves") {
    auto opt = make_sgd();
    optim::MultiStepLR s(*opt, {30, 50}, 0.5);
    for (int t = 0; t < 20; ++t) s.step();
    (void)train::resume_data_position(
        kSaved, 64, opt.get(), &s, {.print = false, .scheduler_unit = train::SchedulerUnit::Batch});
    const StateDict sd = s.state_dict();
    CHECK(sd.at("milestones").to_vector<int64_t>() == std::vector<int64_t>{40, 80});
    auto opt2 = make_sgd();
    optim::MultiStepLR loaded(*opt2, {30, 50}, 0.5);
    loaded.load_state_dict(sd);
    for (int t = 0; t < 70; ++t) {
      s.step();
      loaded.step();
    }
    CHECK(loaded.get_last_lr()[0] == s.get_last_lr()[0]);
    CHECK(s.get_last_lr()[0] == Approx(0.1 * 0.25).epsilon(1e-15));
  }
}

TEST_CASE("resume: step counts stay with scheduler_unit Epoch and Auto, and the message says so") {
  auto opt = make_sgd();
  optim::MultiStepLR ms(*opt, {30, 50}, 0.5);
  for (int t = 0; t < 20; ++t) ms.step();
  auto r = train::resume_data_position(kSaved, 64, opt.get(), &ms, {.print = false});
  CHECK(ms.state_dict().at("milestones").to_vector<int64_t>() == std::vector<int64_t>{30, 50});
  CHECK_THAT(r.message, Contains("MultiStepLR's step counts, such as milestones, are left as they "
                                 "are: right when it steps once per epoch; pass scheduler_unit "
                                 "= Batch"));
  r = train::resume_data_position(kSaved, 64, opt.get(), &ms,
                                  {.print = false, .scheduler_unit = train::SchedulerUnit::Epoch});
  CHECK(ms.state_dict().at("milestones").to_vector<int64_t>() == std::vector<int64_t>{30, 50});

  // Epoch leaves even a OneCycleLR alone (one stepped per epoch: an epoch's samples stay).
  auto opt2 = make_sgd();
  optim::OneCycleLR oc(*opt2, 1.0, 100);
  for (int t = 0; t < 20; ++t) oc.step();
  (void)train::resume_data_position(
      kSaved, 64, opt2.get(), &oc, {.print = false, .scheduler_unit = train::SchedulerUnit::Epoch});
  CHECK(oc.total_steps() == 100);
  CHECK(oc.last_epoch() == 20);

  // A function of the step has nothing to convert: said, not silently skipped.
  auto opt3 = make_sgd();
  optim::LambdaLR lam(*opt3, [](int64_t t) { return 1.0 / (1.0 + static_cast<double>(t)); });
  r = train::resume_data_position(kSaved, 64, opt3.get(), &lam,
                                  {.print = false, .scheduler_unit = train::SchedulerUnit::Batch});
  CHECK_THAT(r.message, Contains("LambdaLR's steps cannot be converted"));
  CHECK_THROWS_WITH(lam.rescale_remaining(-1.0), Contains("positive and finite"));
  CHECK_THROWS_WITH(ms.rescale_remaining(INFINITY), Contains("positive and finite"));
}
