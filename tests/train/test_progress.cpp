// train::Progress: plain lines for logs (no carriage return ever), the live bar on a tty, the
// rate / ETA arithmetic on a manual clock, and rank gating.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dltrain/core/error.hpp"
#include "dltrain/train/progress.hpp"
#include "tests/train/train_test_util.hpp"

using namespace dltrain;
using namespace dltrain::train;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {
/// Everything written to a temporary FILE*.
std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  return s;
}
size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("Progress: plain lines every N steps and at the end, no carriage return",
          "[train][progress]") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  test::ManualClock clock;
  {
    Progress p(
        {.total_steps = 100, .label = "train", .out = f, .tty = 0, .rank = 0, .clock = clock.fn()});
    CHECK(p.enabled());
    CHECK_FALSE(p.live());
    p.begin(2);
    for (int s = 1; s <= 100; ++s) {
      clock.t += 0.5;  // 2 steps/s
      p.update(s, 1.0 / s, 0.01, 32);
    }
    p.end();
  }
  const std::string out = contents(f);
  std::fclose(f);
  CHECK(out.find('\r') == std::string::npos);
  CHECK(out.find('\x1b') == std::string::npos);
  CHECK(count(out, "\n") == 10);  // every = total / 10; end() adds nothing after step 100
  CHECK_THAT(out, Contains("train epoch 2 step 10/100 (10.0%) | 2.00 step/s, 64.0 samples/s | "
                           "loss 0.1000 | lr 0.01 | elapsed 5.0s ETA 45.0s"));
  CHECK_THAT(out, Contains("step 100/100 (100.0%)"));
  CHECK_THAT(out, Contains("ETA 0.0s"));
}

TEST_CASE("Progress: rate over the current window, long ETAs in minutes, NaN loss shown",
          "[train][progress]") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  test::ManualClock clock;
  Progress p(
      {.total_steps = 1000, .every = 10, .out = f, .tty = 0, .rank = 0, .clock = clock.fn()});
  for (int s = 1; s <= 10; ++s) {
    clock.t += 1.0;
    p.update(s);
  }
  for (int s = 11; s <= 20; ++s) {
    clock.t += 0.25;  // four times faster now
    p.update(s, std::nan(""));
  }
  const std::string out = contents(f);
  std::fclose(f);
  CHECK_THAT(out, Contains("step 10/1000 (1.0%) | 1.00 step/s | elapsed 10.0s ETA 16m30s"));
  CHECK_THAT(out, Contains("step 20/1000 (2.0%) | 4.00 step/s | loss nan"));
}

TEST_CASE("Progress: unknown total prints every 100 steps without bar or ETA",
          "[train][progress]") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  test::ManualClock clock;
  {
    Progress p({.out = f, .tty = 0, .rank = 0, .clock = clock.fn()});
    for (int s = 1; s <= 250; ++s) {
      clock.t += 0.01;
      p.update(s);
    }
  }  // the destructor prints the last, partial window
  const std::string out = contents(f);
  std::fclose(f);
  CHECK(count(out, "\n") == 3);
  CHECK_THAT(out, Contains("train step 100 |"));
  CHECK_THAT(out, Contains("train step 250 |"));
  CHECK(out.find("ETA") == std::string::npos);
}

TEST_CASE("Progress: on a tty one live line redrawn with a carriage return, finished by a newline",
          "[train][progress]") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  test::ManualClock clock;
  {
    Progress p({.total_steps = 4,
                .out = f,
                .tty = 1,
                .rank = 0,
                .redraw_seconds = 0.08,
                .clock = clock.fn()});
    CHECK(p.live());
    for (int s = 1; s <= 4; ++s) {
      clock.t += 0.05;  // redraws at most every 0.08 s: steps 1 and 3, and the last
      p.update(s, 0.5);
    }
    CHECK_THAT(p.line(), StartsWith("[####################] train step 4/4"));
    p.end();
    p.end();  // idempotent
  }
  const std::string out = contents(f);
  std::fclose(f);
  CHECK(count(out, "\r") == 4);  // steps 1, 3, 4 and the final redraw of end()
  CHECK(count(out, "\n") == 1);
  CHECK(out.back() == '\n');
  CHECK_THAT(out, Contains("[#####...............] train step 1/4"));
  CHECK_THAT(out, Contains("\x1b[K"));
}

TEST_CASE("Progress: ranks other than 0 print nothing, the rank comes from the launcher",
          "[train][progress]") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  {
    Progress p({.total_steps = 2, .out = f, .tty = 0, .rank = 1});
    CHECK_FALSE(p.enabled());
    p.update(1, 0.1);
    p.update(2, 0.1);
  }
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "4", 1);
  {
    Progress p({.total_steps = 2, .out = f, .tty = 0});
    CHECK_FALSE(p.enabled());
    p.update(2);
  }
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  CHECK(contents(f).empty());
  std::fclose(f);
  CHECK_THROWS_WITH(Progress({.total_steps = -1}), Contains("total_steps"));
  CHECK_THROWS_AS(Progress({.out = nullptr}), Error);
}

TEST_CASE(
    "Progress: a terminal gets the live bar, except under a launcher (mpirun's ranks get a "
    "pseudo-terminal even when the job's output goes to a file)",
    "[train][progress]") {
  const int master = posix_openpt(O_RDWR | O_NOCTTY);
  REQUIRE(master >= 0);
  REQUIRE(grantpt(master) == 0);
  REQUIRE(unlockpt(master) == 0);
  const int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
  REQUIRE(slave >= 0);
  std::FILE* f = fdopen(slave, "w");
  REQUIRE(f);
  {
    Progress p({.out = f, .rank = 0});
    CHECK(p.live());
  }
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  {
    Progress p({.out = f});
    CHECK(p.enabled());
    CHECK_FALSE(p.live());
    Progress forced({.out = f, .tty = 1});
    CHECK(forced.live());
  }
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  std::fclose(f);
  close(master);
}
