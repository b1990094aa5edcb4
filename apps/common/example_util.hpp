// Helpers shared by the examples: wall-clock seconds, the --device flag's parsing, the course's
// precision and layout flags (--amp, --amp-dtype, --channels-last) and profiler flags, the flags
// every example shares (CommonFlags, on cli::Flags, holding those two) and the --metrics /
// --tensorboard sinks (header-only). apps/common/training.hpp has the training loop's
// shared pieces.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "apps/common/cli.hpp"
#include "dltrain/amp/autocast.hpp"
#include "dltrain/amp/grad_scaler.hpp"
#include "dltrain/backend/cuda.hpp"
#include "dltrain/core/device.hpp"
#include "dltrain/data/dataloader.hpp"
#include "dltrain/distributed/process_group.hpp"
#include "dltrain/io/checkpoint.hpp"
#include "dltrain/nn/module.hpp"
#include "dltrain/optim/optimizer.hpp"
#include "dltrain/optim/scheduler.hpp"
#include "dltrain/train/loop.hpp"
#include "dltrain/train/metrics.hpp"
#include "dltrain/train/preemption.hpp"
#include "dltrain/train/profiler.hpp"
#include "dltrain/train/resume.hpp"

namespace dltrain::apps {

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

/// "cpu", "cuda" (device 0) or "cuda:N"; throws std::invalid_argument otherwise.
inline Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    const std::string n = s.substr(5);
    if (!n.empty() && n.size() < 4 && n.find_first_not_of("0123456789") == std::string::npos)
      return Device::cuda(std::stoi(n));
  }
  throw std::invalid_argument(s);
}

/// The course's mixed-precision and layout flags: `--amp` (autocast in f16 with a GradScaler on
/// a GPU, bf16 without one on the CPU), `--amp-dtype f16|bf16` to choose, `--channels-last`.
struct PrecisionFlags {
  bool amp = false;
  std::string amp_dtype;  // empty: the device's default
  bool channels_last = false;

  /// Adds --amp and --amp-dtype, and --channels-last unless `with_layout` is false (a model
  /// without image tensors, where the layout does not apply: say so in the program's help).
  void add_to(cli::Flags& f, bool with_layout = true) {
    f.group(cli::group::kDevice);
    f.add_switch("--amp", &amp,
                 "mixed precision: autocast (f16 + GradScaler on a GPU, bf16 on the CPU)");
    f.add("--amp-dtype", &amp_dtype, "the autocast dtype [default: the device's]")
        .choices({"f16", "bf16"});
    if (with_layout)
      f.add_switch("--channels-last", &channels_last, "channels-last (NHWC) memory format");
  }
  /// Checks the values (after Flags::parse); exits with status 2 on a bad one.
  void check(const cli::Flags& f) const {
    if (!amp_dtype.empty() && !amp) f.fail("--amp-dtype needs --amp; add --amp or drop it");
  }
  /// The autocast dtype on `d`.
  DType dtype(Device d) const {
    if (amp_dtype.empty()) return amp::default_autocast_dtype(d.type);
    return amp_dtype == "f16" ? DType::f16 : DType::bf16;
  }
  /// The autocast region of a forward pass on `d` (a disabled region without --amp).
  amp::autocast region(Device d) const { return amp::autocast(d.type, dtype(d), amp); }
  /// Loss scaling is for f16 only: bf16 has f32's range, and f32 needs none.
  amp::GradScalerOptions scaler_options(Device d) const {
    return {.enabled = amp && dtype(d) == DType::f16};
  }
  MemoryFormat format() const {
    return channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  }
  /// "f32", "amp-bf16" or "amp-f16".
  std::string precision(Device d) const {
    return amp ? (dtype(d) == DType::f16 ? "amp-f16" : "amp-bf16") : "f32";
  }
  const char* layout() const { return channels_last ? "channels-last" : "contiguous"; }
  /// train::evaluate_classifier's options on `d`: this layout and autocast.
  train::EvaluateOptions evaluate_options(Device d) const {
    return {.device = d, .memory_format = format(), .autocast = amp, .autocast_dtype = dtype(d)};
  }
  /// "precision amp-bf16, layout channels-last, loss scaling off".
  std::string describe(Device d) const {
    return "precision " + precision(d) + ", layout " + layout() + ", loss scaling " +
           (scaler_options(d).enabled ? "on" : "off");
  }
};

