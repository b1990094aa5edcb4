// ZeroRedundancyOptimizer (ZeRO-1) on 2 and 3 ranks: DDP + ZeRO(SGD momentum) and DDP +
// ZeRO(AdamW, driven by an LR scheduler) train exactly like one process with the plain
// optimizer (the Fashion-MNIST CNN of test_ddp.cpp); the consolidated state dict is the single
// process's and loads into it; a single-process state re-sharded into ZeRO continues
// identically; each rank holds only its shard's state; mismatched parameters fail on every rank.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "dltrain/dltrain.hpp"
#include "tests/mpi/fm_model.hpp"

using namespace dltrain;
using namespace dltrain::distributed;

namespace {

using namespace mpi_test;

std::shared_ptr<nn::Sequential> fm_cnn(DType dt) { return mpi_test::fm_cnn(false, dt); }

enum class Kind { SGD, AdamW };

std::unique_ptr<optim::Optimizer> plain(Kind k, std::vector<optim::ParamGroup> groups) {
  if (k == Kind::SGD)
    return std::make_unique<optim::SGD>(
        std::move(groups), optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
  return std::make_unique<optim::AdamW>(std::move(groups),
                                        optim::AdamWOptions{.lr = 2e-3, .weight_decay = 0.05});
}
std::unique_ptr<optim::Optimizer> plain(Kind k, std::vector<Tensor> params) {
  return plain(k, std::vector<optim::ParamGroup>{{.params = std::move(params)}});
}

std::unique_ptr<ZeroRedundancyOptimizer> zero(Kind k, std::vector<Tensor> params,
                                              ProcessGroup* group = nullptr) {
  return std::make_unique<ZeroRedundancyOptimizer>(
      std::move(params), [k](std::vector<optim::ParamGroup> g) { return plain(k, std::move(g)); },
      ZeroOptions{.group = group, .bucket_cap_mb = 0.02});
}

// One step of one process on the whole batch s.
void step_single(nn::Module& m, optim::Optimizer& o, optim::LRScheduler* sched, DType dt, int s) {
  const Data& d = fm_data(dt);
  Tensor x = d.x.narrow(0, s * kBatch, kBatch), y = d.y.narrow(0, s * kBatch, kBatch);
  o.zero_grad();
  cross_entropy(m.forward(x), y).backward();
  o.step();
  if (sched) sched->step();
}

// One DDP step of this rank on its share of batch s.
void step_ddp(DistributedDataParallel& ddp, optim::Optimizer& o, optim::LRScheduler* sched,
              DType dt, int s) {
  const Data& d = fm_data(dt);
  const int64_t per_rank = kBatch / world_size();
  const int64_t first = s * kBatch + rank() * per_rank;
  o.zero_grad();
  cross_entropy(ddp(d.x.narrow(0, first, per_rank)), d.y.narrow(0, first, per_rank)).backward();
  o.step();
  if (sched) sched->step();
}

std::unique_ptr<optim::LRScheduler> scheduler(Kind k, optim::Optimizer& o) {
  if (k == Kind::SGD) return nullptr;
  return std::make_unique<optim::StepLR>(o, 5, 0.5);
}

// Copies `from`'s parameter values into `to`.
void copy_weights(nn::Module& to, const nn::Module& from) {
  NoGradGuard ng;
  auto pt = to.parameters(), pf = from.parameters();
  for (size_t i = 0; i < pt.size(); ++i) pt[i].copy_(pf[i]);
}

// Largest |a - b| / max(|b|, 1e-300) over the entries of two state dicts with the same keys.
double state_diff(const StateDict& a, const StateDict& b) {
  std::set<std::string> ka, kb;
  for (const auto& [k, t] : a) ka.insert(k);
  for (const auto& [k, t] : b) kb.insert(k);
  REQUIRE(ka == kb);
  double worst = 0;
  for (const auto& [k, t] : b) {
    INFO("entry " << k);
    const Tensor& u = a.at(k);
    REQUIRE(u.shape() == t.shape());
    REQUIRE(u.dtype() == t.dtype());
    const auto x = u.to(DType::f64).to_vector<double>(), y = t.to(DType::f64).to_vector<double>();
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      num += (x[i] - y[i]) * (x[i] - y[i]);
      den += y[i] * y[i];
    }
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
  return worst;
}

// Trains one process with the plain optimizer and this rank under DDP + ZeRO side by side for
// kSteps; returns the relative difference of the weights (and, with `sensitivity`, how far
// one process drifts from last-bit-perturbed weights; with `state`, the state dicts'
// difference).
double train_pair(Kind k, DType dt, double* sensitivity, double* state = nullptr) {
  auto ref = fm_cnn(dt), model = fm_cnn(dt);
  DistributedDataParallel ddp(model, {.bucket_cap_mb = 0.05, .first_bucket_cap_mb = 0.01});
  auto o_ref = plain(k, ref->parameters());
  auto o = zero(k, model->parameters());
  auto s_ref = scheduler(k, *o_ref), s = scheduler(k, *o);
  for (int i = 0; i < kSteps; ++i) {
    step_single(*ref, *o_ref, s_ref.get(), dt, i);
    step_ddp(ddp, *o, s.get(), dt, i);
  }
  if (s) CHECK(o->param_groups()[0].lr == o_ref->param_groups()[0].lr);
  if (state) *state = state_diff(o->state_dict(), o_ref->state_dict());
  if (sensitivity) {
    auto ref2 = fm_cnn(dt);
    {
      NoGradGuard ng;
      Generator gp(77);
      const double ulp = dt == DType::f32 ? 1.2e-7 : 2.3e-16;
      for (auto& p : ref2->parameters())
        p.copy_(mul(p, add(mul(randn(p.shape(), dt, &gp), ulp), 1.0)));
    }
    auto o2 = plain(k, ref2->parameters());
    auto s2 = scheduler(k, *o2);
    for (int i = 0; i < kSteps; ++i) step_single(*ref2, *o2, s2.get(), dt, i);
    *sensitivity = rel_diff(*ref2, *ref);
  }
  const double mine = rel_diff(*model, *ref);
  // Every rank holds the same full model.
  CHECK(all_reduce_value(mine, ReduceOp::Max) == mine);
  return mine;
}

void check_equivalence(Kind k, const char* what) {
  double s32 = 0, s64 = 0, st = 0;
  const double f32 = train_pair(k, DType::f32, &s32);
  const double f64 = train_pair(k, DType::f64, &s64, &st);
  std::printf(
      "rank %d: DDP + ZeRO(%s) vs one process after %d steps: f32 %.3g (bound %.3g), "
      "f64 %.3g, f64 state dict %.3g\n",
      rank(), what, kSteps, f32, f32_bound(s32), f64, st);
  CHECK(f32 <= f32_bound(s32));
  CHECK(f64 < 1e-12);
  CHECK(st < 1e-12);
}

}  // namespace

TEST_CASE("ZeRO-1 + DDP with SGD momentum equals one process with SGD", "[mpi][zero]") {
  check_equivalence(Kind::SGD, "SGD momentum");
}

TEST_CASE("ZeRO-1 + DDP with AdamW and StepLR equals one process with AdamW", "[mpi][zero]") {
  check_equivalence(Kind::AdamW, "AdamW");
}

TEST_CASE("ZeRO-1 state dicts: consolidated equals one process's, loads there, and re-shards",
          "[mpi][zero]") {
  for (Kind k : {Kind::SGD, Kind::AdamW}) {
    INFO((k == Kind::SGD ? "SGD" : "AdamW"));
    const DType dt = DType::f64;
    const int half = kSteps / 2;
    auto ref = fm_cnn(dt), model = fm_cnn(dt);
    DistributedDataParallel ddp(model, {.bucket_cap_mb = 0.05, .first_bucket_cap_mb = 0.01});
    auto o_ref = plain(k, ref->parameters());
    auto o = zero(k, model->parameters());
    for (int i = 0; i < half; ++i) {
      step_single(*ref, *o_ref, nullptr, dt, i);
      step_ddp(ddp, *o, nullptr, dt, i);
    }
    // Consolidated on every rank, and on the last rank only.
    const StateDict full = o->state_dict();
    CHECK(state_diff(full, o_ref->state_dict()) < 1e-12);
    const int last = world_size() - 1;
    const StateDict on_last = o->consolidated_state_dict(last);
    if (rank() == last) {
      CHECK(state_diff(on_last, full) == 0.0);
    } else {
      CHECK(on_last.empty());
    }

    // The consolidated state resumes a single process; the single process's state resumes
    // ZeRO on this rank count (another partition than the one that saved it, in general).
    auto single = fm_cnn(dt), resharded = fm_cnn(dt);
    copy_weights(*single, *model);
    copy_weights(*resharded, *ref);
    auto o_single = plain(k, single->parameters());
    o_single->load_state_dict(full);
    DistributedDataParallel ddp2(resharded, {.bucket_cap_mb = 0.05, .first_bucket_cap_mb = 0.01});
    auto o2 = zero(k, resharded->parameters());
    o2->load_state_dict(o_ref->state_dict());
    for (int i = half; i < kSteps; ++i) {
      step_single(*ref, *o_ref, nullptr, dt, i);
      step_single(*single, *o_single, nullptr, dt, i);
      step_ddp(ddp2, *o2, nullptr, dt, i);
    }
    const double d_single = rel_diff(*single, *ref), d_resharded = rel_diff(*resharded, *ref);
    std::printf(
        "rank %d: %s resumed for %d steps: single process from the consolidated state "
        "%.3g, ZeRO from the single process's state %.3g\n",
        rank(), k == Kind::SGD ? "SGD" : "AdamW", kSteps - half, d_single, d_resharded);
    CHECK(d_single < 1e-12);
    CHECK(d_resharded < 1e-12);
    CHECK(state_diff(o2->state_dict(), o_ref->state_dict()) < 1e-12);
  }
}

TEST_CASE("ZeRO-1: each rank holds the state of its shard only, about 1/N of it", "[mpi][zero]") {
  const DType dt = DType::f32;
  auto ref = fm_cnn(dt), model = fm_cnn(dt);
  DistributedDataParallel ddp(model);
  auto o_ref = plain(Kind::AdamW, ref->parameters());
  auto o = zero(Kind::AdamW, model->parameters());
  step_single(*ref, *o_ref, nullptr, dt, 0);
  step_ddp(ddp, *o, nullptr, dt, 0);

  const auto params = model->parameters();
  const auto& mine = o->local_parameters();
  int64_t owned_numel = 0, total_numel = 0, largest = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    total_numel += params[i].numel();
    largest = std::max(largest, params[i].numel());
    const bool owned = std::find(mine.begin(), mine.end(), static_cast<int64_t>(i)) != mine.end();
    CHECK(owned == (o->owner(static_cast<int64_t>(i)) == rank()));
    if (owned) owned_numel += params[i].numel();
  }
  // The local state: exactly the owned parameters' exp_avg and exp_avg_sq, shaped like them.
  const StateDict local = o->local_state_dict();
  for (size_t k = 0; k < mine.size(); ++k) {
    const Tensor& p = params[static_cast<size_t>(mine[k])];
    const std::string pre = "state." + std::to_string(k) + ".";
    CHECK(local.at(pre + "exp_avg").shape() == p.shape());
    CHECK(local.at(pre + "exp_avg_sq").shape() == p.shape());
  }
  CHECK_FALSE(local.contains("state." + std::to_string(mine.size()) + ".exp_avg"));
  const int64_t bytes = o->local_state_bytes();
  CHECK(bytes == 2 * owned_numel * 4 + static_cast<int64_t>(mine.size()) * 8);
  int64_t full_bytes = 0;
  for (const auto& [key, t] : o_ref->state_dict()) {
    if (key.rfind("state.", 0) == 0)
      full_bytes += t.numel() * static_cast<int64_t>(t.element_size());
  }
  std::printf(
      "rank %d of %d: %zu of %zu parameters, optimizer state %lld bytes of %lld "
      "(%.1f%%)\n",
      rank(), world_size(), mine.size(), params.size(), static_cast<long long>(bytes),
      static_cast<long long>(full_bytes), 100.0 * bytes / full_bytes);
  CHECK(static_cast<int64_t>(all_reduce_value(static_cast<double>(bytes))) == full_bytes);
  // The greedy partition: no rank holds more than its share plus the largest parameter.
  CHECK(owned_numel <= total_numel / world_size() + largest);
}

