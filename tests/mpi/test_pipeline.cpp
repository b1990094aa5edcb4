// distributed::Pipeline and RankLayout on 2, 3 (an uneven split) and 4 ranks: both schedules
// train an 8-block MLP for 20 SGD steps to the same weights as one process on the full batch,
// in f64; 1F1B stores at most min(p - s, m) micro-batches per stage and GPipe m; the gathered
// state dict loads into a single-process model; 4 ranks run 2 stages x 2 data-parallel
// replicas; a checkpoint of the pipeline's model and AdamW state (two parameter groups) is a
// single process's, which loads it, and the pipeline resumes from it on another cut.
//
// Tolerance: the pipeline computes the same operations as one process except that the batch
// sums of the weight gradients are split into per-micro-batch partial sums (and each
// micro-batch's mean is rescaled by b_j / B), which changes only the rounding: a few ulps of
// each gradient element per step (|terms| ~ 1, 12 rows: ~12 * 2^-53 ~ 1e-15). Twenty SGD steps
// with lr 0.1 and momentum 0.9 carry at most ~20 * 10 such errors into the weights (the
// momentum sum 1 / (1 - 0.9) = 10), ~1e-13 at worst; 1e-12 is that with a margin.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dltrain/dltrain.hpp"

using namespace dltrain;
using namespace dltrain::distributed;

namespace {

constexpr double kTol = 1e-12;

// 8 blocks: Linear(4, 6) + Tanh, 6 x (Linear(6, 6) + Tanh), Linear(6, 3).
std::shared_ptr<nn::Sequential> mlp(uint64_t seed) {
  manual_seed(seed);
  const TensorOptions f64(DType::f64);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(nn::sequential(
      {std::make_shared<nn::Linear>(4, 6, true, f64), std::make_shared<nn::Tanh>()}));
  for (int i = 0; i < 6; ++i)
    m->push_back(nn::sequential(
        {std::make_shared<nn::Linear>(6, 6, true, f64), std::make_shared<nn::Tanh>()}));
  m->push_back(std::make_shared<nn::Linear>(6, 3, true, f64));
  return m;
}

double max_diff(const Tensor& a, const Tensor& b) {
  return max(abs(sub(a.detach(), b.detach()))).item<double>();
}

Tensor mse(const Tensor& out, const Tensor& target) { return mse_loss(out, target); }

// One optimizer step of the single process `ref` and of `pipe` on the batch (x, y); returns
// the difference of the two losses.
double step_both(nn::Module& ref, optim::Optimizer& ref_opt, Pipeline& pipe, optim::Optimizer& opt,
                 const Tensor& x, const Tensor& y) {
  ref_opt.zero_grad();
  const Tensor l = mse_loss(ref.forward(x), y);
  l.backward();
  ref_opt.step();
  opt.zero_grad();
  const double pl = pipe.forward_backward(x, y, mse);
  opt.step();
  return std::abs(pl - l.item<double>());
}

}  // namespace

