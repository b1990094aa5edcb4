// Model parallelism as day 4 of the course teaches it (issue 31): a small vision transformer
// (patch embedding, pre-norm transformer encoder layers, mean-pooled head) on Fashion-MNIST (or
// synthetic images), trained on P pipeline stages x D data-parallel replicas x T tensor-parallel
// shards of the job's ranks (distributed::RankLayout).
//
//   mpirun -np 4 model_parallel [--data DIR | --synthetic N] [--pipeline-stages 2]
//          [--micro-batches 4] [--schedule 1f1b|gpipe] [--tensor-parallel 2] [--batch-size 32]
//          [--epochs 1] [--lr 1e-3] [--dim 64] [--depth 4] [--heads 4] [--patch 7]
//          [--test [--test-nsteps N]] [--threads N] [--json PATH] [--checkpoint FILE.h5 [--resume]]
//          [--balance params|time] [--checkpoint-activations] [--amp]
//
// Every rank builds the same model from --seed (the tensor-parallel layers are built as the
// ordinary ones, then sliced), so a run on any layout starts from the same weights as one
// process. With T > 1 the encoder layers are distributed::TensorParallelTransformerEncoderLayer
// over the tensor group; with P > 1 distributed::Pipeline cuts the model (patch embedding,
// layers, head: an nn::Sequential) into stages balanced by parameter count and runs the
// micro-batches with the chosen schedule over the pipeline group; with D > 1 each replica reads
// its share of every batch (DistributedSampler over the replicas) and the gradients are averaged
// over the data group (PipelineOptions::data_group). The optimizer is AdamW over the parameters
// this rank holds. --balance time cuts by measured forward time (Pipeline::timed_cuts);
// --checkpoint-activations recomputes each stage's forward in backward; --amp runs forwards
// and loss under bf16 autocast.
//
// The report prints the rank layout, each rank's parameter bytes and peak tensor memory, the
// throughput, and at the end the test accuracy of the trained model, evaluated on rank 0 after
// gathering the full weights (Pipeline::full_state_dict, distributed::gather_state_dict) into an
// ordinary model: the weights a single process (or PyTorch) would load.
//
// --checkpoint writes, at each epoch end, the whole model's weights and AdamW state gathered on
// rank 0 (Pipeline::full_state_dict / full_optimizer_state_dict) as one ordinary checkpoint: a
// single process loads it (io::load_checkpoint), and --resume continues from it at the next
// epoch on any layout, one process included (tensor-parallel blocks are gathered first:
// distributed::gather_state_dict / gather_optimizer_state_dict). With --checkpoint, SIGUSR1 or
// SIGTERM (Slurm's wall-time warning, preemption) saves at the next step boundary, with the
// position in the epoch, and exits 75 for slurm/cpu-ranks.slurm to requeue; --resume continues
// mid-epoch.
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apps/common/example_util.hpp"
#include "apps/common/training.hpp"
#include "dltrain/dltrain.hpp"
#include "examples/fashion_mnist/model.hpp"

using namespace dltrain;
using namespace dltrain::apps;

