// Pipeline: the stage split, the two schedules and the gathered state dict (see the header for
// the protocol). Invariants: between steps no micro-batch is stored (stored_ == 0) and no send
// is in flight; within a step, stage s receives micro-batch j's activation only from s - 1 and
// its gradient only from s + 1, each pair of stages exchanging in micro-batch order, so the
// (source, tag) matching of the group never has two candidates.
#include "dltrain/distributed/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <sstream>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/ops/elementwise.hpp"

namespace dltrain::distributed {

namespace {

using Clock = std::chrono::steady_clock;

// Adds the time from construction to destruction to `acc` (seconds).
struct Timed {
  explicit Timed(double& acc) : acc_(acc), t0_(Clock::now()) {}
  ~Timed() { acc_ += std::chrono::duration<double>(Clock::now() - t0_).count(); }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;
  double& acc_;
  Clock::time_point t0_;
};

constexpr int kMaxDims = 8;
// Tags above the schedules' range: the state-dict gather.
constexpr int kStateTag = 30000;

// [dtype, ndim, dims...]: what the receiver of an activation needs to allocate it.
Tensor header_of(const Tensor& t) {
  DLTRAIN_CHECK(t.dim() <= kMaxDims, "Pipeline: an activation of ", t.dim(),
                " dimensions crosses a stage boundary; at most ", kMaxDims,
                " are supported (reshape it inside the stage)");
  std::vector<int64_t> h(2 + kMaxDims, 0);
  h[0] = static_cast<int64_t>(t.dtype());
  h[1] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d)
    h[static_cast<size_t>(2 + d)] = t.shape()[static_cast<size_t>(d)];
  return from_vector(h, {2 + kMaxDims});
}

// Sends the header then the values (contiguous) of `t`; the Works keep both alive.
void send_with_header(ProcessGroup& g, const Tensor& t, int dst, int tag, std::vector<Work>& out) {
  out.push_back(g.send(header_of(t), dst, tag));
  out.push_back(g.send(t.contiguous(), dst, tag));
}

Tensor recv_with_header(ProcessGroup& g, int src, int tag, Device device) {
  Tensor h = zeros({2 + kMaxDims}, DType::i64);
  g.recv(h, src, tag).wait();
  const auto v = h.to_vector<int64_t>();
  Shape shape(v.begin() + 2, v.begin() + 2 + v[1]);
  Tensor t = empty(shape, TensorOptions(static_cast<DType>(v[0])).with_device(device));
  g.recv(t, src, tag).wait();
  return t;
}

void send_string(ProcessGroup& g, const std::string& s, int dst, int tag, std::vector<Work>& out) {
  std::vector<uint8_t> bytes(s.begin(), s.end());
  send_with_header(g, from_vector(bytes, {static_cast<int64_t>(bytes.size())}), dst, tag, out);
}

std::string recv_string(ProcessGroup& g, int src, int tag) {
  const auto v = recv_with_header(g, src, tag, Device::cpu()).to_vector<uint8_t>();
  return std::string(v.begin(), v.end());
}

}  // namespace

const char* schedule_name(PipelineSchedule s) {
  return s == PipelineSchedule::GPipe ? "gpipe" : "1f1b";
}

PipelineSchedule parse_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::GPipe;
  if (name == "1f1b") return PipelineSchedule::OneFOneB;
  DLTRAIN_FAIL("pipeline schedule '", name, "' is unknown; choose gpipe or 1f1b");
}

// One micro-batch in flight on this stage: its input (a leaf requiring grad on stages > 0, so
// its gradient can be sent back) and its output (the weighted loss on the last stage).
struct Pipeline::MicroBatch {
  Tensor input, output;
};