TEST_CASE("Pipeline: GPipe and 1F1B match one process for 20 SGD steps (f64)", "[mpi][pipeline]") {
  ProcessGroup& g = default_group();
  const int p = g.size();
  struct Case {
    PipelineSchedule schedule;
    int micro_batches;
    bool explicit_cuts;
  };
  for (const Case c : {Case{PipelineSchedule::GPipe, 4, false},
                       Case{PipelineSchedule::OneFOneB, 5, false},  // 12 rows: 2,2,3,2,3
                       Case{PipelineSchedule::OneFOneB, 2, true},   // m < p on 3 ranks
                       Case{PipelineSchedule::GPipe, 3, true}}) {
    INFO("schedule " << schedule_name(c.schedule) << ", " << c.micro_batches
                     << " micro-batches, cuts " << (c.explicit_cuts ? "given" : "balanced"));
    std::vector<int64_t> cuts;
    if (c.explicit_cuts)  // deliberately uneven: stage 0 gets one module only
      for (int s = 1; s < p; ++s) cuts.push_back(s == 1 ? 1 : 1 + (s - 1) * 7 / (p - 1));
    auto ref = mlp(11);
    auto model = mlp(11);
    Pipeline pipe(model, {.cuts = cuts, .micro_batches = c.micro_batches, .schedule = c.schedule});
    REQUIRE(pipe.num_stages() == p);
    REQUIRE(pipe.stage() == g.rank());
    REQUIRE(pipe.boundaries().size() == static_cast<size_t>(p + 1));
    CHECK(pipe.stage_module().size() == pipe.boundaries()[static_cast<size_t>(g.rank() + 1)] -
                                            pipe.boundaries()[static_cast<size_t>(g.rank())]);
    optim::SGD ref_opt(ref->parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::SGD opt(pipe.parameters(), {.lr = 0.1, .momentum = 0.9});
    Generator gen(5);
    double worst_loss = 0;
    for (int step = 0; step < 20; ++step) {
      Tensor x = randn({12, 4}, DType::f64, &gen), y = randn({12, 3}, DType::f64, &gen);
      worst_loss = std::max(worst_loss, step_both(*ref, ref_opt, pipe, opt, x, y));
      CHECK(pipe.stored_activations() == 0);
    }
    CHECK(worst_loss <= kTol);
    // This stage's parameters against the reference's, by their full-model names.
    const StateDict want = ref->state_dict();
    double worst = 0;
    int64_t compared = 0;
    for (const auto& [name, t] : pipe.stage_module().state_dict()) {
      worst = std::max(worst, max_diff(t, want.at(name)));
      ++compared;
    }
    CHECK(compared > 0);
    CHECK(worst <= kTol);
    // Stored activations: GPipe m on every stage; 1F1B min(p - s, m) <= p.
    const int64_t peak = pipe.peak_stored_activations();
    if (c.schedule == PipelineSchedule::GPipe) {
      CHECK(peak == c.micro_batches);
    } else {
      CHECK(peak == std::min(p - g.rank(), c.micro_batches));
      CHECK(peak <= p);
    }
    // The gathered state dict is the full model's: a single process loads it.
    StateDict full = pipe.full_state_dict(0);
    if (g.rank() == 0) {
      CHECK(full.keys() == want.keys());
      auto single = mlp(99);
      single->load_state_dict(full);
      double w = 0;
      for (const auto& [name, t] : single->state_dict())
        w = std::max(w, max_diff(t, want.at(name)));
      CHECK(w <= kTol);
    } else {
      CHECK(full.empty());
    }
    // And back: a pipeline over a fresh model takes this stage's part of the full state.
    Pipeline again(mlp(98), {.cuts = cuts, .micro_batches = 1});
    again.load_full_state_dict(want);
    for (const auto& [name, t] : again.stage_module().state_dict())
      CHECK(max_diff(t, want.at(name)) == 0.0);
  }
}

TEST_CASE("Pipeline: balanced cuts and argument errors", "[mpi][pipeline]") {
  ProcessGroup& g = default_group();
  auto model = mlp(1);
  // Parameter counts 30, 42 x 6, 21: two stages balance at [0, 4) 156 | [4, 8) 147.
  CHECK(Pipeline::balanced_cuts(*model, 2) == std::vector<int64_t>{4});
  CHECK(Pipeline::balanced_cuts(*model, 1).empty());
  CHECK_THROWS_WITH(Pipeline::balanced_cuts(*model, 9), Catch::Contains("8 modules cannot fill 9"));
  CHECK_THROWS_WITH(Pipeline(model, {.micro_batches = 0}), Catch::Contains("micro_batches = 0"));
  if (g.size() > 1) {
    CHECK_THROWS_WITH(
        Pipeline(model, {.cuts = std::vector<int64_t>(static_cast<size_t>(g.size()), 1)}),
        Catch::Contains("cut points for"));
    std::vector<int64_t> bad(static_cast<size_t>(g.size() - 1), 0);
    CHECK_THROWS_WITH(Pipeline(model, {.cuts = bad}), Catch::Contains("must increase strictly"));
  }
  CHECK(std::string(schedule_name(parse_schedule("1f1b"))) == "1f1b");
  CHECK_THROWS_WITH(parse_schedule("zb"), Catch::Contains("choose gpipe or 1f1b"));
  if (g.size() == 2) {
    // Both ends check the batch (with 2 stages they are all the stages, so all ranks throw).
    Pipeline pipe(model, {.micro_batches = 5});
    CHECK_THROWS_WITH(
        pipe.forward_backward(zeros({4, 4}, DType::f64), zeros({4, 3}, DType::f64), mse),
        Catch::Contains("a batch of 4 cannot make 5 micro-batches"));
  }
  g.barrier().wait();
}

TEST_CASE("RankLayout: coordinates, groups and the printed table", "[mpi][groups]") {
  ProcessGroup& g = default_group();
  const int n = g.size(), me = g.rank();
  const int pp = n % 2 == 0 ? 2 : n;
  RankLayout layout({.pipeline = pp, .print = false});
  CHECK(layout.pipeline_size() * layout.data_size() * layout.tensor_size() == n);
  CHECK(layout.rank_of(layout.stage(), layout.replica(), layout.tensor_rank()) == me);
  CHECK(layout.pipeline_group().size() == pp);
  CHECK(layout.pipeline_group().rank() == layout.stage());
  CHECK(layout.data_group().size() == layout.data_size());
  CHECK(layout.data_group().rank() == layout.replica());
  CHECK(layout.tensor_group().size() == 1);
  // The pipeline group's members are the ranks of this replica, one per stage.
  Tensor t = full({1}, me, DType::i64);
  layout.pipeline_group().all_reduce(t).wait();
  int64_t want = 0;
  for (int s = 0; s < pp; ++s) want += layout.rank_of(s, layout.replica(), 0);
  CHECK(t.item<int64_t>() == want);
  CHECK_THAT(layout.str(), Catch::Contains(std::to_string(n) + " ranks = " + std::to_string(pp) +
                                           " pipeline stage"));
  if (n == 4) {
    RankLayout l2({.pipeline = 2, .data = 1, .tensor = 2, .print = false});
    CHECK(l2.tensor_rank() == me % 2);
    CHECK(l2.stage() == me / 2);
    CHECK(l2.tensor_group().size() == 2);
    CHECK_THAT(l2.str(), Catch::Contains("stage 1: replica 0 ranks 2 3"));
  }
  CHECK_THROWS_WITH(RankLayout({.pipeline = n + 1, .print = false}),
                    Catch::Contains("cannot be divided"));
  CHECK_THROWS_WITH(RankLayout({.pipeline = 1, .data = n + 1, .print = false}),
                    Catch::Contains("but the group has"));
}

TEST_CASE("Pipeline x data parallelism: 2 stages x 2 replicas match one process",
          "[mpi][pipeline]") {
  ProcessGroup& g = default_group();
  if (g.size() != 4) return;
  RankLayout layout({.pipeline = 2});  // prints the layout once, on rank 0
  auto ref = mlp(21);
  Pipeline pipe(
      mlp(21),
      {.group = &layout.pipeline_group(), .micro_batches = 3, .data_group = &layout.data_group()});
  optim::SGD ref_opt(ref->parameters(), {.lr = 0.1});
  optim::SGD opt(pipe.parameters(), {.lr = 0.1});
  Generator gen(8);
  for (int step = 0; step < 20; ++step) {
    Tensor x = randn({16, 4}, DType::f64, &gen), y = randn({16, 3}, DType::f64, &gen);
    ref_opt.zero_grad();
    Tensor l = mse_loss((*ref)(x), y);
    l.backward();
    ref_opt.step();
    // Replica d trains on rows [8d, 8d + 8); the average of the two halves' mean-loss
    // gradients (PipelineOptions::data_group) is the full batch's, and so is their mean loss.
    opt.zero_grad();
    const int64_t r0 = 8 * layout.replica();
    const double pl = pipe.forward_backward(x.narrow(0, r0, 8), y.narrow(0, r0, 8), mse);
    CHECK(std::abs(pl - l.item<double>()) <= kTol);
    opt.step();
  }
  const StateDict want = ref->state_dict();
  double worst = 0;
  for (const auto& [name, t] : pipe.stage_module().state_dict())
    worst = std::max(worst, max_diff(t, want.at(name)));
  CHECK(worst <= kTol);
}

namespace {

// AdamW with param_groups_no_decay's two groups (weights decay 0.01, biases none): each stage's
// optimizer is built by the same rule over its stage, the single process's over the model.
std::unique_ptr<optim::Optimizer> adamw_two_groups(const nn::Module& m) {
  return std::make_unique<optim::AdamW>(optim::param_groups_no_decay(m, 0.01),
                                        optim::AdamWOptions{.lr = 0.01});
}

// One optimizer step of `model` (one process) or of the pipeline on the batch (x, y).
void step_of(nn::Module& model, optim::Optimizer& opt, const std::pair<Tensor, Tensor>& xy) {
  opt.zero_grad();
  mse_loss(model.forward(xy.first), xy.second).backward();
  opt.step();
}
void step_of(Pipeline& pipe, optim::Optimizer& opt, const std::pair<Tensor, Tensor>& xy) {
  opt.zero_grad();
  pipe.forward_backward(xy.first, xy.second, mse);
  opt.step();
}

// Largest difference between two state dicts with the same keys (integers compared as f64).
double state_diff(const StateDict& a, const StateDict& b) {
  REQUIRE(a.keys() == b.keys());
  double worst = 0;
  for (const auto& [name, t] : a)
    worst = std::max(worst, max_diff(t.to(DType::f64), b.at(name).to(DType::f64)));
  return worst;
}

}  // namespace

// The optimizer's state follows the same rounding argument as the weights (kTol above): Adam's
// moments are sums of the gradients' rounding errors, its update scale-free in them.
TEST_CASE(
    "Pipeline: model and optimizer checkpoint loads in one process and resumes on the pipeline",
    "[mpi][pipeline][checkpoint]") {
  ProcessGroup& g = default_group();
  const int p = g.size(), me = g.rank();
  auto ref = mlp(31);
  const auto ref_opt = adamw_two_groups(*ref);
  Pipeline pipe(mlp(31), {.micro_batches = 3});
  const auto opt = adamw_two_groups(pipe.stage_module());
  Generator gen(12);
  auto batch = [&gen] {
    Tensor x = randn({12, 4}, DType::f64, &gen), y = randn({12, 3}, DType::f64, &gen);
    return std::make_pair(x, y);
  };
  for (int step = 0; step < 5; ++step) {
    const auto xy = batch();
    step_of(*ref, *ref_opt, xy);
    step_of(pipe, *opt, xy);
  }
  // Gathered on rank 0: the single process's keys, flat indices and groups, its values.
  io::Checkpoint ck;
  ck.model = pipe.full_state_dict(0);
  ck.optimizer = pipe.full_optimizer_state_dict(*opt, 0);
  if (me == 0) {
    CHECK(state_diff(ck.optimizer, ref_opt->state_dict()) <= kTol);
    CHECK(state_diff(ck.model, ref->state_dict()) <= kTol);
  } else {
    CHECK(ck.optimizer.empty());
  }
  // One ordinary checkpoint file, written by rank 0 and read by every rank.
  if (!io::hdf5_supported()) {
    WARN("SKIPPED: the checkpoint file part needs HDF5 (this build has none)");
    return;
  }
  Tensor tag = full({1}, me == 0 ? static_cast<double>(::getpid()) : 0.0, DType::i64);
  g.broadcast(tag, 0).wait();
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("dltrain_pipeline_ckpt_" + std::to_string(tag.item<int64_t>()) + "_" +
                             std::to_string(p) + ".h5"))
                               .string();
  if (me == 0) io::write_checkpoint(path, ck);
  g.barrier().wait();
  const io::Checkpoint loaded = io::read_checkpoint(path);
  g.barrier().wait();
  if (me == 0) std::filesystem::remove(path);

  // A single process loads it (no communication) and trains 4 more steps.
  auto single = mlp(77);
  single->load_state_dict(loaded.model);
  const auto single_opt = adamw_two_groups(*single);
  single_opt->load_state_dict(loaded.optimizer);
  CHECK(state_diff(single_opt->state_dict(), loaded.optimizer) == 0.0);
  // The pipeline resumes from it on another cut and schedule (stage 0 one module).
  std::vector<int64_t> cuts;
  for (int s = 1; s < p; ++s) cuts.push_back(s == 1 ? 1 : 1 + (s - 1) * 7 / (p - 1));
  Pipeline again(mlp(78), {.cuts = cuts, .micro_batches = 2, .schedule = PipelineSchedule::GPipe});
  const auto again_opt = adamw_two_groups(again.stage_module());
  again.load_full_state_dict(loaded.model);
  again.load_full_optimizer_state_dict(*again_opt, loaded.optimizer);
  const StateDict round_trip = again.full_optimizer_state_dict(*again_opt, 0);
  if (me == 0) CHECK(state_diff(round_trip, loaded.optimizer) == 0.0);
  for (int step = 0; step < 4; ++step) {
    const auto xy = batch();
    step_of(*single, *single_opt, xy);
    step_of(again, *again_opt, xy);
    step_of(*ref, *ref_opt, xy);  // the uninterrupted run
  }
  const StateDict want = single->state_dict(), uninterrupted = ref->state_dict();
  double worst = 0, worst_ref = 0;
  for (const auto& [name, t] : again.stage_module().state_dict()) {
    worst = std::max(worst, max_diff(t, want.at(name)));
    worst_ref = std::max(worst_ref, max_diff(t, uninterrupted.at(name)));
  }
  CHECK(worst <= kTol);
  CHECK(worst_ref <= kTol);
  const StateDict resumed = again.full_optimizer_state_dict(*again_opt, 0);
  if (me == 0) CHECK(state_diff(resumed, single_opt->state_dict()) <= kTol);

  // Errors: an optimizer over other parameters; a state grouped otherwise (one group where the
  // stages have two), refused on every rank.
  auto other = mlp(5);
  optim::SGD stray(other->parameters(), {.lr = 0.1});
  CHECK_THROWS_WITH(again.full_optimizer_state_dict(stray, 0),
                    Catch::Contains("not exactly the stage's"));
  optim::AdamW one_group(single->parameters(), {.lr = 0.01});
  CHECK_THROWS_WITH(
      again.load_full_optimizer_state_dict(*again_opt, one_group.state_dict()),
      Catch::Contains("the state has 1 parameter groups and the stages' optimizers 2"));
  g.barrier().wait();
}

