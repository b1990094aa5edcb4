// The MPI process group and the MPI runtime (built when MPI is found).
//
// Every collective of a group runs on the group's one communication thread, in the order
// the callers issued them, so all ranks issue MPI calls in the same order and the caller's
// thread never blocks in MPI (that is what lets DDP overlap reduction with backward). The
// thread makes blocking calls (MPI_Allreduce, ...): Open MPI's blocking collectives are about
// twice as fast as its non-blocking ones driven by MPI_Test (6 vs 3 GB/s for 4 MiB between
// two ranks here; libnbc's schedules progress only inside MPI calls). A watchdog thread
// enforces the timeout: a collective still running after it prints what it was and
// MPI_Aborts the job.
//
// CUDA tensors: with a CUDA-aware MPI (cuda_aware(): MPIX_Query_cuda_support() where the
// library has Open MPI's CUDA extension or MPICH's MPIX_GPU_query_support, overridden by
// DLTRAIN_MPI_CUDA_AWARE=0|1) the device pointers go to MPI as they are, once the
// communication thread has waited for an event recorded on the caller's stream; 16-bit
// reductions still stage (their MPI ops are host code) and Avg's division runs in wait() on
// the caller's stream. Otherwise they are staged through page-locked host memory from the
// library's pinned pool: an asynchronous device-to-host copy on the caller's stream when the
// collective is issued (the communication thread waits for its event), and a copy back on
// the thread that calls wait(). Counts above INT_MAX are split into several calls.
//
// Point to point: send/recv are posted by the same thread, in issue order, as non-blocking
// MPI_Isend/MPI_Irecv of bytes (1 GiB per request), and stay pending in p2p_ while the thread
// goes on with its queue; it polls them with MPI_Testsome between tasks and every 50 us while
// any is pending (a blocking collective running meanwhile progresses them too). So a rank that
// sends to a peer that is itself sending to it never deadlocks, whatever the message sizes. A
// recv completes in error when the message holds another number of bytes than its tensor. The
// watchdog times out the oldest pending send/recv as it does a collective.
//
// split() runs MPI_Comm_split on the communication thread too (it is a collective of comm_),
// and the new group gets its own communicator, thread and watchdog.
// The C API only: keep Open MPI / MPICH from pulling in their deprecated C++ bindings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
// Open MPI's extensions header declares MPIX_Query_cuda_support() when it was built with its
// CUDA extension (Debian's is, with MPIX_CUDA_AWARE_SUPPORT 0 at build time: the runtime
// query is what counts).
#if defined(OPEN_MPI) && OPEN_MPI && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>
#include <type_traits>
#include <vector>

#include "dltrain/autograd/node.hpp"
#include "dltrain/backend/cuda.hpp"
#include "dltrain/core/half.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "src/backend/cpu/half_convert.hpp"
#include "src/distributed/internal.hpp"