std::vector<int64_t> Pipeline::balanced_cuts(const nn::Sequential& model, int stages) {
  const int64_t n = model.size();
  DLTRAIN_CHECK(stages >= 1 && n >= stages, "Pipeline: ", n, " modules cannot fill ", stages,
                " stages (each stage needs one at least); use fewer stages or split the model "
                "into more modules");
  std::vector<int64_t> prefix(static_cast<size_t>(n + 1), 0);
  for (int64_t i = 0; i < n; ++i)
    prefix[static_cast<size_t>(i + 1)] =
        prefix[static_cast<size_t>(i)] + model[i]->num_parameters();
  // best[k][i]: the smallest largest stage when modules [0, i) fill k stages; from[k][i] the
  // start of the last of them. O(p n^2): models have tens or hundreds of top-level modules.
  const int64_t inf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(static_cast<size_t>(stages + 1),
                                         std::vector<int64_t>(static_cast<size_t>(n + 1), inf));
  auto from = best;
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k)
    for (int64_t i = k; i <= n; ++i)
      for (int64_t j = k - 1; j < i; ++j) {
        const int64_t prev = best[static_cast<size_t>(k - 1)][static_cast<size_t>(j)];
        if (prev == inf) continue;
        const int64_t cost =
            std::max(prev, prefix[static_cast<size_t>(i)] - prefix[static_cast<size_t>(j)]);
        if (cost < best[static_cast<size_t>(k)][static_cast<size_t>(i)]) {
          best[static_cast<size_t>(k)][static_cast<size_t>(i)] = cost;
          from[static_cast<size_t>(k)][static_cast<size_t>(i)] = j;
        }
      }
  std::vector<int64_t> cuts(static_cast<size_t>(stages - 1));
  int64_t i = n;
  for (int k = stages; k > 1; --k) {
    i = from[static_cast<size_t>(k)][static_cast<size_t>(i)];
    cuts[static_cast<size_t>(k - 2)] = i;
  }
  return cuts;
}

Pipeline::Pipeline(std::shared_ptr<nn::Sequential> model, PipelineOptions options)
    : options_(std::move(options)) {
  DLTRAIN_CHECK(model != nullptr, "Pipeline: the model is null");
  group_ = options_.group ? options_.group : &default_group();
  DLTRAIN_CHECK(
      std::string(group_->backend()) != "nccl" || group_->size() == 1,
      "Pipeline: the nccl group's send/recv share one CUDA stream, where 1F1B's "
      "crossing sends deadlock; pipelines over NCCL are not built yet. Use an MPI group "
      "(distributed::init({.backend = Backend::MPI}) or new_mpi_group), which stages CUDA "
      "tensors through host memory");
  DLTRAIN_CHECK(options_.micro_batches >= 1, "Pipeline: micro_batches = ", options_.micro_batches,
                "; pass 1 or more");
  num_stages_ = group_->size();
  stage_index_ = group_->rank();
  const int64_t n = model->size();
  std::vector<int64_t> cuts = options_.cuts;
  if (cuts.empty() && num_stages_ > 1) cuts = balanced_cuts(*model, num_stages_);
  DLTRAIN_CHECK(static_cast<int>(cuts.size()) == num_stages_ - 1, "Pipeline: ", cuts.size(),
                " cut points for ", num_stages_, " stages; pass ", num_stages_ - 1,
                " (where stages 1.. start), or none to balance by parameter count");
  bounds_.push_back(0);
  for (int64_t c : cuts) {
    DLTRAIN_CHECK(c > bounds_.back() && c < n, "Pipeline: cut points ",
                  shape_str(Shape(cuts.begin(), cuts.end())), " must increase strictly inside (0, ",
                  n, ") for a model of ", n, " modules, so that every stage holds one at least");
    bounds_.push_back(c);
  }
  bounds_.push_back(n);
  stage_ = std::make_shared<nn::Sequential>();
  const auto children = model->named_children();
  for (int64_t i = bounds_[static_cast<size_t>(stage_index_)];
       i < bounds_[static_cast<size_t>(stage_index_ + 1)]; ++i) {
    const auto& c = children[static_cast<size_t>(i)];
    stage_->push_back(c.first, c.second);
  }
  stage_->train(model->is_training());
  const auto params = stage_->parameters();
  if (!params.empty()) device_ = params.front().device();
}

