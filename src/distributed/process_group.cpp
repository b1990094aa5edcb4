// Work handles, the local (world of one) group, and init(): the process-wide distributed
// state. init() is the one place that knows the order of start-up: detect the launch, start
// MPI if the job needs it, check that the ranks agree with each other, choose the device and
// the thread count, then build the default group. Every cross-rank check is symmetric (all
// ranks see the same gathered data and throw together), so a bad launch fails on every rank
// instead of leaving some of them waiting in a collective.
#include <unistd.h>

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iomanip>
#include <set>
#include <sstream>

#include "dltrain/autograd/node.hpp"
#include "dltrain/backend/cuda.hpp"
#include "dltrain/core/parallel.hpp"
#include "src/core/layout.hpp"
#include "src/distributed/internal.hpp"

namespace dltrain::distributed {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

// --- Work --------------------------------------------------------------------------------

void Work::State::complete(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lk(mu);
    error = std::move(e);
    done.store(true, std::memory_order_release);
  }
  cv.notify_all();
}

void Work::State::wait() {
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return done.load(std::memory_order_acquire); });
  if (error) std::rethrow_exception(error);
  if (on_wait && !on_wait_ran) {
    on_wait_ran = true;
    on_wait();
  }
}

void Work::wait() const {
  if (s_) s_->wait();
}

bool Work::is_completed() const { return !s_ || s_->completed(); }

// --- defaults for groups without point-to-point or splitting --------------------------------

Work ProcessGroup::send(const Tensor&, int, int) {
  DLTRAIN_FAIL("send: the ", backend(),
               " process group has no point-to-point transfers; use an mpi or nccl group");
}
Work ProcessGroup::recv(const Tensor&, int, int) {
  DLTRAIN_FAIL("recv: the ", backend(),
               " process group has no point-to-point transfers; use an mpi or nccl group");
}
std::shared_ptr<ProcessGroup> ProcessGroup::split(int, int) {
  DLTRAIN_FAIL("split: the ", backend(),
               " process group cannot be split; use an mpi, nccl or local group");
}

// --- checks and messages -----------------------------------------------------------------