namespace dltrain::distributed {

namespace {

#define DLTRAIN_MPI_CHECK(call)                                                          \
  do {                                                                                   \
    int rc_ = (call);                                                                    \
    if (rc_ != MPI_SUCCESS) {                                                            \
      char msg_[MPI_MAX_ERROR_STRING];                                                   \
      int len_ = 0;                                                                      \
      MPI_Error_string(rc_, msg_, &len_);                                                \
      throw ::dltrain::Error(std::string(#call) + " failed at " + __FILE__ + ":" +       \
                             std::to_string(__LINE__) + ": " + std::string(msg_, len_)); \
    }                                                                                    \
  } while (0)

template <class H, int K>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const H* a = static_cast<const H*>(in);
  H* b = static_cast<H*>(inout);
  if constexpr (std::is_same_v<H, Half> && K == 0) {
    // f16 sums (DDP's f16 compression) through the bulk conversions (F16C where the CPU has
    // it), in blocks on the stack: the same float additions and roundings as the loop below.
    constexpr int kBlock = 512;
    float fa[kBlock], fb[kBlock];
    for (int i0 = 0; i0 < *len; i0 += kBlock) {
      const int n = std::min(kBlock, *len - i0);
      backend::cpu::f16_to_f32(a + i0, fa, n);
      backend::cpu::f16_to_f32(b + i0, fb, n);
      for (int i = 0; i < n; ++i) fa[i] += fb[i];
      backend::cpu::f32_to_f16(fa, b + i0, n);
    }
    return;
  }
  for (int i = 0; i < *len; ++i) {
    const float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    // NaN propagates through max/min as through sum (std::max would drop it).
    float r = K == 0               ? x + y
              : (x != x || y != y) ? x + y
              : K == 1             ? std::max(x, y)
                                   : std::min(x, y);
    b[i] = H(r);
  }
}

struct HalfOps {
  MPI_Op f16[3], bf16[3];
  HalfOps() {
    MPI_Op_create(&half_reduce<Half, 0>, 1, &f16[0]);
    MPI_Op_create(&half_reduce<Half, 1>, 1, &f16[1]);
    MPI_Op_create(&half_reduce<Half, 2>, 1, &f16[2]);
    MPI_Op_create(&half_reduce<BFloat16, 0>, 1, &bf16[0]);
    MPI_Op_create(&half_reduce<BFloat16, 1>, 1, &bf16[1]);
    MPI_Op_create(&half_reduce<BFloat16, 2>, 1, &bf16[2]);
  }
};

const HalfOps& half_ops() {
  static HalfOps ops;
  return ops;
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::f16:
    case DType::bf16:
      return MPI_UINT16_T;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
      return MPI_UINT8_T;
    case DType::b8:
      return MPI_C_BOOL;
  }
  DLTRAIN_FAIL("distributed: no MPI datatype for dtype ", t);
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  const int k = op == ReduceOp::Max ? 1 : op == ReduceOp::Min ? 2 : 0;
  if (t == DType::f16) return half_ops().f16[k];
  if (t == DType::bf16) return half_ops().bf16[k];
  if (t == DType::b8) return op == ReduceOp::Min ? MPI_LAND : MPI_LOR;
  return k == 0 ? MPI_SUM : k == 1 ? MPI_MAX : MPI_MIN;
}

void scale_in_place(const Tensor& t, double factor) {
  void* p = t.data_ptr();
  const int64_t n = t.numel();
  dispatch_floating(t.dtype(), "all_reduce(avg)", [&]<class T>() {
    T* x = static_cast<T*>(p);
    for (int64_t i = 0; i < n; ++i)
      x[i] = T(static_cast<acc_t<T>>(static_cast<acc_t<T>>(x[i]) * static_cast<acc_t<T>>(factor)));
  });
}

using Clock = std::chrono::steady_clock;

// Whether the MPI library itself reports CUDA support (no override).
bool query_cuda_support() {
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
  return MPIX_Query_cuda_support() == 1;
#elif defined(MPIX_GPU_SUPPORT_CUDA)
  int yes = 0;
  return MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &yes) == MPI_SUCCESS && yes == 1;
#else
  return false;
#endif
}

// An uninitialised tensor in page-locked host memory (the CUDA backend's pinned pool) with
// `t`'s shape and strides (t is dense), so copies between them are straight byte copies.
Tensor pinned_like(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::pinned(static_cast<size_t>(t.numel()) * t.element_size());
  impl->shape = t.shape();
  impl->strides = t.strides();
  impl->dtype = t.dtype();
  return Tensor(impl);
}

