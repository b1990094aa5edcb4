// HDF5 checkpoints: round trip of every dtype and field, clear errors on bad files, nothing
// partly loaded, rotation of the last K files, survival of a writer killed mid-save (a child
// process), and exact resume of the Fashion-MNIST CNN mid-epoch in fresh processes.
//
// The child processes re-run this binary on hidden test cases ("[.child]"), steered by
// environment variables.
#include <hdf5.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "dltrain/dltrain.hpp"
#include "dltrain/io/checkpoint.hpp"

using namespace dltrain;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

std::string scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("dltrain_ckpt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

// Runs this test binary on one hidden test case with extra environment; returns its pid.
pid_t spawn_child(const std::string& test_name, const std::vector<std::string>& env) {
  pid_t pid = ::fork();
  if (pid == 0) {
    for (const auto& kv : env) ::putenv(const_cast<char*>(kv.c_str()));
    ::execl("/proc/self/exe", "test_io", test_name.c_str(), "--reporter", "compact", nullptr);
    ::_exit(127);
  }
  return pid;
}

int wait_child(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.numel() * ac.element_size()) == 0;
}

// --- the Fashion-MNIST CNN training run used by the resume test ----------------------
struct Run {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::SGD> opt;
  std::unique_ptr<optim::OneCycleLR> sched;
  std::unique_ptr<data::DataLoader> loader;
};

constexpr int64_t kTotalSteps = 24;

Run make_run() {
  static auto train = std::make_shared<data::MNIST>("/usr/share/datasets/fashion-mnist", true,
                                                    data::ImageOptions{{0.2860f}, {0.3530f}});
  manual_seed(0);
  Run r;
  nn::Conv2dOptions c;
  c.padding = 1;
  c.bias = false;
  r.model = std::make_shared<nn::Sequential>();
  r.model->push_back(std::make_shared<nn::Conv2d>(1, 8, 3, c))
      .push_back(std::make_shared<nn::BatchNorm2d>(8))
      .push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::MaxPool2d>(2))
      .push_back(std::make_shared<nn::Flatten>())
      .push_back(std::make_shared<nn::Dropout>(0.2))  // uses the default generator
      .push_back(std::make_shared<nn::Linear>(8 * 14 * 14, 10));
  r.opt = std::make_unique<optim::SGD>(
      r.model->parameters(),
      optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  r.sched = std::make_unique<optim::OneCycleLR>(*r.opt, 0.05, kTotalSteps);
  // 2500 images in batches of 128 (drop_last): 19 batches per epoch, so 24 steps cross an
  // epoch boundary and the half-way checkpoint (step 12) is mid-epoch.
  auto subset = std::make_shared<data::TensorDataset>(train->data().narrow(0, 0, 2500),
                                                      train->targets().narrow(0, 0, 2500));
  r.loader = std::make_unique<data::DataLoader>(
      subset,
      data::DataLoaderOptions{.batch_size = 128, .shuffle = true, .drop_last = true, .seed = 3});
  return r;
}

void train_until(Run& r, io::TrainingProgress& p, int64_t last_step) {
  nn::CrossEntropyLoss criterion;
  r.model->train();
  while (p.step < last_step) {
    r.loader->set_epoch(p.epoch);
    r.loader->set_start_batch(p.batch_in_epoch);
    for (const data::Batch& b : *r.loader) {
      Tensor loss = criterion(r.model->forward(b.data), b.target);
      r.opt->zero_grad();
      loss.backward();
      r.opt->step();
      r.sched->step();
      ++p.step;
      ++p.batch_in_epoch;
      if (p.step == last_step) return;
    }
    ++p.epoch;
    p.batch_in_epoch = 0;
  }
}

}  // namespace

