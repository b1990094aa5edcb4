// FullyShardedDataParallel (ZeRO-3) on 2 and 3 ranks: N ranks x B/N train exactly like one
// process x B (a CNN with SyncBatchNorm in flat units, nested units and units that checkpoint
// their activations; a two-layer transformer encoder with AdamW and gradient accumulation); the
// full state dicts (model and optimizer) are the single process's; each rank holds ~1/N of the
// parameters, gradients and optimizer state (the table is printed); misuse fails loudly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "dltrain/dltrain.hpp"
#include "tests/mpi/fm_model.hpp"

using namespace dltrain;
using namespace dltrain::distributed;

namespace {

using namespace mpi_test;

// A block (conv-BN-ReLU-pool) whose forward may checkpoint its activations in 2 segments.
class Block : public nn::Module {
 public:
  Block(int64_t in, int64_t out, bool checkpoint, DType dt, bool sync)
      : Module("Block"), checkpoint_(checkpoint) {
    nn::Conv2dOptions c;
    c.padding = 1;
    c.bias = false;
    seq_ = std::make_shared<nn::Sequential>();
    seq_->push_back(std::make_shared<nn::Conv2d>(in, out, 3, c, TensorOptions(dt)));
    auto bn = std::make_shared<nn::BatchNorm2d>(out, nn::BatchNormOptions{}, TensorOptions(dt));
    if (sync) make_sync_batchnorm(*bn);
    seq_->push_back(bn)
        .push_back(std::make_shared<nn::ReLU>())
        .push_back(std::make_shared<nn::MaxPool2d>(2));
    register_module("seq", seq_);
  }
  Tensor forward(const Tensor& x) override {
    return checkpoint_ ? nn::checkpoint_sequential(*seq_, 2, x) : (*seq_)(x);
  }

 private:
  std::shared_ptr<nn::Sequential> seq_;
  bool checkpoint_;
};

// The Fashion-MNIST CNN as [block, block, flatten, linear]; `sync`: SyncBatchNorm.
std::shared_ptr<nn::Sequential> cnn(DType dt, bool sync, bool checkpoint = false) {
  manual_seed(42);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<Block>(1, 32, checkpoint, dt, sync))
      .push_back(std::make_shared<Block>(32, 64, checkpoint, dt, sync))
      .push_back(std::make_shared<nn::Flatten>())
      .push_back(std::make_shared<nn::Linear>(64 * 7 * 7, 10, true, TensorOptions(dt)));
  return m;
}

// Two transformer encoder layers (d_model 8, 2 heads, feed-forward 16, no dropout), batch first.
std::shared_ptr<nn::Sequential> encoder(DType dt) {
  manual_seed(43);
  auto m = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 2; ++i)
    m->push_back(std::make_shared<nn::TransformerEncoderLayer>(
        8, 2,
        nn::TransformerEncoderLayerOptions{
            .dim_feedforward = 16, .dropout = 0.0, .batch_first = true},
        TensorOptions(dt)));
  return m;
}

const Data& encoder_data(DType dt) {
  static std::map<DType, Data> cache;
  auto it = cache.find(dt);
  if (it != cache.end()) return it->second;
  Generator g(11);
  const int64_t n = 2 * kSteps * kBatch;
  return cache[dt] = Data{randn({n, 5, 8}, dt, &g), randn({n, 5, 8}, dt, &g)};
}

enum class Net { CNN, Encoder };

Tensor loss_of(Net net, DType dt, const std::function<Tensor(const Tensor&)>& f, int64_t first,
               int64_t count) {
  if (net == Net::Encoder) {
    const Data& d = encoder_data(dt);
    return mse_loss(f(d.x.narrow(0, first, count)), d.y.narrow(0, first, count));
  }
  const Data& d = fm_data(dt);
  return cross_entropy(f(d.x.narrow(0, first, count)), d.y.narrow(0, first, count));
}

std::unique_ptr<optim::Optimizer> make_opt(Net net, std::vector<Tensor> params) {
  if (net == Net::CNN)
    return std::make_unique<optim::SGD>(
        std::move(params), optim::SGDOptions{.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-4});
  return std::make_unique<optim::AdamW>(std::move(params),
                                        optim::AdamWOptions{.lr = 2e-3, .weight_decay = 0.05});
}