class MPIProcessGroup final : public ProcessGroup {
 public:
  MPIProcessGroup(MPI_Comm comm, int rank, int size, std::chrono::milliseconds timeout)
      : ProcessGroup(rank, size, timeout), comm_(comm), cuda_aware_(mpi_cuda_aware()) {
    (void)half_ops();
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);  // a predefined world attribute
    if (flag && ub) max_tag_ = *ub;
    thread_ = std::thread([this] { loop(); });
    watchdog_ = std::thread([this] { watch(); });
  }
  ~MPIProcessGroup() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watch_cv_.notify_all();
    thread_.join();
    watchdog_.join();
    if (detail::mpi_initialized()) MPI_Comm_free(&comm_);
  }

  const char* backend() const override { return "mpi"; }

  Work all_reduce(const Tensor& t, ReduceOp op) override {
    detail::check_collective_tensor("all_reduce", t, false);
    detail::check_reduce_op("all_reduce", op, t.dtype());
    return submit(
        detail::describe_collective("all_reduce", t, reduce_op_name(op)), {t}, {t},
        [this, op](const std::vector<Tensor>& h) {
          const Tensor& x = h[0];
          const DType dt = x.dtype();
          char* p = static_cast<char*>(x.data_ptr());
          int64_t n = x.numel();
          const int64_t chunk = INT_MAX / 2;
          for (int64_t s = 0; s < n; s += chunk) {
            const int c = static_cast<int>(std::min(chunk, n - s));
            DLTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p + s * dtype_size(dt), c, mpi_type(dt),
                                            mpi_op(op, dt), comm_));
          }
          if (op == ReduceOp::Avg && x.device().is_cpu()) scale_in_place(x, 1.0 / size());
        },
        op == ReduceOp::Avg ? 1.0 / size() : 0.0, is_half(t.dtype()));
  }

  Work broadcast(const Tensor& t, int root) override {
    detail::check_collective_tensor("broadcast", t, false);
    DLTRAIN_CHECK(root >= 0 && root < size(), "broadcast: root ", root,
                  " is not a rank of this group of ", size());
    return submit(detail::describe_collective("broadcast", t), {t}, {t},
                  [this, root](const std::vector<Tensor>& h) {
                    const Tensor& x = h[0];
                    char* p = static_cast<char*>(x.data_ptr());
                    const int64_t n = x.numel(), chunk = INT_MAX / 2;
                    for (int64_t s = 0; s < n; s += chunk) {
                      const int c = static_cast<int>(std::min(chunk, n - s));
                      DLTRAIN_MPI_CHECK(
                          MPI_Bcast(p + s * x.element_size(), c, mpi_type(x.dtype()), root, comm_));
                    }
                  });
  }

  Work all_gather(const Tensor& output, const Tensor& input) override {
    detail::check_collective_tensor("all_gather", input, true);
    detail::check_collective_tensor("all_gather", output, true);
    check_pair("all_gather", output, input);
    return submit(
        detail::describe_collective("all_gather", input), {input, output}, {output},
        [this](const std::vector<Tensor>& h) {
          const int n = static_cast<int>(h[0].numel());
          MPI_Datatype t = mpi_type(h[0].dtype());
          DLTRAIN_MPI_CHECK(MPI_Allgather(h[0].data_ptr(), n, t, h[1].data_ptr(), n, t, comm_));
        });
  }

  Work reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override {
    detail::check_collective_tensor("reduce_scatter", input, true);
    detail::check_collective_tensor("reduce_scatter", output, true);
    check_pair("reduce_scatter", input, output);
    detail::check_reduce_op("reduce_scatter", op, input.dtype());
    return submit(
        detail::describe_collective("reduce_scatter", input, reduce_op_name(op)), {input, output},
        {output},
        [this, op](const std::vector<Tensor>& h) {
          const DType dt = h[0].dtype();
          DLTRAIN_MPI_CHECK(MPI_Reduce_scatter_block(h[0].data_ptr(), h[1].data_ptr(),
                                                     static_cast<int>(h[1].numel()), mpi_type(dt),
                                                     mpi_op(op, dt), comm_));
          if (op == ReduceOp::Avg && h[1].device().is_cpu()) scale_in_place(h[1], 1.0 / size());
        },
        op == ReduceOp::Avg ? 1.0 / size() : 0.0, is_half(input.dtype()));
  }

  Work barrier() override {
    return submit("barrier", {}, {},
                  [this](const std::vector<Tensor>&) { DLTRAIN_MPI_CHECK(MPI_Barrier(comm_)); });
  }

  Work send(const Tensor& t, int dst, int tag) override {
    detail::check_p2p("send", t, dst, "dst", tag, *this);
    return submit_p2p(detail::describe_p2p("send", t, dst, tag), t, false, dst, tag);
  }

  Work recv(const Tensor& t, int src, int tag) override {
    detail::check_p2p("recv", t, src, "src", tag, *this);
    return submit_p2p(detail::describe_p2p("recv", t, src, tag), t, true, src, tag);
  }

  int max_tag() const override { return max_tag_; }

  std::shared_ptr<ProcessGroup> split(int color, int key) override {
    auto out = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
    const std::string what = "split(color " + std::to_string(color) + ")";
    submit(what, {}, {}, [this, out, color, key](const std::vector<Tensor>&) {
      DLTRAIN_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, out.get()));
    }).wait();
    if (*out == MPI_COMM_NULL) return nullptr;
    MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    int rank = 0, size = 1;
    MPI_Comm_rank(*out, &rank);
    MPI_Comm_size(*out, &size);
    return std::make_shared<MPIProcessGroup>(*out, rank, size, timeout());
  }

 private:
  using Body = std::function<void(const std::vector<Tensor>&)>;
  struct Task {
    std::string what;
    std::vector<Tensor> tensors;  // host tensors the body reads/writes (kept alive)
    std::shared_ptr<Work::State> state;
    Body body;
    std::shared_ptr<cuda::Event> ready;  // CUDA tensors: wait for it before MPI touches them
    // Point to point (body is empty): post MPI_Isend/MPI_Irecv of tensors[0] with peer and tag.
    bool p2p = false, is_recv = false;
    int peer = 0, tag = 0;
  };
  // A posted send/recv, owned by the communication thread (guarded by mu_ for the watchdog).
  struct Pending {
    std::string what;
    Tensor tensor;
    std::shared_ptr<Work::State> state;
    std::vector<MPI_Request> requests;
    std::vector<int64_t> expected;  // bytes per request (recv)
    std::vector<int64_t> received;  // bytes per completed request (recv), -1 until complete
    std::exception_ptr error;
    size_t left = 0;
    bool is_recv = false;
    Clock::time_point start;
  };

  Work submit_p2p(std::string what, const Tensor& t, bool is_recv, int peer, int tag) {
    Task p2p;
    p2p.is_recv = is_recv;
    p2p.peer = peer;
    p2p.tag = tag;
    return submit(std::move(what), {t}, is_recv ? std::vector<Tensor>{t} : std::vector<Tensor>{},
                  Body(), 0.0, false, &p2p);
  }

  // Called on the communication thread with the task popped: posts its requests.
  void post(Task& task) {
    Pending p;
    p.what = std::move(task.what);
    p.tensor = task.tensors[0];
    p.state = task.state;
    p.is_recv = task.is_recv;
    p.start = Clock::now();
    char* ptr = static_cast<char*>(p.tensor.data_ptr());
    const int64_t bytes = p.tensor.numel() * static_cast<int64_t>(p.tensor.element_size());
    const int64_t chunk = int64_t{1} << 30;
    try {
      for (int64_t s = 0; s < bytes || (s == 0 && bytes == 0); s += chunk) {
        const int c = static_cast<int>(std::min(chunk, bytes - s));
        MPI_Request r;
        if (task.is_recv)
          DLTRAIN_MPI_CHECK(MPI_Irecv(ptr + s, c, MPI_BYTE, task.peer, task.tag, comm_, &r));
        else
          DLTRAIN_MPI_CHECK(MPI_Isend(ptr + s, c, MPI_BYTE, task.peer, task.tag, comm_, &r));
        p.requests.push_back(r);
        p.expected.push_back(c);
        p.received.push_back(-1);
        if (bytes == 0) break;
      }
    } catch (...) {
      // Requests already posted stay pending (their buffers are kept alive in p) and the
      // error is raised by wait() once they complete.
      p.error = std::current_exception();
    }
    p.left = p.requests.size();
    if (p.left == 0) {
      p.state->complete(p.error);
      return;
    }
    std::lock_guard<std::mutex> lk(mu_);
    p2p_.push_back(std::move(p));
  }

  // Tests every pending send/recv once; completes the finished ones. Communication thread.
  void progress() {
    std::vector<Pending> done;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (Pending& p : p2p_) {
        for (size_t i = 0; i < p.requests.size(); ++i) {
          if (p.requests[i] == MPI_REQUEST_NULL) continue;
          int flag = 0;
          MPI_Status st;
          const int rc = MPI_Test(&p.requests[i], &flag, &st);
          if (rc != MPI_SUCCESS && !p.error) {
            char msg[MPI_MAX_ERROR_STRING];
            int len = 0;
            MPI_Error_string(rc, msg, &len);
            p.error = std::make_exception_ptr(
                Error(p.what + " failed: " + std::string(msg, len) +
                      (p.is_recv ? " (a message longer than the tensor: both sides must agree "
                                   "on its shape and dtype)"
                                 : "")));
            flag = 1;
            p.requests[i] = MPI_REQUEST_NULL;
          }
          if (!flag) continue;
          --p.left;
          if (p.is_recv && rc == MPI_SUCCESS) {
            int n = 0;
            MPI_Get_count(&st, MPI_BYTE, &n);
            p.received[i] = n;
          }
        }
      }
      for (auto it = p2p_.begin(); it != p2p_.end();) {
        if (it->left == 0) {
          done.push_back(std::move(*it));
          it = p2p_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (Pending& p : done) {
      if (!p.error && p.is_recv) {
        int64_t got = 0, want = 0;
        for (size_t i = 0; i < p.expected.size(); ++i) {
          got += p.received[i];
          want += p.expected[i];
        }
        if (got != want)
          p.error = std::make_exception_ptr(Error(
              p.what + ": the message holds " + std::to_string(got) + " bytes, the tensor " +
              std::to_string(want) +
              "; the sender and the receiver must agree on the shape and dtype (send the shape "
              "first when it varies)"));
      }
      p.tensor = Tensor();
      p.state->complete(p.error);
    }
  }

  void check_pair(const char* op, const Tensor& big, const Tensor& small) const {
    detail::check_gather_pair(op, big, small, size());
    DLTRAIN_CHECK(small.numel() <= INT_MAX, op, ": ", small.numel(),
                  " elements per rank exceeds MPI's int count; split the tensor");
  }

  static bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }

  // CUDA tensors (see the file comment): passed as they are to a CUDA-aware MPI unless
  // `host_op` (a reduction whose MPI op is host code), with `outputs` scaled by `avg_scale`
  // (when not 0) in wait(); else staged through pinned memory, `outputs` copied back in wait().
  Work submit(std::string what, std::vector<Tensor> tensors, const std::vector<Tensor>& outputs,
              Body body, double avg_scale = 0.0, bool host_op = false, const Task* p2p = nullptr) {
    auto state = std::make_shared<Work::State>();
    std::shared_ptr<cuda::Event> ready;
    bool any_cuda = false;
    for (const Tensor& t : tensors) any_cuda = any_cuda || t.device().is_cuda();
    if (any_cuda) {
      const Device dev = std::find_if(tensors.begin(), tensors.end(), [](const Tensor& t) {
                           return t.device().is_cuda();
                         })->device();
      cuda::DeviceGuard guard(dev.index);
      if (cuda_aware_ && !host_op) {
        if (avg_scale != 0.0) {
          state->on_wait = [outputs, avg_scale] {
            NoGradGuard ng;
            for (Tensor o : outputs) mul_(o, avg_scale);
          };
        }
      } else {
        std::vector<std::pair<Tensor, Tensor>> copy_back;
        for (Tensor& t : tensors) {
          if (!t.device().is_cuda()) continue;
          Tensor host = pinned_like(t);
          host.copy_(t, /*non_blocking=*/true);
          for (const Tensor& o : outputs)
            if (o.impl() == t.impl()) copy_back.emplace_back(t, host);
          t = host;
        }
        if (!copy_back.empty()) {
          state->on_wait = [copy_back] {
            for (const auto& [d, host] : copy_back) {
              Tensor out = d;
              out.copy_(host);
            }
          };
        }
      }
      // The communication thread starts once the caller's stream has produced the tensors
      // (or finished the copies to pinned memory).
      ready = std::make_shared<cuda::Event>();
      ready->record();
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      Task task{std::move(what), std::move(tensors), state, std::move(body), std::move(ready)};
      if (p2p) {
        task.p2p = true;
        task.is_recv = p2p->is_recv;
        task.peer = p2p->peer;
        task.tag = p2p->tag;
      }
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
    return Work(state);
  }

  void loop() {
    for (;;) {
      Task task;
      bool have = false;
      {
        std::unique_lock<std::mutex> lk(mu_);
        auto ready = [&] { return stop_ || !queue_.empty(); };
        if (p2p_.empty())
          cv_.wait(lk, ready);
        else
          cv_.wait_for(lk, std::chrono::microseconds(50), ready);
        if (!queue_.empty()) {
          task = std::move(queue_.front());
          queue_.pop_front();
          have = true;
        } else if (stop_) {
          break;
        }
      }
      if (have) run(task);
      progress();
    }
    cancel_pending();
  }

  void run(Task& task) {
    if (task.p2p) {
      try {
        if (task.ready) task.ready->synchronize();
      } catch (...) {
        task.state->complete(std::current_exception());
        return;
      }
      post(task);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      running_ = &task.what;
      running_since_ = Clock::now();
    }
    std::exception_ptr err;
    try {
      if (task.ready) task.ready->synchronize();
      task.body(task.tensors);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      running_ = nullptr;
    }
    task.tensors.clear();
    task.state->complete(err);
  }

  // At destruction: sends and recvs nobody matched (a program that exits with messages in
  // flight) are cancelled, and their Work completes with an error.
  void cancel_pending() {
    std::lock_guard<std::mutex> lk(mu_);
    for (Pending& p : p2p_) {
      for (MPI_Request& r : p.requests) {
        if (r == MPI_REQUEST_NULL) continue;
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
      p.state->complete(std::make_exception_ptr(
          Error(p.what + ": cancelled, the group was destroyed before the peer matched it")));
    }
    p2p_.clear();
  }

  // Wakes every 100 ms (or at shutdown) and aborts the job when the running collective has
  // exceeded the timeout.
  void watch() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      watch_cv_.wait_for(lk, std::chrono::milliseconds(100));
      if (running_ && Clock::now() - running_since_ > timeout()) timed_out(*running_);
      for (const Pending& p : p2p_)
        if (Clock::now() - p.start > timeout()) timed_out(p.what);
    }
  }

  [[noreturn]] void timed_out(const std::string& what) {
    const double s = std::chrono::duration<double>(timeout()).count();
    detail::print_fatal_once(
        what + " on the mpi group did not complete within " + detail::seconds_str(s) +
        ": another rank has died, is stuck, or issued a different collective (or no matching "
        "send/recv). Aborting the job (DLTRAIN_COLLECTIVE_TIMEOUT=seconds changes the limit)");
    detail::mpi_abort(1);
  }

  MPI_Comm comm_;
  bool cuda_aware_;
  std::thread thread_, watchdog_;
  const std::string* running_ = nullptr;  // the collective in MPI now (guarded by mu_)
  Clock::time_point running_since_;
  std::mutex mu_;
  std::condition_variable cv_;        // the communication thread waits for tasks here
  std::condition_variable watch_cv_;  // the watchdog's tick (a separate cv: notify_one on a
                                      // shared one could wake the watchdog instead)
  std::deque<Task> queue_;
  std::deque<Pending> p2p_;  // posted sends/recvs (communication thread; mu_ for the watchdog)
  bool stop_ = false;
  int max_tag_ = 32767;
};

