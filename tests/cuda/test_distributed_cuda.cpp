// The NCCL process group in a world of one (what a single GPU can check), DDP over it with
// gradients on the GPU, and SyncBatchNorm on CUDA tensors, against the CPU. In a world of one
// every all-reduce is the identity and DDP skips them, so the tests that must see the real
// path (bucket copies, NCCL all-reduces and broadcasts, the 16-bit wire) set
// DDPOptions::reduce_world_of_one. Also DDP's GPU bucket timing, and (hidden, own process:
// ctest cuda_nccl_watchdog_sticky_error) the watchdog after a sticky CUDA error.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <utility>

#include "cuda_test_util.hpp"
#include "dltrain/dltrain.hpp"

using namespace dltrain;
using namespace dltrain::distributed;
using dltrain::test::kCuda;

namespace {
std::shared_ptr<ProcessGroup> nccl_one() {
  return new_nccl_group(0, 1, 0, std::chrono::seconds(60),
                        [](const std::string& bytes) { return bytes; });
}

// Two CIFAR-stem ResNet-18s (4 classes) with the same initial weights (drawn from `seed`), on the
// GPU: the bare model and the one a test wraps.
std::pair<std::shared_ptr<models::ResNet>, std::shared_ptr<models::ResNet>> twin_resnet18(
    uint64_t seed) {
  std::shared_ptr<models::ResNet> m[2];
  for (auto& r : m) {
    manual_seed(seed);
    r = models::resnet18({.num_classes = 4, .cifar_stem = true});
    r->to(kCuda);
  }
  return {m[0], m[1]};
}

}  // namespace

TEST_CASE("cuda: one-rank NCCL group runs every collective in every dtype", "[cuda][nccl]") {
  auto g = nccl_one();
  CHECK(std::string(g->backend()) == "nccl");
  CHECK(g->tensor_device() == kCuda);
  for (DType dt :
       {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    INFO(dltrain::test::dt_str(dt));
    Tensor host = arange(0, 40, 1, TensorOptions(dt));
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      if (op == ReduceOp::Avg && !is_floating(dt)) continue;
      Tensor t = host.to(kCuda);
      Work w = g->all_reduce(t, op);
      w.wait();
      CHECK(t.to(Device::cpu()).to(DType::f64).to_vector<double>() ==
            host.to(DType::f64).to_vector<double>());
    }
    Tensor t = host.to(kCuda);
    g->broadcast(t, 0).wait();
    Tensor out = zeros({40}, TensorOptions(dt).with_device(kCuda));
    g->all_gather(out, t).wait();
    CHECK(out.to(Device::cpu()).to(DType::f64).to_vector<double>() ==
          host.to(DType::f64).to_vector<double>());
    Tensor rs = zeros({40}, TensorOptions(dt).with_device(kCuda));
    g->reduce_scatter(rs, t, ReduceOp::Sum).wait();
    CHECK(rs.to(Device::cpu()).to(DType::f64).to_vector<double>() ==
          host.to(DType::f64).to_vector<double>());
  }
  g->barrier().wait();
  CHECK_THROWS_WITH(g->all_reduce(zeros({4})), Catch::Contains("the nccl group runs on cuda:0"));
}

TEST_CASE("cuda: the NCCL stream is ordered after the producer and before the consumer",
          "[cuda][nccl]") {
  auto g = nccl_one();
  // A long producer kernel on the compute stream, then the collective, then a consumer:
  // without the event ordering the collective would read unfinished values.
  Tensor big = zeros({1 << 22}, kCuda);
  for (int i = 0; i < 20; ++i) add_(big, 1.0);
  g->all_reduce(big, ReduceOp::Sum).wait();
  mul_(big, 2.0);
  CHECK(min(big).item<double>() == 40.0);
  CHECK(max(big).item<double>() == 40.0);
}

