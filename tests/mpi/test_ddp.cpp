// DDP equivalence on 2 and 3 ranks: N ranks with per-rank batch B/N train exactly like one
// process with batch B (the Fashion-MNIST CNN: without BatchNorm, and with its BatchNorm
// synchronised), also with no_sync accumulation; and a model mismatch fails on every rank.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>

#include "dltrain/dltrain.hpp"
#include "src/distributed/internal.hpp"
#include "tests/mpi/fm_model.hpp"

using namespace dltrain;
using namespace dltrain::distributed;

namespace {

using namespace mpi_test;

const Data& data(DType dt) { return fm_data(dt); }

// A Sequential run through nn::checkpoint_sequential (activation checkpointing); its
// parameters are the Sequential's, in the same order.
class Checkpointed : public nn::Module {
 public:
  Checkpointed(std::shared_ptr<nn::Sequential> seq, int64_t segments)
      : Module("Checkpointed"), segments_(segments) {
    seq_ = register_module("seq", std::move(seq));
  }
  Tensor forward(const Tensor& x) override {
    return nn::checkpoint_sequential(*seq_, segments_, x);
  }

 private:
  std::shared_ptr<nn::Sequential> seq_;
  int64_t segments_;
};

// Trains `ref` on full batches and `model` under DDP on this rank's share, side by side
// (with `segments` > 0, the DDP model checkpoints its activations in that many segments).
double train_pair(bool bn, DType dt, int micro_batches, double lr = 0.05,
                  double* sensitivity = nullptr, bool bucket_view = false, int64_t segments = 0) {
  const int n = world_size(), r = rank();
  auto ref = fm_cnn(bn, dt);
  auto seq = fm_cnn(bn, dt);
  if (bn) convert_sync_batchnorm(seq);
  std::shared_ptr<nn::Module> model = seq;
  if (segments > 0) model = std::make_shared<Checkpointed>(seq, segments);
  DistributedDataParallel ddp(
      model,
      {.bucket_cap_mb = 0.05, .first_bucket_cap_mb = 0.01, .gradient_as_bucket_view = bucket_view});
  optim::SGD o_ref(ref->parameters(), {.lr = lr, .momentum = 0.9, .weight_decay = 1e-4});
  optim::SGD o(model->parameters(), {.lr = lr, .momentum = 0.9, .weight_decay = 1e-4});
  const Data& d = data(dt);
  const int64_t per_rank = kBatch / n, per_micro = per_rank / micro_batches;
  for (int s = 0; s < kSteps; ++s) {
    Tensor x = d.x.narrow(0, s * kBatch, kBatch), y = d.y.narrow(0, s * kBatch, kBatch);
    o_ref.zero_grad();
    cross_entropy(ref->forward(x), y).backward();
    o_ref.step();

    o.zero_grad();
    for (int m = 0; m < micro_batches; ++m) {
      Tensor xm = x.narrow(0, r * per_rank + m * per_micro, per_micro);
      Tensor ym = y.narrow(0, r * per_rank + m * per_micro, per_micro);
      auto loss_of = [&] { return div(cross_entropy(ddp(xm), ym), micro_batches); };
      if (m + 1 < micro_batches) {
        auto guard = ddp.no_sync();
        loss_of().backward();
      } else {
        loss_of().backward();
      }
    }
    o.step();
  }
  // Every rank holds the same weights.
  const double mine = rel_diff(*model, *ref);
  if (sensitivity) {
    // The same single-process run from weights perturbed in their last bits: how much the
    // training dynamics alone amplify rounding differences over kSteps.
    auto ref2 = fm_cnn(bn, dt);
    {
      NoGradGuard ng;
      Generator gp(77);
      const double ulp = dt == DType::f32 ? 1.2e-7 : 2.3e-16;
      for (auto& p : ref2->parameters())
        p.copy_(mul(p, add(mul(randn(p.shape(), dt, &gp), ulp), 1.0)));
    }
    optim::SGD o2(ref2->parameters(), {.lr = lr, .momentum = 0.9, .weight_decay = 1e-4});
    for (int s = 0; s < kSteps; ++s) {
      Tensor x = d.x.narrow(0, s * kBatch, kBatch), y = d.y.narrow(0, s * kBatch, kBatch);
      o2.zero_grad();
      cross_entropy(ref2->forward(x), y).backward();
      o2.step();
    }
    *sensitivity = rel_diff(*ref2, *ref);
  }
  CHECK(all_reduce_value(mine, ReduceOp::Max) == mine);
  return mine;
}

}  // namespace

