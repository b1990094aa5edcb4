// train::Profiler: a small conv net's forward, backward and SGD step under the profiler records
// the forward ops, their backward nodes, the optimizer step and user ranges, nested, with
// positive durations; the Chrome trace parses; nothing is recorded with no profiler running;
// a second profiler is refused; ops on other threads are recorded. The hidden case
// "[.profiler_fixture]" writes a trace for tests/train/check_trace.py (Python's json module).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "dltrain/dltrain.hpp"
#include "dltrain/optim/sgd.hpp"
#include "dltrain/train/profiler.hpp"
#include "train/train_test_util.hpp"

using namespace dltrain;
namespace dt = dltrain::train;

namespace {

struct SmallNet {
  nn::Conv2d conv{3, 4, 3, nn::Conv2dOptions{.padding = 1}};
  nn::Linear fc{4 * 8 * 8, 5};
  std::vector<Tensor> parameters() {
    auto p = conv.parameters();
    for (auto& q : fc.parameters()) p.push_back(q);
    return p;
  }
  Tensor forward(const Tensor& x) { return fc.forward(relu(conv.forward(x)).flatten(1)); }
};

// One training step, with user ranges around its phases.
void step(SmallNet& net, optim::SGD& opt) {
  Tensor x = randn({2, 3, 8, 8});
  Tensor target = zeros({2}, DType::i64);
  opt.zero_grad();
  Tensor loss;
  {
    dt::ProfileRange r("forward");
    loss = cross_entropy(net.forward(x), target);
  }
  {
    dt::ProfileRange r("backward");
    loss.backward();
  }
  opt.step();
}

const dt::ProfileEvent* find(const std::vector<dt::ProfileEvent>& evs, const std::string& name) {
  for (const auto& e : evs)
    if (e.name == name) return &e;
  return nullptr;
}

// True when `inner` lies within `outer` on the same thread.
bool nested_in(const dt::ProfileEvent& inner, const dt::ProfileEvent& outer) {
  return inner.thread == outer.thread && inner.start_us >= outer.start_us &&
         inner.start_us + inner.dur_us <= outer.start_us + outer.dur_us + 1e-3 &&
         inner.depth > outer.depth;
}

}  // namespace

TEST_CASE("Profiler records forward ops, backward nodes, optimizer steps and ranges",
          "[train][profiler]") {
  manual_seed(1);
  SmallNet net;
  optim::SGD opt(net.parameters(), {.lr = 0.1});
  step(net, opt);  // warm-up, not profiled
  dt::Profiler prof({.record_shapes = true});
  REQUIRE(prof.running());
  step(net, opt);
  prof.stop();
  REQUIRE_FALSE(prof.running());
  const auto& evs = prof.events();
  // On the CPU linear is matmul + add (their nodes: mm_backward, add_backward), as PyTorch's
  // addmm; on CUDA it records linear_backward.
  for (const char* name : {"conv2d", "linear", "relu", "cross_entropy", "conv2d_backward",
                           "mm_backward", "add_backward", "autograd::backward", "SGD.step",
                           "forward", "backward", "AccumulateGrad"}) {
    INFO(name);
    const dt::ProfileEvent* e = find(evs, name);
    REQUIRE(e != nullptr);
    CHECK(e->dur_us > 0);
    CHECK(e->self_us >= 0);
    CHECK(e->self_us <= e->dur_us);
    CHECK(e->cuda_dur_us == -1);  // CPU tensors: no GPU timing
  }
  const auto* conv = find(evs, "conv2d");
  const auto* fwd = find(evs, "forward");
  const auto* bwd = find(evs, "backward");
  CHECK(conv->category == "cpu_op");
  CHECK(find(evs, "conv2d_backward")->category == "backward");
  CHECK(find(evs, "SGD.step")->category == "optimizer");
  CHECK(fwd->category == "user_range");
  CHECK(nested_in(*conv, *fwd));
  CHECK(nested_in(*find(evs, "conv2d_backward"), *find(evs, "autograd::backward")));
  CHECK(nested_in(*find(evs, "autograd::backward"), *bwd));
  CHECK(fwd->self_us < fwd->dur_us);  // the ops inside took time
  CHECK(conv->shapes == "[[2, 3, 8, 8], [4, 3, 3, 3], [4]]");
  // Events come ordered by thread and start time.
  for (size_t i = 1; i < evs.size(); ++i)
    if (evs[i].thread == evs[i - 1].thread) CHECK(evs[i].start_us >= evs[i - 1].start_us);

  // One conv2d per step, counted once although it may redispatch to itself.
  auto stats = prof.key_averages();
  std::map<std::string, dt::ProfileStat> by;
  for (auto& s : stats) by[s.name] = s;
  CHECK(by["conv2d"].calls == 1);
  CHECK(by["conv2d_backward"].calls == 1);
  CHECK(by["SGD.step"].calls == 1);
  for (size_t i = 1; i < stats.size(); ++i) CHECK(stats[i - 1].self_us >= stats[i].self_us);
  // Self times add up to the time covered by the outermost scopes.
  double self = 0, top = 0;
  for (auto& e : evs) {
    self += e.self_us;
    if (e.depth == 0) top += e.dur_us;
  }
  CHECK(self == Approx(top).epsilon(1e-6));

  const std::string table = prof.table(5);
  CHECK(table.find("Self CPU ms") != std::string::npos);
  CHECK(table.find("Self CPU time total") != std::string::npos);
  CHECK(table.find(stats[0].name) != std::string::npos);
  // Five rows between the rules.
  CHECK(std::count(table.begin(), table.end(), '\n') == 3 + 5 + 2);
  CHECK(prof.table(5, true).find("[[2, 3, 8, 8]") != std::string::npos);
}

