// train::TrainStep, ProfileWindow, EpochTally and evaluate_classifier (dltrain/train/loop.hpp):
// the step does exactly what a hand-written loop does (bitwise), accumulation steps once per
// cycle with the cycle's mean gradient, the callbacks see every batch, the profiler window
// writes its trace, evaluation counts what the ops count, and misuse is refused by name.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <tuple>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "dltrain/train/loop.hpp"

using namespace dltrain;

namespace {

struct Run {
  int seeded = (default_generator().manual_seed(11), 0);
  std::shared_ptr<nn::Linear> model = std::make_shared<nn::Linear>(3, 2);
  optim::SGD opt{model->parameters(), {.lr = 0.05, .momentum = 0.9}};
  amp::GradScaler scaler{{.enabled = false}};
};

// 14 samples of 3 features: batches of 2 give 7 batches per epoch.
data::DataLoader make_loader() {
  Tensor x = mul(arange(42, DType::f32).reshape({14, 3}), 0.1);
  Tensor y = zeros({14}, DType::i64);
  for (int64_t i = 0; i < 14; ++i) y.data<int64_t>()[i] = (i * 7) % 2;
  return data::DataLoader(std::make_shared<data::TensorDataset>(x, y), {.batch_size = 2});
}

bool same(const nn::Linear& a, const nn::Linear& b) {
  return allclose(a.weight, b.weight, 0, 0) && allclose(a.bias, b.bias, 0, 0);
}

}  // namespace

TEST_CASE("TrainStep: one batch per step equals the hand-written loop, bit for bit",
          "[train][loop]") {
  data::DataLoader loader = make_loader();
  Run hand;
  optim::StepLR hand_sched{hand.opt, 3, 0.5};
  for (int epoch = 0; epoch < 2; ++epoch)
    for (const data::Batch& b : loader) {
      hand.opt.zero_grad();
      cross_entropy(hand.model->forward(b.data), b.target).backward();
      hand.opt.step();
      hand_sched.step();
    }

  Run r;
  optim::StepLR sched{r.opt, 3, 0.5};
  train::Chronometer chrono;
  std::vector<std::tuple<int64_t, double, double>> seen;
  train::TrainStep step(
      r.opt, r.scaler,
      {.scheduler = &sched,
       .first_step = 4,
       .chronometer = &chrono,
       .on_step = [&](int64_t s, double loss, double lr) { seen.emplace_back(s, loss, lr); }});
  double loss_sum = 0;
  for (int epoch = 0; epoch < 2; ++epoch) {
    step.begin_epoch(*r.model, epoch);
    loss_sum = 0;
    for (const data::Batch& b : loader) {
      step.data_ready();
      loss_sum +=
          step.run(b.size(), [&] { return cross_entropy(r.model->forward(b.data), b.target); });
      step.begin();
    }
    const train::EpochTally& t = step.end_epoch();
    CHECK(t.batches == 7);
    CHECK(t.samples == 14);
    CHECK(t.loss_sum == loss_sum);
    CHECK(t.mean_loss() == loss_sum / 7);
    CHECK(t.seconds > 0);
    CHECK(t.throughput() == 14 / t.seconds);
  }
  CHECK(same(*r.model, *hand.model));
  CHECK(step.step() == 4 + 14);  // counted on from first_step
  REQUIRE(seen.size() == 14);
  CHECK(std::get<0>(seen.front()) == 5);
  CHECK(std::get<0>(seen.back()) == 18);
  // The learning rate shown is the scheduler's after the step: 0.05 halved every 3 steps.
  CHECK(std::get<2>(seen[1]) == 0.05);
  CHECK(std::get<2>(seen[2]) == 0.025);
  CHECK(step.learning_rate() == sched.get_last_lr()[0]);
  CHECK(chrono.step_times().size() == 14);
}

TEST_CASE("TrainStep: accumulation steps once per cycle with the cycle's mean gradient",
          "[train][loop]") {
  // 7 batches with k = 3: cycles of 3, 3 and the epoch's last batch alone. By hand: each
  // batch's loss divided by its cycle's length, gradients summed, one step per cycle.
  data::DataLoader loader = make_loader();
  Run hand;
  {
    const std::vector<int> cycle_of = {3, 3, 3, 3, 3, 3, 1};
    int i = 0, in_cycle = 0;
    for (const data::Batch& b : loader) {
      if (in_cycle == 0) hand.opt.zero_grad();
      const Tensor loss = cross_entropy(hand.model->forward(b.data), b.target);
      (cycle_of[i] > 1 ? div(loss, static_cast<double>(cycle_of[i])) : loss).backward();
      if (++in_cycle == cycle_of[i]) {
        hand.opt.step();
        in_cycle = 0;
      }
      ++i;
    }
  }
  Run r;
  int no_sync_calls = 0;
  train::TrainStep step(r.opt, r.scaler);
  step.set_accumulation(3, loader.size(), [&](const std::function<void()>& backward) {
    ++no_sync_calls;
    backward();
  });
  step.begin_epoch(*r.model, 0);
  std::vector<bool> boundary;
  for (const data::Batch& b : loader) {
    step.run(b.size(), [&] { return cross_entropy(r.model->forward(b.data), b.target); });
    boundary.push_back(step.at_boundary());
  }
  step.end_epoch();
  CHECK(step.step() == 3);
  CHECK(no_sync_calls == 4);  // the first two batches of each full cycle
  CHECK(boundary == std::vector<bool>{false, false, true, false, false, true, true});
  CHECK(same(*r.model, *hand.model));
}