TEST_CASE("DDP: N ranks x B/N equal one process x B (Fashion-MNIST CNN, no BN)", "[mpi][ddp]") {
  double s32 = 0, s64 = 0;
  const double f32 = train_pair(false, DType::f32, 1, 0.05, &s32);
  const double f64 = train_pair(false, DType::f64, 1, 0.05, &s64);
  std::printf("rank %d: single process from last-bit-perturbed weights: f32 %.3g, f64 %.3g\n",
              rank(), s32, s64);
  std::printf("rank %d: DDP vs single process after %d steps: f32 %.3g, f64 %.3g\n", rank(), kSteps,
              f32, f64);
  CHECK(f32 <= f32_bound(s32));
  CHECK(f64 < 1e-12);
}

TEST_CASE("DDP + SyncBatchNorm: N ranks x B/N equal one process x B with BatchNorm",
          "[mpi][ddp][syncbn]") {
  // BatchNorm makes this regime chaotic at lr 0.05 (the last-bit differences of a different
  // summation order grow ~1000x in 20 steps, in f64 as in f32, with or without DDP); at
  // lr 0.01 they do not, so the comparison tests DDP and not the dynamics.
  double s32 = 0, s64 = 0;
  const double f32 = train_pair(true, DType::f32, 1, 0.01, &s32);
  const double f64 = train_pair(true, DType::f64, 1, 0.01, &s64);
  std::printf("rank %d: single process from last-bit-perturbed weights: f32 %.3g, f64 %.3g\n",
              rank(), s32, s64);
  std::printf("rank %d: DDP+SyncBN vs single process after %d steps: f32 %.3g, f64 %.3g\n", rank(),
              kSteps, f32, f64);
  CHECK(f32 <= f32_bound(s32));
  CHECK(f64 < 1e-12);
}

TEST_CASE("DDP no_sync: 2 micro-batches per step equal one process x B", "[mpi][ddp]") {
  if (kBatch / world_size() % 2 != 0) return;
  double s32 = 0;
  const double f32 = train_pair(false, DType::f32, 2, 0.05, &s32);
  const double f64 = train_pair(false, DType::f64, 2);
  std::printf("rank %d: DDP no_sync x2 vs single process: f32 %.3g, f64 %.3g\n", rank(), f32, f64);
  CHECK(f32 <= f32_bound(s32));
  CHECK(f64 < 1e-12);
  // The same with the gradients as views of the buckets (no copies; zero_grad keeps them).
  const double view64 = train_pair(false, DType::f64, 2, 0.05, nullptr, true);
  std::printf("rank %d: DDP no_sync x2, gradient_as_bucket_view, vs single process: f64 %.3g\n",
              rank(), view64);
  CHECK(view64 < 1e-12);
}