TEST_CASE("checkpoint round trip: every dtype, order, progress, RNG, metadata", "[io][ckpt]") {
  REQUIRE(io::hdf5_supported());
  io::Checkpoint c;
  Generator g(1);
  c.model.insert("conv.weight",
                 randn({4, 3, 2, 2}, DType::f32, &g).contiguous(MemoryFormat::ChannelsLast));
  c.model.insert("a.f64", randn({3, 2}, DType::f64, &g));
  c.model.insert("b.half", randn({5}, DType::f16, &g));
  c.model.insert("c.bf16", randn({5}, DType::bf16, &g));
  c.model.insert("d.i32", from_vector(std::vector<int32_t>{-1, 7, 1 << 30}));
  c.model.insert("bn.num_batches_tracked", scalar_tensor(42, DType::i64));
  c.model.insert("e.u8", from_vector(std::vector<uint8_t>{0, 255}));
  c.model.insert("f.bool", gt(randn({6}, DType::f32, &g), 0.0));
  c.model.insert("g.empty", zeros({0, 3}));
  c.model.insert("h.view", randn({4, 6}, DType::f32, &g).t().slice(0, 1, 5, 2));
  c.optimizer.insert_scalar("param_groups.0.lr", 0.125);
  c.optimizer.insert("state.0.momentum_buffer", randn({4}, DType::f32, &g));
  c.progress = {3, 1234, 17};
  c.rng_seed = 99;
  c.rng_offset = 1ull << 40;
  c.metadata = {{"arch", "resnet50"}, {"note", "hello, world"}, {"empty", ""}};
  const std::string path = scratch("roundtrip.h5");
  io::write_checkpoint(path, c);
  io::Checkpoint r = io::read_checkpoint(path);
  REQUIRE(r.model.keys() == c.model.keys());  // insertion order survives
  for (const auto& [k, t] : c.model) {
    INFO(k);
    REQUIRE(bitwise_equal(r.model.at(k), t));
  }
  REQUIRE(r.optimizer.scalar("param_groups.0.lr") == 0.125);
  REQUIRE(bitwise_equal(r.optimizer.at("state.0.momentum_buffer"),
                        c.optimizer.at("state.0.momentum_buffer")));
  REQUIRE(r.scheduler.empty());
  REQUIRE(r.progress.epoch == 3);
  REQUIRE(r.progress.step == 1234);
  REQUIRE(r.progress.batch_in_epoch == 17);
  REQUIRE(r.rng_seed == 99);
  REQUIRE(r.rng_offset == (1ull << 40));
  REQUIRE(r.metadata == c.metadata);
  REQUIRE(r.dltrain_version == kVersion);
  REQUIRE(r.format_version == io::kCheckpointFormat);
  REQUIRE_FALSE(fs::exists(path + ".tmp-" + std::to_string(::getpid())));
}