TEST_CASE("cuda: DDP over a one-rank NCCL group trains as the bare model, SyncBN on CUDA",
          "[cuda][nccl][ddp]") {
  auto g = nccl_one();
  auto [ref, model] = twin_resnet18(1);
  convert_sync_batchnorm(model, g.get());
  // In a group of one the synced statistics equal the local ones, so the runs agree (up to
  // the different BN arithmetic).
  DistributedDataParallel ddp(model, {.group = g.get()});
  optim::SGD o1(ref->parameters(), {.lr = 0.01, .momentum = 0.9});
  optim::SGD o2(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  Generator gen(4);
  for (int s = 0; s < 3; ++s) {
    Tensor x = randn({8, 3, 16, 16}, {}, &gen).to(kCuda);
    Tensor y = randint(0, 4, {8}, DType::i64, &gen).to(kCuda);
    o1.zero_grad();
    cross_entropy(ref->forward(x), y).backward();
    o1.step();
    o2.zero_grad();
    cross_entropy(ddp(x), y).backward();
    o2.step();
  }
  auto a = ref->parameters(), b = model->parameters();
  for (size_t i = 0; i < a.size(); ++i)
    dltrain::test::check_close(b[i].to(Device::cpu()), a[i].to(Device::cpu()), 1e-3, 1e-4,
                               "parameter " + std::to_string(i), 1e-3);
}

TEST_CASE("cuda: DDP reduce_world_of_one drives NCCL's bucketed all-reduce in a world of one",
          "[cuda][nccl][ddp]") {
  // The bare model's gradients against DDP's after the copies into the buckets, one NCCL
  // all-reduce (average) per bucket on the group's stream, and the copies back; twice, the
  // second time on the buckets rebuilt (an NCCL broadcast) after the first. cuDNN's
  // backward-filter kernels may add with atomics, so the two backward passes agree to f32
  // rounding, not bit for bit: a misplaced bucket view would be off by whole values.
  auto g = nccl_one();
  for (bool as_view : {false, true}) {
    for (bool channels_last : {false, true}) {
      INFO("gradient_as_bucket_view " << as_view << ", channels-last " << channels_last);
      auto [ref, model] = twin_resnet18(3);
      if (channels_last) {
        ref->to(MemoryFormat::ChannelsLast);
        model->to(MemoryFormat::ChannelsLast);
      }
      DistributedDataParallel ddp(model, {.group = g.get(),
                                          .bucket_cap_mb = 2,
                                          .first_bucket_cap_mb = 0.5,
                                          .gradient_as_bucket_view = as_view,
                                          .reduce_world_of_one = true});
      REQUIRE(ddp.buckets().size() > 3);
      Generator gen(5);
      for (int step = 0; step < 2; ++step) {
        Tensor x = randn({8, 3, 16, 16}, {}, &gen).to(kCuda);
        if (channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
        ref->zero_grad();
        model->zero_grad();
        sum(ref->forward(x)).backward();
        sum(ddp(x)).backward();
        auto a = ref->parameters(), b = model->parameters();
        for (size_t i = 0; i < a.size(); ++i)
          dltrain::test::check_close(
              b[i].grad().to(Device::cpu()), a[i].grad().to(Device::cpu()), 1e-4, 0,
              "step " + std::to_string(step) + ", gradient " + std::to_string(i), 1e-4);
      }
    }
  }
}

TEST_CASE("cuda: DDP reduce_world_of_one with bf16 compression rounds through NCCL's bf16 wire",
          "[cuda][nccl][ddp][compression]") {
  auto g = nccl_one();
  auto [ref, model] = twin_resnet18(4);
  DistributedDataParallel ddp(
      model, {.group = g.get(), .gradient_compression = DType::bf16, .reduce_world_of_one = true});
  for (const auto& b : ddp.buckets()) CHECK(b.wire_dtype == DType::bf16);
  Tensor x = randn({8, 3, 16, 16}).to(kCuda);
  sum(ref->forward(x)).backward();
  sum(ddp(x)).backward();
  auto a = ref->parameters(), b = model->parameters();
  int64_t moved = 0, total = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const Tensor want = a[i].grad().to(Device::cpu());
    const Tensor got = b[i].grad().to(Device::cpu());
    // bf16 keeps 8 significant bits: within one bf16 ulp (2^-7 relative) of the f32 gradient,
    // plus the two backward passes' f32 differences.
    dltrain::test::check_close(got, want, 0x1p-7, 0, "gradient " + std::to_string(i), 1e-4);
    const auto gv = got.to_vector<float>(), wv = want.to_vector<float>();
    for (size_t k = 0; k < gv.size(); ++k)
      moved += std::abs(gv[k] - wv[k]) > 1e-6f * std::abs(wv[k]) ? 1 : 0;
    total += static_cast<int64_t>(gv.size());
  }
  INFO(moved << " of " << total << " gradient elements moved by the bf16 wire");
  CHECK(moved > total / 2);  // the wire really ran (without it nothing would be rounded)
}

namespace {

// A small layer `a`, eight heavy matmuls with a constant (no parameters), a small layer `b`:
// backward completes b's bucket, then spends the GPU's time on the matmuls' input gradients,
// then completes a's bucket. The host only enqueues those matmuls.
class HeavyMiddle : public nn::Module {
 public:
  HeavyMiddle() : Module("HeavyMiddle") {
    a = register_module("a", std::make_shared<nn::Linear>(64, 4096));
    b = register_module("b", std::make_shared<nn::Linear>(4096, 64));
    heavy = mul(randn({4096, 4096}), 1.0 / 64).to(kCuda);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = a->forward(x);
    for (int k = 0; k < 8; ++k) h = matmul(h, heavy);
    return b->forward(h);
  }
  std::shared_ptr<nn::Linear> a, b;
  Tensor heavy;
};

}  // namespace

TEST_CASE("cuda: DDP's bucket ready times are when the GPU finished them, not when enqueued",
          "[cuda][ddp][timing]") {
  const test::Tf32 no_tf32(false);  // FMA f32: the matmuls take milliseconds
  auto g = nccl_one();
  manual_seed(6);
  auto model = std::make_shared<HeavyMiddle>();
  model->to(kCuda);
  // Caps of 1.01 MiB: [b.bias, b.weight (1 MiB)], [a.bias, a.weight].
  DistributedDataParallel ddp(
      model, {.group = g.get(), .bucket_cap_mb = 1.01, .first_bucket_cap_mb = 1.01});
  REQUIRE(ddp.buckets().size() == 2);
  REQUIRE(ddp.buckets()[0].parameters.front() == "b.bias");
  const Tensor x = randn({2048, 64}).to(kCuda);
  for (int i = 0; i < 2; ++i) {  // warm-up: GEMM plans, the pool, the rebuild
    model->zero_grad();
    sum(ddp(x)).backward();
  }
  // The eight matmuls' GPU time alone.
  Tensor h = randn({2048, 4096}).to(kCuda);
  cuda::synchronize();
  cuda::Event e0(true), e1(true);
  e0.record();
  for (int k = 0; k < 8; ++k) h = matmul(h, model->heavy);
  e1.record();
  e1.synchronize();
  const double heavy_s = e0.elapsed_ms(e1) / 1e3;
  // The timed round: the host enqueues backward and returns without waiting for the GPU.
  model->zero_grad();
  Tensor loss = sum(ddp(x));
  cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  loss.backward();
  const double host_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto r = ddp.last_round_timing();  // waits for the round's events
  REQUIRE(r.bucket_ready_seconds.size() == 2);
  const double gap = r.bucket_ready_seconds[1] - r.bucket_ready_seconds[0];
  std::printf(
      "DDP GPU timing: buckets ready at %.3f and %.3f ms, backward %.3f ms (GPU); the heavy "
      "matmuls alone %.3f ms; the host's backward() call %.3f ms\n",
      r.bucket_ready_seconds[0] * 1e3, r.bucket_ready_seconds[1] * 1e3, r.backward_seconds * 1e3,
      heavy_s * 1e3, host_s * 1e3);
  INFO("gap " << gap * 1e3 << " ms, matmuls " << heavy_s * 1e3 << " ms, host " << host_s * 1e3
              << " ms");
  // a's bucket completes after the matmuls' input gradients have run on the GPU (they cost
  // what the forward matmuls cost); host enqueue times would put it right after b's.
  CHECK(gap >= 0.5 * heavy_s);
  CHECK(r.bucket_ready_seconds[0] >= 0);
  CHECK(r.backward_seconds >= r.bucket_ready_seconds[1]);
  // Read twice: the same figures (the events are read once, then kept).
  const auto again = ddp.last_round_timing();
  CHECK(again.bucket_ready_seconds == r.bucket_ready_seconds);
  CHECK(again.backward_seconds == r.backward_seconds);
}

TEST_CASE("cuda: after a sticky CUDA error the NCCL watchdog reports it and the caller gets it",
          "[.][cuda][nccl][sticky]") {
  // Hidden (it ruins this process's CUDA context): ctest runs it alone as
  // cuda_nccl_watchdog_sticky_error. Before, the watchdog's event query threw in its own
  // thread and the process died in std::terminate.
  auto g = nccl_one();
  Tensor t = ones({1 << 20}, kCuda);
  g->all_reduce(t).wait();
  cuda::synchronize();
  // Keep the compute stream busy, then a kernel that writes through a bad device pointer, then
  // a collective ordered after it: its "done" event can never complete.
  Tensor busy = zeros({1 << 24}, kCuda);
  for (int i = 0; i < 200; ++i) add_(busy, 1.0);  // ~10 ms of queued work
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage(reinterpret_cast<void*>(uintptr_t{1} << 40), 4096, kCuda, [](void*) {});
  impl->shape = {1024};
  impl->strides = {1};
  Tensor bad(impl);
  bad.fill_(1.0);
  Work w = g->all_reduce(t);
  std::this_thread::sleep_for(std::chrono::seconds(2));  // the watchdog polls every 100 ms
  CHECK_THROWS_WITH(w.wait(), Catch::Contains("nccl group watchdog") &&
                                  Catch::Contains("CUDA_LAUNCH_BLOCKING=1"));
  CHECK_THROWS_WITH(g->all_reduce(t), Catch::Contains("nccl group watchdog"));
  CHECK_THROWS_AS(g->all_reduce(t), Error);
  g.reset();  // aborts the communicator instead of waiting on a lost context
}