TEST_CASE("TrainStep: misuse is refused by name", "[train][loop]") {
  data::DataLoader loader = make_loader();
  Run r;
  train::TrainStep step(r.opt, r.scaler);
  CHECK_THROWS_WITH(step.set_accumulation(2, 0),
                    Catch::Contains("needs the loader's batches per epoch"));
  step.set_accumulation(4, loader.size());
  step.begin_epoch(*r.model, 0);
  int n = 0;
  for (const data::Batch& b : loader) {
    step.run(b.size(), [&] { return cross_entropy(r.model->forward(b.data), b.target); });
    if (++n == 2) break;
  }
  CHECK_THROWS_WITH(step.end_epoch(), Catch::Contains("inside a cycle of accumulated gradients"));
  CHECK_THROWS_WITH(train::TrainStep(r.opt, r.scaler, {.first_step = -1}),
                    Catch::Contains("first_step"));
  // Without a scheduler the learning rate is the first group's.
  CHECK(step.learning_rate() == 0.05);
}

TEST_CASE("ProfileWindow: profiles the steps after warm-up and writes the trace once",
          "[train][loop]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("dltrain_loop_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "trace.json").string();
  CHECK_THROWS_WITH(train::ProfileWindow({.path = (dir / "trace.txt").string()}),
                    Catch::Contains("must end in .json"));
  CHECK_THROWS_WITH(train::ProfileWindow({.steps = 0}), Catch::Contains("steps must be > 0"));

  data::DataLoader loader = make_loader();
  Run r;
  train::ProfileWindow window({.path = path, .steps = 2, .warmup = 3});
  train::ProfileWindow off({.path = (dir / "never.json").string(), .enabled = false});
  train::TrainStep step(r.opt, r.scaler, {.profiler = &window});
  step.begin_epoch(*r.model, 0);
  int n = 0;
  for (const data::Batch& b : loader) {
    off.begin_step();
    step.run(b.size(), [&] { return cross_entropy(r.model->forward(b.data), b.target); });
    off.end_step();
    // Written when the fifth step (3 warm-up + 2 profiled) ends, not before.
    CHECK(window.written() == (++n >= 5));
    step.begin();
  }
  step.end_epoch();
  REQUIRE(std::filesystem::exists(path));
  CHECK(std::filesystem::file_size(path) > 0);
  CHECK_FALSE(off.written());
  CHECK_FALSE(std::filesystem::exists(dir / "never.json"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("evaluate_classifier: the summed loss and the hits the ops give, in eval mode",
          "[train][loop]") {
  data::DataLoader loader = make_loader();
  Run r;
  r.model->train();
  Tensor x = mul(arange(42, DType::f32).reshape({14, 3}), 0.1);
  Tensor y = zeros({14}, DType::i64);
  for (int64_t i = 0; i < 14; ++i) y.data<int64_t>()[i] = (i * 7) % 2;
  const train::ClassifierFigures f = train::evaluate_classifier(*r.model, loader);
  CHECK_FALSE(r.model->is_training());
  CHECK(f.count == 14);
  Tensor logits;
  {
    NoGradGuard ng;
    logits = r.model->forward(x);
  }
  CrossEntropyOptions o;
  o.reduction = Reduction::Sum;
  // Summed per batch of 2 in f32, then in f64: within 7 additions of the f32 total's rounding.
  const double whole = cross_entropy(logits, y, o).item<double>();
  CHECK(std::abs(f.loss_sum - whole) <= 8 * std::ldexp(std::abs(whole), -23));
  const auto hits =
      static_cast<int64_t>(sum(eq(argmax(logits, 1), y).to(DType::i64)).item<double>());
  CHECK(f.correct == hits);
  CHECK(f.accuracy() == 100.0 * static_cast<double>(hits) / 14);
  CHECK(f.loss() == f.loss_sum / 14);
  CHECK(std::isnan(train::ClassifierFigures{}.accuracy()));

  // A model whose output is not [batch, classes] logits is refused by name.
  auto flat = std::make_shared<nn::Flatten>(0);
  CHECK_THROWS_WITH(train::evaluate_classifier(*flat, loader),
                    Catch::Contains("[batch, classes] logits"));
}