TEST_CASE("ZeRO-1: parameters that differ between ranks fail on every rank, naming them",
          "[mpi][zero]") {
  const int last = world_size() - 1;
  auto m = fm_cnn(DType::f32);
  auto params = m->parameters();
  if (rank() == last) params.pop_back();
  try {
    zero(Kind::SGD, params);
    FAIL("mismatched parameters must be refused");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("the parameters differ between ranks (rank(s) " + std::to_string(last) +
                   " differ from rank 0): rank " + std::to_string(last) + " has " +
                   std::to_string(params.size() - (rank() == last ? 0 : 1)) + " parameters") !=
          std::string::npos);
  }
  // An empty list on one rank: that rank gets the wrapped optimizer's message, the others name
  // it.
  std::vector<Tensor> some = m->parameters();
  if (rank() == last) some.clear();
  try {
    zero(Kind::SGD, some);
    FAIL("an empty parameter list must be refused");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    if (rank() == last) {
      CHECK(msg.find("SGD: got an empty parameter list") != std::string::npos);
    } else {
      CHECK(msg.find("building the wrapped optimizer failed on rank(s) " + std::to_string(last)) !=
            std::string::npos);
    }
  }
  CHECK_THROWS_WITH(ZeroRedundancyOptimizer(m->parameters(), OptimizerFactory{}),
                    Catch::Contains("the optimizer factory is empty"));
}