TEST_CASE("DDP + activation checkpointing: N ranks x B/N equal one process x B",
          "[mpi][ddp][checkpoint]") {
  // The parameters' gradients leave each checkpointed segment through the outer backward pass,
  // so DDP's hooks fire once per parameter, in order, as without checkpointing; with
  // SyncBatchNorm the recomputation synchronises its statistics again (in backward, on every
  // rank alike) and moves the running statistics once.
  for (const bool bn : {false, true}) {
    const double lr = bn ? 0.01 : 0.05;
    double s32 = 0;
    train_pair(bn, DType::f32, 1, lr, &s32);
    const double f32 = train_pair(bn, DType::f32, 1, lr, nullptr, false, 3);
    const double f64 = train_pair(bn, DType::f64, 1, lr, nullptr, false, 3);
    // Micro-batches change BatchNorm's statistics (each normalises its own half): no_sync is
    // compared without BN only.
    const double micro64 = !bn && kBatch / world_size() % 2 == 0
                               ? train_pair(bn, DType::f64, 2, lr, nullptr, false, 2)
                               : 0.0;
    std::printf(
        "rank %d: DDP%s + checkpoint vs single process: f32 %.3g, f64 %.3g, "
        "f64 with no_sync x2 %.3g\n",
        rank(), bn ? "+SyncBN" : "", f32, f64, micro64);
    CHECK(f32 <= f32_bound(s32));
    CHECK(f64 < 1e-12);
    CHECK(micro64 < 1e-12);
  }
}

namespace {
// Head b is used on rank 0 only: a parameter that gets no gradient on the other ranks.
class RankHeads : public nn::Module {
 public:
  RankHeads() : Module("RankHeads") {
    a = register_module("a", std::make_shared<nn::Linear>(4, 2, true, TensorOptions(DType::f64)));
    b = register_module("b", std::make_shared<nn::Linear>(4, 2, true, TensorOptions(DType::f64)));
  }
  Tensor forward(const Tensor& x) override {
    return use_b ? add(a->forward(x), mul(b->forward(x), 3.0)) : a->forward(x);
  }
  std::shared_ptr<nn::Linear> a, b;
  bool use_b = true;
};
}  // namespace

TEST_CASE(
    "DDP find_unused_parameters: a parameter used on some ranks only is averaged with "
    "zeros from the others",
    "[mpi][ddp]") {
  const int n = world_size();
  auto make = [] {
    manual_seed(12);
    return std::make_shared<RankHeads>();
  };
  auto input = [](int r) {
    Generator g(40 + static_cast<uint64_t>(r));
    return randn({5, 4}, DType::f64, &g);
  };
  auto m = make();
  DistributedDataParallel ddp(m, {.find_unused_parameters = true});
  m->use_b = rank() == 0;
  sum(ddp(input(rank()))).backward();
  // The reference: every rank's gradient computed here, averaged (b's is zero off rank 0).
  std::vector<Tensor> want;
  for (int r = 0; r < n; ++r) {
    auto bare = make();
    bare->use_b = r == 0;
    sum(bare->forward(input(r))).backward();
    auto ps = bare->parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      Tensor g = ps[i].grad().defined() ? ps[i].grad() : zeros_like(ps[i]);
      if (r == 0)
        want.push_back(div(g, n));
      else
        want[i] = add(want[i], div(g, n));
    }
  }
  auto got = m->parameters();
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("parameter " << i);
    CHECK(max(abs(sub(got[i].grad(), want[i]))).item<double>() < 1e-14);
  }
  CHECK(sum(abs(m->b->weight.grad())).item<double>() > 0.0);  // rank 0's share on every rank
}

TEST_CASE("DDP: parameters and buffers are broadcast from rank 0", "[mpi][ddp]") {
  manual_seed(100 + static_cast<uint64_t>(rank()));  // different weights on every rank
  auto m = std::make_shared<nn::Sequential>();
  nn::BatchNormOptions frozen_stats;
  frozen_stats.momentum = 0.0;  // forward leaves the running statistics as they are
  m->push_back(std::make_shared<nn::Linear>(5, 4))
      .push_back(std::make_shared<nn::BatchNorm1d>(4, frozen_stats));
  auto bn = std::dynamic_pointer_cast<nn::BatchNorm>(m->child("1"));
  bn->running_mean.fill_(rank());
  DistributedDataParallel ddp(m);
  const double w = sum(m->parameters()[0]).item<double>();
  CHECK(all_reduce_value(w, ReduceOp::Max) == all_reduce_value(w, ReduceOp::Min));
  CHECK(bn->running_mean.to_vector<float>()[0] == 0.0f);
  // broadcast_buffers: rank 0's buffers win at every training forward.
  bn->running_mean.fill_(rank() + 10.0);
  ddp(randn({3, 5}));
  CHECK(bn->running_mean.to_vector<float>()[0] == 10.0f);
}