TEST_CASE("Profiler Chrome trace is traceEvents JSON", "[train][profiler]") {
  SmallNet net;
  optim::SGD opt(net.parameters(), {.lr = 0.1});
  dt::Profiler prof;
  step(net, opt);
  test::TrainTempDir dir("profiler");
  const std::string path = dir.file("sub/trace.json");
  prof.write_chrome_trace(path);  // stops the profiler
  auto j = nlohmann::json::parse(test::read_text(path));
  REQUIRE(j.contains("traceEvents"));
  int complete = 0, meta = 0;
  bool saw_conv = false;
  for (const auto& e : j["traceEvents"]) {
    REQUIRE(e.contains("ph"));
    REQUIRE(e.contains("pid"));
    REQUIRE(e.contains("tid"));
    if (e["ph"] == "X") {
      ++complete;
      CHECK(e["ts"].get<double>() >= 0);
      CHECK(e["dur"].get<double>() >= 0);
      CHECK(e["name"].is_string());
      CHECK(e["cat"].is_string());
      saw_conv = saw_conv || e["name"] == "conv2d_backward";
    } else {
      CHECK(e["ph"] == "M");
      ++meta;
    }
  }
  CHECK(complete == static_cast<int>(prof.events().size()));
  CHECK(meta >= 2);  // process and thread names
  CHECK(saw_conv);
}

TEST_CASE("Profiler: nothing is recorded when no profiler runs", "[train][profiler]") {
  SmallNet net;
  optim::SGD opt(net.parameters(), {.lr = 0.1});
  {
    dt::Profiler prof;
    prof.stop();
    step(net, opt);  // after stop
    CHECK(prof.events().empty());
  }
  step(net, opt);  // no profiler at all
  dt::Profiler next;
  // Nothing from before this profiler started leaks into it.
  CHECK(next.events().empty());
}

TEST_CASE("Profiler: one at a time", "[train][profiler]") {
  dt::Profiler first;
  CHECK_THROWS_WITH(dt::Profiler(), Catch::Contains("already running"));
  first.stop();
  dt::Profiler second;  // fine once the first stopped
  add(ones({2}), ones({2}));
  CHECK(find(second.events(), "add") != nullptr);
}

TEST_CASE("Profiler records ops on other threads", "[train][profiler]") {
  dt::Profiler prof;
  std::thread worker([] {
    dt::ProfileRange r("worker");
    mul(ones({4}), ones({4}));
  });
  worker.join();  // the worker has exited before stop(): its events are kept
  add(ones({2}), ones({2}));
  const auto& evs = prof.events();
  const auto* w = find(evs, "worker");
  const auto* a = find(evs, "add");
  REQUIRE(w != nullptr);
  REQUIRE(a != nullptr);
  CHECK(w->thread != a->thread);
  const auto* m = find(evs, "mul");
  REQUIRE(m != nullptr);
  CHECK(nested_in(*m, *w));
}

TEST_CASE("Profiler trace fixture for check_trace.py", "[.profiler_fixture]") {
  const char* out = std::getenv("DLTRAIN_PROFILE_FIXTURE");
  REQUIRE(out != nullptr);
  SmallNet net;
  optim::SGD opt(net.parameters(), {.lr = 0.1});
  step(net, opt);
  dt::Profiler prof({.record_shapes = true});
  for (int i = 0; i < 2; ++i) step(net, opt);
  prof.write_chrome_trace(out);
}
