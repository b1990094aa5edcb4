// train:: on a GPU: the profiler's CUDA-event timing (GPU times on ops, the "CUDA" track of the
// trace, none when switched off) and the chronometer's device-synchronised marks and peak device
// memory. GPU-only: without a GPU, tests/cuda/main.cpp makes every test exit with ctest's skip
// code (4), so ctest lists them as "Skipped", never as passed.
#include <catch2/catch.hpp>

#include <string>

#include "dltrain/dltrain.hpp"

using namespace dltrain;

namespace {
// Runs a few GPU ops (matmuls and an elementwise op) on cuda:0.
Tensor gpu_work() {
  const Device dev = Device::cuda(0);
  const Tensor a = randn({512, 512}).to(dev), b = randn({512, 512}).to(dev);
  Tensor c = a;
  for (int i = 0; i < 5; ++i) c = relu(matmul(c, b));
  return c;
}
}  // namespace

TEST_CASE("the profiler times CUDA ops with events on the GPU timeline", "[cuda][gpu]") {
  (void)gpu_work();  // warm-up: handles, algorithm choices
  train::Profiler prof;
  const Tensor c = gpu_work();
  prof.stop();
  int timed = 0;
  for (const auto& e : prof.events()) {
    if (e.cuda_dur_us < 0) continue;
    ++timed;
    CHECK(e.cuda_start_us >= 0);
  }
  CHECK(timed >= 10);  // the matmuls and relus, at least
  double cuda_total = 0;
  for (const auto& s : prof.key_averages()) cuda_total += s.cuda_us;
  CHECK(cuda_total > 0);
  CHECK(prof.chrome_trace_json().find("CUDA") != std::string::npos);
  CHECK(c.device() == Device::cuda(0));

  // Switched off: CPU times only.
  train::Profiler cpu_only({.record_shapes = false, .cuda = false});
  (void)gpu_work();
  cpu_only.stop();
  REQUIRE_FALSE(cpu_only.events().empty());
  for (const auto& e : cpu_only.events()) CHECK(e.cuda_dur_us < 0);
}

TEST_CASE("the chronometer waits for the device and reports its peak memory", "[cuda][gpu]") {
  cuda::synchronize();
  cuda::reset_peak_memory_stats();
  train::Chronometer chrono({.device = Device::cuda(0)});
  chrono.begin_epoch();
  for (int step = 0; step < 3; ++step) {
    chrono.begin_step();
    const Tensor big = ones({int64_t{1} << 22}, Device::cuda(0));  // 16 MiB
    chrono.lap(train::Phase::Data);
    const Tensor y = gpu_work();
    chrono.lap(train::Phase::Forward);
    CHECK(chrono.end_step(8) > 0);
  }
  CHECK(chrono.end_epoch() > 0);
  const train::ChronometerSummary s = chrono.summary();
  CHECK(s.steps == 3);
  CHECK(s.device == "cuda:0");
  CHECK(s.peak_device_bytes >= (int64_t{1} << 24));
  CHECK(s.phases[static_cast<int>(train::Phase::Forward)].count == 3);
  CHECK(s.phases[static_cast<int>(train::Phase::Forward)].min > 0);
  CHECK(s.samples_per_second > 0);
  CHECK(chrono.json().find("peak_device_bytes") != std::string::npos);
}