namespace detail {

std::string describe_collective(const char* name, const Tensor& t, const char* extra) {
  std::ostringstream os;
  os << name;
  if (extra) os << "(" << extra << ")";
  const double bytes = static_cast<double>(t.numel()) * static_cast<double>(t.element_size());
  os << " of " << t.numel() << " " << dtype_name(t.dtype()) << " elements (";
  // Three significant digits ("3.91 KiB", "97.5 MiB"), bytes below 1 KiB.
  os << std::setprecision(3);
  if (bytes >= 1 << 30)
    os << bytes / (1 << 30) << " GiB";
  else if (bytes >= 1 << 20)
    os << bytes / (1 << 20) << " MiB";
  else if (bytes >= 1024)
    os << bytes / 1024 << " KiB";
  else
    os << bytes << " bytes";
  os << ", shape " << shape_str(t.shape()) << ", on " << t.device().str() << ")";
  return os.str();
}

std::string seconds_str(double s) {
  std::ostringstream os;
  os << s << " s";
  return os.str();
}

void check_reduce_op(const char* op, ReduceOp r, DType dt) {
  DLTRAIN_CHECK(r != ReduceOp::Avg || is_floating(dt), op, "(avg) of a ", dt,
                " tensor: averaging needs a floating dtype; use Sum and divide");
}

void check_gather_pair(const char* op, const Tensor& big, const Tensor& small, int group_size) {
  DLTRAIN_CHECK(big.dtype() == small.dtype() && big.device() == small.device(), op,
                ": input and output must have the same dtype and device, got ", big.dtype(), " on ",
                big.device().str(), " and ", small.dtype(), " on ", small.device().str());
  DLTRAIN_CHECK(big.numel() == small.numel() * group_size, op, ": expected size() * ",
                small.numel(), " = ", small.numel() * group_size,
                " elements (all_gather's "
                "output, reduce_scatter's input), got ",
                big.numel());
}

void check_collective_tensor(const char* op, const Tensor& t, bool contiguous_only) {
  DLTRAIN_CHECK(t.defined(), op, ": the tensor is undefined");
  const bool dense = t.is_contiguous() || (!contiguous_only && dltrain::detail::is_dense(t));
  DLTRAIN_CHECK(dense, op, ": the tensor of shape ", shape_str(t.shape()), " with strides ",
                shape_str(t.strides()), " is not ",
                contiguous_only ? "contiguous"
                                : "dense (no gaps or overlaps, e.g. contiguous or channels-last)",
                "; pass t.contiguous() and copy the result back");
}

void check_p2p(const char* op, const Tensor& t, int peer, const char* peer_name, int tag,
               const ProcessGroup& g) {
  check_collective_tensor(op, t, false);
  DLTRAIN_CHECK(g.size() > 1, op, "(", peer_name, " = ", peer, "): this ", g.backend(),
                " group has one rank, so there is no peer to exchange with; run the job on "
                "several ranks (mpirun -np 2 or more) or skip point-to-point in a world of one");
  DLTRAIN_CHECK(peer >= 0 && peer < g.size(), op, ": ", peer_name, " = ", peer,
                " is not a rank of this ", g.backend(), " group of ", g.size(),
                "; pass a rank in [0, ", g.size(),
                ") of this group (a sub-group numbers its ranks from 0)");
  DLTRAIN_CHECK(peer != g.rank(), op, ": ", peer_name, " = ", peer,
                " is this rank itself; copy the tensor instead (t.copy_(u)) or pick another rank");
  DLTRAIN_CHECK(tag >= 0 && tag <= g.max_tag(), op, ": tag ", tag, " is outside [0, ", g.max_tag(),
                "] (the largest tag this ", g.backend(),
                " library accepts); number messages modulo ", g.max_tag() + 1);
}

std::string describe_p2p(const char* op, const Tensor& t, int peer, int tag) {
  std::ostringstream os;
  os << describe_collective(op, t) << (std::string(op) == "send" ? " to" : " from") << " rank "
     << peer << " (tag " << tag << ")";
  return os.str();
}

// "dltrain: rank R of N (host): message" on stderr, after whatever stdout holds.
static void print_for_rank(const std::string& message) {
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  std::fflush(stdout);
  std::fprintf(stderr, "dltrain: rank %d of %d (%s): %s\n", rank(), world_size(), host,
               message.c_str());
  std::fflush(stderr);
}

void print_fatal_once(const std::string& message) {
  static std::atomic<bool> printed{false};
  if (printed.exchange(true)) return;
  print_for_rank(message);
}

bool DeferredError::set(const std::string& message) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (set_) return false;
    set_ = true;
    message_ = message;
  }
  print_for_rank(message);
  return true;
}

bool DeferredError::is_set() const {
  std::lock_guard<std::mutex> lk(mu_);
  return set_;
}

void DeferredError::throw_if_set(const std::string& op) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (set_) DLTRAIN_FAIL(op, ": ", message_);
}

std::string broadcast_string(ProcessGroup& g, const std::string& s) {
  const TensorOptions i64 = TensorOptions(DType::i64).with_device(g.tensor_device());
  Tensor len = full({1}, static_cast<double>(s.size()), i64);
  g.broadcast(len, 0).wait();
  const int64_t n = len.item<int64_t>();
  std::vector<uint8_t> bytes(s.begin(), s.end());
  bytes.resize(static_cast<size_t>(n));
  Tensor t = from_vector(bytes, {n}).to(g.tensor_device());
  if (n > 0) g.broadcast(t, 0).wait();
  auto v = t.to_vector<uint8_t>();
  return std::string(v.begin(), v.end());
}

int rank_thread_share(int mask_cpus, int ranks_sharing, int usable) {
  // SLURM_CPUS_PER_TASK (in `usable`) is already one task's share: dividing it again by the
  // ranks that share an unbound mask would leave half the CPUs of two tasks idle.
  return std::max(1, std::min(usable, mask_cpus / std::max(1, ranks_sharing)));
}

}  // namespace detail

// --- the local group -----------------------------------------------------------------------