TEST_CASE("checkpoint errors: missing, not HDF5, truncated, newer format", "[io][ckpt]") {
  REQUIRE_THROWS_WITH(io::read_checkpoint(scratch("nope.h5")), Contains("no file"));
  const std::string text = scratch("text.h5");
  std::ofstream(text) << "this is not an HDF5 file\n";
  REQUIRE_THROWS_WITH(io::read_checkpoint(text), Contains("not an HDF5 file"));

  io::Checkpoint c;
  c.model.insert("w", randn({256, 256}));
  const std::string path = scratch("full.h5");
  io::write_checkpoint(path, c);
  const auto size = fs::file_size(path);
  for (double frac : {0.9, 0.5, 0.1, 0.001}) {
    const std::string cut = scratch("cut.h5");
    fs::copy_file(path, cut, fs::copy_options::overwrite_existing);
    fs::resize_file(cut, static_cast<uintmax_t>(static_cast<double>(size) * frac));
    INFO("cut at " << frac);
    REQUIRE_THROWS_WITH(io::read_checkpoint(cut), Contains(cut));
  }

  // A file from a future dltrain: bump the format attribute with the HDF5 API.
  const std::string future = scratch("future.h5");
  fs::copy_file(path, future, fs::copy_options::overwrite_existing);
  {
    hid_t f = H5Fopen(future.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
    int64_t v = io::kCheckpointFormat + 1;
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Fclose(f);
  }
  REQUIRE_THROWS_WITH(io::read_checkpoint(future),
                      Contains("format " + std::to_string(io::kCheckpointFormat + 1)) &&
                          Contains("upgrade dltrain"));
  REQUIRE_THROWS_WITH(io::write_checkpoint(scratch("no/such/dir/x.h5"), c),
                      Contains("does not exist"));
}

TEST_CASE("load_checkpoint restores model, optimizer, scheduler and RNG; errors load nothing",
          "[io][ckpt]") {
  manual_seed(5);
  auto model = models::resnet18({.num_classes = 10, .cifar_stem = true});
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::StepLR sched(opt, 2, 0.5);
  Tensor x = randn({2, 3, 16, 16});
  Tensor y = from_vector(std::vector<int64_t>{1, 2});
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    cross_entropy(model->forward(x), y).backward();
    opt.step();
    sched.step();
  }
  const std::string path = scratch("resnet.h5");
  io::save_checkpoint(path, *model, &opt, &sched, {1, 3, 0}, {{"arch", "resnet18-cifar"}});
  const uint64_t offset = default_generator().offset();

  manual_seed(6);  // a different start: weights, RNG
  auto model2 = models::resnet18({.num_classes = 10, .cifar_stem = true});
  optim::SGD opt2(model2->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::StepLR sched2(opt2, 2, 0.5);
  io::TrainingProgress p = io::load_checkpoint(path, *model2, &opt2, &sched2);
  REQUIRE(p.step == 3);
  REQUIRE(p.epoch == 1);
  REQUIRE(default_generator().seed() == 5);
  REQUIRE(default_generator().offset() == offset);
  for (const auto& [k, t] : model->state_dict()) {
    INFO(k);
    REQUIRE(bitwise_equal(model2->state_dict().at(k), t));
  }
  REQUIRE(sched2.get_last_lr() == sched.get_last_lr());
  // One more identical step on both gives identical weights (optimizer state came back).
  for (auto* pair : {&opt, &opt2}) {
    auto& m = pair == &opt ? model : model2;
    pair->zero_grad();
    cross_entropy(m->forward(x), y).backward();
    pair->step();
  }
  REQUIRE(bitwise_equal(model2->fc->weight, model->fc->weight));

  // Weights only (inference): no optimizer needed.
  auto infer = models::resnet18({.num_classes = 10, .cifar_stem = true});
  io::load_checkpoint(path, *infer, nullptr, nullptr, false);
  REQUIRE(bitwise_equal(infer->conv1->weight, model2->state_dict().at("conv1.weight").clone()) ==
          false);  // model2 moved on by one step; infer holds the saved weights
  io::Checkpoint raw = io::read_checkpoint(path);
  REQUIRE(bitwise_equal(infer->conv1->weight.detach(), raw.model.at("conv1.weight")));
  REQUIRE(raw.metadata.at("arch") == "resnet18-cifar");

  // A different architecture is refused and nothing changes, optimizer included.
  auto other = models::resnet34({.num_classes = 10, .cifar_stem = true});
  optim::SGD opt3(other->parameters(), {.lr = 0.1, .momentum = 0.9});
  Tensor before = other->conv1->weight.clone();
  REQUIRE_THROWS_WITH(io::load_checkpoint(path, *other, &opt3),
                      Contains("Missing keys") && Contains("Nothing was loaded"));
  REQUIRE(bitwise_equal(other->conv1->weight, before));
  REQUIRE(opt3.state_dict().size() ==
          optim::SGD(other->parameters(), {.lr = 0.1, .momentum = 0.9}).state_dict().size());
  // An optimizer of another type is refused after the model part succeeded: the model is
  // rolled back to its previous weights.
  auto model4 = models::resnet18({.num_classes = 10, .cifar_stem = true});
  optim::Adam adam(model4->parameters(), {.lr = 1e-3});
  Tensor w4 = model4->conv1->weight.clone();
  REQUIRE_THROWS_WITH(io::load_checkpoint(path, *model4, &adam), Contains("Nothing was loaded"));
  REQUIRE(bitwise_equal(model4->conv1->weight, w4));
}

TEST_CASE("keep_last rotates older checkpoints to path.1, path.2", "[io][ckpt]") {
  const std::string path = scratch("rot.h5");
  for (int64_t step = 1; step <= 4; ++step) {
    io::Checkpoint c;
    c.model.insert("w", full({2}, static_cast<double>(step)));
    c.progress.step = step;
    io::write_checkpoint(path, c, {.keep_last = 3});
  }
  REQUIRE(io::read_checkpoint(path).progress.step == 4);
  REQUIRE(io::read_checkpoint(path + ".1").progress.step == 3);
  REQUIRE(io::read_checkpoint(path + ".2").progress.step == 2);
  REQUIRE_FALSE(fs::exists(path + ".3"));
}

// Child: writes checkpoints of a 16 MB tensor filled with the iteration number, forever.
TEST_CASE("checkpoint writer child", "[.child]") {
  const char* path = std::getenv("DLTRAIN_CKPT_PATH");
  REQUIRE(path != nullptr);
  io::Checkpoint c;
  for (int64_t it = 0;; ++it) {
    c.model.insert("big", full({4 << 20}, static_cast<double>(it)));
    c.progress.step = it;
    io::write_checkpoint(path, c);
  }
}

TEST_CASE("a writer killed at any moment leaves a loadable previous checkpoint", "[io][ckpt]") {
  const std::string path = scratch("killed.h5");
  io::Checkpoint c;
  c.model.insert("big", full({4 << 20}, -1.0));
  c.progress.step = -1;
  io::write_checkpoint(path, c);
  for (int delay_ms : {5, 40, 90, 150, 230, 370}) {
    pid_t pid = spawn_child("checkpoint writer child", {"DLTRAIN_CKPT_PATH=" + path});
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ::kill(pid, SIGKILL);
    wait_child(pid);
    io::Checkpoint r = io::read_checkpoint(path);  // must not throw
    const double v = static_cast<double>(r.progress.step);
    INFO("killed after " << delay_ms << " ms at saved step " << v);
    REQUIRE(r.model.at("big").numel() == (4 << 20));
    REQUIRE(min(r.model.at("big")).item<double>() == v);
    REQUIRE(max(r.model.at("big")).item<double>() == v);
  }
}

// Child: phase "first" trains the CNN to the half-way step and checkpoints; phase "second"
// starts from nothing, loads that checkpoint, trains to the end and checkpoints again.
TEST_CASE("resume child", "[.child]") {
  const std::string phase = std::getenv("DLTRAIN_RESUME_PHASE");
  const std::string path = std::getenv("DLTRAIN_CKPT_PATH");
  Run r = make_run();
  io::TrainingProgress p;
  if (phase == "second") p = io::load_checkpoint(path, *r.model, r.opt.get(), r.sched.get());
  train_until(r, p, phase == "first" ? kTotalSteps / 2 : kTotalSteps);
  io::save_checkpoint(path + (phase == "first" ? "" : ".final"), *r.model, r.opt.get(),
                      r.sched.get(), p);
}

TEST_CASE("exact resume: N/2 steps + checkpoint + new process + N/2 steps == N steps, bitwise",
          "[io][ckpt][resume]") {
  Run straight = make_run();
  io::TrainingProgress p;
  train_until(straight, p, kTotalSteps);
  REQUIRE(p.epoch == 1);  // crossed an epoch boundary
  const std::string path = scratch("resume.h5");
  REQUIRE(wait_child(spawn_child(
              "resume child", {"DLTRAIN_RESUME_PHASE=first", "DLTRAIN_CKPT_PATH=" + path})) == 0);
  io::Checkpoint half = io::read_checkpoint(path);
  REQUIRE(half.progress.step == kTotalSteps / 2);
  REQUIRE(half.progress.batch_in_epoch == kTotalSteps / 2);  // mid-epoch
  REQUIRE(wait_child(spawn_child(
              "resume child", {"DLTRAIN_RESUME_PHASE=second", "DLTRAIN_CKPT_PATH=" + path})) == 0);
  io::Checkpoint resumed = io::read_checkpoint(path + ".final");
  REQUIRE(resumed.progress.step == kTotalSteps);
  StateDict want = straight.model->state_dict();
  REQUIRE(resumed.model.keys() == want.keys());
  for (const auto& [k, t] : want) {
    INFO(k);
    REQUIRE(bitwise_equal(resumed.model.at(k), t));
  }
  StateDict want_opt = straight.opt->state_dict();
  for (const auto& [k, t] : want_opt) {
    INFO(k);
    REQUIRE(bitwise_equal(resumed.optimizer.at(k), t));
  }
}