namespace {

// A small transformer on [B, 5, 4] token sequences: Linear(4, 8) embedding, three pre-norm
// encoder layers (2 heads, feed-forward 16, no dropout), Flatten, Linear(40, 3): 6 modules.
std::shared_ptr<nn::Sequential> encoder(uint64_t seed) {
  manual_seed(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(4, 8));
  const nn::TransformerEncoderLayerOptions lo{
      .dim_feedforward = 16, .dropout = 0.0, .batch_first = true, .norm_first = true};
  for (int i = 0; i < 3; ++i) m->push_back(std::make_shared<nn::TransformerEncoderLayer>(8, 2, lo));
  m->push_back(std::make_shared<nn::Flatten>());
  m->push_back(std::make_shared<nn::Linear>(40, 3));
  m->to(DType::f64);
  return m;
}

}  // namespace

// The transformer's sums are split the same way as the MLP's (per micro-batch partial sums of
// the weight gradients; attention and layer norm are per sample), so the same 1e-12 holds with
// SGD. (Not with Adam: the attention's key bias has an exact gradient of 0, so its gradient is
// rounding noise, which Adam normalises into steps of up to lr each.)
TEST_CASE("Pipeline: a transformer encoder matches one process for 20 SGD steps (f64)",
          "[mpi][pipeline]") {
  ProcessGroup& g = default_group();
  for (const PipelineSchedule schedule : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB}) {
    INFO("schedule " << schedule_name(schedule));
    auto ref = encoder(41);
    Pipeline pipe(encoder(41), {.micro_batches = 4, .schedule = schedule});
    optim::SGD ref_opt(ref->parameters(), {.lr = 0.05, .momentum = 0.9});
    optim::SGD opt(pipe.parameters(), {.lr = 0.05, .momentum = 0.9});
    Generator gen(9);
    double worst_loss = 0;
    for (int step = 0; step < 20; ++step) {
      Tensor x = randn({10, 5, 4}, DType::f64, &gen), y = randn({10, 3}, DType::f64, &gen);
      worst_loss = std::max(worst_loss, step_both(*ref, ref_opt, pipe, opt, x, y));
    }
    CHECK(worst_loss <= kTol);
    const StateDict want = ref->state_dict();
    double worst = 0;
    for (const auto& [name, t] : pipe.stage_module().state_dict())
      worst = std::max(worst, max_diff(t, want.at(name)));
    CHECK(worst <= kTol);
  }
  g.barrier().wait();
}