TEST_CASE("DDP: a model that differs between ranks fails on every rank, naming it", "[mpi][ddp]") {
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(5, rank() == 1 ? 3 : 4));
  try {
    DistributedDataParallel ddp(m);
    FAIL("a mismatched model must be refused");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("differs between ranks (rank(s) 1") != std::string::npos);
    if (rank() == 1)
      CHECK(msg.find("'0.weight' [3, 5] float32 on rank 1 but parameter '0.weight' [4, 5] float32 "
                     "on rank 0") != std::string::npos);
  }
}

TEST_CASE("DDP + autocast + GradScaler: an overflow on one rank skips the step on every rank",
          "[mpi][ddp][amp]") {
  manual_seed(8);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(6, 8))
      .push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::Linear>(8, 3));
  DistributedDataParallel ddp(m);
  optim::SGD opt(m->parameters(), {.lr = 0.1});
  amp::GradScaler scaler({.init_scale = 1024.0, .growth_interval = 2});
  Generator g(3 + static_cast<uint64_t>(rank()));
  std::vector<int> skipped;
  for (int step = 0; step < 6; ++step) {
    Tensor x = randn({4, 6}, {}, &g);
    // Step 2: rank 1's batch overflows; the averaged gradients are inf on every rank.
    if (step == 2 && rank() == 1) x = full({4, 6}, 3e38);
    Tensor y = randint(0, 3, {4}, DType::i64, &g);
    const auto before = m->parameters()[0].to_vector<float>();
    opt.zero_grad();
    {
      amp::autocast ac(DeviceType::CPU, DType::bf16);
      Tensor loss = cross_entropy(ddp(x), y);
      scaler.scale(loss).backward();
    }
    scaler.step(opt);
    scaler.update();
    if (m->parameters()[0].to_vector<float>() == before) skipped.push_back(step);
    // The same scale and weights on every rank, every step.
    const double s = scaler.get_scale();
    CHECK(all_reduce_value(s, ReduceOp::Max) == all_reduce_value(s, ReduceOp::Min));
    const double w = sum(m->parameters()[0]).item<double>();
    CHECK(all_reduce_value(w, ReduceOp::Max) == all_reduce_value(w, ReduceOp::Min));
  }
  CHECK(skipped == std::vector<int>{2});
  // 1024 -> x2 after steps 0-1 -> /2 at step 2 -> x2 after steps 3-4: 2048.
  CHECK(scaler.get_scale() == 2048.0);
}

// --- gradient_compression (bf16 / f16 all-reduce) ------------------------------------------

