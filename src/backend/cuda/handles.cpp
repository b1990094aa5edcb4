// Per-thread, per-device cuBLASLt and cuDNN handles drawn from process-wide pools (see
// handles.hpp). Invariant: a handle is owned by at most one thread at a time; the pools and
// the handles in them live until the process exits.
#include "src/backend/cuda/handles.hpp"

#include <mutex>
#include <vector>

#include "src/backend/cuda/lib_check.hpp"
#include "src/backend/cuda/runtime.hpp"

namespace dltrain::backend::cuda {

namespace {

template <class H>
struct HandlePool {
  std::mutex mu;
  std::vector<std::vector<H>> free;  // by device

  H take(int device) {
    std::lock_guard<std::mutex> lock(mu);
    if (static_cast<size_t>(device) < free.size() && !free[device].empty()) {
      H h = free[device].back();
      free[device].pop_back();
      return h;
    }
    return nullptr;
  }
  void give(int device, H h) {
    std::lock_guard<std::mutex> lock(mu);
    if (free.size() <= static_cast<size_t>(device)) free.resize(device + 1);
    free[device].push_back(h);
  }
};

// Never destroyed: threads may give handles back during process exit.
HandlePool<cublasLtHandle_t>& lt_pool() {
  static auto* p = new HandlePool<cublasLtHandle_t>;
  return *p;
}
HandlePool<cudnnHandle_t>& dnn_pool() {
  static auto* p = new HandlePool<cudnnHandle_t>;
  return *p;
}

// The calling thread's handles; given back to the pools when the thread exits.
struct ThreadHandles {
  std::vector<cublasLtHandle_t> lt;
  std::vector<cudnnHandle_t> dnn;
  ~ThreadHandles() {
    for (size_t d = 0; d < lt.size(); ++d)
      if (lt[d]) lt_pool().give(static_cast<int>(d), lt[d]);
    for (size_t d = 0; d < dnn.size(); ++d)
      if (dnn[d]) dnn_pool().give(static_cast<int>(d), dnn[d]);
  }
};
thread_local ThreadHandles tls_handles;

template <class H>
H& slot(std::vector<H>& v, int device) {
  DLTRAIN_CHECK(device >= 0, "CUDA library handle requested for invalid device ", device);
  if (v.size() <= static_cast<size_t>(device)) v.resize(device + 1, nullptr);
  return v[device];
}

}  // namespace

cublasLtHandle_t cublaslt_handle(int device) {
  cublasLtHandle_t& h = slot(tls_handles.lt, device);
  if (!h) {
    h = lt_pool().take(device);
    if (!h) {
      Guard g(device);
      DLTRAIN_CUBLAS_CHECK(cublasLtCreate(&h));
    }
  }
  return h;
}

cudnnHandle_t cudnn_handle(int device) {
  cudnnHandle_t& h = slot(tls_handles.dnn, device);
  if (!h) {
    h = dnn_pool().take(device);
    if (!h) {
      Guard g(device);
      DLTRAIN_CUDNN_CHECK(cudnnCreate(&h));
    }
  }
  DLTRAIN_CUDNN_CHECK(cudnnSetStream(h, stream(device)));
  return h;
}

cudnnDataType_t cudnn_data_type(DType t, const char* op) {
  switch (t) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f64:
      return CUDNN_DATA_DOUBLE;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      DLTRAIN_FAIL(op, " on CUDA: expected a floating dtype (f32, f64, f16, bf16) but got ", t);
  }
}

}  // namespace dltrain::backend::cuda
