// A FullyShardedDataParallel checkpoint written on one rank count resumes on another:
//   fsdp_resume run OUT CKPT K   trains kSteps steps (AdamW, three units), writes the full model
//                                and optimizer state after step K to CKPT (rank 0) and the final
//                                ones to OUT
//   fsdp_resume resume CKPT OUT  loads CKPT (any rank count: each rank keeps its shards of the
//                                full state), trains the remaining steps, writes OUT
//   fsdp_resume compare A B TOL  every entry of A and B within TOL (relative), the same keys
// The global batch (12 rows per step) is the same whatever the rank count, each rank taking its
// share in rank order, so the uninterrupted run and the resumed ones see the same data.
#include <cmath>
#include <cstdio>
#include <set>
#include <string>

#include "dltrain/dltrain.hpp"

using namespace dltrain;

namespace {

constexpr int64_t kGlobal = 12;
constexpr int kSteps = 8;

std::shared_ptr<nn::Sequential> make_model() {
  manual_seed(5);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(16, 12, true, DType::f64))
      .push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::Linear>(12, 12, true, DType::f64))
      .push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::Linear>(12, 4, true, DType::f64));
  return m;
}

StateDict with_prefix(const std::string& pre, const StateDict& sd, StateDict out = {}) {
  for (const auto& [k, t] : sd) out.insert(pre + k, t);
  return out;
}

StateDict strip(const std::string& pre, const StateDict& sd) {
  StateDict out;
  for (const auto& [k, t] : sd)
    if (k.rfind(pre, 0) == 0) out.insert(k.substr(pre.size()), t);
  return out;
}

int run_training(const std::string& out, const std::string& ckpt, int save_at, bool resume) {
  distributed::ProcessGroup& g = distributed::init();
  const int n = g.size();
  if (kGlobal % n != 0) distributed::abort("the global batch 12 must divide by the rank count");
  auto model = make_model();
  distributed::FullyShardedDataParallel fsdp(model, {.units = {"0", "2"}});
  optim::AdamW opt(fsdp.parameters(), {.lr = 1e-2, .weight_decay = 0.01});
  Generator gen(11);
  Tensor x = randn({kSteps * kGlobal, 16}, DType::f64, &gen);
  Tensor y = randint(0, 4, {kSteps * kGlobal}, DType::i64, &gen);
  int step = 0;
  if (resume) {
    const StateDict saved = io::load_safetensors(ckpt);
    fsdp.load_full_state_dict(strip("model.", saved));
    fsdp.load_full_optim_state_dict(opt, strip("optim.", saved));
    step = static_cast<int>(saved.scalar("step"));
    std::printf("rank %d of %d: resumed after step %d (saved on %d ranks)\n", g.rank(), n, step,
                static_cast<int>(saved.scalar("world_size")));
  }
  auto save = [&](const std::string& path) {
    StateDict sd = with_prefix("model.", fsdp.full_state_dict());
    sd = with_prefix("optim.", fsdp.full_optim_state_dict(opt), std::move(sd));
    sd.insert_scalar("step", step, true);
    sd.insert_scalar("world_size", n, true);
    distributed::on_main_process([&] { io::save_safetensors(path, sd); });
  };
  const int64_t per_rank = kGlobal / n;
  for (; step < kSteps;) {
    const int64_t first = step * kGlobal + g.rank() * per_rank;
    opt.zero_grad();
    cross_entropy(fsdp(x.narrow(0, first, per_rank)), y.narrow(0, first, per_rank)).backward();
    opt.step();
    ++step;
    if (!resume && step == save_at && !ckpt.empty()) save(ckpt);
  }
  save(out);
  return 0;
}

int compare(const std::string& a, const std::string& b, double tol) {
  StateDict x = io::load_safetensors(a), y = io::load_safetensors(b);
  std::set<std::string> kx, ky;
  for (const auto& [k, t] : x)
    if (k != "world_size") kx.insert(k);
  for (const auto& [k, t] : y)
    if (k != "world_size") ky.insert(k);
  if (kx != ky) {
    std::printf("%s and %s hold different entries\n", a.c_str(), b.c_str());
    return 1;
  }
  double worst = 0;
  std::string where;
  for (const std::string& k : kx) {
    auto u = x.at(k).to(DType::f64).to_vector<double>(),
         v = y.at(k).to(DType::f64).to_vector<double>();
    double num = 0, den = 0;
    for (size_t i = 0; i < u.size(); ++i) {
      num += (u[i] - v[i]) * (u[i] - v[i]);
      den += v[i] * v[i];
    }
    const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    if (rel >= worst) {
      worst = rel;
      where = k;
    }
  }
  std::printf(
      "%s vs %s: %zu entries (model and optimizer), worst relative difference %.3g in "
      "'%s' (tolerance %.3g)\n",
      a.c_str(), b.c_str(), kx.size(), worst, where.c_str(), tol);
  return worst <= tol ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "run" && argc == 5)
      return run_training(argv[2], argv[3], std::stoi(argv[4]), false);
    if (mode == "resume" && argc == 4) return run_training(argv[3], argv[2], 0, true);
    if (mode == "compare" && argc == 5) return compare(argv[2], argv[3], std::stod(argv[4]));
  } catch (const std::exception& e) {
    distributed::abort(std::string("fsdp_resume: ") + e.what());
  }
  std::fprintf(stderr, "usage: fsdp_resume run OUT CKPT K | resume CKPT OUT | compare A B TOL\n");
  return 2;
}
