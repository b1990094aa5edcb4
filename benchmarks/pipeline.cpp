// Pipeline parallelism on CPU ranks: the measured bubble fraction against the theory
// (p - 1) / (m + p - 1) for p stages and m micro-batches, and the throughput of the pipeline
// against one process running the whole model. Run under mpirun, one thread per rank (issue 31):
//
//   DLTRAIN_NUM_THREADS=1 mpirun -np 2 pipeline [--width 512] [--blocks 8] [--batch 256]
//                        [--micro-batches 1,4,16] [--schedule 1f1b|gpipe] [--rounds 5]
//                        [--json PATH]
//
// The model is --blocks blocks of Linear(width, width) + ReLU in f32, cut evenly by parameter
// count, trained with an MSE loss (forward_backward only: the optimizer step is the same in both
// and outside the pipeline). Per m: one untimed step, then --rounds steps, each after a barrier.
// A stage's bubble is 1 - compute / step (Pipeline::last_step_times: the time its forward, loss
// and backward ran, over the step's wall time on the slowest rank); the table gives the median
// over rounds of the mean over stages. The theory assumes equal stages and free communication;
// the measure includes whatever the stages' imbalance, the transfers and the small
// micro-batches' lower GEMM efficiency cost. The single-process baseline runs the whole model on
// the full batch on rank 0 while the other ranks wait in a recv (50 us polls, not a spinning
// barrier). Ranks must not outnumber the cores: more ranks than cores measures the scheduler, not
// the pipeline.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "apps/common/cli.hpp"
#include "dltrain/dltrain.hpp"

using namespace dltrain;
using Clock = std::chrono::steady_clock;

namespace {

std::shared_ptr<nn::Sequential> make_model(int64_t width, int64_t blocks) {
  manual_seed(0);
  auto m = std::make_shared<nn::Sequential>();
  for (int64_t i = 0; i < blocks; ++i)
    m->push_back(
        nn::sequential({std::make_shared<nn::Linear>(width, width), std::make_shared<nn::ReLU>()}));
  return m;
}

struct Row {
  int64_t micro_batches = 0;
  double theory = 0, bubble = 0, step_ms = 0, samples_per_s = 0;
  // The stages' compute per step (the fastest and the slowest stage): their gap is idle time
  // the theory, which assumes equal stages, does not count.
  double compute_min_ms = 0, compute_max_ms = 0;
};

Tensor mse(const Tensor& out, const Tensor& target) { return mse_loss(out, target); }

}  // namespace