MPI_Comm& node_comm() {
  static MPI_Comm c = [] {
    MPI_Comm n;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &n);
    return n;
  }();
  return c;
}

std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& mine) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(size)), displs(static_cast<size_t>(size));
  DLTRAIN_MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm));
  int total = 0;
  for (int i = 0; i < size; ++i) {
    displs[static_cast<size_t>(i)] = total;
    total += lens[static_cast<size_t>(i)];
  }
  std::string all(static_cast<size_t>(total), '\0');
  DLTRAIN_MPI_CHECK(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(),
                                   displs.data(), MPI_CHAR, comm));
  std::vector<std::string> out;
  for (int i = 0; i < size; ++i)
    out.push_back(all.substr(static_cast<size_t>(displs[static_cast<size_t>(i)]),
                             static_cast<size_t>(lens[static_cast<size_t>(i)])));
  return out;
}

}  // namespace

std::shared_ptr<ProcessGroup> new_mpi_group(std::chrono::milliseconds timeout) {
  DLTRAIN_CHECK(detail::mpi_initialized(),
                "new_mpi_group: MPI is not initialised; call distributed::init() first");
  MPI_Comm comm;
  DLTRAIN_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  return std::make_shared<MPIProcessGroup>(comm, rank, size, timeout);
}

bool mpi_available() { return true; }

