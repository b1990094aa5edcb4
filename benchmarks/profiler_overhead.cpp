// What train::Profiler costs per op: a loop of tiny elementwise ops (16 floats, so the op's
// fixed overhead is all there is to time) and a small MLP training step (forward, backward,
// SGD), each timed with no profiler active and, when the build has one, under an active
// train::Profiler. The inactive figure against a build without the profiler hooks is the
// cost of the hooks themselves (one relaxed atomic load and branch per op).
//
//   profiler_overhead [--iters 200000] [--repeats 7] [--steps 2000]
//
// Prints ns per op (median of --repeats) and us per MLP step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "apps/common/cli.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/optim/sgd.hpp"
#if __has_include("dltrain/train/profiler.hpp")
#include "dltrain/train/profiler.hpp"
#define HAVE_PROFILER 1
#endif

using namespace dltrain;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ns per op over `iters` iterations of three ops.
double tiny_ops(int64_t iters) {
  Tensor x = ones({16});
  Tensor y;
  auto t0 = Clock::now();
  for (int64_t i = 0; i < iters; ++i) {
    y = add(x, x);
    y = mul(y, x);
    y = relu(y);
  }
  auto t1 = Clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / double(iters * 3);
}

// us per training step of a 2-layer MLP on a batch of 8 x 32.
double mlp_steps(int steps) {
  manual_seed(0);
  nn::Linear l1(32, 64), l2(64, 10);
  std::vector<Tensor> params = l1.parameters();
  for (auto& p : l2.parameters()) params.push_back(p);
  optim::SGD opt(params, {.lr = 0.01, .momentum = 0.9});
  Tensor x = randn({8, 32});
  Tensor target = zeros({8}, DType::i64);
  auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    Tensor loss = cross_entropy(l2.forward(relu(l1.forward(x))), target);
    loss.backward();
    opt.step();
  }
  auto t1 = Clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / steps;
}

struct Figures {
  double op_ns, step_us;
};

Figures measure(int64_t iters, int repeats, int steps) {
  std::vector<double> ops, mlp;
  for (int r = 0; r < repeats; ++r) {
    ops.push_back(tiny_ops(iters));
    mlp.push_back(mlp_steps(steps));
  }
  return {median(ops), median(mlp)};
}

}  // namespace

int main(int argc, char** argv) {
  int64_t iters = 200000;
  int repeats = 7, steps = 2000;
  cli::Flags flags("profiler_overhead",
                   "What train::Profiler's hooks cost: ns per tiny op and us per MLP step with no "
                   "profiler running, then with one recording.");
  flags.group(cli::group::kBenchmark);
  flags.add("--iters", &iters, "tiny ops timed per repeat").min(10);
  flags.add("--repeats", &repeats, "repeats (the median is reported)").positive();
  flags.add("--steps", &steps, "MLP steps timed per repeat").min(10);
  flags.parse(argc, argv);
  set_num_threads(1);
  tiny_ops(iters / 10);  // warm-up
  mlp_steps(steps / 10);
  Figures off = measure(iters, repeats, steps);
  std::printf("%-28s %12s %14s\n", "profiler", "ns/tiny op", "us/MLP step");
  std::printf("%-28s %12.1f %14.2f\n", "inactive", off.op_ns, off.step_us);
#ifdef HAVE_PROFILER
  {
    train::Profiler prof;
    Figures on = measure(iters / 10, repeats, steps / 10);
    prof.stop();
    std::printf("%-28s %12.1f %14.2f\n", "active (events kept)", on.op_ns, on.step_us);
  }
#else
  std::printf("(built without train::Profiler: no active figure)\n");
#endif
  return 0;
}