namespace {

class LocalProcessGroup final : public ProcessGroup {
 public:
  explicit LocalProcessGroup(std::chrono::milliseconds timeout) : ProcessGroup(0, 1, timeout) {}
  const char* backend() const override { return "local"; }
  Work all_reduce(const Tensor& t, ReduceOp op) override {
    detail::check_collective_tensor("all_reduce", t, false);
    detail::check_reduce_op("all_reduce", op, t.dtype());
    return Work();
  }
  Work broadcast(const Tensor& t, int root) override {
    detail::check_collective_tensor("broadcast", t, false);
    DLTRAIN_CHECK(root == 0, "broadcast: root ", root, " is not a rank of this group of 1");
    return Work();
  }
  Work all_gather(const Tensor& output, const Tensor& input) override {
    return copy("all_gather", output, input);
  }
  Work reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override {
    detail::check_reduce_op("reduce_scatter", op, input.dtype());
    return copy("reduce_scatter", output, input);
  }
  Work barrier() override { return Work(); }
  Work send(const Tensor& t, int dst, int tag) override {
    detail::check_p2p("send", t, dst, "dst", tag, *this);
    return Work();  // unreachable: a group of one has no other rank
  }
  Work recv(const Tensor& t, int src, int tag) override {
    detail::check_p2p("recv", t, src, "src", tag, *this);
    return Work();
  }
  std::shared_ptr<ProcessGroup> split(int color, int /*key*/) override {
    if (color < 0) return nullptr;
    return std::make_shared<LocalProcessGroup>(timeout());
  }

 private:
  Work copy(const char* op, const Tensor& output, const Tensor& input) {
    detail::check_collective_tensor(op, input, true);
    detail::check_collective_tensor(op, output, true);
    detail::check_gather_pair(op, output, input, 1);
    Tensor o = output;
    NoGradGuard ng;
    o.copy_(input.reshape(output.shape()));
    return Work();
  }
};

// --- process-wide state ----------------------------------------------------------------------

struct World {
  Environment env;
  std::shared_ptr<ProcessGroup> group;
  Device device = Device::cpu();
  bool mpi = false;
  bool finalized = false;
};

World*& world_ptr() {
  static World* w = nullptr;
  return w;
}

std::string cpu_list() {
  cpu_set_t set;
  std::string s;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return s;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) s += std::to_string(c) + ",";
  return s;
}

std::set<std::string> split_list(const std::string& s) {
  std::set<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.insert(item);
  return out;
}

void on_terminate() {
  std::string msg = "terminate called without an exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      msg = std::string("uncaught exception: ") + x.what();
    } catch (...) {
      msg = "uncaught exception of a non-standard type";
    }
  }
  detail::print_fatal_once(msg + " (aborting the job so that no other rank waits for this one)");
  detail::mpi_abort(1);
}

void finalize_at_exit() {
  try {
    finalize();
  } catch (const std::exception& e) {
    detail::print_fatal_once(std::string("finalize at exit failed: ") + e.what());
    detail::mpi_abort(1);
  }
}

// Threads for this rank: its CPUs shared among the ranks on the node whose CPUs overlap its
// own (unbound ranks on one node all see every CPU), capped by SLURM_CPUS_PER_TASK.
int thread_share(const World& w) {
  const int cpus = usable_cpus();
  if (w.env.world_size == 1) return cpus;
  const std::string mine = cpu_list();
  const auto my_set = split_list(mine);
  const int mask = my_set.empty() ? cpus : static_cast<int>(my_set.size());
  if (w.mpi) {
    const auto all = detail::mpi_node_allgather_strings(mine);
    int sharing = 0;
    for (const auto& other : all) {
      bool overlap = false;
      for (const auto& c : split_list(other)) overlap = overlap || my_set.count(c) > 0;
      sharing += overlap ? 1 : 0;
    }
    return detail::rank_thread_share(mask, sharing, cpus);
  }
  return detail::rank_thread_share(mask, w.env.local_world_size, cpus);
}