bool mpi_cuda_aware() {
  if (const char* v = std::getenv("DLTRAIN_MPI_CUDA_AWARE"); v && *v) {
    const std::string s(v);
    DLTRAIN_CHECK(s == "0" || s == "1", "DLTRAIN_MPI_CUDA_AWARE must be 0 or 1, got '", s, "'");
    return s == "1";
  }
  return detail::mpi_initialized() && query_cuda_support();
}

namespace detail {

bool mpi_compiled() { return true; }

bool mpi_initialized() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

void mpi_init() {
  int init = 0;
  MPI_Initialized(&init);
  int provided = 0;
  if (!init) {
    DLTRAIN_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
  } else {
    MPI_Query_thread(&provided);
  }
  DLTRAIN_CHECK(provided >= MPI_THREAD_SERIALIZED,
                "distributed::init: this MPI library gives thread level ", provided,
                " but dltrain's communication thread needs MPI_THREAD_SERIALIZED or better; use "
                "an MPI built with thread support (Open MPI and MPICH are, by default)");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

int mpi_world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int mpi_world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
int mpi_node_rank() {
  int r = 0;
  MPI_Comm_rank(node_comm(), &r);
  return r;
}
int mpi_node_size() {
  int s = 1;
  MPI_Comm_size(node_comm(), &s);
  return s;
}
void mpi_node_index(int& node, int& nodes) {
  int leader = mpi_world_rank();  // the node's lowest world rank names it
  DLTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node_comm()));
  std::vector<int> leaders(static_cast<size_t>(mpi_world_size()));
  DLTRAIN_MPI_CHECK(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD));
  std::sort(leaders.begin(), leaders.end());
  leaders.erase(std::unique(leaders.begin(), leaders.end()), leaders.end());
  nodes = static_cast<int>(leaders.size());
  node =
      static_cast<int>(std::lower_bound(leaders.begin(), leaders.end(), leader) - leaders.begin());
}

std::vector<std::string> mpi_allgather_strings(const std::string& mine) {
  return allgather_strings(MPI_COMM_WORLD, mine);
}
std::vector<std::string> mpi_node_allgather_strings(const std::string& mine) {
  return allgather_strings(node_comm(), mine);
}

std::string mpi_broadcast_bytes(const std::string& bytes) {
  int len = static_cast<int>(bytes.size());
  DLTRAIN_MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD));
  std::string out = bytes;
  out.resize(static_cast<size_t>(len));
  DLTRAIN_MPI_CHECK(MPI_Bcast(out.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD));
  return out;
}

void mpi_abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (mpi_initialized()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void mpi_finalize() {
  if (mpi_initialized()) MPI_Finalize();
}

}  // namespace detail
}  // namespace dltrain::distributed