TEST_CASE("ZeRO-1 over a group of one equals the plain optimizer, GradScaler included",
          "[mpi][zero][world1]") {
  // A local group of one on every rank: no communication, the shard is everything.
  auto local = new_local_group(std::chrono::seconds(60));
  for (Kind k : {Kind::SGD, Kind::AdamW}) {
    INFO((k == Kind::SGD ? "SGD" : "AdamW"));
    auto ref = fm_cnn(DType::f32), model = fm_cnn(DType::f32);
    auto o_ref = plain(k, ref->parameters());
    auto o = zero(k, model->parameters(), local.get());
    CHECK(o->local_parameters().size() == model->parameters().size());
    CHECK(std::string(o->name()) == o_ref->name());
    amp::GradScaler sc_ref({.init_scale = 1024.0}), sc({.init_scale = 1024.0});
    const Data& d = fm_data(DType::f32);
    for (int s = 0; s < 5; ++s) {
      Tensor x = d.x.narrow(0, s * kBatch, kBatch), y = d.y.narrow(0, s * kBatch, kBatch);
      o_ref->zero_grad();
      sc_ref.scale(cross_entropy(ref->forward(x), y)).backward();
      sc_ref.step(*o_ref);
      sc_ref.update();
      o->zero_grad();
      sc.scale(cross_entropy(model->forward(x), y)).backward();
      optim::Optimizer& base = *o;  // stepped through the base class, as GradScaler does
      sc.step(base);
      sc.update();
    }
    CHECK(rel_diff(*model, *ref) == 0.0);
    CHECK(state_diff(o->state_dict(), o_ref->state_dict()) == 0.0);
    CHECK_THROWS_WITH(o->add_param_group({}), Catch::Contains("not supported"));
  }
}
