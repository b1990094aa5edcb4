// DistributedDataParallel, SyncBatchNorm and the process-group plumbing in a world of one
// (the local group): what must hold whatever the number of ranks. The multi-rank behaviour
// is tested under mpirun in tests/mpi.
#include <catch2/catch.hpp>

#include <algorithm>
#include <deque>
#include <map>
#include <thread>

#include "dltrain/dltrain.hpp"
#include "src/distributed/internal.hpp"
#include "tests/gradcheck.hpp"

using namespace dltrain;
using namespace dltrain::distributed;

namespace {

std::shared_ptr<nn::Sequential> small_cnn(bool bn, DType dt = DType::f32) {
  Generator g(7);
  nn::Conv2dOptions c;
  c.padding = 1;
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Conv2d>(1, 4, 3, c, TensorOptions(dt)));
  if (bn) m->push_back(std::make_shared<nn::BatchNorm2d>(4, nn::BatchNormOptions{}, dt));
  m->push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::MaxPool2d>(2))
      .push_back(std::make_shared<nn::Flatten>())
      .push_back(std::make_shared<nn::Linear>(4 * 4 * 4, 3, true, TensorOptions(dt)));
  return m;
}

void copy_weights(nn::Module& dst, const nn::Module& src) { dst.load_state_dict(src.state_dict()); }

