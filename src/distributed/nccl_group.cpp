// The NCCL process group (built with CUDA when NCCL is found).
//
// Collectives run on the group's own high-priority stream: each one waits (on the GPU) for an
// event recorded on the caller's current stream, runs, and records a "done" event. wait()
// makes the caller's current stream wait for "done", so the host never blocks (PyTorch's
// semantics). Memory safety across streams: the tensors a collective touches were allocated
// on (and will be freed on) the compute stream, which does not know the NCCL stream still
// reads them; the group therefore keeps every collective's tensors alive until its "done"
// event has completed, whatever the caller does with its handles. (cuda::record_stream
// would be correct too, but with the stream-ordered pool a free then makes the compute
// stream wait for the NCCL stream up to that point, which can serialise later buckets'
// communication with the compute that follows; holding the tensors costs nothing on the GPU.)
// A watchdog thread retires finished collectives, and when one is still pending after the
// timeout (or NCCL reports an asynchronous error) it prints which one and aborts the
// communicator and the job. When checking a collective's event fails (a sticky CUDA error: an
// earlier kernel faulted, and the context is lost), it prints the error once, keeps it and
// stops watching; the caller's next wait() or collective on the group raises it as
// dltrain::Error (an exception escaping the thread would end the process in std::terminate,
// hiding the fault), and the destructor aborts the communicator instead of waiting on it.
//
// send/recv are ncclSend/ncclRecv on the same stream, one per call (no tags in NCCL: messages
// between two ranks match in issue order), and split() is ncclCommSplit. Neither has run on a
// GPU yet (no machine with two GPUs was available when they were written): compiled, untested.
// One stream means a send waits on the GPU until the peer posts its recv, so two ranks that
// each send to the other before receiving deadlock; issue the recv first on one side.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "dltrain/backend/cuda.hpp"
#include "src/backend/cuda/check.hpp"
#include "src/distributed/internal.hpp"

#define DLTRAIN_NCCL_CHECK(call)                                                           \
  do {                                                                                     \
    const ncclResult_t dltrain_nr_ = (call);                                               \
    if (dltrain_nr_ != ncclSuccess)                                                        \
      DLTRAIN_FAIL(#call, " failed at ", __FILE__, ":", __LINE__, ": ",                    \
                   ncclGetErrorString(dltrain_nr_), " (", ncclGetLastError(nullptr), ")"); \
  } while (0)

namespace dltrain::distributed {

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
    case DType::b8:
      return ncclUint8;
  }
  DLTRAIN_FAIL("nccl: unsupported dtype ", t);
}

ncclRedOp_t nccl_op(ReduceOp op, DType t) {
  if (t == DType::b8) return op == ReduceOp::Min ? ncclMin : ncclMax;  // logical and / or
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      return ncclAvg;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  return ncclSum;
}

// What the caller sees of a failure the watchdog caught (detail::DeferredError).
constexpr const char* kStickyAdvice =
    "CUDA errors of this kind are sticky: this process's CUDA context can run nothing more. The "
    "fault is an earlier kernel or copy on this device (an index out of range, a bad pointer); "
    "rerun with CUDA_LAUNCH_BLOCKING=1 to have it raised where it happens";

struct NcclState final : Work::State {
  cuda::Event done;
  int device = 0;
  std::string what;
  std::shared_ptr<detail::DeferredError> error;  // the group's
  void wait() override {
    error->throw_if_set("wait() on " + what);
    cuda::DeviceGuard g(device);
    done.wait(cuda::current_stream(device));
  }
  bool completed() const override {
    error->throw_if_set("is_completed() on " + what);
    return done.query();
  }
};

class NCCLProcessGroup final : public ProcessGroup {
 public:
  // A group over an existing communicator (split()).
  NCCLProcessGroup(ncclComm_t comm, int rank, int size, int device,
                   std::chrono::milliseconds timeout)
      : ProcessGroup(rank, size, timeout), device_(device), comm_(comm) {
    cuda::DeviceGuard g(device);
    stream_ = cuda::Stream::create(device, /*high_priority=*/true);
    watchdog_ = std::thread([this] { watch(); });
  }