// Fails on every rank when two ranks of a node chose the same GPU.
void check_gpu_binding(const World& w, int dev) {
  // Every rank takes part (the gather is collective), CPU ranks with device -1 included.
  if (!w.mpi) return;
  const char* vis = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string mine = std::string(vis ? vis : "*") + "#" + std::to_string(dev);
  const auto all = detail::mpi_node_allgather_strings(mine);
  for (size_t a = 0; a < all.size(); ++a)
    for (size_t b = a + 1; b < all.size(); ++b)
      DLTRAIN_CHECK(all[a] != all[b] || all[a].ends_with("#-1"),
                    "distributed::init: node-local ranks ", a, " and ", b, " would both use GPU ",
                    dev, " (CUDA_VISIBLE_DEVICES='", vis ? vis : "",
                    "'): start one task per GPU (srun --ntasks-per-node=<GPUs per node> "
                    "--gpus-per-task=1, or mpirun -npernode <GPUs per node>)");
}

std::shared_ptr<ProcessGroup> make_group(World& w, const InitOptions& o,
                                         std::chrono::milliseconds timeout) {
  Backend b = o.backend;
  if (b == Backend::Auto) {
    if (w.device.is_cuda() && nccl_available() && w.env.world_size > 1)
      b = Backend::NCCL;
    else
      b = w.env.world_size > 1 ? Backend::MPI : Backend::Local;
  }
  switch (b) {
    case Backend::Local:
      DLTRAIN_CHECK(w.env.world_size == 1,
                    "distributed::init: the local backend is a world of "
                    "one, but the launch has ",
                    w.env.world_size, " ranks");
      return new_local_group(timeout);
    case Backend::MPI:
      DLTRAIN_CHECK(w.env.launcher != Launcher::TorchRun || w.env.world_size == 1,
                    "distributed::init: ", w.env.describe(),
                    ": torchrun-style variables bootstrap only the NCCL backend (GPU ranks, over "
                    "MASTER_ADDR:MASTER_PORT), and this rank trains on the CPU",
                    o.use_gpu ? " (no GPU visible)"
                              : " (the program asked for the CPU: InitOptions::use_gpu is off)",
                    ". CPU ranks reduce over MPI: launch with mpirun -np ", w.env.world_size,
                    " or srun --mpi=pmix, without RANK/WORLD_SIZE");
      DLTRAIN_CHECK(w.mpi || w.env.world_size == 1,
                    "distributed::init: the MPI backend needs a launch by mpirun or srun; this "
                    "one is ",
                    w.env.describe());
      if (!w.mpi) return new_local_group(timeout);
      return new_mpi_group(timeout);
    case Backend::NCCL: {
      DLTRAIN_CHECK(w.device.is_cuda(),
                    "distributed::init: the NCCL backend needs a GPU, and "
                    "this rank has none visible");
      std::function<std::string(const std::string&)> boot;
      if (w.mpi) {
        boot = [](const std::string& bytes) { return detail::mpi_broadcast_bytes(bytes); };
      } else {
        DLTRAIN_CHECK(
            (!w.env.master_addr.empty() && w.env.master_port > 0) || w.env.world_size == 1,
            "distributed::init: NCCL without MPI bootstraps over TCP and needs "
            "MASTER_ADDR and MASTER_PORT (rank 0's host and a free port)");
        Environment env = w.env;
        boot = [env, timeout](const std::string& bytes) {
          if (env.world_size == 1) return bytes;
          return tcp_broadcast_bytes(env.master_addr, env.master_port, env.rank, env.world_size,
                                     bytes, timeout);
        };
      }
      return new_nccl_group(w.env.rank, w.env.world_size, w.device.index, timeout, boot);
    }
    case Backend::Auto:
      break;
  }
  DLTRAIN_FAIL("distributed::init: unknown backend");
}

}  // namespace

std::shared_ptr<ProcessGroup> new_local_group(std::chrono::milliseconds timeout) {
  return std::make_shared<LocalProcessGroup>(timeout);
}