struct Setup {
  Net net = Net::CNN;
  DType dt = DType::f64;
  std::vector<std::string> units{};
  bool checkpoint = false;
  int micro = 1;
};

std::shared_ptr<nn::Module> make_model(const Setup& s, bool fsdp_side) {
  if (s.net == Net::Encoder) return encoder(s.dt);
  return cnn(s.dt, fsdp_side, fsdp_side && s.checkpoint);
}

void single_step(const Setup& s, nn::Module& m, optim::Optimizer& o, int i) {
  o.zero_grad();
  loss_of(
      s.net, s.dt, [&](const Tensor& x) { return m.forward(x); }, i * kBatch, kBatch)
      .backward();
  o.step();
}

// The relative difference of the single process's model and the FSDP model's full state after
// `steps`; `check` runs on both after training (state dicts).
double train_pair(const Setup& s, int steps = kSteps, double* sensitivity = nullptr,
                  const std::function<void(FullyShardedDataParallel&, optim::Optimizer&,
                                           nn::Module&, optim::Optimizer&)>& check = {}) {
  auto ref = make_model(s, false), model = make_model(s, true);
  auto o_ref = make_opt(s.net, ref->parameters());
  FullyShardedDataParallel fsdp(model, {.units = s.units});
  auto o = make_opt(s.net, fsdp.parameters());
  const int64_t per_rank = kBatch / world_size(), per_micro = per_rank / s.micro;
  for (int i = 0; i < steps; ++i) {
    single_step(s, *ref, *o_ref, i);
    o->zero_grad();
    for (int m = 0; m < s.micro; ++m) {
      const int64_t first = i * kBatch + rank() * per_rank + m * per_micro;
      auto loss = [&] {
        return div(loss_of(
                       s.net, s.dt, [&](const Tensor& x) { return fsdp(x); }, first, per_micro),
                   static_cast<double>(s.micro));
      };
      if (m + 1 < s.micro) {
        auto guard = fsdp.no_sync();
        loss().backward();
      } else {
        loss().backward();
      }
    }
    o->step();
  }
  auto full = fsdp.full_state_dict();
  auto single = make_model(s, false);
  single->load_state_dict(full);
  const double d = rel_diff(*single, *ref);
  CHECK(all_reduce_value(d, ReduceOp::Max) == d);  // every rank gathered the same model
  if (check) check(fsdp, *o, *ref, *o_ref);
  if (sensitivity) {
    auto ref2 = make_model(s, false);
    {
      NoGradGuard ng;
      Generator gp(77);
      const double ulp = s.dt == DType::f32 ? 1.2e-7 : 2.3e-16;
      for (auto& p : ref2->parameters())
        p.copy_(mul(p, add(mul(randn(p.shape(), s.dt, &gp), ulp), 1.0)));
    }
    auto o2 = make_opt(s.net, ref2->parameters());
    for (int i = 0; i < steps; ++i) single_step(s, *ref2, *o2, i);
    *sensitivity = rel_diff(*ref2, *ref);
  }
  return d;
}

double state_diff(const StateDict& a, const StateDict& b) {
  double worst = 0;
  for (const auto& [k, t] : b) {
    if (k == "type") continue;
    INFO("entry " << k);
    REQUIRE(a.contains(k));
    const Tensor& u = a.at(k);
    REQUIRE(u.shape() == t.shape());
    const auto x = u.to(DType::f64).to_vector<double>(), y = t.to(DType::f64).to_vector<double>();
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      num += (x[i] - y[i]) * (x[i] - y[i]);
      den += y[i] * y[i];
    }
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
  for (const auto& [k, t] : a) CHECK(b.contains(k));
  return worst;
}

}  // namespace

TEST_CASE("FSDP: flat, nested and checkpointing units equal one process (CNN + SyncBatchNorm)",
          "[mpi][fsdp]") {
  // lr 0.01 with BatchNorm, as DDP's test (at 0.05 the single process itself is chaotic).
  const std::vector<std::string> flat = {"0", "1", "3"};
  const std::vector<std::string> nested = {"0", "0.seq.0", "1", "1.seq.0"};
  double s32 = 0;
  const double f32 = train_pair({.dt = DType::f32, .units = flat}, kSteps, &s32);
  const double f64_flat = train_pair({.units = flat});
  const double f64_nested = train_pair({.units = nested});
  const double f64_ckpt = train_pair({.units = flat, .checkpoint = true});
  std::printf(
      "rank %d: FSDP vs one process after %d steps (CNN+SyncBN, SGD momentum): f32 flat %.3g "
      "(bound %.3g), f64 flat %.3g, nested %.3g, checkpointed units %.3g\n",
      rank(), kSteps, f32, f32_bound(s32), f64_flat, f64_nested, f64_ckpt);
  CHECK(f32 <= f32_bound(s32));
  CHECK(f64_flat < 1e-12);
  CHECK(f64_nested < 1e-12);
  CHECK(f64_ckpt < 1e-12);
}