int main(int argc, char** argv) {
  int64_t width = 512, blocks = 8, batch = 256, rounds = 5;
  std::vector<int64_t> micro = {1, 4, 16};
  std::string json, schedule = "1f1b";
  cli::Flags flags("pipeline",
                   "Measured bubble fraction of a pipeline of CPU ranks against (p-1)/(m+p-1), "
                   "and its throughput against one process, as a table and JSON.");
  flags.group(cli::group::kBenchmark);
  flags.add("--width", &width, "features of each Linear layer").positive();
  flags.add("--blocks", &blocks, "Linear + ReLU blocks").positive();
  flags.add("--batch", &batch, "rows per step").positive();
  flags.add("--micro-batches", &micro, "comma-separated micro-batch counts");
  flags.add("--schedule", &schedule, "1f1b or gpipe");
  flags.add("--rounds", &rounds, "timed steps per micro-batch count").positive();
  flags.group(cli::group::kCheckpoint);
  flags.add("--json", &json, "write the figures here (rank 0)").value_name("FILE.json");
  flags.parse(argc, argv);
  try {
    distributed::ProcessGroup& g = distributed::init();
    const int p = g.size();
    const auto sched = distributed::parse_schedule(schedule);
    Tensor x = randn({batch, width}), y = randn({batch, width});

    // One process, the whole model, the full batch (rank 0; the others wait for its word).
    double single_ms = 0;
    {
      Tensor done = zeros({1});
      if (g.rank() == 0) {
        auto model = make_model(width, blocks);
        std::vector<double> ms;
        for (int64_t r = 0; r <= rounds; ++r) {
          const auto t0 = Clock::now();
          model->zero_grad();
          mse_loss((*model)(x), y).backward();
          const double t = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
          if (r > 0) ms.push_back(t);
        }
        single_ms = train::compute_stats(ms).median;
        done.fill_(single_ms);
        std::vector<distributed::Work> sends;
        for (int r = 1; r < p; ++r) sends.push_back(g.send(done, r, 0));
        for (distributed::Work& w : sends) w.wait();
      } else {
        g.recv(done, 0, 0).wait();
        single_ms = done.item<double>();
      }
    }

    std::vector<Row> rows;
    for (int64_t m : micro) {
      distributed::Pipeline pipe(make_model(width, blocks),
                                 {.micro_batches = static_cast<int>(m), .schedule = sched});
      std::vector<double> bubbles, steps, cmin, cmax;
      for (int64_t r = 0; r <= rounds; ++r) {
        pipe.stage_module().zero_grad();
        g.barrier().wait();
        pipe.forward_backward(x, y, mse);
        if (r == 0) continue;  // untimed
        // The step is the slowest rank's wall time (the last stage may finish first: its final
        // gradient send completes before stage 0's last backward); each stage's bubble is its
        // idle share of that step.
        const auto& t = pipe.last_step_times();
        const double step = distributed::all_reduce_value(t.step_s, distributed::ReduceOp::Max);
        steps.push_back(step * 1000.0);
        bubbles.push_back(
            distributed::all_reduce_value(1.0 - t.compute_s / step, distributed::ReduceOp::Avg));
        cmin.push_back(1000.0 *
                       distributed::all_reduce_value(t.compute_s, distributed::ReduceOp::Min));
        cmax.push_back(1000.0 *
                       distributed::all_reduce_value(t.compute_s, distributed::ReduceOp::Max));
      }
      Row row;
      row.micro_batches = m;
      row.theory = static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
      row.bubble = train::compute_stats(bubbles).median;
      row.step_ms = train::compute_stats(steps).median;
      row.samples_per_s = static_cast<double>(batch) / (row.step_ms / 1000.0);
      row.compute_min_ms = train::compute_stats(cmin).median;
      row.compute_max_ms = train::compute_stats(cmax).median;
      rows.push_back(row);
    }

    if (g.rank() == 0) {
      const double single_sps = static_cast<double>(batch) / (single_ms / 1000.0);
      std::printf(
          "pipeline: %lld x (Linear(%lld, %lld) + ReLU) f32, batch %lld, %s, %d stages (%s), %d "
          "thread(s) per rank; forward+backward per step, median of %lld rounds\n",
          static_cast<long long>(blocks), static_cast<long long>(width),
          static_cast<long long>(width), static_cast<long long>(batch), schedule.c_str(), p,
          g.backend(), get_num_threads(), static_cast<long long>(rounds));
      std::printf("  one process, whole model: %.1f ms/step, %.0f samples/s\n", single_ms,
                  single_sps);
      std::printf("  %6s %10s %10s %10s %10s %17s %12s %10s\n", "m", "theory", "measured",
                  "diff pts", "step ms", "stage compute ms", "samples/s", "x 1 proc");
      for (const Row& r : rows)
        std::printf("  %6lld %10.3f %10.3f %10.1f %10.1f %8.1f-%-8.1f %12.0f %10.2f\n",
                    static_cast<long long>(r.micro_batches), r.theory, r.bubble,
                    100.0 * (r.bubble - r.theory), r.step_ms, r.compute_min_ms, r.compute_max_ms,
                    r.samples_per_s, r.samples_per_s / single_sps);
      if (!json.empty()) {
        std::ofstream f(json);
        f << "{\"benchmark\": \"pipeline\", \"schedule\": \"" << schedule << "\", \"stages\": " << p
          << ", \"width\": " << width << ", \"blocks\": " << blocks << ", \"batch\": " << batch
          << ", \"threads_per_rank\": " << get_num_threads()
          << ", \"single_process_ms\": " << single_ms << ", \"rows\": [";
        for (size_t i = 0; i < rows.size(); ++i)
          f << (i ? ", " : "") << "{\"micro_batches\": " << rows[i].micro_batches
            << ", \"bubble_theory\": " << rows[i].theory
            << ", \"bubble_measured\": " << rows[i].bubble << ", \"step_ms\": " << rows[i].step_ms
            << ", \"stage_compute_ms_min\": " << rows[i].compute_min_ms
            << ", \"stage_compute_ms_max\": " << rows[i].compute_max_ms
            << ", \"samples_per_s\": " << rows[i].samples_per_s
            << ", \"speedup_vs_one_process\": " << rows[i].samples_per_s / single_sps << "}";
        f << "]}\n";
        std::printf("wrote %s\n", json.c_str());
      }
    }
  } catch (const std::exception& e) {
    distributed::abort(std::string("pipeline: ") + e.what());
  }
  return 0;
}