/// The course's profiler flags: `--profile FILE.json` profiles `--profile-steps N` (5) training
/// steps after `--profile-warmup N` (2) steps of this run, then writes the Chrome trace to FILE
/// and prints the ops table; `--profile-shapes` records input shapes.
struct ProfileFlags {
  std::string path;
  int64_t steps = 5;
  int64_t warmup = 2;
  bool shapes = false;
  void add_to(cli::Flags& f) {
    f.group(cli::group::kProfiler);
    f.add("--profile", &path, "profile a few training steps, write the Chrome trace here")
        .value_name("FILE.json");
    f.add("--profile-steps", &steps, "training steps profiled").positive();
    f.add("--profile-warmup", &warmup, "steps run before profiling starts").min(0);
    f.add_switch("--profile-shapes", &shapes, "record the input shapes of every op");
  }
  /// Checks the values (after Flags::parse); exits with status 2 on a bad one.
  void check(const cli::Flags& f) const {
    if (!path.empty() && !path.ends_with(".json"))
      f.fail("--profile takes a FILE.json for the Chrome trace (got '" + path + "')");
  }
  /// train::ProfileWindow's options; the window opens on the main process only.
  train::ProfileWindowOptions window(bool main_process) const {
    return {.path = path,
            .steps = steps,
            .warmup = warmup,
            .record_shapes = shapes,
            .enabled = main_process};
  }
};

/// The flags most examples share, in the course's groups (cli::group). Set the example's
/// defaults in the fields, add the groups it has, parse, then check().
struct CommonFlags {
  // Training (hyper-parameters)
  int64_t batch_size = 128;
  int64_t epochs = 1;
  double lr = 0.1;
  uint64_t seed = 0;
  // Test mode
  bool test = false;
  int64_t test_nsteps = 50;
  // Data and DataLoader
  std::string data;
  int64_t num_workers = 0;
  int64_t prefetch_factor = 2;
  bool persistent_workers = false;
  bool pin_memory = false;
  bool non_blocking = false;
  // Device
  std::string device = "cpu";
  int threads = 0;
  // Checkpoint and report
  std::string json, metrics, tensorboard, checkpoint;
  bool resume = false;
  std::string resume_lr_scaling = "keep";
  // Device and precision (--amp, --amp-dtype, --channels-last), Profiler
  PrecisionFlags prec;
  ProfileFlags prof;