TEST_CASE("FSDP: transformer encoder with AdamW, with and without no_sync accumulation",
          "[mpi][fsdp]") {
  const std::vector<std::string> layers = {"0", "1"};
  double s32 = 0;
  const double f32 =
      train_pair({.net = Net::Encoder, .dt = DType::f32, .units = layers}, kSteps, &s32);
  double state = 1;
  const double f64 = train_pair(
      {.net = Net::Encoder, .units = layers}, kSteps, nullptr,
      [&](FullyShardedDataParallel& f, optim::Optimizer& o, nn::Module&, optim::Optimizer& o_ref) {
        state = state_diff(f.full_optim_state_dict(o), o_ref.state_dict());
      });
  const double micro = kBatch / world_size() % 2 == 0
                           ? train_pair({.net = Net::Encoder, .units = layers, .micro = 2})
                           : 0.0;
  std::printf(
      "rank %d: FSDP vs one process (encoder, AdamW): f32 %.3g (bound %.3g), f64 %.3g, full "
      "optimizer state %.3g, f64 with no_sync x2 %.3g\n",
      rank(), f32, f32_bound(s32), f64, state, micro);
  CHECK(f32 <= f32_bound(s32));
  CHECK(f64 < 1e-12);
  CHECK(state < 1e-12);
  CHECK(micro < 1e-12);
}

TEST_CASE("FSDP: full state dicts load into one process and back; sharded state round-trips",
          "[mpi][fsdp]") {
  const Setup s{.units = {"0", "1", "3"}};
  const int half = kSteps / 2;
  train_pair(s, half, nullptr,
             [&](FullyShardedDataParallel& f, optim::Optimizer& o, nn::Module& ref,
                 optim::Optimizer& o_ref) {
               const StateDict model = f.full_state_dict(), optim = f.full_optim_state_dict(o);
               CHECK(state_diff(optim, o_ref.state_dict()) < 1e-12);
               // A fresh FSDP on this rank count from the single process's state continues
               // like it; the sharded state reloads into it exactly.
               auto m2 = make_model(s, true);
               FullyShardedDataParallel f2(m2, {.units = s.units});
               auto o2 = make_opt(s.net, f2.parameters());
               f2.load_full_state_dict(ref.state_dict());
               f2.load_full_optim_state_dict(*o2, o_ref.state_dict());
               StateDict ref_half;
               for (const auto& [k, t] : ref.state_dict()) ref_half.insert(k, t.clone());
               const StateDict shards = f2.sharded_state_dict();
               const StateDict local_opt = o2->state_dict();
               for (int i = half; i < kSteps; ++i) {
                 single_step(s, ref, o_ref, i);
                 o2->zero_grad();
                 const int64_t per_rank = kBatch / world_size();
                 loss_of(
                     s.net, s.dt, [&](const Tensor& x) { return f2(x); },
                     i * kBatch + rank() * per_rank, per_rank)
                     .backward();
                 o2->step();
               }
               auto single = make_model(s, false);
               single->load_state_dict(f2.full_state_dict());
               const double resumed = rel_diff(*single, ref);
               f2.load_sharded_state_dict(shards);
               o2->load_state_dict(local_opt);
               auto back = make_model(s, false);
               back->load_state_dict(f2.full_state_dict());
               std::printf(
                   "rank %d: FSDP resumed from a single process's state for %d steps: "
                   "%.3g\n",
                   rank(), kSteps - half, resumed);
               CHECK(resumed < 1e-12);
               CHECK(state_diff(back->state_dict(), ref_half) == 0.0);
               CHECK(state_diff(model, ref_half) < 1e-12);
               StateDict wrong = shards;
               wrong.insert_scalar("world_size", world_size() + 1);
               CHECK_THROWS_WITH(f2.load_sharded_state_dict(wrong),
                                 Catch::Contains("resumes on the same rank count only"));
               StateDict missing = ref.state_dict();
               StateDict partial;
               for (const auto& [k, t] : missing)
                 if (k != "3.bias") partial.insert(k, t);
               CHECK_THROWS_WITH(f2.load_full_state_dict(partial),
                                 Catch::Contains("missing '3.bias'"));
             });
}