std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks, ProcessGroup* parent) {
  ProcessGroup& g = parent ? *parent : default_group();
  // Agreement first (an FNV-1a hash of the list, its max and min over the ranks), so that a
  // list that differs between ranks fails on every rank instead of leaving some in the split;
  // the checks below then see the same list everywhere and fail together too.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  };
  mix(ranks.size());
  for (int r : ranks) mix(static_cast<uint64_t>(static_cast<uint32_t>(r)));
  const auto mine = static_cast<int64_t>(h >> 1);  // 63 bits: negation cannot overflow
  if (g.size() > 1) {
    Tensor t = from_vector(std::vector<int64_t>{mine, -mine}, {2}).to(g.tensor_device());
    g.all_reduce(t, ReduceOp::Max).wait();
    const auto v = t.to(Device::cpu()).to_vector<int64_t>();
    DLTRAIN_CHECK(v[0] == mine && -v[1] == mine,
                  "new_group: the ranks passed differ between the ranks of the group (this rank "
                  "passed ",
                  shape_str(std::vector<int64_t>(ranks.begin(), ranks.end())),
                  "); every rank must call new_group with the same list, in the same order");
  }
  DLTRAIN_CHECK(!ranks.empty(), "new_group: the list of ranks is empty; pass at least one rank");
  std::vector<char> seen(static_cast<size_t>(g.size()), 0);
  int index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    DLTRAIN_CHECK(r >= 0 && r < g.size(), "new_group: rank ", r,
                  " is not a rank of the parent group of ", g.size(), "; pass ranks in [0, ",
                  g.size(), ")");
    DLTRAIN_CHECK(!seen[static_cast<size_t>(r)], "new_group: rank ", r,
                  " appears twice in the list; list each rank once");
    seen[static_cast<size_t>(r)] = 1;
    if (r == g.rank()) index = static_cast<int>(i);
  }
  return g.split(index >= 0 ? 0 : -1, index);
}

std::chrono::milliseconds default_timeout() {
  if (const char* v = std::getenv("DLTRAIN_COLLECTIVE_TIMEOUT")) {
    char* end = nullptr;
    double s = std::strtod(v, &end);
    DLTRAIN_CHECK(end != v && *end == '\0' && s > 0, "DLTRAIN_COLLECTIVE_TIMEOUT='", v,
                  "' is not a positive number of seconds; set it to e.g. 600, or unset it");
    return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0));
  }
  return std::chrono::minutes(10);
}

ProcessGroup& init(const InitOptions& options) {
  if (World* w = world_ptr()) {
    DLTRAIN_CHECK(!w->finalized, "distributed::init after finalize(): MPI cannot restart");
    return *w->group;
  }
  auto w = std::make_unique<World>();
  w->env = detect_environment();
  const auto timeout = options.timeout.count() > 0 ? options.timeout : default_timeout();
  // Before MPI: a lone process would otherwise fail on MPI's "rank 0 of 1", which blames srun.
  if (w->env.slurm_job_script && w->env.world_size > 1) {
    const int n = w->env.world_size;
    DLTRAIN_FAIL("distributed::init: ", w->env.describe(), ": the job asks for ", n,
                 " tasks, but this process was not started by srun (SLURM_STEP_ID is not set), "
                 "so ",
                 n == 2 ? std::string("rank 1 does not exist")
                        : "ranks 1 to " + std::to_string(n - 1) + " do not exist",
                 ". Start the program with srun in the job script (srun --mpi=pmix ./program "
                 "...), or request --ntasks=1 to run one process");
  }
  const bool wants_mpi = (w->env.world_size > 1 || w->env.sizes_from_mpi) &&
                         w->env.launcher != Launcher::TorchRun && options.backend != Backend::Local;
  if (wants_mpi) {
    DLTRAIN_CHECK(detail::mpi_compiled() || options.backend == Backend::NCCL,
                  "distributed::init: ", w->env.describe(),
                  ", but this dltrain was built without MPI; install an MPI (Debian: "
                  "libopenmpi-dev openmpi-bin) and reconfigure, or run a single process");
    if (detail::mpi_compiled()) {
      detail::mpi_init();
      w->mpi = true;
      const int mr = detail::mpi_world_rank(), ms = detail::mpi_world_size();
      if (w->env.sizes_from_mpi) {
        w->env.world_size = ms;
        w->env.local_rank = detail::mpi_node_rank();
        w->env.local_world_size = detail::mpi_node_size();
        w->env.sizes_from_mpi = false;
      }
      if (w->env.node_from_mpi) {
        detail::mpi_node_index(w->env.node_id, w->env.num_nodes);
        w->env.node_from_mpi = false;
      }
      DLTRAIN_CHECK(ms == w->env.world_size && mr == w->env.rank,
                    "distributed::init: ", w->env.describe(), ", but MPI sees rank ", mr, " of ",
                    ms,
                    ". Under Slurm, srun must start MPI programs with its PMI plugin (srun "
                    "--mpi=pmix, or pmi2); otherwise launch with mpirun");
    }
  }
  world_ptr() = w.get();  // rank()/world_size() in messages from here on

  const int gpus = options.use_gpu ? cuda::device_count() : 0;
  try {
    const int dev = select_gpu(w->env, gpus);
    check_gpu_binding(*w, dev);
    if (dev >= 0) {
      cuda::set_device(dev);
      w->device = Device::cuda(dev);
    }
    if (options.set_threads && !num_threads_set_explicitly()) set_num_threads(thread_share(*w));
    w->group = make_group(*w, options, timeout);
  } catch (...) {
    world_ptr() = nullptr;
    throw;
  }
  if (w->env.world_size > 1) {
    std::set_terminate(on_terminate);
    std::atexit(finalize_at_exit);
  }
  if (options.verbose) {
    std::printf("dltrain: %s; backend %s, device %s, %d threads\n", w->env.describe().c_str(),
                w->group->backend(), w->device.str().c_str(), get_num_threads());
    std::fflush(stdout);
  }
  return *w.release()->group;
}

