// Resuming with another global batch (run by tests/mpi/CMakeLists): a checkpoint written by
// N ranks with per-rank batch B resumes on M ranks with per-rank batch B'; the data position
// is kept in samples, so the interrupted and the resumed run together see every sample of the
// epoch exactly once, and the learning rate follows the linear scaling rule.
//   ddp_resume_batch run B STEPS CKPT SEEN     train epoch 0 from its start with per-rank batch
//                                              B, stop after STEPS steps, save CKPT and write
//                                              how often each sample was seen to SEEN
//   ddp_resume_batch resume B CKPT SEEN        resume CKPT with per-rank batch B to the end of
//                                              the epoch; check the learning rate; write SEEN
//   ddp_resume_batch check SEEN1 SEEN2         exit 0 when every sample was seen once in all
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "dltrain/dltrain.hpp"
#include "dltrain/train/resume.hpp"

using namespace dltrain;

namespace {

// 96 samples: divides into the global batches used (2 x 8, 3 x 4, 1 x 12 ...) without padding.
constexpr int64_t kImages = 96;
constexpr double kLr = 0.04;

std::shared_ptr<data::Dataset> make_data() {
  // Feature 0 of sample i is i, so a batch says which samples it holds.
  Generator g(11);
  Tensor x = randn({kImages, 4}, DType::f64, &g);
  x.select(1, 0).copy_(arange(kImages, DType::f64));
  Tensor y = randint(0, 3, {kImages}, DType::i64, &g);
  return std::make_shared<data::TensorDataset>(x, y);
}

void write_seen(const std::string& path, const std::vector<int64_t>& local) {
  Tensor t = from_vector(local, {kImages});
  distributed::default_group().all_reduce(t).wait();
  if (distributed::is_main_process()) {
    std::ofstream out(path);
    for (int64_t v : t.to_vector<int64_t>()) out << v << "\n";
  }
  distributed::barrier();
}

int run_training(int64_t batch, int64_t stop_after, const std::string& ckpt,
                 const std::string& seen, bool resume) {
  distributed::ProcessGroup& g = distributed::init();
  const int64_t global = batch * g.size();
  manual_seed(5);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Linear>(4, 3, true, DType::f64));
  distributed::DistributedDataParallel ddp(model);
  optim::SGD opt(model->parameters(), {.lr = kLr, .momentum = 0.9});
  optim::StepLR sched(opt, 100, 0.5);
  auto ds = make_data();
  auto sampler = std::make_shared<data::DistributedSampler>(kImages, g.rank(), g.size(), true, 7);
  data::DataLoader loader(ds, sampler, {.batch_size = batch});
  loader.set_epoch(0);
  io::TrainingProgress p;
  int64_t step = 0, samples = 0;
  if (resume) {
    p = io::load_checkpoint(ckpt, *model, &opt, &sched);
    const double saved_lr = *opt.param_groups()[0].lr;
    auto r = train::resume_data_position(p, global, &opt, &sched,
                                         {.lr_scaling = train::LRScaling::Linear});
    step = r.step;
    samples = r.samples_in_epoch;
    loader.set_epoch(r.epoch);
    loader.set_start_sample(r.samples_in_epoch);
    // The linear rule: lr x new global / saved global, in the optimizer and the scheduler.
    const double want = saved_lr * static_cast<double>(global) / p.global_batch;
    const double lr = *opt.param_groups()[0].lr;
    std::printf(
        "rank %d of %d: resumed at sample %lld of epoch %lld, global batch %lld -> %lld, "
        "lr %.6g -> %.6g\n",
        g.rank(), g.size(), static_cast<long long>(samples), static_cast<long long>(r.epoch),
        static_cast<long long>(p.global_batch), static_cast<long long>(global), saved_lr, lr);
    if (std::abs(lr - want) > 1e-15 || std::abs(sched.get_last_lr()[0] - want) > 1e-15 ||
        (p.global_batch != global) != r.global_batch_changed() ||
        (r.global_batch_changed() &&
         r.message.find("global batch " + std::to_string(p.global_batch) + " -> " +
                        std::to_string(global)) == std::string::npos))
      distributed::abort("ddp_resume_batch: wrong learning rate or message after resuming");
  }
  std::vector<int64_t> local(kImages);
  int64_t b = 0;
  for (const data::Batch& batch_data : loader) {
    if (stop_after >= 0 && b == stop_after) break;
    for (double id : batch_data.data.select(1, 0).to_vector<double>())
      ++local[static_cast<size_t>(id)];
    opt.zero_grad();
    cross_entropy(ddp(batch_data.data), batch_data.target).backward();
    opt.step();
    sched.step();
    ++step;
    ++b;
    samples += global;
  }
  if (!resume) {
    if (distributed::is_main_process())
      io::save_checkpoint(ckpt, *model, &opt, &sched,
                          {.epoch = 0,
                           .step = step,
                           .batch_in_epoch = b,
                           .samples_in_epoch = samples,
                           .global_batch = global});
    distributed::barrier();
  }
  write_seen(seen, local);
  return 0;
}

int check(const std::string& a, const std::string& b) {
  std::ifstream fa(a), fb(b);
  int64_t x = 0, y = 0, i = 0, bad = 0, first = 0, second = 0;
  while (fa >> x && fb >> y) {
    if (x + y != 1) {
      if (bad++ < 5)
        std::printf("sample %lld seen %lld + %lld times\n", static_cast<long long>(i),
                    static_cast<long long>(x), static_cast<long long>(y));
    }
    first += x;
    second += y;
    ++i;
  }
  std::printf("%lld samples: %lld before the checkpoint, %lld after; %lld not seen exactly once\n",
              static_cast<long long>(i), static_cast<long long>(first),
              static_cast<long long>(second), static_cast<long long>(bad));
  return i == kImages && bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "run" && argc == 6)
      return run_training(std::stoll(argv[2]), std::stoll(argv[3]), argv[4], argv[5], false);
    if (mode == "resume" && argc == 5)
      return run_training(std::stoll(argv[2]), -1, argv[3], argv[4], true);
    if (mode == "check" && argc == 4) return check(argv[2], argv[3]);
  } catch (const std::exception& e) {
    distributed::abort(std::string("ddp_resume_batch: ") + e.what());
  }
  std::fprintf(stderr,
               "usage: ddp_resume_batch run B STEPS CKPT SEEN | resume B CKPT SEEN | check A B\n");
  return 2;
}