Pipeline::~Pipeline() {
  // A step interrupted by an exception leaves sends in flight: their tensors are kept by the
  // group until they complete, so nothing is freed under MPI.
  for (Work& w : sends_) {
    try {
      w.wait();
    } catch (...) {
    }
  }
}

void Pipeline::forward_one(int j, const PipelineLoss& loss) {
  const bool first = stage_index_ == 0, last = stage_index_ == num_stages_ - 1;
  const int tag = (2 * j) % (group_->max_tag() + 1);
  auto mb = std::make_unique<MicroBatch>();
  if (first) {
    mb->input = inputs_[static_cast<size_t>(j)];
  } else {
    mb->input = recv_with_header(*group_, stage_index_ - 1, tag, device_);
    if (is_floating(mb->input.dtype())) mb->input.requires_grad_(true);
  }
  Timed timed(times_.compute_s);
  Tensor y = (*stage_)(mb->input);
  if (last) {
    Tensor l = loss(y, targets_[static_cast<size_t>(j)]);
    DLTRAIN_CHECK(l.defined() && l.numel() == 1, "Pipeline: the loss returned ",
                  l.defined() ? shape_str(l.shape()) : std::string("an undefined tensor"),
                  " for micro-batch ", j, "; it must return a one-element tensor");
    const double w = weights_[static_cast<size_t>(j)];
    mb->output = w == 1.0 ? l : mul(l, w);
    loss_sum_ += mb->output.detach().to(Device::cpu()).to(DType::f64).item<double>();
  } else {
    send_with_header(*group_, y.detach(), stage_index_ + 1, tag, sends_);
    mb->output = y;
  }
  micro_[static_cast<size_t>(j)] = std::move(mb);
  ++stored_;
  peak_stored_ = std::max(peak_stored_, stored_);
}

void Pipeline::backward_one(int j) {
  const bool first = stage_index_ == 0, last = stage_index_ == num_stages_ - 1;
  const int tag = (2 * j + 1) % (group_->max_tag() + 1);
  std::unique_ptr<MicroBatch> mb = std::move(micro_[static_cast<size_t>(j)]);
  DLTRAIN_CHECK(mb != nullptr, "Pipeline: backward of micro-batch ", j,
                " before its forward (a schedule bug)");
  Tensor g;
  if (!last) {
    g = empty(mb->output.shape(),
              TensorOptions(mb->output.dtype()).with_device(mb->output.device()));
    group_->recv(g, stage_index_ + 1, tag).wait();
  }
  Timed timed(times_.compute_s);
  if (mb->output.requires_grad()) mb->output.backward(g);
  if (!first) {
    Tensor gi = mb->input.requires_grad() ? mb->input.grad() : Tensor();
    // An input the stage's output does not depend on gets a zero gradient.
    if (!gi.defined()) gi = zeros_like(mb->input);
    sends_.push_back(group_->send(gi.contiguous(), stage_index_ - 1, tag));
  }
  --stored_;
}