namespace {

struct Args : CommonFlags {
  int64_t dim = 64, depth = 4, heads = 4, patch = 7;
  int64_t pipeline = 1, micro_batches = 4, tensor = 1, synthetic = 0;
  std::string schedule = "1f1b", balance = "params";
  double wd = 0.05;
  bool checkpoint_activations = false, amp = false;
};

Args parse(int argc, char** argv) {
  Args a;
  a.batch_size = 32;
  a.lr = 1e-3;
  a.data = fashion_mnist::kDefaultData;
  cli::Flags f("model_parallel",
               "A vision transformer on Fashion-MNIST trained with pipeline, tensor and data "
               "parallelism over the ranks of an mpirun/srun job (P x D x T ranks).");
  a.add_training(f);
  f.add("--wd", &a.wd, "AdamW weight decay").min(0);
  f.add("--dim", &a.dim, "embedding width").positive();
  f.add("--depth", &a.depth, "transformer encoder layers").positive();
  f.add("--heads", &a.heads, "attention heads (divisible by --tensor-parallel)").positive();
  f.add("--patch", &a.patch, "patch size (divides 28)").positive();
  f.group(cli::group::kDistributed);
  f.add("--pipeline-stages", &a.pipeline, "pipeline stages P").positive();
  f.add("--micro-batches", &a.micro_batches, "micro-batches per batch on the pipeline").positive();
  f.add("--schedule", &a.schedule, "pipeline schedule").choices({"1f1b", "gpipe"});
  f.add("--balance", &a.balance,
        "cut the stages by parameter count (params) or by each module's forward time measured "
        "on one micro-batch (time; averaged over the pipeline's ranks)")
      .choices({"params", "time"});
  f.add_switch("--checkpoint-activations", &a.checkpoint_activations,
               "recompute each stage's forward in backward: a stage keeps only its input per "
               "micro-batch in flight");
  f.add("--tensor-parallel", &a.tensor,
        "tensor-parallel shards T (the data-parallel replicas "
        "are what is left: ranks / (P x T))")
      .positive();
  a.add_test(f);
  a.add_data(f, "Fashion-MNIST's IDX files (Debian: dataset-fashion-mnist)");
  f.add("--synthetic", &a.synthetic, "train on N random 28x28 images instead of --data (0: off)")
      .min(0);
  f.group(cli::group::kDevice);
  f.add("--threads", &a.threads, "CPU threads per rank (0: DLTRAIN_NUM_THREADS or all cores)")
      .min(0);
  f.add_switch("--amp", &a.amp,
               "forward and loss under bf16 autocast (activations cross the stages in bf16)");
  a.add_report(f, /*with_metrics=*/false);
  f.group(cli::group::kCheckpoint);
  f.add("--checkpoint", &a.checkpoint,
        "save the whole model's weights and optimizer state, gathered into one ordinary "
        "checkpoint, at each epoch end and on SIGUSR1/SIGTERM (then exit 75 for a requeue)")
      .value_name("FILE.h5");
  f.add_switch("--resume", &a.resume,
               "continue from --checkpoint when the file exists (at the epoch it ended; any "
               "number of stages and replicas)");
  a.parse(f, argc, argv);
  if (28 % a.patch != 0) f.fail("--patch must divide 28 (the images' size)");
  if (a.resume && a.checkpoint.empty()) f.fail("--resume needs --checkpoint FILE.h5");
  return a;
}

// Conv2d patches + a learned position embedding: [N, 1, 28, 28] -> [N, L, E].
class PatchEmbed : public nn::Module {
 public:
  PatchEmbed(int64_t patch, int64_t dim) : Module("PatchEmbed") {
    const int64_t side = 28 / patch;
    proj = register_module(
        "proj", std::make_shared<nn::Conv2d>(1, dim, patch, nn::Conv2dOptions{.stride = patch}));
    pos_embed = register_parameter("pos_embed", mul(randn({1, side * side, dim}), 0.02));
  }
  Tensor forward(const Tensor& x) override {
    return add((*proj)(x).flatten(2).transpose(1, 2), pos_embed);
  }
  std::shared_ptr<nn::Conv2d> proj;
  Tensor pos_embed;
};

// LayerNorm, mean over the tokens, linear classifier: [N, L, E] -> [N, 10].
class Head : public nn::Module {
 public:
  explicit Head(int64_t dim) : Module("Head") {
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(Shape{dim}));
    fc = register_module("fc", std::make_shared<nn::Linear>(dim, 10));
  }
  Tensor forward(const Tensor& x) override { return (*fc)(mean((*norm)(x), {1})); }
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> fc;
};