TEST_CASE("DDP gradient_compression: the average equals an exact all-reduce of the 16-bit shares",
          "[mpi][ddp][compression]") {
  const int n = world_size();
  auto make = [] {
    manual_seed(3);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Linear>(16, 32))
        .push_back(std::make_shared<nn::ReLU>())
        .push_back(std::make_shared<nn::Linear>(32, 5));
    return m;
  };
  for (DType wire : {DType::bf16, DType::f16}) {
    for (bool view : {false, true}) {
      auto m = make(), bare = make();
      DistributedDataParallel ddp(m, {.first_bucket_cap_mb = 0.001,
                                      .gradient_as_bucket_view = view,
                                      .gradient_compression = wire});
      for (const auto& b : ddp.buckets()) CHECK(b.wire_dtype == wire);
      Generator g(20 + static_cast<uint64_t>(rank()));
      Tensor x = mul(randn({6, 16}, {}, &g), 1.0 + rank()), y = randint(0, 5, {6}, DType::i64, &g);
      cross_entropy(ddp(x), y).backward();
      cross_entropy(bare->forward(x), y).backward();
      // Each rank's share is its gradient / n rounded to `wire` (as DDP computes it); their
      // exact sum (f64 holds a sum of three 16-bit values exactly) is the reference. Each of
      // the reduction's n - 1 partial sums is rounded to `wire` again: at most half an ulp of
      // the partial sum each, so |got - ref| <= (n - 1) u sum_r |share_r| (+ half the smallest
      // subnormal spacing per rounding), with u = 2^-8 (bf16) or 2^-11 (f16).
      const double u = wire == DType::bf16 ? 0x1p-8 : 0x1p-11;
      const double tiny = wire == DType::bf16 ? 0x1p-134 : 0x1p-25;
      double worst = 0;  // the largest error in units of the bound
      int64_t not_representable = 0, not_nearest = 0, elements = 0;
      for (size_t i = 0; i < m->parameters().size(); ++i) {
        Tensor share = mul(bare->parameters()[i].grad(), 1.0 / n).to(wire).to(DType::f64);
        Tensor ref = share.clone(), mag = abs(share);
        default_group().all_reduce(ref, ReduceOp::Sum).wait();
        default_group().all_reduce(mag, ReduceOp::Sum).wait();
        Tensor got = m->parameters()[i].grad().to(DType::f64);
        auto r = ref.to_vector<double>(), a = mag.to_vector<double>(), v = got.to_vector<double>(),
             w = got.to(wire).to(DType::f64).to_vector<double>(),
             nearest = ref.to(wire).to(DType::f64).to_vector<double>();
        for (size_t k = 0; k < v.size(); ++k, ++elements) {
          const double bound = (n - 1) * (u * a[k] + tiny) + 1e-300;
          worst = std::max(worst, std::abs(v[k] - r[k]) / bound);
          not_representable += v[k] != w[k];
          not_nearest += v[k] != nearest[k];
        }
      }
      std::printf("rank %d: %s compression%s: worst error %.3g of the bound over %lld gradients\n",
                  rank(), dtype_name(wire), view ? " (bucket views)" : "", worst,
                  static_cast<long long>(elements));
      CHECK(worst <= 1.0);
      CHECK(not_representable == 0);  // the result went through 16 bits
      // Two ranks: one rounding of the (exact in float) sum, to the nearest 16-bit value.
      if (n == 2) CHECK(not_nearest == 0);
    }
  }
}