// Checkpointing recomputes the same ops on the same inputs: the same gradients, bit for bit.
// Autocast with one micro-batch runs the single process's ops on the same rows (the bf16
// activation crosses the stage boundary unchanged): the same results, bit for bit too.
TEST_CASE("Pipeline: activation checkpointing per stage and autocast give one process's results",
          "[mpi][pipeline]") {
  ProcessGroup& g = default_group();
  {
    Pipeline plain(mlp(61), {.micro_batches = 3});
    Pipeline ckpt(mlp(61), {.micro_batches = 3, .checkpoint_activations = true});
    optim::SGD o1(plain.parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::SGD o2(ckpt.parameters(), {.lr = 0.1, .momentum = 0.9});
    Generator gen(3);
    for (int step = 0; step < 5; ++step) {
      Tensor x = randn({9, 4}, DType::f64, &gen), y = randn({9, 3}, DType::f64, &gen);
      o1.zero_grad();
      const double l1 = plain.forward_backward(x, y, mse);
      o1.step();
      o2.zero_grad();
      const double l2 = ckpt.forward_backward(x, y, mse);
      o2.step();
      CHECK(l1 == l2);
      CHECK(ckpt.stored_activations() == 0);
    }
    const StateDict a = plain.stage_module().state_dict(), b = ckpt.stage_module().state_dict();
    double worst = 0;
    for (const auto& [name, t] : a) worst = std::max(worst, max_diff(t, b.at(name)));
    CHECK(worst == 0.0);
  }
  {
    auto f32 = [](uint64_t seed) {
      auto m = mlp(seed);
      m->to(DType::f32);
      return m;
    };
    auto ref = f32(62);
    Pipeline pipe(f32(62), {.micro_batches = 1, .autocast = true, .autocast_dtype = DType::bf16});
    Generator gen(4);
    Tensor x = randn({8, 4}, TensorOptions(), &gen), y = randn({8, 3}, TensorOptions(), &gen);
    Tensor l;
    {
      const amp::autocast ac(DeviceType::CPU, DType::bf16);
      l = mse_loss((*ref)(x), y);
    }
    l.backward();
    const double pl = pipe.forward_backward(x, y, mse);
    CHECK(pl == l.item<double>());
    double worst = 0;
    int64_t compared = 0;
    const auto ref_params = ref->named_parameters();
    for (const auto& [name, t] : pipe.stage_module().named_parameters())
      for (const auto& [rn, rt] : ref_params)
        if (rn == name) {
          worst = std::max(worst, max_diff(t.grad(), rt.grad()));
          ++compared;
        }
    CHECK(compared > 0);
    CHECK(worst == 0.0);
  }
  g.barrier().wait();
}

TEST_CASE("Pipeline: timed_cuts gives every rank the same valid cuts", "[mpi][pipeline]") {
  ProcessGroup& g = default_group();
  const int p = g.size();
  auto model = encoder(71);
  Generator gen(2);
  const Tensor example = randn({4, 5, 4}, DType::f64, &gen);
  const std::vector<int64_t> cuts = Pipeline::timed_cuts(*model, example);
  REQUIRE(static_cast<int>(cuts.size()) == p - 1);
  for (size_t i = 0; i < cuts.size(); ++i) {
    CHECK(cuts[i] > (i == 0 ? 0 : cuts[i - 1]));
    CHECK(cuts[i] < model->size());
  }
  CHECK(Pipeline::last_module_times().size() == static_cast<size_t>(model->size()));
  // The same on every rank: the sum of the cuts over the ranks is p times this rank's.
  Tensor t = zeros({static_cast<int64_t>(cuts.size()) + 1}, DType::f64);
  for (size_t i = 0; i < cuts.size(); ++i) t.data<double>()[i] = static_cast<double>(cuts[i]);
  Tensor mine = t.clone();
  g.all_reduce(t).wait();
  CHECK(max_diff(t, mul(mine, static_cast<double>(p))) == 0.0);
  // They drive a pipeline like given cuts.
  Pipeline pipe(encoder(71), {.cuts = cuts, .micro_batches = 2});
  CHECK(pipe.boundaries()[1] == (p > 1 ? cuts[0] : model->size()));
  CHECK_THROWS_WITH(Pipeline::timed_cuts(*model, example, nullptr, 7),
                    Catch::Contains("6 modules cannot fill 7"));
}
