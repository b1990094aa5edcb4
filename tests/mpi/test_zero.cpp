// ZeroRedundancyOptimizer (ZeRO-1) on 2 and 3 ranks: DDP + ZeRO(SGD momentum) and DDP +
// ZeRO(AdamW, driven by an LR scheduler) train exactly like one process with the plain
// optimizer (the Fashion-MNIST CNN of test_ddp.cpp); the consolidated state dict is the single
// process's and loads into it; a single-process state re-sharded into ZeRO continues
// identically; each rank holds only its shard's state; mismatched parameters fail on every rank.
// ZeRO-2 (DDP with shard_gradients = the ZeRO optimizer): the CNN with SyncBatchNorm (SGD
// momentum) and a transformer encoder (AdamW + StepLR) train like one process, with no_sync
// accumulation too; each rank keeps exactly its own parameters' gradients, through both the
// reduce-scattered buckets and the all-reduced single-owner ones. With GradScaler and
// distributed::clip_grad_norm_ (ZeRO-1 and 2): an overflow in one owner's gradient skips the
// step on every rank, and the clipped, scaled run equals one process.
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

// `lr_scale` multiplies the learning rate (the BatchNorm model trains at 0.2x, see test_ddp.cpp).
std::unique_ptr<optim::Optimizer> plain(Kind k, std::vector<optim::ParamGroup> groups,
                                        double lr_scale = 1.0) {
  if (k == Kind::SGD)
    return std::make_unique<optim::SGD>(
        std::move(groups),
        optim::SGDOptions{.lr = 0.05 * lr_scale, .momentum = 0.9, .weight_decay = 1e-4});
  return std::make_unique<optim::AdamW>(
      std::move(groups), optim::AdamWOptions{.lr = 2e-3 * lr_scale, .weight_decay = 0.05});
}
std::unique_ptr<optim::Optimizer> plain(Kind k, std::vector<Tensor> params, double lr_scale = 1.0) {
  return plain(k, std::vector<optim::ParamGroup>{{.params = std::move(params)}}, lr_scale);
}

