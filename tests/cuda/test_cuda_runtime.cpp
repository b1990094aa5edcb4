// CUDA runtime: host<->device copies (dense, strided, broadcast, converting), the fill kernel
// against the CPU, streams and their guards, events, memory statistics and pinned blocks.
// GPU-only: without a GPU, tests/cuda/main.cpp makes every test exit with ctest's
// skip code (4), so ctest lists them as "Skipped", never as passed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "src/backend/cuda/cuda_backend.hpp"

using namespace dltrain;

TEST_CASE("host to device round trip and fill kernel", "[cuda][gpu]") {
  Tensor x = randn({1000}, DType::f32);
  Tensor d = x.to(Device::cuda(0));
  REQUIRE(d.device() == Device::cuda(0));
  REQUIRE(d.to(Device::cpu()).to_vector<float>() == x.to_vector<float>());
  for (DType dt :
       {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    Tensor g = empty({777}, TensorOptions(dt).with_device(Device::cuda(0)));
    g.fill_(3.0);
    REQUIRE(g.to(Device::cpu()).to_vector<double>() == full({777}, 3.0, dt).to_vector<double>());
  }
}

TEST_CASE("non-contiguous CUDA tensors copy to the host and convert dtype", "[cuda][gpu]") {
  Tensor x = randn({6, 8}, DType::f32);
  Tensor d = x.to(Device::cuda(0));
  Tensor view = d.t().slice(0, 1, 7, 2);  // strided, offset view of a CUDA storage
  REQUIRE_FALSE(view.is_contiguous());
  Tensor want = x.t().slice(0, 1, 7, 2).contiguous();
  REQUIRE(view.to(Device::cpu()).to_vector<float>() == want.to_vector<float>());
  Tensor f64_dev = empty({3, 6}, TensorOptions(DType::f64).with_device(Device::cuda(0)));
  f64_dev.copy_(view.contiguous());  // dtype change on the device path
  REQUIRE(allclose(f64_dev.to(Device::cpu()), want.to(DType::f64), 0, 0));
  f64_dev.copy_(view);  // dtype change from a strided, offset source
  REQUIRE(allclose(f64_dev.to(Device::cpu()), want.to(DType::f64), 0, 0));
}

TEST_CASE("copies across devices with non-dense, broadcast and converting operands",
          "[cuda][gpu]") {
  const Device dev = Device::cuda(0);
  const Tensor x = randn({4, 6, 5}, DType::f32);
  // Host to a non-dense device destination (every other row of a taller tensor).
  Tensor tall = zeros({4, 12, 5}, dev);
  Tensor dst = tall.slice(1, 0, 12, 2);
  dst.copy_(x);
  REQUIRE(dst.to(Device::cpu()).to_vector<float>() == x.to_vector<float>());
  REQUIRE(tall.slice(1, 1, 12, 2).to(Device::cpu()).to_vector<float>() ==
          zeros({4, 6, 5}).to_vector<float>());
  // A non-dense device source to a non-dense host destination.
  Tensor host_tall = zeros({4, 12, 5});
  host_tall.slice(1, 1, 12, 2).copy_(dst);
  REQUIRE(host_tall.slice(1, 1, 12, 2).to_vector<float>() == x.to_vector<float>());
  // A broadcast f64 source (on the host, then on the device) into a device f16 destination:
  // converted through float on either side, as on the CPU, so the values are equal bit for bit.
  const Tensor b = randn({6, 1}, DType::f64);
  const Tensor want = b.to(DType::f16).expand({4, 6, 5});
  Tensor h = empty({4, 6, 5}, TensorOptions(DType::f16).with_device(dev));
  h.copy_(b);
  REQUIRE(allclose(h.to(Device::cpu()), want, 0, 0));
  h.fill_(0.0);
  h.copy_(b.to(dev));
  REQUIRE(allclose(h.to(Device::cpu()), want, 0, 0));
  // A channels-last device tensor comes back channels-last with the same values.
  const Tensor cl = randn({2, 3, 4, 5}).contiguous(MemoryFormat::ChannelsLast);
  const Tensor cl_back = cl.to(dev).to(Device::cpu());
  REQUIRE(cl_back.is_contiguous(MemoryFormat::ChannelsLast));
  REQUIRE(cl_back.to_vector<float>() == cl.to_vector<float>());
}

TEST_CASE("streams, stream and device guards, events and memory statistics", "[cuda][gpu]") {
  const cuda::Stream compute = cuda::current_stream(0);
  REQUIRE(compute == cuda::Stream::compute(0));
  cuda::Stream side = cuda::Stream::create(0);  // outlives the tensors allocated on it
  Tensor y;
  {
    cuda::StreamGuard g(side);
    REQUIRE(cuda::current_stream(0) == side);
    REQUIRE(cuda::current_device() == 0);
    y = mul(ones({1 << 20}, Device::cuda(0)), 3.0);  // allocated and computed on `side`
  }
  REQUIRE(cuda::current_stream(0) == compute);  // the previous current stream is back
  cuda::Event done;
  done.record(side);
  done.wait(compute);  // the compute stream reads y only after side's work
  REQUIRE(sum(y).item<double>() == 3.0 * (1 << 20));
  side.synchronize();
  REQUIRE(side.query());

  cuda::Event t0(true), t1(true);
  t0.record();
  Tensor z = exp(y);
  t1.record();
  t1.synchronize();
  REQUIRE(t1.query());
  REQUIRE(t0.elapsed_ms(t1) >= 0.0f);

  {
    cuda::DeviceGuard g(0);
    REQUIRE(cuda::current_device() == 0);
  }
  REQUIRE_THROWS_WITH(cuda::DeviceGuard(cuda::device_count()), Catch::Contains("does not exist"));

  cuda::synchronize();
  const size_t before = cuda::memory_allocated();
  {
    Tensor big = empty({1 << 20}, Device::cuda(0));
    REQUIRE(cuda::memory_allocated() == before + (size_t{1} << 22));
    REQUIRE(cuda::max_memory_allocated() >= cuda::memory_allocated());
    REQUIRE(cuda::memory_reserved() >= cuda::memory_allocated());
  }
  REQUIRE(cuda::memory_allocated() == before);
  // Pinned blocks are recycled once their copies are done.
  for (int k = 0; k < 3; ++k) {
    Tensor p = randn({1000}).pin_memory();
    Tensor d = p.to(Device::cuda(0), /*non_blocking=*/true);
    REQUIRE(d.to_vector<float>() == p.to_vector<float>());
  }
  cuda::empty_cache();
}

// The allocator's stream rules (record_stream, streams that die before their tensors, pinned
// fences on the copy's stream). Each test makes a side stream slow with a long chain of
// kernels, so that without the rule the memory would be handed out (and overwritten) while
// the side stream still uses it: the values read back then differ.
namespace {
constexpr int64_t kBig = int64_t{1} << 22;  // 16 MiB of f32

// Enqueues ~`n` dependent kernels on the current stream (a busy stream for the tests).
Tensor busy_work(int n) {
  Tensor b = ones({kBig}, Device::cuda(0));
  for (int i = 0; i < n; ++i) b = add(b, mul(b, 0.0));
  return b;
}
}  // namespace

TEST_CASE("record_stream: memory used by another stream is not reused before it has run",
          "[cuda][gpu]") {
  const Device dev = Device::cuda(0);
  cuda::Stream side = cuda::Stream::create(0);
  Tensor x = ones({kBig}, dev);  // allocated (and freed) on the compute stream
  cuda::Event made;
  made.record();
  made.wait(side);
  Tensor y;
  {
    cuda::StreamGuard g(side);
    busy_work(100);
    y = x;
    for (int i = 0; i < 200; ++i) y = add(y, x);  // side reads x 200 times
  }
  cuda::record_stream(x, side);
  cuda::record_stream(x, side);       // recording twice is harmless
  x = Tensor();                       // freed while side still reads it
  Tensor z = full({kBig}, 5.0, dev);  // the compute stream's next block of that size
  cuda::Event done;
  done.record(side);
  done.wait(cuda::current_stream(0));
  CHECK(min(y).item<double>() == 201.0);
  CHECK(max(y).item<double>() == 201.0);
  CHECK(min(z).item<double>() == 5.0);
  // Errors: a pageable host tensor, an undefined tensor.
  CHECK_THROWS_WITH(cuda::record_stream(ones({4}), side), Catch::Contains("pageable"));
  CHECK_THROWS_WITH(cuda::record_stream(Tensor(), side), Catch::Contains("undefined"));
}

TEST_CASE("a tensor may outlive the Stream::create stream it was allocated on", "[cuda][gpu]") {
  const Device dev = Device::cuda(0);
  cuda::synchronize();
  const size_t before = cuda::memory_allocated();
  Tensor t;
  cuda::Event made;
  {
    cuda::Stream s = cuda::Stream::create(0);
    cuda::StreamGuard g(s);
    t = mul(ones({kBig}, dev), 2.0);  // allocated on s, so freed on s
    made.record(s);
  }  // the last user handle of s is gone: the blocks allocated on it keep it alive
  made.wait(cuda::current_stream(0));
  CHECK(sum(t).item<double>() == 2.0 * kBig);
  t = Tensor();  // frees on s, which is destroyed only now
  cuda::synchronize();
  CHECK(cuda::memory_allocated() == before);
  // The runtime is still healthy: no stale error surfaces in the next op.
  CHECK(sum(ones({1000}, dev)).item<double>() == 1000.0);
}

TEST_CASE("a pinned block is fenced on the stream of its copy, not the thread's current one",
          "[cuda][gpu]") {
  const Device dev = Device::cuda(0);
  cuda::Stream side = cuda::Stream::create(0);
  Tensor host = full({kBig}, 3.0).pin_memory();
  Tensor d = empty({kBig}, dev);
  cuda::Event made;
  made.record();
  made.wait(side);
  {
    cuda::StreamGuard g(side);
    busy_work(200);                        // the copy below waits for these kernels
    d.copy_(host, /*non_blocking=*/true);  // on side; records side on the pinned block
  }
  const void* old = host.data_ptr();
  host = Tensor();  // dropped with the compute stream current (idle)
  Tensor again = empty({kBig}).pin_memory();
  if (again.data_ptr() == old) CHECK(side.query());  // reused only once the copy ran
  std::fill_n(again.data<float>(), kBig, 7.0f);      // would corrupt a copy still pending
  cuda::Event done;
  done.record(side);
  done.wait(cuda::current_stream(0));
  CHECK(min(d).item<double>() == 3.0);
  CHECK(max(d).item<double>() == 3.0);
}

TEST_CASE("pinned pool: statistics, reuse by size class, the cache cap", "[cuda][gpu]") {
  cuda::empty_cache();
  CHECK(cuda::pinned_memory_cached() == 0);
  const size_t base = cuda::pinned_memory_allocated();
  const void* p = nullptr;
  {
    Tensor a = empty({30000}).pin_memory();  // 120,000 bytes: class 122,880
    p = a.data_ptr();
    CHECK(cuda::pinned_memory_allocated() == base + 122880);
  }
  CHECK(cuda::pinned_memory_allocated() == base);
  CHECK(cuda::pinned_memory_cached() == 122880);
  {
    Tensor b = empty({20000}).pin_memory();  // 80,000 bytes: the cached block serves it
    CHECK(b.data_ptr() == p);
  }
  cuda::set_pinned_cache_limit(0);  // ready blocks go back to the driver
  CHECK(cuda::pinned_memory_cached() == 0);
  { Tensor c = empty({1000}).pin_memory(); }
  CHECK(cuda::pinned_memory_cached() == 0);  // no caching at limit 0
  cuda::set_pinned_cache_limit(size_t{2} << 30);
}

TEST_CASE("an allocation beyond the device raises OutOfMemoryError, and the device goes on",
          "[cuda][gpu][memory]") {
  // 4 TiB: more than any GPU. cudaErrorMemoryAllocation is not sticky, so code that can do
  // with less (cuDNN's workspace search) may catch this type alone and try again.
  const TensorOptions u8 = TensorOptions(DType::u8).with_device(Device::cuda(0));
  CHECK_THROWS_AS(empty({int64_t(1) << 42}, u8), OutOfMemoryError);
  CHECK_THROWS_WITH(empty({int64_t(1) << 42}, u8), Catch::Contains("CUDA out of memory"));
  Tensor t = ones({1000}, Device::cuda(0));
  CHECK(sum(t).item<double>() == 1000.0);
}