  NCCLProcessGroup(int rank, int size, int device, std::chrono::milliseconds timeout,
                   const std::function<std::string(const std::string&)>& bootstrap)
      : ProcessGroup(rank, size, timeout), device_(device) {
    cuda::DeviceGuard g(device);
    ncclUniqueId id{};
    std::string mine;
    if (rank == 0) {
      DLTRAIN_NCCL_CHECK(ncclGetUniqueId(&id));
      mine.assign(reinterpret_cast<const char*>(&id), sizeof(id));
    }
    const std::string got = bootstrap(mine);
    DLTRAIN_CHECK(got.size() == sizeof(id), "nccl: the bootstrap delivered ", got.size(),
                  " bytes instead of NCCL's ", sizeof(id), "-byte unique id");
    std::memcpy(&id, got.data(), sizeof(id));
    DLTRAIN_NCCL_CHECK(ncclCommInitRank(&comm_, size, id, rank));
    stream_ = cuda::Stream::create(device, /*high_priority=*/true);
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NCCLProcessGroup() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    if (error_->is_set()) {  // the context is lost: nothing to wait for, nothing to flush
      ncclCommAbort(comm_);
      return;
    }
    try {
      stream_.synchronize();
    } catch (...) {
    }
    ncclCommDestroy(comm_);
  }

  const char* backend() const override { return "nccl"; }
  Device tensor_device() const override { return Device::cuda(device_); }

