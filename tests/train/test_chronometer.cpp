// train::Chronometer: phase and step statistics from a hand-driven clock, warm-up exclusion,
// misuse errors, the table, and the JSON summary parsed back with nlohmann/json.
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "dltrain/backend/cuda.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/core/memory.hpp"
#include "dltrain/train/chronometer.hpp"
#include "tests/train/train_test_util.hpp"

using namespace dltrain;
using namespace dltrain::train;
using Catch::Matchers::Contains;

TEST_CASE("compute_stats: min, median (odd and even), mean, population std, max, total",
          "[train][chronometer]") {
  const Stats odd = compute_stats({3, 1, 2});
  CHECK(odd.count == 3);
  CHECK(odd.min == 1);
  CHECK(odd.median == 2);
  CHECK(odd.max == 3);
  CHECK(odd.mean == Approx(2));
  CHECK(odd.std == Approx(std::sqrt(2.0 / 3.0)));
  CHECK(odd.total == Approx(6));
  const Stats even = compute_stats({4, 1, 3, 2});
  CHECK(even.median == Approx(2.5));
  const Stats none = compute_stats({});
  CHECK(none.count == 0);
  CHECK(none.median == 0);
}

TEST_CASE("Chronometer: laps split a step into phases, warm-up steps are left out",
          "[train][chronometer]") {
  test::ManualClock clock;
  Chronometer c({.warmup_steps = 1, .clock = clock.fn()});
  c.begin_epoch();
  // Step k (0-based): data 0.01*(k+1), forward 0.02, backward 0.03, optimizer 0.005.
  for (int k = 0; k < 4; ++k) {
    c.begin_step();
    clock.t += 0.01 * (k + 1);
    c.lap(Phase::Data);
    clock.t += 0.02;
    c.lap(Phase::Forward);
    clock.t += 0.03;
    c.lap(Phase::Backward);
    clock.t += 0.005;
    c.lap(Phase::Optimizer);
    clock.t += 0.001;  // untimed bookkeeping still counts in the whole step
    CHECK(c.end_step(32) == Approx(0.01 * (k + 1) + 0.056));
  }
  clock.t += 1.0;
  const double epoch = c.end_epoch();
  CHECK(epoch == Approx(0.01 * 10 + 4 * 0.056 + 1.0));

  const ChronometerSummary s = c.summary();
  CHECK(s.steps == 4);
  CHECK(s.measured_steps == 3);
  const Stats& data = s.phases[static_cast<int>(Phase::Data)];
  CHECK(data.count == 3);
  CHECK(data.min == Approx(0.02));  // the warm-up step's 0.01 is left out
  CHECK(data.median == Approx(0.03));
  CHECK(data.max == Approx(0.04));
  CHECK(s.phases[static_cast<int>(Phase::Forward)].median == Approx(0.02));
  CHECK(s.phases[static_cast<int>(Phase::Forward)].std == Approx(0).margin(1e-12));
  CHECK(s.phases[static_cast<int>(Phase::Optimizer)].mean == Approx(0.005));
  CHECK(s.step.median == Approx(0.03 + 0.056));
  CHECK(s.epoch.count == 1);
  CHECK(s.samples_per_second == Approx(3 * 32 / (0.09 + 3 * 0.056)));
  CHECK(s.peak_host_rss_bytes > 0);
  // On the CPU the peak is the CPU allocator's (nothing allocated a tensor in between).
  CHECK(s.peak_device_bytes == static_cast<int64_t>(max_memory_allocated(Device::cpu())));
  CHECK(s.device == "cpu");
}

TEST_CASE("Chronometer: a phase lapped twice in a step adds up, an unlapped one is absent",
          "[train][chronometer]") {
  test::ManualClock clock;
  Chronometer c({.clock = clock.fn()});
  c.begin_step();
  clock.t += 0.5;
  c.lap(Phase::Forward);
  clock.t += 0.25;
  c.lap(Phase::Backward);
  clock.t += 0.5;
  c.lap(Phase::Forward);
  c.end_step();
  REQUIRE(c.phase_times(Phase::Forward).size() == 1);
  CHECK(c.phase_times(Phase::Forward)[0] == Approx(1.0));
  CHECK(c.phase_times(Phase::Data).empty());
  CHECK(c.summary().phases[static_cast<int>(Phase::Data)].count == 0);
  c.reset();
  CHECK(c.summary().steps == 0);
  CHECK(c.step_times().empty());
}