std::unique_ptr<ZeroRedundancyOptimizer> zero(Kind k, std::vector<Tensor> params,
                                              ProcessGroup* group = nullptr,
                                              double lr_scale = 1.0) {
  return std::make_unique<ZeroRedundancyOptimizer>(
      std::move(params),
      [k, lr_scale](std::vector<optim::ParamGroup> g) { return plain(k, std::move(g), lr_scale); },
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

// --- ZeRO-2: DDP reduce-scatters the gradients to their owners (DDPOptions::shard_gradients) ---

namespace {

enum class Net { CNN, CNNBN, Encoder };
const char* net_name(Net n) {
  return n == Net::CNN ? "CNN" : n == Net::CNNBN ? "CNN+BatchNorm" : "transformer encoder";
}

// A one-layer transformer encoder (d_model 8, 2 heads, feed-forward 16, no dropout) over
// sequences of 5 tokens, regressed onto random targets.
class TinyEncoder : public nn::Module {
 public:
  explicit TinyEncoder(DType dt) : Module("TinyEncoder") {
    manual_seed(43);
    layer_ = register_module("layer",
                             std::make_shared<nn::TransformerEncoderLayer>(
                                 8, 2,
                                 nn::TransformerEncoderLayerOptions{
                                     .dim_feedforward = 16, .dropout = 0.0, .batch_first = true},
                                 TensorOptions(dt)));
  }
  Tensor forward(const Tensor& x) override { return layer_->forward(x); }

 private:
  std::shared_ptr<nn::TransformerEncoderLayer> layer_;
};

const Data& encoder_data(DType dt) {
  static std::map<DType, Data> cache;
  auto it = cache.find(dt);
  if (it != cache.end()) return it->second;
  Generator g(11);
  const int64_t n = 2 * kSteps * kBatch;
  return cache[dt] = Data{randn({n, 5, 8}, dt, &g), randn({n, 5, 8}, dt, &g)};
}

// The model; `sync` converts its BatchNorm to SyncBatchNorm (the DDP side).
std::shared_ptr<nn::Module> make_net(Net n, DType dt, bool sync) {
  if (n == Net::Encoder) return std::make_shared<TinyEncoder>(dt);
  auto m = mpi_test::fm_cnn(n == Net::CNNBN, dt);
  if (sync && n == Net::CNNBN) convert_sync_batchnorm(m);
  return m;
}

// The mean loss of `f` over samples [first, first + count).
Tensor net_loss(Net n, DType dt, const std::function<Tensor(const Tensor&)>& f, int64_t first,
                int64_t count) {
  if (n == Net::Encoder) {
    const Data& d = encoder_data(dt);
    return mse_loss(f(d.x.narrow(0, first, count)), d.y.narrow(0, first, count));
  }
  const Data& d = fm_data(dt);
  return cross_entropy(f(d.x.narrow(0, first, count)), d.y.narrow(0, first, count));
}

struct Zero2Result {
  double weights = 0, state = 0;
};

// One process with the plain optimizer beside this rank under DDP(shard_gradients) + ZeRO, for
// kSteps on the same global batches (`micro` micro-batches per step, all but the last under
// no_sync). After the first synchronised backward, checks that this rank holds exactly its own
// parameters' gradients.
Zero2Result train_zero2(Kind k, Net net, DType dt, int micro, double lr_scale,
                        double* sensitivity = nullptr) {
  auto ref = make_net(net, dt, false), model = make_net(net, dt, true);
  auto o_ref = plain(k, ref->parameters(), lr_scale);
  auto o = zero(k, model->parameters(), nullptr, lr_scale);
  DistributedDataParallel ddp(
      model, {.bucket_cap_mb = 0.05, .first_bucket_cap_mb = 0.01, .shard_gradients = o.get()});
  auto s_ref = scheduler(k, *o_ref), s = scheduler(k, *o);
  const int64_t per_rank = kBatch / world_size(), per_micro = per_rank / micro;
  auto single_step = [&](nn::Module& m, optim::Optimizer& opt, optim::LRScheduler* sched, int i) {
    opt.zero_grad();
    net_loss(
        net, dt, [&](const Tensor& x) { return m.forward(x); }, i * kBatch, kBatch)
        .backward();
    opt.step();
    if (sched) sched->step();
  };
  for (int i = 0; i < kSteps; ++i) {
    single_step(*ref, *o_ref, s_ref.get(), i);
    o->zero_grad();
    for (int m = 0; m < micro; ++m) {
      const int64_t first = i * kBatch + rank() * per_rank + m * per_micro;
      auto loss = [&] {
        return div(net_loss(
                       net, dt, [&](const Tensor& x) { return ddp(x); }, first, per_micro),
                   static_cast<double>(micro));
      };
      if (m + 1 < micro) {
        auto guard = ddp.no_sync();
        loss().backward();
      } else {
        loss().backward();
      }
    }
    if (i == 0) {
      // Only the owned parameters keep a gradient; together the ranks hold each one once.
      const auto params = model->parameters();
      int64_t held = 0, total = 0;
      for (const Tensor& p : params) {
        total += p.numel();
        const bool mine = o->owner_of(p) == rank();
        CHECK(p.grad().defined() == mine);
        if (p.grad().defined()) held += p.grad().numel();
      }
      CHECK(static_cast<int64_t>(all_reduce_value(static_cast<double>(held))) == total);
    }
    o->step();
    if (s) s->step();
  }
  Zero2Result r;
  r.weights = rel_diff(*model, *ref);
  r.state = state_diff(o->state_dict(), o_ref->state_dict());
  CHECK(all_reduce_value(r.weights, ReduceOp::Max) == r.weights);
  if (sensitivity) {
    auto ref2 = make_net(net, dt, false);
    {
      NoGradGuard ng;
      Generator gp(77);
      const double ulp = dt == DType::f32 ? 1.2e-7 : 2.3e-16;
      for (auto& p : ref2->parameters())
        p.copy_(mul(p, add(mul(randn(p.shape(), dt, &gp), ulp), 1.0)));
    }
    auto o2 = plain(k, ref2->parameters(), lr_scale);
    auto s2 = scheduler(k, *o2);
    for (int i = 0; i < kSteps; ++i) single_step(*ref2, *o2, s2.get(), i);
    *sensitivity = rel_diff(*ref2, *ref);
  }
  return r;
}

void check_zero2(Kind k, Net net, double lr_scale) {
  double s32 = 0;
  const Zero2Result f32 = train_zero2(k, net, DType::f32, 1, lr_scale, &s32);
  const Zero2Result f64 = train_zero2(k, net, DType::f64, 1, lr_scale);
  std::printf(
      "rank %d: ZeRO-2 (%s, %s) vs one process after %d steps: f32 %.3g (bound %.3g), f64 %.3g, "
      "f64 state dict %.3g\n",
      rank(), k == Kind::SGD ? "SGD momentum" : "AdamW + StepLR", net_name(net), kSteps,
      f32.weights, f32_bound(s32), f64.weights, f64.state);
  CHECK(f32.weights <= f32_bound(s32));
  CHECK(f64.weights < 1e-12);
  CHECK(f64.state < 1e-12);
}

}  // namespace

TEST_CASE("ZeRO-2 (SGD momentum): CNN with SyncBatchNorm equals one process", "[mpi][zero2]") {
  // lr 0.01 as DDP's BatchNorm test: at 0.05 the single process itself is chaotic.
  check_zero2(Kind::SGD, Net::CNNBN, 0.2);
}

TEST_CASE("ZeRO-2 (AdamW + StepLR): transformer encoder equals one process", "[mpi][zero2]") {
  check_zero2(Kind::AdamW, Net::Encoder, 1.0);
}

TEST_CASE("ZeRO-2 with no_sync: 2 micro-batches per step equal one process", "[mpi][zero2]") {
  if (kBatch / world_size() % 2 != 0) return;
  const Zero2Result cnn = train_zero2(Kind::SGD, Net::CNN, DType::f64, 2, 1.0);
  const Zero2Result enc = train_zero2(Kind::AdamW, Net::Encoder, DType::f64, 2, 1.0);
  std::printf("rank %d: ZeRO-2 no_sync x2 vs one process, f64: CNN %.3g, encoder %.3g\n", rank(),
              cnn.weights, enc.weights);
  CHECK(cnn.weights < 1e-12);
  CHECK(enc.weights < 1e-12);
  CHECK(enc.state < 1e-12);
}

TEST_CASE("ZeRO-2: buckets are one padded segment per rank; misuse is refused", "[mpi][zero2]") {
  // The CNN's few large parameters each fill a bucket alone (all-reduced, one owner); the
  // encoder's many small ones share a bucket between owners (reduce-scattered).
  for (Net net : {Net::CNN, Net::Encoder}) {
    INFO(net_name(net));
    auto model = make_net(net, DType::f32, true);
    auto o = zero(Kind::SGD, model->parameters());
    DistributedDataParallel ddp(
        model, {.bucket_cap_mb = 0.05, .first_bucket_cap_mb = 0.01, .shard_gradients = o.get()});
    int64_t reduced = 0, total = 0, in_bucket = 0, scattered = 0;
    for (const auto& b : ddp.buckets()) {
      int64_t elements = 0;
      for (const std::string& name : b.parameters)
        for (const auto& [n, p] : model->named_parameters())
          if (n == name) elements += p.numel();
      in_bucket += elements;
      // Reduce-scattered: size() segments, padding at most doubling it; else all-reduced as is.
      if (b.shard_numel > 0) {
        ++scattered;
        CHECK(b.numel == b.shard_numel * world_size());
        CHECK(b.numel <= 2 * elements);
      } else {
        CHECK(b.numel == elements);
      }
      reduced += b.numel;
    }
    for (const Tensor& p : model->parameters()) total += p.numel();
    CHECK(in_bucket == total);
    if (net == Net::Encoder) CHECK(scattered > 0);
    // One step: each rank keeps its own parameters' gradients, and only those.
    const int64_t per_rank = kBatch / world_size();
    net_loss(
        net, DType::f32, [&](const Tensor& x) { return ddp(x); }, rank() * per_rank, per_rank)
        .backward();
    int64_t kept = 0;
    for (const Tensor& p : model->parameters()) {
      CHECK(p.grad().defined() == (o->owner_of(p) == rank()));
      if (p.grad().defined()) kept += p.grad().numel();
    }
    std::printf(
        "rank %d: ZeRO-2, %s: %zu buckets, %lld reduce-scattered, %lld elements on the wire "
        "for %lld; gradients kept on this rank: %lld elements (%.1f%%)\n",
        rank(), net_name(net), ddp.buckets().size(), static_cast<long long>(scattered),
        static_cast<long long>(reduced), static_cast<long long>(total),
        static_cast<long long>(kept), 100.0 * kept / total);
    CHECK(static_cast<int64_t>(all_reduce_value(static_cast<double>(kept))) == total);
  }

  auto model = make_net(Net::CNN, DType::f32, true);
  auto o = zero(Kind::SGD, model->parameters());
  auto other = make_net(Net::CNN, DType::f32, true);
  CHECK_THROWS_WITH(DistributedDataParallel(other, {.shard_gradients = o.get()}),
                    Catch::Contains("is not one of the ZeroRedundancyOptimizer's parameters"));
  CHECK_THROWS_WITH(
      DistributedDataParallel(model,
                              {.gradient_compression = DType::bf16, .shard_gradients = o.get()}),
      Catch::Contains("works neither with gradient_as_bucket_view nor with gradient_compression"));
}

namespace {

struct ScaledResult {
  double weights = 0, norms = 0, scale = 0;
  int skipped = 0, clipped = 0;
};

// One process (plain AdamW, GradScaler, optim::clip_grad_norm_) beside this rank under DDP +
// ZeRO (`sharded`: ZeRO-2's reduce-scattered gradients) with GradScaler and
// distributed::clip_grad_norm_, on the transformer encoder in f64 for kSteps. At steps 3 and 11
// one parameter's gradient gets an inf after backward: on one process, and under ZeRO on the
// rank that owns it only (under ZeRO-2 the others do not hold that gradient), so every rank
// must skip those steps, and the scale must back off alike.
ScaledResult train_scaled(bool sharded) {
  const Net net = Net::Encoder;
  const DType dt = DType::f64;
  auto ref = make_net(net, dt, false), model = make_net(net, dt, true);
  auto o_ref = plain(Kind::AdamW, ref->parameters());
  auto o = zero(Kind::AdamW, model->parameters());
  DistributedDataParallel ddp(model, {.bucket_cap_mb = 0.05,
                                      .first_bucket_cap_mb = 0.01,
                                      .shard_gradients = sharded ? o.get() : nullptr});
  const amp::GradScalerOptions so{.init_scale = 1024.0, .growth_interval = 3};
  amp::GradScaler sc_ref(so), sc(so);
  const int64_t per_rank = kBatch / world_size();
  const int64_t poisoned = 2;  // flat index of the parameter whose gradient overflows
  const double max_norm = 0.05;
  ScaledResult r;
  for (int i = 0; i < kSteps; ++i) {
    const bool poison = i == 3 || i == 11;
    // One process.
    o_ref->zero_grad();
    sc_ref
        .scale(net_loss(
            net, dt, [&](const Tensor& x) { return ref->forward(x); }, i * kBatch, kBatch))
        .backward();
    if (poison) ref->parameters()[poisoned].grad().view({-1}).narrow(0, 0, 1).fill_(INFINITY);
    sc_ref.unscale_(*o_ref);
    const double n_ref = optim::clip_grad_norm_(ref->parameters(), max_norm).item<double>();
    const bool took_ref = sc_ref.step(*o_ref);
    sc_ref.update();
    // This rank under ZeRO.
    o->zero_grad();
    const int64_t first = i * kBatch + rank() * per_rank;
    sc.scale(net_loss(
                 net, dt, [&](const Tensor& x) { return ddp(x); }, first, per_rank))
        .backward();
    const Tensor p = model->parameters()[poisoned];
    if (poison && o->owner_of(p) == rank()) p.grad().view({-1}).narrow(0, 0, 1).fill_(INFINITY);
    sc.unscale_(*o);
    const double n = distributed::clip_grad_norm_(*o, max_norm).item<double>();
    const bool took = sc.step(*o);
    sc.update();
    CHECK(took == took_ref);
    CHECK(took == !poison);
    if (!took) ++r.skipped;
    if (std::isfinite(n_ref)) {
      r.norms = std::max(r.norms, std::fabs(n - n_ref) / n_ref);
      if (n_ref > max_norm) ++r.clipped;
    } else {
      CHECK(!std::isfinite(n));
    }
  }
  r.weights = rel_diff(*model, *ref);
  r.scale = std::fabs(sc.get_scale() - sc_ref.get_scale());
  CHECK(all_reduce_value(r.weights, ReduceOp::Max) == r.weights);
  return r;
}

}  // namespace

TEST_CASE(
    "ZeRO-1 and ZeRO-2 with GradScaler and clipping: an overflow on one owner skips the "
    "step on every rank, and the clipped run equals one process",
    "[mpi][zero2][scaler]") {
  for (const bool sharded : {false, true}) {
    const ScaledResult r = train_scaled(sharded);
    std::printf(
        "rank %d: ZeRO-%d + GradScaler + clip_grad_norm_ vs one process, f64: weights %.3g, "
        "norms %.3g, %d steps skipped, %d clipped\n",
        rank(), sharded ? 2 : 1, r.weights, r.norms, r.skipped, r.clipped);
    CHECK(r.skipped == 2);
    CHECK(r.clipped >= kSteps / 2);  // the clipping is exercised, not a no-op
    CHECK(r.weights < 1e-12);
    // The totals differ only in the order of the partial sums: a few ulps of each.
    CHECK(r.norms < 1e-13);
    CHECK(r.scale == 0.0);
  }
}