namespace {

// The Fashion-MNIST CNN trained kSteps steps with SGD on global batches of kBatch: under DDP
// (this rank's share, `compression` on the wire), or in one process (each rank runs the same)
// with every gradient rounded to `round_to` before the step when given.
std::shared_ptr<nn::Sequential> train_cnn(bool ddp_run, std::optional<DType> compression,
                                          std::optional<DType> round_to = std::nullopt) {
  const int n = ddp_run ? world_size() : 1, r = ddp_run ? rank() : 0;
  auto model = fm_cnn(false, DType::f32);
  std::unique_ptr<DistributedDataParallel> ddp;
  if (ddp_run)
    ddp = std::make_unique<DistributedDataParallel>(
        model, DDPOptions{.bucket_cap_mb = 0.05,
                          .first_bucket_cap_mb = 0.01,
                          .gradient_compression = compression});
  optim::SGD o(model->parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
  const Data& d = data(DType::f32);
  const int64_t per_rank = kBatch / n;
  for (int s = 0; s < kSteps; ++s) {
    Tensor x = d.x.narrow(0, s * kBatch + r * per_rank, per_rank);
    Tensor y = d.y.narrow(0, s * kBatch + r * per_rank, per_rank);
    o.zero_grad();
    cross_entropy(ddp ? (*ddp)(x) : model->forward(x), y).backward();
    if (round_to) {
      NoGradGuard ng;
      for (auto& p : model->parameters()) p.grad().copy_(p.grad().to(*round_to));
    }
    o.step();
  }
  return model;
}

}  // namespace

TEST_CASE("DDP gradient_compression: training stays within the measured bound of f32",
          "[mpi][ddp][compression]") {
  // The bound is measured: the single-process run whose gradients are rounded to 16 bits at
  // every step drifts from the f32 run by some amount after kSteps (the dynamics amplify the
  // rounding); DDP with a 16-bit all-reduce rounds each rank's share and each partial sum, so
  // it may drift a few times more, not orders of magnitude: 10x the measured drift.
  auto f32_ddp = train_cnn(true, std::nullopt);
  auto f32_one = train_cnn(false, std::nullopt);
  for (DType wire : {DType::bf16, DType::f16}) {
    auto c_ddp = train_cnn(true, wire);
    auto c_one = train_cnn(false, std::nullopt, wire);
    const double drift = rel_diff(*c_ddp, *f32_ddp), measured = rel_diff(*c_one, *f32_one);
    std::printf(
        "rank %d: %s all-reduce vs f32 DDP after %d steps: %.3g; one process with gradients "
        "rounded to %s vs f32: %.3g (bound %.3g)\n",
        rank(), dtype_name(wire), kSteps, drift, dtype_name(wire), measured, 10 * measured);
    CHECK(drift > 0);  // the reduction did run in 16 bits
    CHECK(drift <= 10 * measured);
    CHECK(all_reduce_value(drift, ReduceOp::Max) == drift);  // the same weights on every rank
  }
}

namespace {
const Data& f32_data() { return data(DType::f32); }
}  // namespace

TEST_CASE("DDP reduce_world_of_one drives a real MPI group, a world of one included",
          "[mpi][ddp][world1]") {
  // Under `mpirun -np 1` (ctest mpi_np1) init() makes the local group, since a world of one
  // needs no MPI; this case starts MPI itself so that DDP reduces over an MPI group of one
  // rank (main.cpp finalises it). On N ranks it takes the default MPI group.
  std::shared_ptr<ProcessGroup> own;
  ProcessGroup* g = &default_group();
  if (std::string(g->backend()) != "mpi") {
    REQUIRE(g->size() == 1);
    distributed::detail::mpi_init();
    own = new_mpi_group(std::chrono::seconds(120));
    g = own.get();
  }
  REQUIRE(std::string(g->backend()) == "mpi");
  const int n = g->size();
  const Data& d = f32_data();
  // Every rank the same batch, so the average is each rank's own gradient.
  Tensor x = d.x.narrow(0, 0, kBatch), y = d.y.narrow(0, 0, kBatch);
  for (const std::optional<DType> wire :
       {std::optional<DType>(), std::optional<DType>(DType::bf16)}) {
    if (wire && n > 1) continue;  // the multi-rank compression tests are above
    INFO("world of " << n << ", gradient_compression " << (wire ? "bf16" : "none"));
    auto ref = fm_cnn(false, DType::f32), model = fm_cnn(false, DType::f32);
    DistributedDataParallel ddp(model, {.group = g,
                                        .bucket_cap_mb = 0.05,
                                        .first_bucket_cap_mb = 0.01,
                                        .gradient_compression = wire,
                                        .reduce_world_of_one = true});
    REQUIRE(ddp.buckets().size() > 2);
    for (const auto& b : ddp.buckets()) CHECK(b.wire_dtype == wire.value_or(DType::f32));
    cross_entropy(ref->forward(x), y).backward();
    cross_entropy(ddp(x), y).backward();
    auto pr = ref->parameters(), pm = model->parameters();
    for (size_t i = 0; i < pr.size(); ++i) {
      INFO("parameter " << i);
      const Tensor want = wire ? pr[i].grad().to(*wire).to(DType::f32) : pr[i].grad();
      const auto got = pm[i].grad().to_vector<float>(), w = want.to_vector<float>();
      if (n <= 2) {
        // One rank: copies and a one-rank MPI reduction, exact. Two: (g + g) / 2 is exact.
        CHECK(got == w);
      } else {
        // Three: g + g + g rounds once, the division once more: within 2 ulp.
        for (size_t k = 0; k < got.size(); ++k)
          CHECK(std::abs(got[k] - w[k]) <= 2 * 0x1p-23f * std::abs(w[k]));
      }
    }
  }
}