  /// --batch-size, --epochs, --lr, --seed (the batch size is per rank).
  void add_training(cli::Flags& f) {
    f.group(cli::group::kTraining);
    f.add("--batch-size", &batch_size, "images per step and rank (global batch = ranks x this)")
        .positive();
    f.add("--epochs", &epochs, "number of epochs to train").positive();
    f.add("--lr", &lr, "learning rate (the peak of the OneCycle schedule)").min(0);
    f.add("--seed", &seed, "seed of the weights, the shuffling and the augmentation");
  }
  /// --test, --test-nsteps.
  void add_test(cli::Flags& f) {
    f.group(cli::group::kTest);
    f.add_switch("--test", &test, "stop after --test-nsteps training steps (a quick check)");
    f.add("--test-nsteps", &test_nsteps, "the number of steps in test mode").positive();
  }
  /// --data DIR (`what` says what the folder holds).
  cli::Flag add_data(cli::Flags& f, const std::string& what) {
    f.group(cli::group::kData);
    return f.add("--data", &data, what).value_name("DIR");
  }
  /// --num-workers, and with `all` --prefetch-factor, --[no-]persistent-workers,
  /// --[no-]pin-memory, --[no-]non-blocking (the course's DataLoader flags).
  void add_loader(cli::Flags& f, bool all = true) {
    f.group(cli::group::kData);
    f.add("--num-workers", &num_workers, "DataLoader worker threads (0: batches built inline)")
        .min(0);
    if (!all) return;
    f.add("--prefetch-factor", &prefetch_factor, "batches in flight per worker").min(1);
    f.add_switch("--persistent-workers", &persistent_workers,
                 "keep the worker threads between epochs (needs --num-workers > 0)", true);
    f.add_switch("--pin-memory", &pin_memory,
                 "build batches in pinned host memory (needs --device cuda)", true);
    f.add_switch("--non-blocking", &non_blocking,
                 "copy batches to the GPU asynchronously (no effect on the CPU)", true);
  }
  /// --device, --threads.
  void add_device(cli::Flags& f) {
    f.group(cli::group::kDevice);
    f.add("--device", &device, "cpu, cuda (one GPU per rank) or cuda:N").value_name("cpu|cuda[:N]");
    f.add("--threads", &threads, "CPU threads (0: DLTRAIN_NUM_THREADS or all cores)").min(0);
  }
  /// --json, and with `metrics` --metrics and --tensorboard.
  void add_report(cli::Flags& f, bool with_metrics = true) {
    f.group(cli::group::kCheckpoint);
    f.add("--json", &json, "write the run's report (figures per epoch, step times) here")
        .value_name("FILE.json");
    if (!with_metrics) return;
    f.add("--metrics", &metrics,
          "log every step's loss and lr and every epoch's figures (CSV, or JSON lines for "
          ".jsonl; tools/dltrain-plot draws it)")
        .value_name("FILE.csv|.jsonl");
    f.add("--tensorboard", &tensorboard, "write TensorBoard event files into this folder")
        .value_name("DIR");
  }
  /// --checkpoint, --resume, and with `lr_scaling` --resume-lr-scaling.
  void add_checkpoint(cli::Flags& f, bool with_lr_scaling = true) {
    f.group(cli::group::kCheckpoint);
    f.add("--checkpoint", &checkpoint,
          "save the full training state here (each epoch end; on SIGUSR1/SIGTERM, then exit 75 "
          "for a requeue)")
        .value_name("FILE.h5");
    f.add_switch("--resume", &resume, "continue from --checkpoint when the file exists");
    if (with_lr_scaling)
      f.add("--resume-lr-scaling", &resume_lr_scaling,
            "learning rate of a run resumed with another global batch")
          .choices({"keep", "linear", "sqrt"});
  }
  /// Checks what concerns several flags (after Flags::parse); exits with status 2 naming the
  /// flag and the fix.
  void check(const cli::Flags& f) const {
    try {
      (void)parse_device(device);
    } catch (const std::exception&) {
      f.fail("--device: '" + device + "' is not a device; pass cpu, cuda or cuda:N");
    }
    const bool gpu = device != "cpu";
    if (gpu && !cuda::is_available())
      f.fail("--device " + device +
             ": no CUDA device is visible (or this build has no CUDA backend); pass --device cpu");
    if (pin_memory && !gpu) f.fail("--pin-memory needs a GPU; drop it or pass --device cuda");
    if (persistent_workers && num_workers == 0)
      f.fail("--persistent-workers needs worker threads; drop it or pass --num-workers N (N > 0)");
    if (resume && checkpoint.empty())
      f.fail("--resume needs --checkpoint FILE (the file to resume from)");
    if (!tensorboard.empty() && !train::tensorboard_available())
      f.fail(
          "--tensorboard needs a build with protobuf (DLTRAIN_WITH_PROTOBUF: install "
          "libprotobuf-dev, protobuf-compiler and libisal-dev, then rebuild); drop it or use "
          "--metrics FILE.csv");
    prec.check(f);
    prof.check(f);
  }
  /// Parses the command line and checks the values (prints the error naming the flag and exits
  /// with status 2 on a bad one).
  void parse(cli::Flags& f, int argc, char** argv) {
    f.parse(argc, argv);
    check(f);
  }
  Device parsed_device() const { return parse_device(device); }
  /// The training DataLoader's options: --batch-size (per rank), --seed and the loader flags,
  /// without shuffling: a DistributedSampler gives each rank its share of one epoch order (the
  /// seed's, also for one process, so that a checkpoint resumes on any number of ranks).
  data::DataLoaderOptions loader_options(bool drop_last) const {
    data::DataLoaderOptions lo;
    lo.batch_size = batch_size;
    lo.shuffle = false;
    lo.drop_last = drop_last;
    lo.seed = seed;
    lo.num_workers = num_workers;
    lo.prefetch_factor = prefetch_factor;
    lo.pin_memory = pin_memory;
    lo.persistent_workers = persistent_workers;
    return lo;
  }
  /// --resume-lr-scaling as train::LRScaling.
  train::LRScaling lr_scaling() const {
    if (resume_lr_scaling == "linear") return train::LRScaling::Linear;
    if (resume_lr_scaling == "sqrt") return train::LRScaling::Sqrt;
    return train::LRScaling::Keep;
  }
};

/// The sinks of `--metrics FILE` (JSON lines when FILE ends in .jsonl, else CSV) and
/// `--tensorboard DIR`; a resumed run appends to the file. Rank 0 writes (MetricsWriter).
inline train::MetricsOptions metrics_options(const std::string& file, const std::string& tb_dir,
                                             bool append) {
  const bool jsonl = file.size() > 6 && file.ends_with(".jsonl");
  return {.csv = jsonl ? "" : file,
          .jsonl = jsonl ? file : "",
          .tensorboard = tb_dir,
          .append = append};
}

/// Where the metrics file is and how to plot it (one line per file).
inline void print_metrics_hint(const std::vector<std::string>& paths) {
  for (const std::string& path : paths)
    if (path.find("tfevents") == std::string::npos)  // not TensorBoard's
      std::printf("plot: tools/dltrain-plot %s\n", path.c_str());
}

}  // namespace dltrain::apps
