// CPU allocation for Storage; CUDA allocation is delegated to the backend.
#include "dltrain/core/storage.hpp"

#include <new>

#include "dltrain/core/error.hpp"
#include "src/backend/cuda/cuda_backend.hpp"

namespace dltrain {

namespace {
constexpr std::align_val_t kAlign{64};
}

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (device.is_cpu()) {
    void* p = nullptr;
    try {
      p = ::operator new(nbytes == 0 ? 1 : nbytes, kAlign);
    } catch (const std::bad_alloc&) {
      DLTRAIN_FAIL("out of CPU memory: could not allocate ", nbytes,
                   " bytes; reduce the batch size or the model size");
    }
    data_ = std::shared_ptr<void>(p, [](void* q) { ::operator delete(q, kAlign); });
  } else {
    void* p = backend::cuda::allocate(nbytes, device);
    data_ = std::shared_ptr<void>(p, [device](void* q) { backend::cuda::deallocate(q, device); });
  }
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data, std::move(deleter)), nbytes_(nbytes), device_(device) {}

}  // namespace dltrain