std::vector<double> flat_params(const nn::Module& m) {
  std::vector<double> out;
  for (const auto& p : m.parameters()) {
    auto v = p.to(DType::f64).to_vector<double>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace

TEST_CASE("autograd::queue_callback runs once after the last node, and only inside backward",
          "[distributed][autograd]") {
  Tensor w = ones({3}).requires_grad_();
  int calls = 0;
  bool grad_ready = false;
  w.register_hook([&](const Tensor&) {
    autograd::queue_callback([&] {
      ++calls;
      grad_ready = w.grad().defined();
    });
  });
  sum(mul(w, 2.0)).backward();
  CHECK(calls == 1);
  CHECK(grad_ready);
  CHECK_THROWS_WITH(autograd::queue_callback([] {}),
                    Catch::Contains("no backward pass is running"));
}

TEST_CASE("local group: collectives are the identity and check their arguments",
          "[distributed][group]") {
  auto g = new_local_group(std::chrono::seconds(10));
  CHECK(g->size() == 1);
  CHECK(std::string(g->backend()) == "local");
  Tensor t = tensor({1, 2, 3});
  Work w = g->all_reduce(t, ReduceOp::Avg);
  w.wait();
  CHECK(w.is_completed());
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3});
  Tensor out = zeros({3});
  g->all_gather(out, t).wait();
  CHECK(out.to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK_THROWS_WITH(g->all_reduce(tensor({1, 2}, DType::i64), ReduceOp::Avg).wait(),
                    Catch::Contains("averaging needs a floating dtype"));
  Tensor strided = zeros({4, 8}).narrow(1, 0, 4);  // gaps between rows
  CHECK_THROWS_WITH(g->all_reduce(strided).wait(), Catch::Contains("not dense"));
  CHECK_THROWS_WITH(g->broadcast(t, 1).wait(), Catch::Contains("root 1"));
}

TEST_CASE("tcp rendezvous delivers rank 0's bytes to every rank on loopback",
          "[distributed][tcp]") {
  const std::string blob(128, '\x7f');
  const int port =
      29000 + static_cast<int>(std::hash<std::thread::id>()(std::this_thread::get_id()) % 900);
  std::vector<std::string> got(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.emplace_back([&, r] {
      got[static_cast<size_t>(r)] = tcp_broadcast_bytes(
          "127.0.0.1", port, r, 3, r == 0 ? blob : std::string(), std::chrono::seconds(20));
    });
  for (auto& t : ranks) t.join();
  for (const auto& s : got) CHECK(s == blob);
  CHECK_THROWS_WITH(
      tcp_broadcast_bytes("127.0.0.1", port + 1, 1, 2, "", std::chrono::milliseconds(300)),
      Catch::Contains("could not reach rank 0"));
}

TEST_CASE("DDP in a world of one trains exactly as the bare model", "[distributed][ddp]") {
  auto group = new_local_group(std::chrono::seconds(30));
  auto ref = small_cnn(false);
  auto model = small_cnn(false);
  copy_weights(*model, *ref);
  DistributedDataParallel ddp(
      model, {.group = group.get(), .bucket_cap_mb = 0.0005, .first_bucket_cap_mb = 0.0001});
  // Buckets: reverse registration order, small first bucket, every trainable parameter once.
  auto buckets = ddp.buckets();
  REQUIRE(buckets.size() >= 2);
  CHECK(buckets[0].parameters.front() == "4.bias");
  size_t n = 0;
  for (const auto& b : buckets) n += b.parameters.size();
  CHECK(n == model->parameters().size());

  optim::SGD o1(ref->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD o2(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  Generator g(3);
  for (int step = 0; step < 4; ++step) {
    Tensor x = randn({6, 1, 8, 8}, {}, &g);
    Tensor y = randint(0, 3, {6}, DType::i64, &g);
    o1.zero_grad();
    cross_entropy(ref->forward(x), y).backward();
    o1.step();
    o2.zero_grad();
    cross_entropy(ddp(x), y).backward();
    o2.step();
  }
  CHECK(flat_params(*ref) == flat_params(*model));
}

TEST_CASE("DDP no_sync accumulates locally, gradient_as_bucket_view shares the buckets",
          "[distributed][ddp]") {
  auto group = new_local_group(std::chrono::seconds(30));
  auto ref = small_cnn(false);
  auto model = small_cnn(false);
  copy_weights(*model, *ref);
  DistributedDataParallel ddp(model, {.group = group.get(), .gradient_as_bucket_view = true});
  Generator g(5);
  Tensor x1 = randn({4, 1, 8, 8}, {}, &g), x2 = randn({4, 1, 8, 8}, {}, &g);
  Tensor y1 = randint(0, 3, {4}, DType::i64, &g), y2 = randint(0, 3, {4}, DType::i64, &g);
  cross_entropy(ref->forward(x1), y1).backward();
  cross_entropy(ref->forward(x2), y2).backward();
  {
    auto guard = ddp.no_sync();
    cross_entropy(ddp(x1), y1).backward();
  }
  cross_entropy(ddp(x2), y2).backward();
  auto rp = ref->parameters(), mp = model->parameters();
  for (size_t i = 0; i < rp.size(); ++i) {
    auto a = rp[i].grad().to_vector<float>(), b = mp[i].grad().to_vector<float>();
    REQUIRE(a.size() == b.size());
    for (size_t k = 0; k < a.size(); ++k) CHECK(a[k] == Approx(b[k]).epsilon(1e-5).margin(1e-6));
  }
  // The gradient is a view of the bucket: zero_grad(set_to_none) then forward re-attaches it.
  model->zero_grad();
  cross_entropy(ddp(x1), y1).backward();
  ref->zero_grad();
  cross_entropy(ref->forward(x1), y1).backward();
  for (size_t i = 0; i < rp.size(); ++i) {
    auto a = rp[i].grad().to_vector<float>(), b = mp[i].grad().to_vector<float>();
    for (size_t k = 0; k < a.size(); ++k) CHECK(a[k] == Approx(b[k]).epsilon(1e-5).margin(1e-6));
  }
}

namespace {
// Uses `head_b` only when asked: a parameter that may get no gradient.
class TwoHeads : public nn::Module {
 public:
  TwoHeads() : Module("TwoHeads") {
    a = register_module("a", std::make_shared<nn::Linear>(4, 2));
    b = register_module("b", std::make_shared<nn::Linear>(4, 2));
  }
  Tensor forward(const Tensor& x) override {
    return use_b ? add(a->forward(x), b->forward(x)) : a->forward(x);
  }
  std::shared_ptr<nn::Linear> a, b;
  bool use_b = true;
};
}  // namespace

TEST_CASE("DDP: a parameter without gradient is an error unless find_unused_parameters",
          "[distributed][ddp]") {
  auto group = new_local_group(std::chrono::seconds(30));
  auto m = std::make_shared<TwoHeads>();
  DistributedDataParallel ddp(m, {.group = group.get()});
  m->use_b = false;
  Tensor x = randn({3, 4});
  CHECK_THROWS_WITH(sum(ddp(x)).backward(), Catch::Contains("got no gradient") &&
                                                Catch::Contains("'b.weight'") &&
                                                Catch::Contains("find_unused_parameters"));

  auto m2 = std::make_shared<TwoHeads>();
  DistributedDataParallel ddp2(m2, {.group = group.get(), .find_unused_parameters = true});
  m2->use_b = false;
  sum(ddp2(x)).backward();
  CHECK(m2->a->weight.grad().defined());
  CHECK(m2->b->weight.grad().defined());  // reduced as zeros (other ranks may have used it)
  CHECK(sum(abs(m2->b->weight.grad())).item<double>() == 0.0);
  m2->use_b = true;
  m2->zero_grad();
  sum(ddp2(x)).backward();
  CHECK(sum(abs(m2->b->weight.grad())).item<double>() > 0.0);
}

TEST_CASE("SyncBatchNorm in a group of one matches BatchNorm, and gradchecks in f64",
          "[distributed][syncbn]") {
  auto group = new_local_group(std::chrono::seconds(30));
  nn::BatchNorm2d plain(3, {}, DType::f64);
  SyncBatchNorm sync(3, {}, group.get(), DType::f64);
  Tensor x = testing::rnd({4, 3, 5, 5}, 11);
  add_(x, 3.0);  // a mean far from zero exercises the shifted sums
  Tensor a = plain.forward(x), b = sync.forward(x);
  CHECK(max(abs(sub(a, b))).item<double>() < 1e-12);
  CHECK(max(abs(sub(plain.running_mean, sync.running_mean))).item<double>() < 1e-14);
  CHECK(max(abs(sub(plain.running_var, sync.running_var))).item<double>() < 1e-13);
  // channels-last input keeps its layout
  Tensor xcl = x.contiguous(MemoryFormat::ChannelsLast);
  CHECK(sync.forward(xcl).is_contiguous(MemoryFormat::ChannelsLast));

  SyncBatchNorm bn(3, {}, group.get(), DType::f64);
  Generator gw(2);
  bn.weight.detach().copy_(add(randn({3}, DType::f64, &gw), 1.5));
  bn.bias.detach().copy_(randn({3}, DType::f64, &gw));
  Tensor xin = testing::leaf({3, 3, 2, 2}, 4);
  testing::gradcheck([&](const std::vector<Tensor>& in) { return bn.forward(in[0]); },
                     {xin, bn.weight, bn.bias});
  // 2-d input [N, C]
  SyncBatchNorm bn1(3, {}, group.get(), DType::f64);
  testing::gradcheck([&](const std::vector<Tensor>& in) { return bn1.forward(in[0]); },
                     {testing::leaf({5, 3}, 8)});
}

TEST_CASE("convert_sync_batchnorm converts in place, ResNet's typed fields included",
          "[distributed][syncbn]") {
  auto net = models::resnet18({.num_classes = 4, .cifar_stem = true});
  auto params_before = net->parameters();
  convert_sync_batchnorm(net);
  int converted = 0;
  net->apply([&](nn::Module& m) {
    if (auto* bn = dynamic_cast<nn::BatchNorm*>(&m)) converted += bn->sync_stats ? 1 : 0;
  });
  CHECK(converted == 20);
  auto params_after = net->parameters();
  REQUIRE(params_before.size() == params_after.size());
  for (size_t i = 0; i < params_before.size(); ++i)
    CHECK(params_before[i].impl() == params_after[i].impl());  // optimizers stay valid
  // Without init() and without a group there is nothing to synchronise with.
  if (!is_initialized())
    CHECK_THROWS_WITH(net->forward(randn({2, 3, 8, 8})), Catch::Contains("distributed::init"));
}

TEST_CASE("init() in a single process needs no MPI and gives a world of one",
          "[distributed][init]") {
  ProcessGroup& g = init();
  CHECK(is_initialized());
  CHECK(g.size() == 1);
  CHECK(world_size() == 1);
  CHECK(rank() == 0);
  CHECK(is_main_process());
  CHECK(std::string(g.backend()) == "local");
  CHECK(all_reduce_value(2.5) == 2.5);
  barrier();
  CHECK(&init() == &g);
  // The helpers: rank 0 is this process; its exception comes back as it was.
  int ran = 0;
  on_main_process([&] { ++ran; });
  CHECK(ran == 1);
  CHECK_THROWS_WITH(on_main_process([] { throw Error("cannot write ckpt.h5"); }),
                    "cannot write ckpt.h5");
  auto s = data::DistributedSampler::for_default_group(10, false);
  CHECK(s->world_size() == 1);
  CHECK(s->indices().size() == 10);
}

namespace {
// A model with two inputs and two outputs (the typed-call style of docs/design.md): one
// head per input; `use_b` leaves head b without a gradient.
class PairModel : public nn::Module {
 public:
  using nn::Module::forward;  // the one-tensor forward stays visible
  PairModel() : Module("PairModel") {
    a = register_module("a", std::make_shared<nn::Linear>(4, 2));
    b = register_module("b", std::make_shared<nn::Linear>(3, 2));
  }
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& z) {
    Tensor ya = a->forward(x);
    return {ya, use_b ? b->forward(z) : mul(ya, 2.0)};
  }
  std::shared_ptr<nn::Linear> a, b;
  bool use_b = true;
};
}  // namespace

TEST_CASE("DDP call<M>: a model with several inputs and outputs, find_unused included",
          "[distributed][ddp]") {
  auto group = new_local_group(std::chrono::seconds(30));
  auto ref = std::make_shared<PairModel>();
  auto model = std::make_shared<PairModel>();
  copy_weights(*model, *ref);
  DistributedDataParallel ddp(model, {.group = group.get()});
  Tensor x = randn({5, 4}), z = randn({5, 3});
  auto [r1, r2] = ref->forward(x, z);
  sum(add(r1, mul(r2, r2))).backward();
  auto [y1, y2] = ddp.call<PairModel>(x, z);
  sum(add(y1, mul(y2, y2))).backward();
  for (size_t i = 0; i < ref->parameters().size(); ++i)
    CHECK(allclose(model->parameters()[i].grad(), ref->parameters()[i].grad(), 1e-6, 1e-7));
  CHECK_THROWS_WITH(ddp.call<nn::Linear>(x),
                    Catch::Contains("PairModel") && Catch::Contains("call<M>"));

  auto m2 = std::make_shared<PairModel>();
  DistributedDataParallel ddp2(m2, {.group = group.get(), .find_unused_parameters = true});
  m2->use_b = false;
  auto [u1, u2] = ddp2.call<PairModel>(x, z);
  sum(add(u1, u2)).backward();  // b got no gradient: reduced as zeros, no error
  CHECK(sum(abs(m2->b->weight.grad())).item<double>() == 0.0);
  CHECK(sum(abs(m2->a->weight.grad())).item<double>() > 0.0);
}

TEST_CASE("DDP default buckets: 1 MiB first, then 25 MiB, filled in reverse registration order",
          "[distributed][ddp]") {
  auto group = new_local_group(std::chrono::seconds(30));
  auto net = models::resnet18({.num_classes = 1000});  // 11.7 M f32 parameters, 44.6 MiB
  DistributedDataParallel ddp(net, {.group = group.get()});
  auto named = net->named_parameters();
  std::map<std::string, int64_t> bytes_of;
  for (const auto& [name, t] : named) bytes_of[name] = t.numel() * 4;
  // The parameters in reverse registration order, as the buckets must hold them.
  std::vector<std::string> reversed;
  for (auto it = named.rbegin(); it != named.rend(); ++it) reversed.push_back(it->first);
  auto buckets = ddp.buckets();
  REQUIRE(buckets.size() >= 3);
  CHECK(buckets[0].parameters.front() == "fc.bias");
  std::vector<std::string> order;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const int64_t cap = (b == 0 ? 1 : 25) * int64_t{1} << 20;
    int64_t bytes = 0;
    for (const auto& p : buckets[b].parameters) bytes += bytes_of[p];
    CHECK(bytes == buckets[b].numel * 4);
    // Within the cap, unless one parameter alone exceeds it (fc.weight: 1000 x 512 x 4 B).
    if (buckets[b].parameters.size() > 1) CHECK(bytes <= cap);
    // Full: the next parameter would not have fitted.
    if (b + 1 < buckets.size()) CHECK(bytes + bytes_of[buckets[b + 1].parameters.front()] > cap);
    order.insert(order.end(), buckets[b].parameters.begin(), buckets[b].parameters.end());
  }
  CHECK(order == reversed);
}

namespace {

// A group that says it has two ranks (or `size`) and reduces nothing (every rank as rank 0): it
// records the all-reduces DDP issues, so a test can see when they are launched.
class RecordingGroup final : public ProcessGroup {
 public:
  explicit RecordingGroup(std::vector<std::string>& log, int size = 2)
      : ProcessGroup(0, size, std::chrono::seconds(30)), log_(log) {}
  const char* backend() const override { return "recording"; }
  Work all_reduce(const Tensor& t, ReduceOp) override {
    log_.push_back("all_reduce " + std::to_string(t.numel()));
    return Work();
  }
  Work broadcast(const Tensor&, int) override { return Work(); }
  Work all_gather(const Tensor& output, const Tensor& input) override {
    NoGradGuard ng;
    Tensor o = output;
    o.copy_(cat(std::vector<Tensor>(static_cast<size_t>(size()), input.reshape({-1})))
                .view(output.shape()));
    return Work();
  }
  Work reduce_scatter(const Tensor&, const Tensor&, ReduceOp) override { return Work(); }
  Work barrier() override { return Work(); }

 private:
  std::vector<std::string>& log_;
};

}  // namespace

TEST_CASE("DDP launches a full bucket's all-reduce from the gradient hooks, before backward ends",
          "[distributed][ddp]") {
  for (bool overlap : {true, false}) {
    std::vector<std::string> log;
    RecordingGroup group(log);
    manual_seed(4);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Linear>(64, 64))
        .push_back(std::make_shared<nn::ReLU>())
        .push_back(std::make_shared<nn::Linear>(64, 64))
        .push_back(std::make_shared<nn::ReLU>())
        .push_back(std::make_shared<nn::Linear>(64, 64));
    // 16640 B per layer: one bucket per layer (caps of 16672 B), the last layer's first.
    DistributedDataParallel ddp(m, {.group = &group,
                                    .bucket_cap_mb = 0.0159,
                                    .first_bucket_cap_mb = 0.0159,
                                    .overlap = overlap});
    REQUIRE(ddp.buckets().size() == 3);
    CHECK(ddp.buckets()[0].parameters == std::vector<std::string>{"4.bias", "4.weight"});
    // The first layer's gradients are the last ones backward computes.
    m->parameters()[0].register_hook([&](const Tensor&) { log.push_back("grad 0.weight"); });
    log.clear();
    sum(ddp(randn({8, 64}))).backward();
    INFO("overlap " << overlap);
    REQUIRE(log.size() == 4);
    const auto grad_at = std::find(log.begin(), log.end(), "grad 0.weight") - log.begin();
    if (overlap) {
      // Layers 4 and 2 are reduced while backward still runs (layer 0's bucket may launch
      // from DDP's own hook on 0.weight, just before this one).
      CHECK(log[0] == "all_reduce 4160");
      CHECK(log[1] == "all_reduce 4160");
      CHECK(grad_at >= 2);
    } else {  // overlap = false: everything after backward
      CHECK(grad_at == 0);
    }
    CHECK(std::count(log.begin(), log.end(), "all_reduce 4160") == 3);
  }
}

namespace {

// Three layers registered in the opposite order to their use: `a` runs first in forward, so
// its gradients are the last ones backward produces, yet reverse registration order puts it
// in the first bucket.
class DeclaredBackwards : public nn::Module {
 public:
  DeclaredBackwards() : Module("DeclaredBackwards") {
    c = register_module("c", std::make_shared<nn::Linear>(64, 64));
    b = register_module("b", std::make_shared<nn::Linear>(64, 64));
    a = register_module("a", std::make_shared<nn::Linear>(64, 64));
  }
  Tensor forward(const Tensor& x) override {
    return c->forward(relu(b->forward(relu(a->forward(x)))));
  }
  std::shared_ptr<nn::Linear> a, b, c;
};

std::vector<std::string> bucket_order(const DistributedDataParallel& ddp) {
  std::vector<std::string> out;
  for (const auto& b : ddp.buckets()) out.push_back(b.parameters.front().substr(0, 1));
  return out;
}

}  // namespace

TEST_CASE("DDP rebuilds its buckets in the gradients' ready order after the first backward",
          "[distributed][ddp]") {
  for (bool rebuild : {true, false}) {
    for (bool as_view : {false, true}) {
      INFO("rebuild_buckets " << rebuild << ", gradient_as_bucket_view " << as_view);
      std::vector<std::string> log;
      RecordingGroup group(log);
      manual_seed(5);
      auto m = std::make_shared<DeclaredBackwards>();
      DistributedDataParallel ddp(m, {.group = &group,
                                      .bucket_cap_mb = 0.0159,
                                      .first_bucket_cap_mb = 0.0159,
                                      .gradient_as_bucket_view = as_view,
                                      .rebuild_buckets = rebuild});
      CHECK(bucket_order(ddp) == std::vector<std::string>{"a", "b", "c"});
      // Logged after DDP's own hooks (registered first) on each of a's two parameters.
      for (auto& p : m->a->parameters())
        p.register_hook([&](const Tensor&) { log.push_back("grad a"); });
      Tensor x = randn({8, 64});
      // Step 1: bucket 0 (layer a) is complete only when backward ends, and buckets launch
      // in index order, so every all-reduce waits for it.
      sum(ddp(x)).backward();
      REQUIRE(log.size() == 5);
      CHECK(std::find(log.begin(), log.end(), "grad a") - log.begin() == 0);
      // The gradients survive the rebuild (a RecordingGroup reduces nothing: own gradients).
      std::vector<std::vector<float>> grads;
      for (const auto& p : m->parameters()) grads.push_back(p.grad().to_vector<float>());
      CHECK(bucket_order(ddp) == (rebuild ? std::vector<std::string>{"c", "b", "a"}
                                          : std::vector<std::string>{"a", "b", "c"}));
      // Step 2, the same batch: with the rebuilt buckets c and b are reduced while backward
      // still runs.
      log.clear();
      m->zero_grad();
      sum(ddp(x)).backward();
      REQUIRE(log.size() == 5);
      const auto grad_at = std::find(log.begin(), log.end(), "grad a") - log.begin();
      if (rebuild)
        CHECK(grad_at >= 2);
      else
        CHECK(grad_at == 0);
      for (size_t i = 0; i < grads.size(); ++i)
        CHECK(m->parameters()[i].grad().to_vector<float>() == grads[i]);
      // The round's timing: one ready time per bucket, within the backward; rebuilt buckets
      // complete in their own order, the initial layout's first bucket (layer a) last.
      const auto timing = ddp.last_round_timing();
      REQUIRE(timing.bucket_ready_seconds.size() == 3);
      CHECK(timing.backward_seconds > 0);
      for (double t : timing.bucket_ready_seconds) {
        CHECK(t >= 0);
        CHECK(t <= timing.backward_seconds);
      }
      const auto& r = timing.bucket_ready_seconds;
      if (rebuild)
        CHECK((r[0] <= r[1] && r[1] <= r[2]));
      else
        CHECK((r[2] <= r[1] && r[1] <= r[0]));
    }
  }
}

TEST_CASE("DDP reduce_world_of_one: a group of one copies, reduces and copies back anyway",
          "[distributed][ddp]") {
  // Caps of 524 B: [linear bias], [linear weight (768 B, alone)], [conv bias, conv weight].
  const double cap = 0.0005;
  Tensor x = randn({4, 1, 8, 8});
  for (bool option : {false, true}) {
    for (bool as_view : {false, true}) {
      for (bool recording : {true, false}) {
        INFO("reduce_world_of_one " << option << ", gradient_as_bucket_view " << as_view << ", "
                                    << (recording ? "recording group" : "local group"));
        std::vector<std::string> log;
        RecordingGroup rec(log, /*size=*/1);
        auto local = new_local_group(std::chrono::seconds(10));
        ProcessGroup* g = recording ? static_cast<ProcessGroup*>(&rec) : local.get();
        auto ref = small_cnn(false), m = small_cnn(false);
        copy_weights(*m, *ref);
        DistributedDataParallel ddp(m, {.group = g,
                                        .bucket_cap_mb = cap,
                                        .first_bucket_cap_mb = cap,
                                        .gradient_as_bucket_view = as_view,
                                        .reduce_world_of_one = option});
        REQUIRE(ddp.buckets().size() == 3);
        // Two steps: the second runs on the buckets rebuilt after the first.
        for (int step = 0; step < 2; ++step) {
          log.clear();
          ref->zero_grad();
          m->zero_grad();
          sum(ref->forward(x)).backward();
          sum(ddp(x)).backward();
          if (recording)
            CHECK(std::count_if(log.begin(), log.end(), [](const std::string& e) {
                    return e.rfind("all_reduce", 0) == 0;
                  }) == (option ? 3 : 0));
          // Copies into the buckets and back are exact, and a reduction over one rank is the
          // identity: the bare model's gradients bit for bit.
          auto pr = ref->parameters(), pm = m->parameters();
          for (size_t i = 0; i < pr.size(); ++i) {
            INFO("step " << step << ", parameter " << i);
            REQUIRE(pm[i].grad().defined());
            CHECK(pm[i].grad().to_vector<float>() == pr[i].grad().to_vector<float>());
          }
        }
      }
    }
  }
}

TEST_CASE("DDP reduce_world_of_one with gradient_compression rounds through the 16-bit wire",
          "[distributed][ddp][compression]") {
  Tensor x = randn({4, 1, 8, 8});
  for (bool option : {false, true}) {
    INFO("reduce_world_of_one " << option);
    std::vector<std::string> log;
    RecordingGroup g(log, /*size=*/1);
    auto ref = small_cnn(false), m = small_cnn(false);
    copy_weights(*m, *ref);
    DistributedDataParallel ddp(
        m, {.group = &g, .gradient_compression = DType::bf16, .reduce_world_of_one = option});
    for (const auto& b : ddp.buckets()) CHECK(b.wire_dtype == (option ? DType::bf16 : DType::f32));
    sum(ref->forward(x)).backward();
    sum(ddp(x)).backward();
    auto pr = ref->parameters(), pm = m->parameters();
    int64_t rounded = 0, total = 0;
    for (size_t i = 0; i < pr.size(); ++i) {
      const Tensor want = option ? pr[i].grad().to(DType::bf16).to(DType::f32) : pr[i].grad();
      CHECK(pm[i].grad().to_vector<float>() == want.to_vector<float>());
      const auto a = pm[i].grad().to_vector<float>(), b = pr[i].grad().to_vector<float>();
      for (size_t k = 0; k < a.size(); ++k) rounded += a[k] != b[k] ? 1 : 0;
      total += static_cast<int64_t>(a.size());
    }
    // The wire really ran: most f32 gradients are not bf16 numbers.
    if (option)
      CHECK(rounded > total / 2);
    else
      CHECK(rounded == 0);
  }
}

TEST_CASE("a watchdog's poll keeps the error a completion check throws, for the caller",
          "[distributed][watchdog]") {
  // A fake pending queue: a completion check that throws stands for cudaEventQuery after a
  // sticky CUDA error, which used to escape the NCCL watchdog thread into std::terminate.
  struct Entry {
    int id;
    bool done, throws;
  };
  auto completed = [](const Entry& e) {
    if (e.throws)
      throw Error("cudaEventQuery failed: cudaErrorIllegalAddress (an illegal memory access)");
    return e.done;
  };
  auto describe = [](const Entry& e) { return "collective " + std::to_string(e.id); };
  std::deque<Entry> q{{0, true, false}, {1, true, false}, {2, false, true}, {3, true, false}};
  distributed::detail::DeferredError err;
  CHECK_FALSE(distributed::detail::retire_completed(q, completed, describe, err, "test watchdog",
                                                    "Advice."));
  REQUIRE(q.size() == 2);  // the completed prefix was retired, the failing entry kept
  CHECK(q.front().id == 2);
  REQUIRE(err.is_set());
  CHECK_THROWS_AS(err.throw_if_set("wait() on collective 2"), Error);
  CHECK_THROWS_WITH(err.throw_if_set("wait() on collective 2"),
                    Catch::StartsWith("wait() on collective 2: test watchdog: checking "
                                      "collective 2 failed: cudaEventQuery failed") &&
                        Catch::Contains("Advice."));
  // Reported once: a later error is neither printed nor kept.
  CHECK_FALSE(err.set("another failure"));
  CHECK_THROWS_WITH(err.throw_if_set("x"), !Catch::Contains("another failure"));

  // No error: the completed prefix goes, the watch goes on, nothing is raised.
  std::deque<Entry> ok{{0, true, false}, {1, false, false}};
  distributed::detail::DeferredError none;
  CHECK(distributed::detail::retire_completed(ok, completed, describe, none, "test watchdog",
                                              "Advice."));
  CHECK(ok.size() == 1);
  CHECK_FALSE(none.is_set());
  CHECK_NOTHROW(none.throw_if_set("x"));
}