// The model from the seed: ordinary encoder layers, or tensor-parallel ones over `tp` (built
// from the generator as the ordinary ones, then sliced: the same weights).
std::shared_ptr<nn::Sequential> make_vit(const Args& a, distributed::ProcessGroup* tp) {
  manual_seed(a.seed);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back("embed", std::make_shared<PatchEmbed>(a.patch, a.dim));
  const nn::TransformerEncoderLayerOptions lo{
      .dim_feedforward = 4 * a.dim, .dropout = 0.0, .batch_first = true, .norm_first = true};
  for (int64_t i = 0; i < a.depth; ++i) {
    const std::string name = "layer" + std::to_string(i);
    if (tp)
      m->push_back(name, std::make_shared<distributed::TensorParallelTransformerEncoderLayer>(
                             a.dim, a.heads, *tp, lo));
    else
      m->push_back(name, std::make_shared<nn::TransformerEncoderLayer>(a.dim, a.heads, lo));
  }
  m->push_back("head", std::make_shared<Head>(a.dim));
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  return run_guarded("model_parallel", [&]() -> int {
    const char* backend = "";
    const Run run = start_run(args, /*data_parallel=*/true, &backend);
    distributed::RankLayout layout(
        {.pipeline = static_cast<int>(args.pipeline), .tensor = static_cast<int>(args.tensor)});
    const int P = layout.pipeline_size(), D = layout.data_size(), T = layout.tensor_size();

    // Data: each replica its share of every batch; the ranks of one replica read the same.
    std::shared_ptr<data::TensorDataset> train_set, test_set;
    const data::ImageOptions norm = fashion_mnist::normalization();
    if (args.synthetic > 0) {
      Generator g(args.seed + 7);
      train_set = std::make_shared<data::TensorDataset>(
          randn({args.synthetic, 1, 28, 28}, TensorOptions(), &g),
          randint(0, 10, {args.synthetic}, DType::i64, &g));
      test_set = train_set;
    } else {
      train_set = std::make_shared<data::MNIST>(args.data, true, norm);
      test_set = std::make_shared<data::MNIST>(args.data, false, norm);
    }
    data::DataLoaderOptions lo;
    lo.batch_size = args.batch_size;
    lo.drop_last = true;
    auto sampler = std::make_shared<data::DistributedSampler>(train_set->size(), layout.replica(),
                                                              D, true, args.seed, true);
    data::DataLoader loader(train_set, sampler, lo);

    auto model = make_vit(args, T > 1 ? &layout.tensor_group() : nullptr);
    std::unique_ptr<distributed::Pipeline> pipe;
    if (P > 1) {
      std::vector<int64_t> cuts;  // empty: balanced by parameter count
      if (args.balance == "time") {
        const int64_t rows = std::max<int64_t>(1, args.batch_size / args.micro_batches);
        Generator g(args.seed + 11);
        cuts = distributed::Pipeline::timed_cuts(
            *model, randn({rows, 1, 28, 28}, TensorOptions(), &g), &layout.pipeline_group());
        std::string times;
        for (double t : distributed::Pipeline::last_module_times()) {
          times += ' ';  // (appended apart: GCC 12 warns about " " + to_string)
          times += std::to_string(static_cast<int64_t>(t * 1e6));
        }
        std::printf("stages balanced by forward time (us per module:%s)\n", times.c_str());
      }
      pipe = std::make_unique<distributed::Pipeline>(
          model,
          distributed::PipelineOptions{.group = &layout.pipeline_group(),
                                       .cuts = cuts,
                                       .micro_batches = static_cast<int>(args.micro_batches),
                                       .schedule = distributed::parse_schedule(args.schedule),
                                       .data_group = &layout.data_group(),
                                       .checkpoint_activations = args.checkpoint_activations,
                                       .autocast = args.amp,
                                       .autocast_dtype = DType::bf16});
      std::string b;
      for (int64_t x : pipe->boundaries()) {
        b += ' ';
        b += std::to_string(x);
      }
      std::printf("pipeline stage boundaries (module indices):%s%s%s\n", b.c_str(),
                  args.checkpoint_activations ? ", activation checkpointing" : "",
                  args.amp ? ", bf16 autocast" : "");
    }
    const std::vector<Tensor> params = pipe ? pipe->parameters() : model->parameters();
    int64_t bytes = 0;
    for (const Tensor& p : params) bytes += p.numel() * static_cast<int64_t>(p.element_size());
    optim::AdamW opt(params, {.lr = args.lr, .weight_decay = args.wd});
    std::printf(
        "vision transformer: dim %lld, %lld layers, %lld heads, patch %lld; global batch "
        "%lld (%d replicas x %lld)%s\n",
        static_cast<long long>(args.dim), static_cast<long long>(args.depth),
        static_cast<long long>(args.heads), static_cast<long long>(args.patch),
        static_cast<long long>(args.batch_size * D), D, static_cast<long long>(args.batch_size),
        P > 1 ? (", " + std::to_string(args.micro_batches) + " micro-batches, " + args.schedule +
                 " schedule")
                    .c_str()
              : "");
    std::fflush(stdout);
    // Each rank's share of the parameters, printed by rank 0 (the others' stdout is closed).
    const Tensor all_bytes = zeros({run.ranks}, DType::f64);
    all_bytes.view({-1}).narrow(0, run.rank, 1).fill_(static_cast<double>(bytes));
    distributed::default_group().all_reduce(all_bytes).wait();
    const std::vector<double> per_rank = all_bytes.to_vector<double>();
    for (int r = 0; r < run.ranks; ++r)
      std::printf("rank %d: %.1f KiB of parameters\n", r, per_rank[static_cast<size_t>(r)] / 1024);

    const auto loss_fn = [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); };
    int64_t step = 0, samples = 0, first_epoch = 0, resume_samples = 0;
    // What this rank trains: its stage, or the model; tensor-parallel layers inside it hold
    // blocks, which distributed::gather_* make whole (no communication without such layers).
    nn::Module& local = pipe ? static_cast<nn::Module&>(pipe->stage_module()) : *model;
    // The whole model's weights and optimizer state on rank 0: each stage's gathered over its
    // tensor group, then the stages over each pipeline group (collective on every rank).
    const auto gather_model = [&] {
      const StateDict mine = distributed::gather_state_dict(local);
      return pipe ? pipe->full_state_dict(mine, 0) : mine;
    };
    const auto gather_optimizer = [&] {
      const StateDict mine = distributed::gather_optimizer_state_dict(local, opt);
      return pipe ? pipe->full_optimizer_state_dict(mine, 0) : mine;
    };
    // --resume: every rank reads the file and keeps its part of the weights and state.
    if (args.resume && std::filesystem::exists(args.checkpoint)) {
      const io::Checkpoint ck = io::read_checkpoint(args.checkpoint);
      distributed::load_full_state_dict(local, pipe ? pipe->stage_state(ck.model) : ck.model);
      distributed::load_full_optimizer_state_dict(
          local, opt, pipe ? pipe->stage_optimizer_state(opt, ck.optimizer) : ck.optimizer);
      first_epoch = ck.progress.epoch;
      step = ck.progress.step;
      // Mid-epoch (a preemption): the rest of the same epoch order, whatever the replicas.
      resume_samples = std::max<int64_t>(0, ck.progress.samples_in_epoch);
      std::printf("resumed from %s: epoch %lld, step %lld, %lld samples into the epoch\n",
                  args.checkpoint.c_str(), static_cast<long long>(first_epoch + 1),
                  static_cast<long long>(step), static_cast<long long>(resume_samples));
    }
    // Slurm's wall-time signal (--signal=USR1@T) or a preemption (SIGTERM): saved at the next
    // step boundary, then exit 75 for the job script to requeue (train/preemption.hpp).
    std::optional<train::PreemptionHandler> preempt;
    if (!args.checkpoint.empty()) preempt.emplace();
    // The whole model's state on rank 0 (collective over each pipeline group), written there:
    // the epoch to resume in and how many of its samples (over the replicas) are done.
    const auto save = [&](int64_t epoch, int64_t samples_in_epoch) {
      io::Checkpoint ck;
      ck.model = gather_model();
      ck.optimizer = gather_optimizer();
      ck.progress.epoch = epoch;
      ck.progress.samples_in_epoch = samples_in_epoch;
      ck.progress.step = step;
      ck.progress.global_batch = args.batch_size * D;
      ck.metadata = {{"example", "model_parallel"}, {"layout", layout.str()}};
      if (run.rank == 0) io::write_checkpoint(args.checkpoint, ck);
      distributed::barrier();
    };
    reset_peak_memory_stats();
    const size_t resident = memory_allocated();  // the datasets and the weights
    double last_loss = 0;
    const auto t0 = Clock::now();
    bool done = false, preempted = false;
    for (int64_t epoch = first_epoch; epoch < args.epochs && !done; ++epoch) {
      loader.set_epoch(epoch);
      if (epoch == first_epoch && resume_samples > 0) loader.set_start_sample(resume_samples);
      int64_t batches = 0;  // of this epoch, in this run
      for (const data::Batch& b : loader) {
        opt.zero_grad();
        if (pipe) {  // gradients and loss averaged over the replicas by the pipeline
          last_loss = pipe->forward_backward(b.data, b.target, loss_fn);
        } else {
          Tensor loss;
          {
            const amp::autocast ac(DeviceType::CPU, DType::bf16, args.amp);
            const Tensor x = args.checkpoint_activations ? nn::checkpoint(*model, b.data)
                                                         : model->forward(b.data);
            loss = loss_fn(x, b.target);
          }
          loss.backward();
          last_loss = loss.item<double>();
          if (D > 1) {  // average the replicas' gradients and losses
            for (const Tensor& p : params)
              if (p.grad().defined())
                layout.data_group().all_reduce(p.grad(), distributed::ReduceOp::Avg).wait();
            const Tensor l = full({}, last_loss, DType::f64);
            layout.data_group().all_reduce(l, distributed::ReduceOp::Avg).wait();
            last_loss = l.item<double>();
          }
        }
        opt.step();
        ++step;
        ++batches;
        samples += b.size() * D;
        if (step % 10 == 0 || (args.test && step == args.test_nsteps)) {
          std::printf("step %lld  loss %.4f\n", static_cast<long long>(step), last_loss);
          std::fflush(stdout);
        }
        if (preempt && preempt->requested()) {
          save(epoch, loader.samples_after(batches));
          std::printf("preempted by %s: saved %s at epoch %lld, step %lld\n",
                      train::signal_name(preempt->signal()), args.checkpoint.c_str(),
                      static_cast<long long>(epoch + 1), static_cast<long long>(step));
          preempted = done = true;
          break;
        }
        if (args.test && step >= args.test_nsteps) {
          done = true;
          break;
        }
      }
      if (!args.checkpoint.empty() && !done) save(epoch + 1, 0);
    }
    if (preempted) return train::kExitRequeue;
    const double secs = seconds(t0, Clock::now());
    const double peak = static_cast<double>(max_memory_allocated() - resident) / (1 << 20);
    const Tensor peaks = zeros({run.ranks}, DType::f64);
    peaks.view({-1}).narrow(0, run.rank, 1).fill_(peak);
    distributed::default_group().all_reduce(peaks).wait();
    const std::vector<double> peak_per_rank = peaks.to_vector<double>();
    for (int r = 0; r < run.ranks; ++r)
      std::printf(
          "rank %d: peak tensor memory while training %.1f MiB (above the data and weights)\n", r,
          peak_per_rank[static_cast<size_t>(r)]);
    std::printf("trained %lld steps in %.1f s: %.1f samples/s, last loss %.4f\n",
                static_cast<long long>(step), secs, static_cast<double>(samples) / secs, last_loss);

    // The full weights on rank 0, in an ordinary model: its test accuracy.
    const StateDict full = gather_model();
    double acc = -1;
    if (run.rank == 0 && !full.empty()) {
      auto reference = make_vit(args, nullptr);
      reference->load_state_dict(full);
      reference->eval();
      NoGradGuard ng;
      data::DataLoaderOptions to;
      to.batch_size = 500;
      int64_t hits = 0, count = 0;
      for (const data::Batch& b : data::DataLoader(test_set, to)) {
        hits += sum(eq(argmax(reference->forward(b.data), 1), b.target)).item<int64_t>();
        count += b.size();
        if (args.test && count >= 2000) break;
      }
      acc = 100.0 * static_cast<double>(hits) / static_cast<double>(count);
      std::printf("test accuracy of the gathered model (one process's %s): %.2f%% on %lld images\n",
                  "nn::Sequential", acc, static_cast<long long>(count));
    }
    if (!args.json.empty() && run.rank == 0)
      cli::write_json_report(args.json, {{"pipeline", P},
                                         {"data", D},
                                         {"tensor", T},
                                         {"schedule", args.schedule},
                                         {"micro_batches", args.micro_batches},
                                         {"steps", step},
                                         {"samples_per_s", static_cast<double>(samples) / secs},
                                         {"last_loss", last_loss},
                                         {"param_bytes_per_rank", per_rank},
                                         {"peak_mib_per_rank", peak_per_rank},
                                         {"test_acc", acc}});
    distributed::barrier();
    return 0;
  });
}
