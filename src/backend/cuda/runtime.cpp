// CUDA runtime glue: device discovery and device memory.
//
// device_count() never throws: without a driver (CI) cudaGetDeviceCount fails
// with "insufficient driver" and we report 0 devices, so a CUDA-enabled build
// runs CPU work anywhere. Memory comes from each device's default stream-ordered
// pool (cudaMallocAsync) with its release threshold raised to "keep everything",
// so steady-state training never returns memory to the driver.
#include <cstdint>
#include <mutex>
#include <vector>

#include "src/backend/cuda/check.hpp"
#include "src/backend/cuda/cuda_backend.hpp"

namespace dltrain::backend::cuda {

bool compiled() { return true; }

int device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky error of a driverless machine
      return 0;
    }
    return n;
  }();
  return count;
}

namespace {
void prepare_pool(int dev) {
  static std::once_flag flags[64];
  std::call_once(flags[dev % 64], [dev] {
    cudaMemPool_t pool;
    DLTRAIN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
    uint64_t threshold = UINT64_MAX;
    DLTRAIN_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  });
}
}  // namespace

void* allocate(size_t nbytes, Device device) {
  DLTRAIN_CHECK(device.index >= 0 && device.index < device_count(), "allocating on ", device,
                ": only ", device_count(), " CUDA device(s) are visible");
  DLTRAIN_CUDA_CHECK(cudaSetDevice(device.index));
  prepare_pool(device.index);
  void* p = nullptr;
  const cudaError_t err = cudaMallocAsync(&p, nbytes == 0 ? 1 : nbytes, cudaStreamPerThread);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    DLTRAIN_FAIL("CUDA out of memory on ", device, ": tried to allocate ", nbytes, " bytes with ",
                 free_b, " of ", total_b, " bytes free; reduce the batch size or use AMP");
  }
  DLTRAIN_CUDA_CHECK(err);
  return p;
}

void deallocate(void* p, Device device) {
  if (!p) return;
  cudaSetDevice(device.index);
  cudaFreeAsync(p, cudaStreamPerThread);  // no throw from a deleter
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  const cudaMemcpyKind kind = dst_device.is_cpu()   ? cudaMemcpyDeviceToHost
                              : src_device.is_cpu() ? cudaMemcpyHostToDevice
                                                    : cudaMemcpyDeviceToDevice;
  DLTRAIN_CUDA_CHECK(cudaSetDevice(dst_device.is_cuda() ? dst_device.index : src_device.index));
  DLTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, cudaStreamPerThread));
  DLTRAIN_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
}

}  // namespace dltrain::backend::cuda