double Pipeline::forward_backward(const Tensor& input, const Tensor& target,
                                  const PipelineLoss& loss) {
  const bool first = stage_index_ == 0, last = stage_index_ == num_stages_ - 1;
  const int m = options_.micro_batches;
  DLTRAIN_CHECK(stored_ == 0, "Pipeline::forward_backward: ", stored_,
                " micro-batches of an interrupted step are still stored; build a new Pipeline "
                "after an error");
  inputs_.clear();
  targets_.clear();
  weights_.assign(static_cast<size_t>(m), 1.0);
  // Micro-batch j holds rows [j B / m, (j + 1) B / m): sizes differ by one at most.
  auto cut = [m, this](const Tensor& t, const char* what) {
    DLTRAIN_CHECK(t.defined() && t.dim() >= 1, "Pipeline::forward_backward: the ", what,
                  " is undefined or 0-d on stage ", stage_index_,
                  "; this stage needs it (dim 0 = batch)");
    const int64_t b = t.shape()[0];
    DLTRAIN_CHECK(b >= m, "Pipeline::forward_backward: a batch of ", b, " cannot make ", m,
                  " micro-batches; use a batch of ", m, " or more, or fewer micro-batches");
    std::vector<Tensor> out;
    for (int j = 0; j < m; ++j) {
      const int64_t s = j * b / m, e = (j + 1) * b / m;
      out.push_back(t.narrow(0, s, e - s));
    }
    return out;
  };
  if (first) inputs_ = cut(input, "input");
  if (last) {
    targets_ = cut(target, "target");
    const double b = static_cast<double>(target.shape()[0]);
    if (options_.mean_loss)
      for (int j = 0; j < m; ++j)
        weights_[static_cast<size_t>(j)] =
            static_cast<double>(targets_[static_cast<size_t>(j)].shape()[0]) / b;
  }
  micro_.clear();
  micro_.resize(static_cast<size_t>(m));
  loss_sum_ = 0.0;
  times_ = StepTimes{};
  const auto start = Clock::now();
  if (options_.schedule == PipelineSchedule::GPipe) {
    for (int j = 0; j < m; ++j) forward_one(j, loss);
    for (int j = 0; j < m; ++j) backward_one(j);
  } else {
    const int warmup = std::min(num_stages_ - stage_index_ - 1, m);
    for (int j = 0; j < warmup; ++j) forward_one(j, loss);
    for (int j = 0; j < m - warmup; ++j) {
      forward_one(warmup + j, loss);
      backward_one(j);
    }
    for (int j = m - warmup; j < m; ++j) backward_one(j);
  }
  for (Work& w : sends_) w.wait();
  sends_.clear();
  inputs_.clear();
  targets_.clear();
  // The loss, from the last stage to every stage.
  double result = loss_sum_;
  if (num_stages_ > 1) {
    Tensor l = full({1}, last ? loss_sum_ : 0.0, DType::f64);
    group_->broadcast(l, num_stages_ - 1).wait();
    result = l.item<double>();
  }
  times_.step_s = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

StateDict Pipeline::full_state_dict(int root) {
  DLTRAIN_CHECK(root >= 0 && root < num_stages_, "Pipeline::full_state_dict: root ", root,
                " is not a rank of the pipeline group of ", num_stages_);
  const StateDict mine = stage_->state_dict();
  StateDict out;
  if (stage_index_ != root) {
    std::vector<Work> sends;
    sends.push_back(
        group_->send(full({1}, static_cast<double>(mine.size()), DType::i64), root, kStateTag));
    for (const auto& [name, t] : mine) {
      send_string(*group_, name, root, kStateTag, sends);
      send_with_header(*group_, t.to(Device::cpu()), root, kStateTag, sends);
    }
    for (Work& w : sends) w.wait();
    return out;
  }
  for (int s = 0; s < num_stages_; ++s) {
    if (s == root) {
      for (const auto& [name, t] : mine) out.insert(name, t.detach().to(Device::cpu()).clone());
      continue;
    }
    Tensor count = zeros({1}, DType::i64);
    group_->recv(count, s, kStateTag).wait();
    for (int64_t i = 0; i < count.item<int64_t>(); ++i) {
      const std::string name = recv_string(*group_, s, kStateTag);
      out.insert(name, recv_with_header(*group_, s, kStateTag, Device::cpu()));
    }
  }
  // Stages in model order whatever the root: the keys come out as the full model's.
  return out;
}

void Pipeline::load_full_state_dict(const StateDict& state) {
  StateDict mine;
  for (const std::string& k : stage_->state_dict().keys()) {
    DLTRAIN_CHECK(state.contains(k), "Pipeline::load_full_state_dict: stage ", stage_index_,
                  " needs '", k, "', which the state dict lacks; pass the full model's state dict");
    mine.insert(k, state.at(k));
  }
  stage_->load_state_dict(mine, /*strict=*/true);
}

}  // namespace dltrain::distributed