bool is_initialized() { return world_ptr() != nullptr; }

ProcessGroup& default_group() {
  World* w = world_ptr();
  DLTRAIN_CHECK(w && w->group,
                "distributed: no default process group; call "
                "distributed::init() first");
  return *w->group;
}

const Environment& environment() {
  static const Environment single;
  World* w = world_ptr();
  return w ? w->env : single;
}

int rank() { return environment().rank; }
int world_size() { return environment().world_size; }
int local_rank() { return environment().local_rank; }
int local_world_size() { return environment().local_world_size; }
int node_id() { return environment().node_id; }
bool is_main_process() { return rank() == 0; }
Device device() {
  World* w = world_ptr();
  return w ? w->device : Device::cpu();
}

void barrier() {
  if (world_size() == 1) return;
  default_group().barrier().wait();
}

void abort(const std::string& message, int code) {
  detail::print_fatal_once(message);
  detail::mpi_abort(code);
}

void finalize() {
  World* w = world_ptr();
  if (!w || w->finalized) return;
  if (w->env.world_size > 1 && w->group) w->group->barrier().wait();
  w->group.reset();  // joins the communication thread, frees communicators
  w->finalized = true;
  if (w->mpi) detail::mpi_finalize();
}

void on_main_process(const std::function<void()>& fn) {
  if (!is_initialized() || world_size() == 1) {
    fn();
    return;
  }
  ProcessGroup& g = default_group();
  std::exception_ptr failure;
  std::string message;
  if (g.rank() == 0) {
    try {
      fn();
    } catch (const std::exception& e) {
      failure = std::current_exception();
      message = e.what();
    } catch (...) {
      failure = std::current_exception();
      message = "an exception of a non-standard type";
    }
  }
  // Rank 0's outcome reaches every rank ("" for success; a failure starts with '!' so that
  // an exception with an empty message still counts); the broadcast also holds the other
  // ranks until rank 0 is done.
  const std::string outcome = detail::broadcast_string(g, failure ? "!" + message : "");
  if (!outcome.empty()) {
    if (failure) std::rethrow_exception(failure);
    DLTRAIN_FAIL("distributed::on_main_process: rank 0 failed: ", outcome.substr(1));
  }
}

double all_reduce_value(double value, ReduceOp op) {
  if (world_size() == 1) return value;
  ProcessGroup& g = default_group();
  Tensor t = full({1}, value, TensorOptions(DType::f64).with_device(g.tensor_device()));
  g.all_reduce(t, op).wait();
  return t.item<double>();
}

}  // namespace dltrain::distributed