  Work all_reduce(const Tensor& t, ReduceOp op) override {
    check("all_reduce", t, false);
    detail::check_reduce_op("all_reduce", op, t.dtype());
    return launch(
        detail::describe_collective("all_reduce", t, reduce_op_name(op)), {t}, [&](cudaStream_t s) {
          DLTRAIN_NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(),
                                           static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                                           nccl_op(op, t.dtype()), comm_, s));
        });
  }

  Work broadcast(const Tensor& t, int root) override {
    check("broadcast", t, false);
    DLTRAIN_CHECK(root >= 0 && root < size(), "broadcast: root ", root,
                  " is not a rank of this group of ", size());
    return launch(detail::describe_collective("broadcast", t), {t}, [&](cudaStream_t s) {
      DLTRAIN_NCCL_CHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                                       nccl_type(t.dtype()), root, comm_, s));
    });
  }

  Work all_gather(const Tensor& output, const Tensor& input) override {
    check("all_gather", input, true);
    check("all_gather", output, true);
    detail::check_gather_pair("all_gather", output, input, size());
    return launch(detail::describe_collective("all_gather", input), {input, output},
                  [&](cudaStream_t s) {
                    DLTRAIN_NCCL_CHECK(ncclAllGather(input.data_ptr(), output.data_ptr(),
                                                     static_cast<size_t>(input.numel()),
                                                     nccl_type(input.dtype()), comm_, s));
                  });
  }

  Work reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override {
    check("reduce_scatter", input, true);
    check("reduce_scatter", output, true);
    detail::check_gather_pair("reduce_scatter", input, output, size());
    detail::check_reduce_op("reduce_scatter", op, input.dtype());
    return launch(detail::describe_collective("reduce_scatter", input, reduce_op_name(op)),
                  {input, output}, [&](cudaStream_t s) {
                    DLTRAIN_NCCL_CHECK(ncclReduceScatter(
                        input.data_ptr(), output.data_ptr(), static_cast<size_t>(output.numel()),
                        nccl_type(input.dtype()), nccl_op(op, input.dtype()), comm_, s));
                  });
  }

  Work send(const Tensor& t, int dst, int tag) override {
    check("send", t, false);
    detail::check_p2p("send", t, dst, "dst", tag, *this);
    return launch(detail::describe_p2p("send", t, dst, tag), {t}, [&](cudaStream_t s) {
      DLTRAIN_NCCL_CHECK(ncclSend(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size(),
                                  ncclUint8, dst, comm_, s));
    });
  }

  Work recv(const Tensor& t, int src, int tag) override {
    check("recv", t, false);
    detail::check_p2p("recv", t, src, "src", tag, *this);
    return launch(detail::describe_p2p("recv", t, src, tag), {t}, [&](cudaStream_t s) {
      DLTRAIN_NCCL_CHECK(ncclRecv(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size(),
                                  ncclUint8, src, comm_, s));
    });
  }

  std::shared_ptr<ProcessGroup> split(int color, int key) override {
    error_->throw_if_set("split on the nccl group");
    cuda::DeviceGuard g(device_);
    // Ordered after this group's pending collectives, as every rank issues it at the same point.
    stream_.synchronize();
    ncclComm_t out = nullptr;
    DLTRAIN_NCCL_CHECK(
        ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &out, nullptr));
    if (color < 0 || out == nullptr) return nullptr;
    int rank = 0, size = 1;
    DLTRAIN_NCCL_CHECK(ncclCommUserRank(out, &rank));
    DLTRAIN_NCCL_CHECK(ncclCommCount(out, &size));
    return std::make_shared<NCCLProcessGroup>(out, rank, size, device_, timeout());
  }

  Work barrier() override {
    // NCCL has no barrier: an all-reduce of one element, and the host waits for it.
    Tensor one = zeros({1}, TensorOptions(DType::f32).with_device(Device::cuda(device_)));
    Work w = all_reduce(one, ReduceOp::Sum);
    w.wait();
    stream_.synchronize();
    return w;
  }

 private:
  void check(const char* op, const Tensor& t, bool contiguous_only) const {
    detail::check_collective_tensor(op, t, contiguous_only);
    DLTRAIN_CHECK(t.device() == Device::cuda(device_), op,
                  ": the nccl group runs on cuda:", device_, " but the tensor is on ",
                  t.device().str(),
                  "; move it there (t.to(distributed::device())) or use an MPI group for CPU "
                  "tensors");
  }

  template <class F>
  Work launch(std::string what, std::vector<Tensor> tensors, F&& enqueue) {
    error_->throw_if_set(what + " on the nccl group");
    cuda::DeviceGuard g(device_);
    cuda::Event ready;
    ready.record(cuda::current_stream(device_));
    ready.wait(stream_);
    enqueue(static_cast<cudaStream_t>(stream_.handle()));
    auto st = std::make_shared<NcclState>();
    st->device = device_;
    st->what = what;
    st->error = error_;
    st->done.record(stream_);
    {
      std::lock_guard<std::mutex> lk(mu_);
      pending_.push_back(Pending{st, std::move(tensors), std::move(what), Clock::now()});
    }
    cv_.notify_one();
    return Work(st);
  }

  void watch() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::milliseconds(100));
      const bool ok = detail::retire_completed(
          pending_, [](const Pending& p) { return p.state->done.query(); },
          [](const Pending& p) { return p.what; }, *error_, "nccl group watchdog", kStickyAdvice);
      if (!ok) {  // reported and kept for the caller; only the destructor is left to wait for
        cv_.wait(lk, [this] { return stop_; });
        return;
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      std::string fatal;
      if (async != ncclSuccess && async != ncclInProgress)
        fatal = std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(async);
      else if (!pending_.empty() && Clock::now() - pending_.front().start > timeout())
        fatal = pending_.front().what + " on the nccl group did not complete within " +
                detail::seconds_str(std::chrono::duration<double>(timeout()).count()) +
                ": another rank has died, is stuck, or issued a different collective";
      if (!fatal.empty()) {
        detail::print_fatal_once(fatal +
                                 ". Aborting the job (DLTRAIN_COLLECTIVE_TIMEOUT=seconds "
                                 "changes the limit)");
        ncclCommAbort(comm_);
        detail::mpi_abort(1);
      }
    }
  }

  struct Pending {
    std::shared_ptr<NcclState> state;
    std::vector<Tensor> tensors;  // alive until the NCCL stream has used them
    std::string what;
    Clock::time_point start;
  };

  int device_;
  ncclComm_t comm_ = nullptr;
  cuda::Stream stream_;
  std::thread watchdog_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  bool stop_ = false;
  std::shared_ptr<detail::DeferredError> error_ = std::make_shared<detail::DeferredError>();
};

}  // namespace

std::shared_ptr<ProcessGroup> new_nccl_group(
    int rank, int size, int device, std::chrono::milliseconds timeout,
    const std::function<std::string(const std::string& bytes)>& bootstrap) {
  DLTRAIN_CHECK(cuda::device_count() > device && device >= 0, "new_nccl_group: cuda:", device,
                " is not a visible device (", cuda::device_count(), " visible)");
  return std::make_shared<NCCLProcessGroup>(rank, size, device, timeout, bootstrap);
}

bool nccl_available() { return true; }

}  // namespace dltrain::distributed