TEST_CASE("Chronometer: marks outside a step or epoch, and bad options, raise dltrain::Error",
          "[train][chronometer]") {
  Chronometer c;
  CHECK_THROWS_WITH(c.lap(Phase::Forward), Contains("begin_step"));
  CHECK_THROWS_AS(c.end_step(), Error);
  CHECK_THROWS_WITH(c.end_epoch(), Contains("begin_epoch"));
  CHECK_THROWS_WITH(Chronometer({.warmup_steps = -1}), Contains("warmup_steps"));
  c.begin_step();
  CHECK_THROWS_WITH(c.end_step(-3), Contains("samples"));
}

TEST_CASE("Chronometer: a CUDA device is accepted only where CUDA is available",
          "[train][chronometer]") {
  if (cuda::is_available())
    CHECK_NOTHROW(Chronometer({.device = Device::cuda(0)}));
  else
    CHECK_THROWS_WITH(Chronometer({.device = Device::cuda(0)}), Contains("Device::cpu()"));
}

TEST_CASE("Chronometer: the table names every lapped phase and the peak memory",
          "[train][chronometer]") {
  test::ManualClock clock;
  Chronometer c({.clock = clock.fn()});
  for (int k = 0; k < 3; ++k) {
    c.begin_step();
    clock.t += 0.002;
    c.lap(Phase::Data);
    clock.t += 0.010;
    c.lap(Phase::Forward);
    c.end_step(8);
  }
  const std::string t = c.table("precision f32, layout contiguous");
  CHECK_THAT(t, Contains("chronometer: precision f32, layout contiguous"));
  CHECK_THAT(t, Contains("over 3 steps"));
  CHECK_THAT(t, Contains("data wait"));
  CHECK_THAT(t, Contains("10.00"));  // forward, ms
  CHECK_THAT(t, Contains("peak host memory (RSS)"));
  CHECK_THAT(t, !Contains("backward"));  // never lapped
  CHECK_THAT(t, Contains("samples/s\n"));
  CHECK_THAT(t, !Contains("on this rank"));  // a single process: the figure is the run's
}

TEST_CASE("Chronometer: json() is valid JSON with the statistics in seconds",
          "[train][chronometer]") {
  test::ManualClock clock;
  Chronometer c({.clock = clock.fn()});
  c.begin_step();
  clock.t += 0.25;
  c.lap(Phase::Backward);
  c.end_step(4);
  const auto j = nlohmann::json::parse(c.json());
  CHECK(j["steps"] == 1);
  CHECK(j["device"] == "cpu");
  CHECK(j["phases"]["backward"]["median_s"].get<double>() == Approx(0.25));
  CHECK_FALSE(j["phases"].contains("data"));
  CHECK(j["samples_per_second"].get<double>() == Approx(16));
  CHECK(j["peak_host_rss_bytes"].get<int64_t>() > 0);
  CHECK(j["peak_device_bytes"].get<int64_t>() ==
        static_cast<int64_t>(max_memory_allocated(Device::cpu())));
  // No step at all: every statistic is 0 and the throughput is 0, still valid JSON.
  Chronometer empty;
  const auto e = nlohmann::json::parse(empty.json());
  CHECK(e["step"]["count"] == 0);
}

TEST_CASE("DurationSeries: exact statistics and a bounded, aligned sample over a long run",
          "[train][chronometer]") {
  // 10,000 values, a permutation of 0..9999 (7919 is prime to 10,000), into a sample of 1,000.
  DurationSeries a(1000), b(1000);
  const int64_t n = 10000;
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(i * 7919 % n);
    a.add(v);
    b.add(2 * v);
  }
  const Stats s = a.stats();
  CHECK(s.count == n);
  CHECK(s.min == 0);
  CHECK(s.max == n - 1);
  CHECK(s.total == Approx(n * (n - 1) / 2.0).epsilon(1e-12));
  CHECK(s.mean == Approx((n - 1) / 2.0).epsilon(1e-12));
  CHECK(s.std == Approx(std::sqrt((static_cast<double>(n) * n - 1) / 12.0)).epsilon(1e-12));
  REQUIRE(a.sample().size() == 1000);  // bounded
  // The sample's median estimates the true one (4999.5): the rank of a sample median of k = 1,000
  // from n values has a standard deviation of about n * 0.5 / sqrt(k) = 158; 5 of them allowed.
  CHECK(std::abs(s.median - 4999.5) < 5 * 158.0);
  // Fed at the same steps, two series replace the same slots: their samples stay aligned.
  REQUIRE(b.sample().size() == a.sample().size());
  for (size_t k = 0; k < a.sample().size(); ++k) CHECK(b.sample()[k] == 2 * a.sample()[k]);
  // Below the capacity every value is kept and the median is exact.
  DurationSeries small(1000);
  for (double v : {5.0, 1.0, 3.0}) small.add(v);
  CHECK(small.sample().size() == 3);
  CHECK(small.stats().median == 3.0);
  small.clear();
  CHECK(small.count() == 0);
  CHECK(small.stats().count == 0);
}
