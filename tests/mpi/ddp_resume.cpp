// Resuming a data-parallel run on a different number of ranks (run by tests/mpi/CMakeLists):
//   ddp_resume run OUT [CKPT K]   train kSteps steps on this job's ranks; with CKPT, rank 0
//                                 saves a checkpoint after step K; rank 0 writes the final
//                                 weights to OUT (safetensors)
//   ddp_resume resume CKPT OUT    load CKPT on every rank, continue to kSteps, write OUT
//   ddp_resume compare A B TOL    exit 0 when A and B differ by at most TOL (relative)
// The global batch is fixed (kGlobal), so global step k consumes positions [k G, (k+1) G) of
// the epoch's DistributedSampler permutation whatever the rank count: the checkpoint's
// (epoch, batch in epoch) is a position in the data for any rank count.
#include <cmath>
#include <cstdio>
#include <string>

#include "dltrain/dltrain.hpp"

using namespace dltrain;

namespace {

constexpr int64_t kGlobal = 12, kImages = 96, kSteps = 12;

std::shared_ptr<nn::Sequential> make_model() {
  manual_seed(5);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Flatten>())
      .push_back(std::make_shared<nn::Linear>(28 * 28, 32, true, DType::f64))
      .push_back(std::make_shared<distributed::SyncBatchNorm>(32, nn::BatchNormOptions{}, nullptr,
                                                              DType::f64))
      .push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::Linear>(32, 10, true, DType::f64));
  return m;
}

std::shared_ptr<data::Dataset> make_data() {
  Generator g(11);
  Tensor x = randn({kImages, 1, 28, 28}, DType::f64, &g);
  Tensor y = randint(0, 10, {kImages}, DType::i64, &g);
  return std::make_shared<data::TensorDataset>(x, y);
}

int run_training(const std::string& out, const std::string& ckpt, int64_t save_at, bool resume) {
  distributed::ProcessGroup& g = distributed::init();
  const int n = g.size();
  if (kGlobal % n != 0) distributed::abort("the global batch 12 must divide by the rank count");
  auto model = make_model();
  distributed::DistributedDataParallel ddp(model);
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  optim::StepLR sched(opt, 5, 0.5);
  auto ds = make_data();
  auto sampler = std::make_shared<data::DistributedSampler>(ds->size(), g.rank(), n, true, 7);
  data::DataLoaderOptions lo;
  lo.batch_size = kGlobal / n;
  data::DataLoader loader(ds, sampler, lo);
  int64_t step = 0, epoch = 0, start_batch = 0;
  if (resume) {
    io::TrainingProgress p = io::load_checkpoint(ckpt, *model, &opt, &sched);
    step = p.step;
    epoch = p.epoch;
    start_batch = p.batch_in_epoch;
    std::printf("rank %d of %d: resumed at epoch %lld batch %lld step %lld\n", g.rank(), n,
                static_cast<long long>(epoch), static_cast<long long>(start_batch),
                static_cast<long long>(step));
  }
  for (; step < kSteps; ++epoch) {
    loader.set_epoch(epoch);
    loader.set_start_batch(start_batch);
    int64_t b = start_batch;
    start_batch = 0;
    for (const data::Batch& batch : loader) {
      opt.zero_grad();
      cross_entropy(ddp(batch.data), batch.target).backward();
      opt.step();
      sched.step();
      ++step;
      ++b;
      if (!ckpt.empty() && !resume && step == save_at) {
        if (distributed::is_main_process())
          io::save_checkpoint(ckpt, *model, &opt, &sched, {epoch, step, b},
                              {{"world_size", std::to_string(n)}});
        distributed::barrier();
      }
      if (step == kSteps) break;
    }
  }
  if (distributed::is_main_process()) io::save_safetensors(out, model->state_dict());
  distributed::barrier();
  return 0;
}

int compare(const std::string& a, const std::string& b, double tol) {
  StateDict x = io::load_safetensors(a), y = io::load_safetensors(b);
  double num = 0, den = 0;
  for (const auto& [name, t] : x) {
    auto u = t.to(DType::f64).to_vector<double>(),
         v = y.at(name).to(DType::f64).to_vector<double>();
    for (size_t i = 0; i < u.size(); ++i) {
      num += (u[i] - v[i]) * (u[i] - v[i]);
      den += v[i] * v[i];
    }
  }
  const double rel = std::sqrt(num / den);
  std::printf("%s vs %s: relative difference %.3g (tolerance %.3g)\n", a.c_str(), b.c_str(), rel,
              tol);
  return rel <= tol ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "run" && (argc == 3 || argc == 5))
      return run_training(argv[2], argc == 5 ? argv[3] : "", argc == 5 ? std::stoll(argv[4]) : 0,
                          false);
    if (mode == "resume" && argc == 4) return run_training(argv[3], argv[2], 0, true);
    if (mode == "compare" && argc == 5) return compare(argv[2], argv[3], std::stod(argv[4]));
  } catch (const std::exception& e) {
    distributed::abort(std::string("ddp_resume: ") + e.what());
  }
  std::fprintf(stderr, "usage: ddp_resume run OUT [CKPT K] | resume CKPT OUT | compare A B TOL\n");
  return 2;
}