TEST_CASE("FSDP: per-rank parameters + gradients + Adam state <= 1/N + the largest unit",
          "[mpi][fsdp][memory]") {
  const DType dt = DType::f32;
  auto model = cnn(dt, true);
  const std::vector<std::string> units = {"0", "1", "3"};
  int64_t total = 0;
  for (const Tensor& p : model->parameters()) total += p.numel();
  FullyShardedDataParallel fsdp(model, {.units = units});
  optim::Adam o(fsdp.parameters(), {.lr = 1e-3});
  const Data& d = fm_data(dt);
  const int64_t per_rank = kBatch / world_size();
  o.zero_grad();
  cross_entropy(fsdp(d.x.narrow(0, rank() * per_rank, per_rank)),
                d.y.narrow(0, rank() * per_rank, per_rank))
      .backward();
  const int64_t grad_bytes = fsdp.local_gradient_bytes();
  o.step();
  int64_t state_bytes = 0;
  for (const auto& [k, t] : o.state_dict())
    if (k.rfind("state.", 0) == 0)
      state_bytes += t.numel() * static_cast<int64_t>(t.element_size());
  int64_t largest = 0;
  for (const auto& u : fsdp.units()) largest = std::max(largest, u.numel);
  const int64_t param_bytes = fsdp.local_parameter_bytes();
  const int64_t mine = param_bytes + grad_bytes + state_bytes;
  // One process (or DDP on each rank): parameters, gradients, exp_avg, exp_avg_sq, in f32, and
  // Adam's step per parameter (8 bytes each).
  const int64_t ddp = 4 * total * 4 + static_cast<int64_t>(model->parameters().size()) * 8;
  const int64_t bound = ddp / world_size() + 4 * largest * 4 + 8 * 8;
  if (rank() == 0)
    std::printf(
        "FSDP memory per rank, CNN (%lld parameters, largest unit %lld), Adam, %d ranks:\n"
        "  %-10s %12s %12s %12s %12s\n",
        static_cast<long long>(total), static_cast<long long>(largest), world_size(), "rank",
        "params", "grads", "adam state", "total");
  for (int r = 0; r < world_size(); ++r) {
    if (r == rank())
      std::printf("  %-10d %12lld %12lld %12lld %12lld (%.1f%% of one process's %lld)\n", r,
                  static_cast<long long>(param_bytes), static_cast<long long>(grad_bytes),
                  static_cast<long long>(state_bytes), static_cast<long long>(mine),
                  100.0 * mine / ddp, static_cast<long long>(ddp));
    std::fflush(stdout);
    barrier();
  }
  CHECK(mine <= bound);
  CHECK(grad_bytes == param_bytes);  // the shard's gradient only, the module's all dropped
  for (const Tensor& p : model->parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("FSDP: misuse is refused with a message", "[mpi][fsdp]") {
  auto model = cnn(DType::f32, true);
  CHECK_THROWS_WITH(FullyShardedDataParallel(model, {.units = {"7"}}),
                    Catch::Contains("no submodule '7'"));
  CHECK_THROWS_WITH(FullyShardedDataParallel(model, {.units = {"2"}}),
                    Catch::Contains("unit '2' has no trainable parameters of its own"));
  FullyShardedDataParallel fsdp(model, {.units = {"0"}});
  optim::LAMB lamb(fsdp.parameters(), {});
  CHECK_THROWS_WITH(fsdp.full_optim_state_dict(lamb), Catch::Contains("not elementwise"));
  // The encoder layer calls its attention through a multi-argument forward: no hooks run.
  auto enc = encoder(DType::f32);
  FullyShardedDataParallel f2(enc, {.units = {"0", "0.self_attn"}});
  CHECK_THROWS_WITH(
      f2(encoder_data(DType::f32).x.narrow(0, 0, 2)),
      Catch::Contains("unit(s) '0.self_attn' did not run through Module::operator()"));
}
